//! What TLS to Redis is given beyond `rediss://`: a CA to verify the
//! server's certificate against (a private CA, as cert-manager issues in
//! a cluster), and a client certificate for mutual TLS (Redis's
//! `tls-auth-clients`). The same files serve every connection of a store:
//! the server, a cluster's nodes, the sentinels and the master they name.

/// PEM contents of the files, read when the settings were made.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// CA certificates the server's certificate is verified against;
    /// `None`: the web PKI roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field(
                "client",
                &self.client.as_ref().map(|_| "(certificate, ***)"),
            )
            .finish()
    }
}

impl RedisTls {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// A client of `info`, over TLS with `tls`'s files when given (`info`
/// must then be a TLS address: `rediss://`, or a sentinel's with `tls`).
pub(crate) fn client(
    info: redis::ConnectionInfo,
    tls: Option<&RedisTls>,
) -> redis::RedisResult<redis::Client> {
    match tls {
        None => redis::Client::open(info),
        Some(t) => redis::Client::build_with_tls(info, t.certificates()),
    }
}

/// A cluster client builder with `tls`'s files, when given.
pub(crate) fn cluster(
    builder: redis::cluster::ClusterClientBuilder,
    tls: Option<&RedisTls>,
) -> redis::cluster::ClusterClientBuilder {
    match tls {
        None => builder,
        Some(t) => builder.certs(t.certificates()),
    }
}
