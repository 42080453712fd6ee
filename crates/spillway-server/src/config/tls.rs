//! `tls:` and `admin.tls:`: the certificate and key files the listeners
//! serve HTTPS with.
//!
//! Validation only checks that both paths are given: the files themselves
//! are read when the server starts (and by `check-config`, through
//! [`TlsSettings::check`](crate::tls::TlsSettings::check)), and again
//! whenever they change. A rules reload does not read them, so a
//! certificate caught half-rotated never holds back new rules.

use std::path::PathBuf;

use serde_saphyr::Spanned;

use spillway_rules::build::Collector;

use super::raw::RawTls;
use crate::tls::TlsFiles;

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
