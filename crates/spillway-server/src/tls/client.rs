//! Client certificates (mutual TLS): with `client_ca`, a listener asks
//! every client for a certificate, verifies it against that CA (rustls's
//! WebPKI verifier: chain, validity, key usage for client auth) and, with
//! `client_san`, admits only a leaf whose DNS or URI SAN equals one of the
//! names. A handshake without one, or with one that fails, fails at the
//! TLS layer like any other failed handshake.
//!
//! The CA file is read again on the certificate watcher's polls (see
//! [`super::Certs::watch`]); a changed CA applies once it reads the same
//! on two polls in a row, and one that does not load leaves the CA in use
//! in place. The verifier is swapped whole, so a handshake sees one CA.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use super::{TlsError, TlsFiles, der, provider};

/// The verifier of one `client_ca`, with the SAN check on top.
pub(crate) struct ClientAuth {
    ca: std::path::PathBuf,
    sans: Vec<String>,
    current: ArcSwap<Verifier>,
    state: Mutex<CaState>,
}

/// One CA file's verifier, as loaded.
struct Verifier {
    webpki: Arc<dyn ClientCertVerifier>,
    /// Certificates in the file.
    count: usize,
}

#[derive(Debug, Default)]
struct CaState {
    /// The file's hash as last considered.
    seen: Option<u64>,
    /// A changed file seen once: it applies if the next read is the same.
    pending: Option<Option<u64>>,
    /// Why the last change was refused.
    last_error: Option<String>,
}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientAuth")
            .field("ca", &self.ca)
            .field("sans", &self.sans)
            .finish_non_exhaustive()
    }
}

/// Reads the CA file and builds its verifier.
fn verifier(path: &Path, pem: &[u8]) -> Result<Verifier, TlsError> {
    let at = |message: String| TlsError {
        path: path.to_path_buf(),
        message,
    };
    let mut roots = RootCertStore::empty();
    let mut count = 0;
    for c in CertificateDer::pem_slice_iter(pem) {
        let c = c.map_err(|e| at(format!("not a valid PEM certificate: {e}")))?;
        roots
            .add(c)
            .map_err(|e| at(format!("not a usable CA certificate: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(at(
            "no certificate in the CA file (expected PEM `-----BEGIN CERTIFICATE-----` blocks)"
                .into(),
        ));
    }
    let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| at(format!("cannot verify client certificates with it: {e}")))?;
    Ok(Verifier { webpki, count })
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl ClientAuth {
    /// The client verifier `files` asks for, if it names a `client_ca`.
    ///
    /// # Errors
    /// The CA file cannot be read or holds no usable certificate.
    pub(crate) fn load(files: &TlsFiles) -> Result<Option<ClientAuth>, TlsError> {
        let Some(ca) = &files.client_ca else {
            return Ok(None);
        };
        let pem = super::read(ca)?;
        let v = verifier(ca, &pem)?;
        Ok(Some(ClientAuth {
            ca: ca.clone(),
            sans: files.client_san.clone(),
            current: ArcSwap::from_pointee(v),
            state: Mutex::new(CaState {
                seen: Some(hash(&pem)),
                ..CaState::default()
            }),
        }))
    }

    /// For `check-config`'s line: the CA file and what it admits.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!(
            ", client certificates required: client_ca {} ({} certificates)",
            self.ca.display(),
            self.current.load().count
        );
        if !self.sans.is_empty() {
            s.push_str(&format!(", client_san {}", self.sans.join(", ")));
        }
        s
    }

    /// Reads the CA file (blocking) and applies a change seen twice in a
    /// row; says whether the CA in use changed.
    pub(crate) fn poll(&self) -> bool {
        let read = super::read(&self.ca);
        let stamp = read.as_ref().ok().map(|b| hash(b));
        let mut st = self.state.lock();
        if stamp == st.seen {
            st.pending = None;
            return false;
        }
        if st.pending != Some(stamp) {
            st.pending = Some(stamp);
            return false;
        }
        st.pending = None;
        st.seen = stamp;
        match read.and_then(|pem| verifier(&self.ca, &pem)) {
            Ok(v) => {
                tracing::info!(
                    client_ca = %self.ca.display(),
                    certificates = v.count,
                    "client CA reloaded: new handshakes are verified against it"
                );
                self.current.store(Arc::new(v));
                st.last_error = None;
                true
            }
            Err(e) => {
                tracing::error!(
                    client_ca = %self.ca.display(),
                    error = %e,
                    "client CA not reloaded, the one in use stays: {e}"
                );
                st.last_error = Some(e.to_string());
                false
            }
        }
    }

    /// What `/v1/status` shows: the file and the last refused change.
    pub(crate) fn status_json(&self) -> serde_json::Value {
        serde_json::json!({
            "client_ca": self.ca.display().to_string(),
            "client_san": self.sans,
            "client_ca_last_error": self.state.lock().last_error,
        })
    }
}

impl ClientCertVerifier for ClientAuth {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the CA may change under a running acceptor, and a hint
    /// list must be borrowed from the verifier. With none, a client sends
    /// the certificate it has (RFC 8446 4.2.4).
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified =
            self.current
                .load()
                .webpki
                .verify_client_cert(end_entity, intermediates, now)?;
        if self.sans.is_empty() {
            return Ok(verified);
        }
        let names = der::sans(end_entity.as_ref()).ok_or(rustls::Error::InvalidCertificate(
            rustls::CertificateError::BadEncoding,
        ))?;
        if names.iter().any(|n| self.sans.contains(n)) {
            Ok(verified)
        } else {
            tracing::debug!(
                sans = ?names,
                "client certificate refused: no SAN is one of client_san"
            );
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .webpki
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .webpki
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().webpki.supported_verify_schemes()
    }
}
