//! TLS to the servers spillway connects to itself (the xDS management
//! server, the trace collector, Redis): the server verified against a CA
//! file (or the system's CA bundle), and a client certificate for mutual
//! TLS. The files are read once, when the settings are made: a bad one
//! stops the start.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the system's CA bundle is on Debian and in spillway's image,
/// trusted when no CA file is named.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The PEM contents of a CA file and a client certificate and key, read
/// and checked. Its `Debug` shows sizes, never the key.
#[derive(Clone, Default)]
pub struct PemFiles {
    /// The CA certificates (at least one).
    pub ca: Option<Vec<u8>>,
    /// The client's certificate chain (at least one) and its key, which
    /// go together.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for PemFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemFiles")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field(
                "client",
                &self.client.as_ref().map(|_| "(certificate, ***)"),
            )
            .finish()
    }
}

/// Reads `ca` and `client`'s files, checking that the CA file holds
/// certificates and that the key goes with its certificate. `what` names
/// the server in errors (`Redis`).
///
/// # Errors
/// A file cannot be read or holds no certificate (or key), or the key
/// does not go with the certificate.
pub fn read_pem_files(
    what: &str,
    ca: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> Result<PemFiles, String> {
    let ca = match ca {
        None => None,
        Some(p) => {
            let pem = read(p).map_err(|e| format!("{what} CA {e}"))?;
            roots(what, p, &pem)?;
            Some(pem)
        }
    };
    let client = match client {
        None => None,
        Some((cert, key)) => {
            let pair = (read(cert)?, read(key)?);
            // Built once to check the pair (any root store will do).
            let builder = rustls::ClientConfig::builder_with_provider(super::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(rustls::RootCertStore::empty());
            let (chain, key_der) = client_pair(cert, key, &pair)?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("{what} client certificate: {e}"))?;
            Some(pair)
        }
    };
    Ok(PemFiles { ca, client })
}

/// A rustls client configuration (no ALPN set) that trusts the
/// certificates in `ca` (else [`SYSTEM_CA_BUNDLE`]) and, with `client`,
/// presents that certificate chain and key. `what` names the server in
/// errors (`xDS server`).
///
/// # Errors
/// A file cannot be read, holds no certificate (or key), or the key does
/// not go with the certificate.
pub fn client_config(
    what: &str,
    ca: Option<&Path>,
    client: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, String> {
    let ca_path: PathBuf = ca.map_or_else(|| SYSTEM_CA_BUNDLE.into(), Path::to_path_buf);
    let pem = read(&ca_path).map_err(|e| format!("{what} CA {e}"))?;
    let builder = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(what, &ca_path, &pem)?);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let pair = (read(cert)?, read(key)?);
            let (chain, key_der) = client_pair(cert, key, &pair)?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("{what} client certificate: {e}"))
        }
    }
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{}: cannot read: {e}", p.display()))
}

/// The certificates of a CA file (at least one).
fn roots(what: &str, path: &Path, pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| format!("{what} CA {}: {e}", path.display()))?;
        roots
            .add(c)
            .map_err(|e| format!("{what} CA {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{what} CA {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(roots)
}

/// A client certificate chain (at least one) and its key, from their
/// files' contents.
fn client_pair(
    cert: &Path,
    key: &Path,
    (cert_pem, key_pem): &(Vec<u8>, Vec<u8>),
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in the file", cert.display()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("{}: no private key: {e}", key.display()))?;
    Ok((chain, key_der))
}
