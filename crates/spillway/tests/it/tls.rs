//! End-to-end: HTTPS on the real binary's decision, gRPC and admin
//! listeners, with certificates this test makes (rcgen) and trusts alone,
//! and their reload when the files change.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_server::grpc::proto::{Code, RateLimitResponse};
use spillway_testkit::upstream::HttpUpstream;

use crate::util::{Server, TempDir, spillway};

/// A self-signed certificate for localhost and 127.0.0.1, and its key.
struct Pair {
    cert: String,
    key: String,
    der: Vec<u8>,
}

fn make(name: &str, serial: u64) -> Pair {
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    params.serial_number = Some(rcgen::SerialNumber::from(serial));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
        der: cert.der().to_vec(),
    }
}

/// An HTTPS client trusting `pairs` only, opening a new connection for
/// every request. (It resumes sessions, which carry the certificate of
/// the handshake that made them: [`served`] makes a client per call.)
fn https(pairs: &[&Pair]) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10));
    for p in pairs {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(p.cert.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

/// The certificate the server presented for `resp`.
fn presented(resp: &reqwest::Response) -> Vec<u8> {
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("a TLS connection")
        .to_vec()
}

/// The certificate a full handshake with `url` gets now (a new client,
/// with no session to resume).
async fn served(url: &str, trust: &[&Pair]) -> Option<Vec<u8>> {
    let r = https(trust).get(url).send().await.ok()?;
    Some(presented(&r))
}

/// Writes `text` to `path` in one step (a rename), as config management
/// does.
fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Polls `f` until it gives `Some`, for up to 30 s.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends `bytes` in plain TCP and reads what comes back until the server
/// closes (or 10 s pass).
fn plain_exchange(addr: &str, bytes: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

const RULES: &str = r#"
tls: { cert: CERT, key: KEY }
rules:
  - name: api
    by: user
    limits:
      - fixed_window: { limit: 3, window: 1m }
domains:
  - domain: edge
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 2 }
"#;

fn rules(dir: &TempDir, body: &str) -> std::path::PathBuf {
    let cert = dir.0.join("cert.pem");
    let key = dir.0.join("key.pem");
    dir.write(
        "rules.yaml",
        &body
            .replace("CERT", cert.to_str().unwrap())
            .replace("KEY", key.to_str().unwrap()),
    )
}

async fn grpc_call(
    addr: &str,
    ca: &Pair,
    user: &str,
) -> Result<RateLimitResponse, Box<dyn std::error::Error>> {
    crate::util::should_rate_limit(crate::util::tls_endpoint(addr, &ca.cert), user).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_serves_https_and_takes_a_new_certificate() {
    let dir = TempDir::new("tls");
    let first = make("spillway test one", 1);
    let cert_path = dir.write("cert.pem", &first.cert);
    let key_path = dir.write("key.pem", &first.key);
    let file = rules(&dir, RULES);
    let s = Server::start(&[
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let grpc = s.listener("gRPC");
    let admin = s.listener("admin API");
    let c = https(&[&first]);

    // The decision API, over HTTPS, still limits.
    let check = |c: &reqwest::Client, user: &str| {
        c.post(format!("https://{}/v1/check", s.addr))
            .json(&json!({ "user": user }))
            .send()
    };
    for i in 0..3 {
        let r = check(&c, "alice").await.unwrap();
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(presented(&r), first.der);
    }
    assert_eq!(check(&c, "alice").await.unwrap().status(), 429);
    // HTTP/2 (ALPN h2) goes to the hyper side of the same port.
    let h2 = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(first.cert.as_bytes()).unwrap())
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = h2
        .post(format!("https://localhost:{}/v1/check", port(&s.addr)))
        .json(&json!({ "user": "bob" }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.version()),
        (200, http::Version::HTTP_2)
    );

    // The admin listener, over HTTPS: the status shows the certificate.
    let st: serde_json::Value = c
        .get(format!("https://{admin}/v1/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tls = &st["tls"];
    assert_eq!(tls["cert"], cert_path.to_str().unwrap(), "{st}");
    assert_eq!(tls["key"], key_path.to_str().unwrap(), "{st}");
    assert_eq!(tls["serial"], "01", "{st}");
    assert!(tls["not_after"].as_str().is_some(), "{st}");
    assert_eq!(tls["last_error"], serde_json::Value::Null, "{st}");
    let metrics = c
        .get(format!("https://{admin}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);

    // gRPC over TLS, and it limits too.
    for _ in 0..2 {
        let r = grpc_call(&grpc, &first, "carol").await.unwrap();
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    }
    let r = grpc_call(&grpc, &first, "carol").await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");

    // Plain HTTP on a TLS port: told so, and the server carries on.
    for at in [&s.addr, &admin, &grpc] {
        let answer = plain_exchange(at, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 400"), "{at}: {answer:?}");
        assert!(answer.contains("https://"), "{answer:?}");
    }
    // Bytes that are neither: closed without a word.
    assert_eq!(plain_exchange(&s.addr, b"\x00\x01\x02\x03"), "");
    // A client that does not trust the certificate is refused by its side.
    assert!(
        https(&[])
            .get(format!("https://{}/healthz", s.addr))
            .send()
            .await
            .is_err()
    );

    // A new certificate over the files: new handshakes get it.
    let second = make("spillway test two", 2);
    let both = [&first, &second];
    let url = format!("https://{}/healthz", s.addr);
    // A client that keeps its sessions, with one made before the reload.
    let keeper = https(&both);
    let r = keeper.get(&url).send().await.unwrap();
    assert_eq!(presented(&r), first.der);
    put(&cert_path, &second.cert);
    put(&key_path, &second.key);
    eventually("the new certificate", || async {
        (served(&url, &both).await? == second.der).then_some(())
    })
    .await;
    // It is not resumed into the old certificate: the reload forgot every
    // session.
    let r = keeper.get(&url).send().await.unwrap();
    assert_eq!(presented(&r), second.der);
    let c = https(&both);
    let status = |c: reqwest::Client| {
        let url = format!("https://{admin}/v1/status");
        async move {
            let st: serde_json::Value = c.get(url).send().await.ok()?.json().await.ok()?;
            Some(st["tls"].clone())
        }
    };
    let tls = status(c.clone()).await.unwrap();
    assert_eq!(tls["serial"], "02", "{tls}");
    // The admin listener shares the pair: it has it too.
    let at_admin = format!("https://{admin}/healthz");
    assert_eq!(served(&at_admin, &both).await.unwrap(), second.der);
    // And the gRPC listener.
    assert!(grpc_call(&grpc, &second, "dave").await.is_ok());
    assert!(s.wait_line("TLS certificate reloaded").contains("cert.pem"));

    // A broken key: refused, the certificate in use stays, the status
    // says why.
    put(&key_path, "-----BEGIN PRIVATE KEY-----\nnot base64!\n");
    let tls = eventually("the refusal on /v1/status", || {
        let st = status(c.clone());
        async move {
            let tls = st.await?;
            tls["last_error"].is_string().then_some(tls)
        }
    })
    .await;
    let why = tls["last_error"].as_str().unwrap();
    assert!(why.contains("key.pem"), "{why}");
    assert_eq!(tls["serial"], "02", "{tls}");
    assert_eq!(served(&url, &both).await.unwrap(), second.der);
    let line = s.wait_line("TLS certificate not reloaded");
    assert!(line.contains("key.pem"), "{line}");

    // A key that is not the certificate's: refused the same way.
    let third = make("spillway test three", 3);
    let other = make("unrelated", 4);
    put(&cert_path, &third.cert);
    put(&key_path, &other.key);
    eventually("the mismatch on /v1/status", || {
        let st = status(c.clone());
        async move {
            let tls = st.await?;
            let e = tls["last_error"].as_str()?.to_string();
            e.contains("does not match").then_some(())
        }
    })
    .await;
    assert_eq!(served(&url, &both).await.unwrap(), second.der);

    // Mended: the next change is taken, and the error clears.
    put(&key_path, &third.key);
    eventually("the mended pair", || async {
        (served(&url, &[&third]).await? == third.der).then_some(())
    })
    .await;
    let tls = status(https(&[&third])).await.unwrap();
    assert_eq!(tls["last_error"], serde_json::Value::Null, "{tls}");
    assert_eq!(tls["serial"], "03", "{tls}");
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_https_with_the_flags_and_admin_has_its_own_pair() {
    let up = HttpUpstream::start().await;
    let dir = TempDir::new("tls-proxy");
    let main = make("proxy", 10);
    let own = make("admin", 11);
    let cert = dir.write("proxy.crt", &main.cert);
    let key = dir.write("proxy.key", &main.key);
    dir.write("cert.pem", &own.cert);
    dir.write("key.pem", &own.key);
    let yaml = format!(
        r#"
proxy:
  upstream: {}
  user: header:X-Api-Key
admin:
  tls: {{ cert: CERT, key: KEY }}
rules:
  - name: api
    by: user
    limits:
      - fixed_window: {{ limit: 2, window: 1m }}
"#,
        up.url()
    );
    let file = rules(&dir, &yaml);
    let s = Server::start_cmd(
        "proxy",
        &[
            "--config",
            file.to_str().unwrap(),
            "--admin-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let admin = s.listener("admin API");
    let c = https(&[&main, &own]);
    let get = || {
        c.get(format!("https://{}/hello", s.addr))
            .header("x-api-key", "k")
            .send()
    };
    for _ in 0..2 {
        let r = get().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(presented(&r), main.der);
        assert_eq!(r.text().await.unwrap(), "hello");
    }
    assert_eq!(get().await.unwrap().status(), 429);
    assert_eq!(up.requests_to("/hello").len(), 2);
    // The admin listener serves its own pair, and both show on the status.
    let r = c
        .get(format!("https://{admin}/v1/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(presented(&r), own.der);
    let st: serde_json::Value = r.json().await.unwrap();
    assert_eq!(st["tls"]["serial"], "0A", "{st}");
    assert_eq!(st["tls"]["admin"]["serial"], "0B", "{st}");
}

#[test]
fn bad_certificate_files_are_configuration_errors() {
    let dir = TempDir::new("tls-bad");
    let file = rules(&dir, RULES);
    // Missing files: exit code 2, the path and what is wrong.
    let out = spillway(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cert.pem: cannot read"), "{err}");
    assert!(err.contains("key.pem: cannot read"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A certificate and someone else's key.
    let a = make("a", 1);
    let b = make("b", 2);
    dir.write("cert.pem", &a.cert);
    dir.write("key.pem", &b.key);
    let out = spillway(&["check-config", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("key.pem: the private key does not match the certificate"),
        "{err}"
    );
    // A good pair: check-config names the files, never the key.
    dir.write("key.pem", &a.key);
    let out = spillway(&["check-config", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("tls: cert "), "{text}");
    assert!(text.contains("serial 01"), "{text}");
    let body: String = a.key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!text.contains(&body[..20]), "{text}");
    // The flags go in pairs.
    let out = spillway(&["serve", "--tls-cert", "x.pem"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
}
