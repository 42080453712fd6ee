use super::*;

fn pair(dir: &Path, name: &str, serial: u64) -> TlsFiles {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.serial_number = Some(rcgen::SerialNumber::from(serial));
    params.not_after = rcgen::date_time_ymd(2040, 6, 30);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let files = TlsFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
        named_by: "tls".into(),
        client_ca: None,
        client_san: Vec::new(),
    };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}

fn temp(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("spillway-tls-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn a_pair_loads_with_its_serial_and_expiry() {
    let dir = temp("load");
    let files = pair(&dir, "a", 0x1234_abcd);
    let l = load(&files).unwrap();
    assert_eq!(l.info.serial.as_deref(), Some("1234ABCD"));
    let t = l.info.not_after.unwrap();
    assert!(t.rfc3339.starts_with("2040-06-30T"), "{}", t.rfc3339);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_files_say_which_and_why() {
    let dir = temp("bad");
    let a = pair(&dir, "a", 1);
    let b = pair(&dir, "b", 2);
    // A key that is not the certificate's.
    let mixed = TlsFiles {
        key: b.key.clone(),
        ..a.clone()
    };
    let e = load(&mixed).unwrap_err();
    assert_eq!(e.path, b.key);
    assert!(e.message.contains("does not match"), "{e}");
    // The files swapped.
    let swapped = TlsFiles {
        cert: a.key.clone(),
        key: a.cert.clone(),
        named_by: "tls".into(),
        client_ca: None,
        client_san: Vec::new(),
    };
    let e = load(&swapped).unwrap_err();
    assert_eq!(e.path, a.key);
    assert!(e.message.contains("no certificate"), "{e}");
    // A key cut short, an encrypted key, an empty one.
    let text = std::fs::read_to_string(&a.key).unwrap();
    for (body, says) in [
        (&text[..text.len() / 2], "not a valid PEM"),
        (
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
            "encrypted",
        ),
        ("", "no private key"),
    ] {
        let k = dir.join("k.pem");
        std::fs::write(&k, body).unwrap();
        let e = load(&TlsFiles {
            key: k.clone(),
            ..a.clone()
        })
        .unwrap_err();
        assert!(
            e.message.contains(says) || e.message.contains("no private key"),
            "{says}: {e}"
        );
        assert_eq!(e.path, k);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_changed_pair_is_taken_a_broken_one_refused() {
    let dir = temp("watch");
    let files = pair(&dir, "live", 1);
    let certs = Arc::new(Certs::load(&files).unwrap());
    let first = certs.current.load_full();
    // A new pair, read twice the same: taken.
    let next = pair(&dir, "next", 2);
    std::fs::copy(&next.cert, &files.cert).unwrap();
    std::fs::copy(&next.key, &files.key).unwrap();
    let read = Pair::read(&files);
    certs.apply(&read);
    assert!(!Arc::ptr_eq(&first, &certs.current.load_full()));
    assert_eq!(certs.status_json()["serial"], "02");
    assert_eq!(certs.status_json()["last_error"], serde_json::Value::Null);
    // A broken key: the pair in use stays, the error shows.
    std::fs::write(&files.key, "junk").unwrap();
    let in_use = certs.current.load_full();
    certs.apply(&Pair::read(&files));
    assert!(Arc::ptr_eq(&in_use, &certs.current.load_full()));
    let st = certs.status_json();
    assert!(
        st["last_error"]
            .as_str()
            .unwrap()
            .contains("no private key"),
        "{st}"
    );
    assert_eq!(st["serial"], "02");
    let _ = std::fs::remove_dir_all(&dir);
}
