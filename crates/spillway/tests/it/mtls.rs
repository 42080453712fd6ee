//! End-to-end: mutual TLS on the real binary's HTTP and gRPC listeners
//! (`client_ca`, `client_san`), `grpc_tls` alone, and the CA's reload,
//! with a CA and certificates this test makes (rcgen).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::certs::{Ca, Usage, ca, leaf};
use crate::util::{Server, TempDir, spillway};

/// An HTTPS client trusting `ca` alone, presenting `identity` if given,
/// with a new connection (and handshake) per request.
fn https(ca: &Ca, identity: Option<&(String, String)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10));
    if let Some((cert, key)) = identity {
        let pem = format!("{cert}{key}");
        b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

/// The status of `POST /v1/check` for `user` over HTTPS, or the error.
async fn http_check(addr: &str, c: &reqwest::Client, user: &str) -> Result<u16, reqwest::Error> {
    let port = addr.rsplit(':').next().unwrap();
    c.post(format!("https://localhost:{port}/v1/check"))
        .json(&json!({ "user": user }))
        .send()
        .await
        .map(|r| r.status().as_u16())
}

/// A ShouldRateLimit over TLS trusting `ca`, presenting `identity`.
async fn grpc_check(
    addr: &str,
    ca: &Ca,
    identity: Option<&(String, String)>,
) -> Result<(), String> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    let port = addr.rsplit(':').next().unwrap();
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .tls_config(tls)
        .unwrap();
    crate::util::should_rate_limit(endpoint, "g")
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Writes `text` to `path` in one step (a rename), as config management
/// does.
fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const DOMAINS: &str = r#"
rules:
  - name: api
    by: user
    limits:
      - fixed_window: { limit: 1000, window: 1m }
domains:
  - domain: edge
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 1000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_verified_and_matched_by_san() {
    let dir = TempDir::new("mtls");
    let root = ca("spillway test CA");
    let other = ca("another CA");
    let server = leaf(&root, &["localhost"], Usage::Server);
    let by_dns = leaf(&root, &["client.good"], Usage::Client);
    let by_uri = leaf(&root, &["spiffe://test/ns/gw/sa/envoy"], Usage::Client);
    let wrong_san = leaf(&root, &["client.other"], Usage::Client);
    let foreign = leaf(&other, &["client.good"], Usage::Client);
    let cert = dir.write("cert.pem", &server.0);
    let key = dir.write("key.pem", &server.1);
    let ca_file = dir.write("ca.pem", &root.pem);
    let file = dir.write(
        "rules.yaml",
        &format!(
            "tls:\n  cert: {}\n  key: {}\n  client_ca: {}\n  client_san: [ client.good, 'spiffe://test/ns/gw/sa/envoy' ]\n{DOMAINS}",
            cert.display(),
            key.display(),
            ca_file.display()
        ),
    );
    let s = Server::start(&[
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let grpc = s.listener("gRPC");

    // Admitted: a certificate the CA issued, with a SAN in client_san
    // (DNS or URI), on HTTP and gRPC.
    for good in [&by_dns, &by_uri] {
        assert_eq!(
            http_check(&s.addr, &https(&root, Some(good)), "u")
                .await
                .unwrap(),
            200
        );
        grpc_check(&grpc, &root, Some(good)).await.unwrap();
    }
    // Refused at the TLS layer: no certificate, another CA's, a SAN not
    // listed.
    for (what, id) in [
        ("no certificate", None),
        ("another CA", Some(&foreign)),
        ("a SAN not listed", Some(&wrong_san)),
    ] {
        let r = http_check(&s.addr, &https(&root, id), "u").await;
        assert!(r.is_err(), "HTTP with {what}: {r:?}");
        let r = grpc_check(&grpc, &root, id).await;
        assert!(r.is_err(), "gRPC with {what}: {r:?}");
    }
    // Refusals cost the server nothing lasting: it serves on.
    assert_eq!(
        http_check(&s.addr, &https(&root, Some(&by_dns)), "u")
            .await
            .unwrap(),
        200
    );

    // A new CA over the file: its clients are admitted, the old CA's
    // refused, on both listeners.
    let next = ca("spillway test CA two");
    let next_client = leaf(&next, &["client.good"], Usage::Client);
    put(&ca_file, &next.pem);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_check(&s.addr, &https(&root, Some(&next_client)), "u")
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the new CA was never taken");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.wait_line("client CA reloaded");
    assert!(
        http_check(&s.addr, &https(&root, Some(&by_dns)), "u")
            .await
            .is_err()
    );
    grpc_check(&grpc, &root, Some(&next_client)).await.unwrap();
    assert!(grpc_check(&grpc, &root, Some(&by_dns)).await.is_err());
    // A broken CA file: refused, the CA in use stays.
    put(&ca_file, "not a certificate\n");
    s.wait_line("client CA not reloaded");
    assert_eq!(
        http_check(&s.addr, &https(&root, Some(&next_client)), "u")
            .await
            .unwrap(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_tls_alone_leaves_http_in_clear() {
    let dir = TempDir::new("grpc-tls");
    let root = ca("spillway test CA");
    let server = leaf(&root, &["localhost"], Usage::Server);
    let client = leaf(&root, &["envoy"], Usage::Client);
    let cert = dir.write("cert.pem", &server.0);
    let key = dir.write("key.pem", &server.1);
    let ca_file = dir.write("ca.pem", &root.pem);
    let file = dir.write(
        "rules.yaml",
        &format!(
            "grpc_tls: {{ cert: {}, key: {}, client_ca: {} }}\n{DOMAINS}",
            cert.display(),
            key.display(),
            ca_file.display()
        ),
    );
    let s = Server::start(&[
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let grpc = s.listener("gRPC");
    // The kubelet's probe, in clear.
    let r = reqwest::get(s.url("/healthcheck")).await.unwrap();
    assert_eq!(r.status(), 200);
    let r = crate::util::client()
        .post(s.url("/v1/check"))
        .json(&json!({ "user": "u" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    grpc_check(&grpc, &root, Some(&client)).await.unwrap();
    assert!(grpc_check(&grpc, &root, None).await.is_err());
}

#[test]
fn check_config_shows_client_certificates_and_refuses_a_bad_ca() {
    let dir = TempDir::new("mtls-check");
    let root = ca("spillway test CA");
    let server = leaf(&root, &["localhost"], Usage::Server);
    let cert = dir.write("cert.pem", &server.0);
    let key = dir.write("key.pem", &server.1);
    let ca_file = dir.write("ca.pem", &root.pem);
    let body = |ca: &Path| {
        format!(
            "tls:\n  cert: {}\n  key: {}\n  client_ca: {}\n  client_san: [ envoy ]\n{DOMAINS}",
            cert.display(),
            key.display(),
            ca.display()
        )
    };
    let good = dir.write("good.yaml", &body(&ca_file));
    let out = spillway(&["check-config", good.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("client certificates required") && text.contains("client_san envoy"),
        "{text}"
    );
    let missing = dir.write("bad.yaml", &body(&dir.0.join("nope.pem")));
    let out = spillway(&["check-config", missing.to_str().unwrap()]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("nope.pem") && text.contains("tls.client_ca"),
        "{text}"
    );
    // And serve does not start with it.
    let out = spillway(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        missing.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nope.pem"), "{err}");
}

/// A handshake stalled where only mutual TLS waits (the server has sent
/// its flight with the certificate request; the client never answers)
/// is cut by `server.head_timeout`, and such handshakes cannot hold the
/// connection budget against a client that has its certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_stalled_at_the_client_certificate_are_cut_and_shed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("mtls-stall");
    let root = ca("spillway test CA");
    let server = leaf(&root, &["localhost"], Usage::Server);
    let client = leaf(&root, &["client.good"], Usage::Client);
    let cert = dir.write("cert.pem", &server.0);
    let key = dir.write("key.pem", &server.1);
    let ca_file = dir.write("ca.pem", &root.pem);
    let file = dir.write(
        "rules.yaml",
        &format!(
            "server: {{ head_timeout: 2s, max_connections: 16 }}\ntls: {{ cert: {}, key: {}, client_ca: {} }}\n{DOMAINS}",
            cert.display(),
            key.display(),
            ca_file.display()
        ),
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let hello = spillway_testkit::attack::client_hello("localhost");
    let mut stalled = Vec::new();
    for _ in 0..40 {
        let mut t = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
        t.write_all(&hello).await.unwrap();
        stalled.push(t);
    }
    // Served while 40 handshakes wait on a budget of 16 (within a
    // generous bound: the point is that it is served at all).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match http_check(&s.addr, &https(&root, Some(&client)), "u").await {
            Ok(200) => break,
            other => assert!(Instant::now() < deadline, "not served: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each stalled handshake is closed by the server (its flight read,
    // then the end), none held open.
    let mut flights = 0;
    for mut t in stalled {
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match t.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let got = closed.expect("a stalled handshake was held open");
        // A shed connection may be closed before its flight; one that
        // got it got a ServerHello (a handshake record) and more.
        if !got.is_empty() {
            assert_eq!(got[0], 0x16, "not a TLS handshake record");
            flights += 1;
        }
    }
    // Some handshakes reached the point where the server waits for the
    // client's certificate (the case under test), and were cut there.
    assert!(flights > 0, "no handshake got the server's flight");
}
