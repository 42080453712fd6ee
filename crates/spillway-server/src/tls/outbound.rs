//! TLS to the servers spillway connects to itself (the xDS management
//! server, the trace collector): the server verified against a CA file
//! (or the system's CA bundle), and a client certificate for mutual TLS.
//! The files are read once, when the settings are made: a bad one stops
//! the start.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the system's CA bundle is on Debian and in spillway's image,
/// trusted when no CA file is named.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

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
    let read =
        |p: &Path| std::fs::read(p).map_err(|e| format!("{}: cannot read: {e}", p.display()));
    let pem = read(&ca_path).map_err(|e| format!("{what} CA {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| format!("{what} CA {}: {e}", ca_path.display()))?;
        roots
            .add(c)
            .map_err(|e| format!("{what} CA {}: {e}", ca_path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{what} CA {}: no certificate in the file",
            ca_path.display()
        ));
    }
    let builder = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{}: {e}", cert.display()))?;
            if chain.is_empty() {
                return Err(format!("{}: no certificate in the file", cert.display()));
            }
            let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
                .map_err(|e| format!("{}: no private key: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("{what} client certificate: {e}"))
        }
    }
}
