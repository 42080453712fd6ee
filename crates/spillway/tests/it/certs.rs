//! Certificates the tests make (rcgen): a certificate authority, and
//! leaves it signs for servers, clients or both.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};

/// A certificate authority: its PEM certificate and what signs with it.
pub struct Ca {
    pub pem: String,
    params: CertificateParams,
    key: KeyPair,
}

/// A new certificate authority named `name`.
pub fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { pem, params, key }
}

/// What a leaf is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    /// No extended key usage: any (one certificate for a server and a
    /// client, as Envoy Gateway mounts the limiter's).
    Any,
}

/// A leaf `ca` signs, for `sans` (`spiffe://...` are URIs, the rest DNS
/// names or addresses); its PEM certificate and key.
pub fn leaf(ca: &Ca, sans: &[&str], usage: Usage) -> (String, String) {
    let mut params = CertificateParams::new(
        sans.iter()
            .filter(|s| !s.contains("://"))
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for uri in sans.iter().filter(|s| s.contains("://")) {
        params
            .subject_alt_names
            .push(SanType::URI((*uri).try_into().unwrap()));
    }
    params.extended_key_usages = match usage {
        Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Usage::Any => Vec::new(),
    };
    let key = KeyPair::generate().unwrap();
    let issuer = Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}
