//! Which listeners serve HTTPS, with which files: the settings `config/`
//! builds from `tls:` and `admin.tls:` (or the `--tls-cert`/`--tls-key`
//! flags), and the check `serve` and `check-config` run on the files.

use std::path::PathBuf;

use spillway_rules::{Error as ConfigError, Errors as ConfigErrors};

/// A certificate chain and its private key, as PEM files. Paths are taken
/// as written: a relative one is relative to the server's working
/// directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own certificate first (PEM
    /// `CERTIFICATE` blocks).
    pub cert: PathBuf,
    /// The private key (PEM: PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE
    /// KEY` or SEC1 `EC PRIVATE KEY`).
    pub key: PathBuf,
    /// What named the pair, for messages: `tls`, `admin.tls`,
    /// `grpc_tls` or `--tls-cert/--tls-key`.
    pub named_by: String,
    /// The CA (PEM certificates) client certificates must chain to: with
    /// it, every listener serving this pair requires one (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`, the names a client certificate's DNS or URI SAN
    /// must equal one of; empty: any certificate the CA issued.
    pub client_san: Vec<String>,
}

/// Which listeners serve HTTPS, with which files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// Every listener's pair (`tls:`, or the `--tls-cert`/`--tls-key`
    /// flags): the decision or proxy port, gRPC and the admin listener.
    pub listeners: Option<TlsFiles>,
    /// The admin listener's own pair (`admin.tls:`), when it differs.
    pub admin: Option<TlsFiles>,
    /// The gRPC listener's own pair (`grpc_tls:`), when it differs: with
    /// it and without `listeners`, only gRPC serves TLS.
    pub grpc: Option<TlsFiles>,
}

impl TlsSettings {
    /// The pair the admin listener serves: its own, else every listener's.
    pub fn for_admin(&self) -> Option<&TlsFiles> {
        self.admin.as_ref().or(self.listeners.as_ref())
    }

    /// The pair the gRPC listener serves: its own, else every listener's.
    pub fn for_grpc(&self) -> Option<&TlsFiles> {
        self.grpc.as_ref().or(self.listeners.as_ref())
    }

    /// Whether any listener serves HTTPS.
    pub fn any(&self) -> bool {
        self.listeners.is_some() || self.admin.is_some() || self.grpc.is_some()
    }

    /// Reads every pair named, as the server does at start: one error per
    /// file that cannot be read, holds no certificate or key, or whose key
    /// does not match its certificate (each under the file's path).
    ///
    /// # Errors
    /// Every problem found.
    pub fn check(&self) -> Result<(), ConfigErrors> {
        self.describe().map(|_| ())
    }

    /// As [`TlsSettings::check`], and on success one line per pair for
    /// `check-config`: its paths, the certificate's serial number and
    /// expiry (never the key's content).
    ///
    /// # Errors
    /// As [`TlsSettings::check`].
    pub fn describe(&self) -> Result<Vec<String>, ConfigErrors> {
        let mut lines = Vec::new();
        let mut errors = Vec::new();
        for files in [&self.listeners, &self.admin, &self.grpc]
            .into_iter()
            .flatten()
        {
            match super::load_all_errors(files) {
                Ok(loaded) => {
                    let info = &loaded.info;
                    let mut line = format!(
                        "{}: cert {}, key {}",
                        files.named_by,
                        files.cert.display(),
                        files.key.display()
                    );
                    if let Some(s) = &info.serial {
                        line.push_str(&format!(", serial {s}"));
                    }
                    if let Some(t) = &info.not_after {
                        line.push_str(&format!(", valid until {}", t.rfc3339));
                        if t.unix < super::unix_secs() {
                            line.push_str(" (EXPIRED: clients will refuse it)");
                        }
                    }
                    match super::client::ClientAuth::load(files) {
                        Ok(None) => {}
                        Ok(Some(c)) => line.push_str(&c.describe()),
                        Err(e) => {
                            errors.push(ConfigError::new(
                                e.path.display().to_string(),
                                0,
                                0,
                                format!("{} ({}.client_ca)", e.message, files.named_by),
                            ));
                            continue;
                        }
                    }
                    lines.push(line);
                }
                Err(list) => errors.extend(list.into_iter().map(|e| {
                    ConfigError::new(
                        e.path.display().to_string(),
                        0,
                        0,
                        format!("{} ({})", e.message, files.named_by),
                    )
                })),
            }
        }
        if errors.is_empty() {
            Ok(lines)
        } else {
            Err(ConfigErrors(errors))
        }
    }
}
