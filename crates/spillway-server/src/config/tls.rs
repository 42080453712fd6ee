//! `tls:` and `admin.tls:`: the certificate and key files the listeners
//! serve HTTPS with.
//!
//! Validation only checks that both paths are given: the files themselves
//! are read when the server starts (and by `check-config`, through
//! [`TlsSettings::check`]), and again whenever they change. A rules reload
//! does not read them, so a certificate caught half-rotated never holds
//! back new rules.

use std::path::PathBuf;

use serde_saphyr::Spanned;

use spillway_rules::build::Collector;

use super::raw::RawTls;
use super::{ConfigError, ConfigErrors};

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
    /// What named the pair, for messages: `tls`, `admin.tls` or
    /// `--tls-cert/--tls-key`.
    pub named_by: String,
}

/// Which listeners serve HTTPS, with which files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// Every listener's pair (`tls:`, or the `--tls-cert`/`--tls-key`
    /// flags): the decision or proxy port, gRPC and the admin listener.
    pub listeners: Option<TlsFiles>,
    /// The admin listener's own pair (`admin.tls:`), when it differs.
    pub admin: Option<TlsFiles>,
}

impl TlsSettings {
    /// The pair the admin listener serves: its own, else every listener's.
    pub fn for_admin(&self) -> Option<&TlsFiles> {
        self.admin.as_ref().or(self.listeners.as_ref())
    }

    /// Whether any listener serves HTTPS.
    pub fn any(&self) -> bool {
        self.listeners.is_some() || self.admin.is_some()
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
        for files in [&self.listeners, &self.admin].into_iter().flatten() {
            match crate::tls::load_all_errors(files) {
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
                        if t.unix < crate::tls::unix_secs() {
                            line.push_str(" (EXPIRED: clients will refuse it)");
                        }
                    }
                    lines.push(line);
                }
                Err(list) => errors.extend(list.into_iter().map(|e| ConfigError {
                    file: e.path.display().to_string(),
                    line: 0,
                    column: 0,
                    message: format!("{} ({})", e.message, files.named_by),
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

/// Reads a `tls:` map (`what`: `tls` or `admin.tls`).
pub(super) fn tls(errs: &mut Collector<'_>, raw: &Spanned<RawTls>, what: &str) -> Option<TlsFiles> {
    let path = |errs: &mut Collector<'_>, p: &Option<Spanned<String>>, field: &str| match p {
        None => {
            errs.at(
                raw,
                format!("{what}: needs `{field}:` (a PEM file); give both cert and key"),
            );
            None
        }
        Some(p) if p.value.trim().is_empty() => {
            errs.at(p, format!("{what}.{field}: an empty path"));
            None
        }
        Some(p) => Some(PathBuf::from(&p.value)),
    };
    let cert = path(errs, &raw.value.cert, "cert");
    let key = path(errs, &raw.value.key, "key");
    Some(TlsFiles {
        cert: cert?,
        key: key?,
        named_by: what.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    #[test]
    fn both_paths_are_needed() {
        let e = parse("f.yaml", "tls: { cert: /a.pem }\nrules: []\n").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("f.yaml:1:"), "{text}");
        assert!(text.contains("tls: needs `key:`"), "{text}");
        let e = parse("f.yaml", "tls: { cert: '', key: /k }\nrules: []\n").unwrap_err();
        assert!(e.to_string().contains("tls.cert: an empty path"), "{e}");
        let e = parse("f.yaml", "tls: { cert: /a, key: /k, ca: /c }\nrules: []\n").unwrap_err();
        assert!(e.to_string().contains("ca"), "{e}");
    }

    #[test]
    fn paths_are_read_as_written() {
        let c = parse(
            "f.yaml",
            "tls: { cert: /etc/c.pem, key: /etc/k.pem }\nadmin:\n  tls: { cert: a.pem, key: b.pem }\nrules: []\n",
        )
        .unwrap();
        let l = c.tls.listeners.as_ref().unwrap();
        assert_eq!(l.cert, std::path::Path::new("/etc/c.pem"));
        assert_eq!(l.key, std::path::Path::new("/etc/k.pem"));
        assert_eq!(l.named_by, "tls");
        let a = c.tls.for_admin().unwrap();
        assert_eq!(a.cert, std::path::Path::new("a.pem"));
        assert_eq!(a.named_by, "admin.tls");
    }

    #[test]
    fn missing_files_are_errors_under_their_path() {
        let c = parse(
            "f.yaml",
            "tls: { cert: /nonexistent/c.pem, key: /nonexistent/k.pem }\nrules: []\n",
        )
        .unwrap();
        let e = c.tls.check().unwrap_err();
        assert_eq!(e.0[0].file, "/nonexistent/c.pem");
        assert!(e.0[0].message.contains("cannot read"), "{e}");
        assert!(e.0[0].message.contains("(tls)"), "{e}");
    }
}
