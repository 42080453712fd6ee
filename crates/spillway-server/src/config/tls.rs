//! `tls:`, `admin.tls:` and `grpc_tls:`: the certificate and key files
//! the listeners serve HTTPS with, and the CA client certificates must
//! chain to (`client_ca`, with `client_san`: mutual TLS).
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

/// Reads a `tls:` map (`what`: `tls`, `admin.tls` or `grpc_tls`).
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
    let client_ca = match &raw.value.client_ca {
        None => None,
        given => path(errs, given, "client_ca"),
    };
    let mut client_san = Vec::new();
    if let Some(sans) = &raw.value.client_san {
        if raw.value.client_ca.is_none() {
            errs.at(
                sans,
                format!("{what}.client_san needs {what}.client_ca: the CA client certificates must chain to"),
            );
        }
        if sans.value.is_empty() {
            errs.at(
                sans,
                format!("{what}.client_san: list at least one name, or leave it out to admit any certificate the CA issued"),
            );
        }
        for name in &sans.value {
            if name.is_empty() || name.len() > 1024 || name.chars().any(char::is_control) {
                errs.at(
                    sans,
                    format!("{what}.client_san: {name:?} is not a DNS name or URI"),
                );
            }
        }
        client_san.clone_from(&sans.value);
    }
    Some(TlsFiles {
        cert: cert?,
        key: key?,
        named_by: what.to_string(),
        client_ca,
        client_san,
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
    fn client_certificates_and_the_grpc_pair() {
        let c = parse(
            "f.yaml",
            "grpc_tls:\n  cert: g.pem\n  key: g.key\n  client_ca: ca.pem\n  client_san: [ envoy.gateway, 'spiffe://a/b' ]\nrules: []\n",
        )
        .unwrap();
        assert!(c.tls.listeners.is_none());
        let g = c.tls.for_grpc().unwrap();
        assert_eq!(g.named_by, "grpc_tls");
        assert_eq!(g.client_ca.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert_eq!(g.client_san, ["envoy.gateway", "spiffe://a/b"]);
        let c = parse("f.yaml", "tls: { cert: a, key: b }\nrules: []\n").unwrap();
        assert_eq!(c.tls.for_grpc().unwrap().named_by, "tls");
        for (text, want, line) in [
            (
                "tls:\n  cert: a\n  key: b\n  client_san: [ x ]\nrules: []\n",
                "tls.client_san needs tls.client_ca",
                4,
            ),
            (
                "admin:\n  tls:\n    cert: a\n    key: b\n    client_ca: c\n    client_san: []\nrules: []\n",
                "admin.tls.client_san: list at least one name",
                6,
            ),
            (
                "grpc_tls:\n  cert: a\n  key: b\n  client_ca: ''\nrules: []\n",
                "grpc_tls.client_ca: an empty path",
                4,
            ),
            (
                "grpc_tls:\n  cert: a\n  client_ca: c\nrules: []\n",
                "grpc_tls: needs `key:`",
                2,
            ),
        ] {
            let e = parse("f.yaml", text).unwrap_err();
            assert!(e.to_string().contains(want), "{text}: {e}");
            assert_eq!(e.0[0].line, line, "{text}: {e}");
        }
    }

    #[test]
    fn a_missing_client_ca_is_an_error_under_its_path() {
        let dir = std::env::temp_dir().join(format!("spillway-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("k.pem"), key.serialize_pem()).unwrap();
        std::fs::write(dir.join("empty.pem"), "").unwrap();
        for (ca, want) in [
            ("nonexistent.pem", "cannot read"),
            ("empty.pem", "no certificate"),
        ] {
            let text = format!(
                "tls: {{ cert: {d}/c.pem, key: {d}/k.pem, client_ca: {d}/{ca} }}\nrules: []\n",
                d = dir.display()
            );
            let e = parse("f.yaml", &text).unwrap().tls.check().unwrap_err();
            assert!(e.0[0].file.ends_with(ca), "{e}");
            assert!(e.0[0].message.contains(want), "{e}");
            assert!(e.0[0].message.contains("(tls.client_ca)"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
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
