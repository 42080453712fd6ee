//! End-to-end: `spillway proxy` (the real binary) in front of a real
//! upstream HTTP server started by the test.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::util::{self as util};
use crate::util::{Server, TempDir, client, header};
use axum::Router;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::routing::{get, post};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// An upstream on a free port: `/hello`, `/stream` (a body of unknown
/// length, in three pieces), `/empty` (204), `/echo` (streams the body back),
/// `/headers` (what it was sent), `/slow` (3 s), `/v1/export` (counted),
/// anything else "ok".
async fn upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let exports = Arc::new(AtomicUsize::new(0));
    let counter = exports.clone();
    let app = Router::new()
        .route(
            "/v1/export",
            post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { "exported" }
            }),
        )
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/stream",
            get(|| async {
                // No length: the proxy must frame it (chunked).
                let parts =
                    ["one,", "two,", "three"].map(|p| Ok::<_, std::io::Error>(p.to_string()));
                Body::from_stream(futures_util::stream::iter(parts))
            }),
        )
        .route(
            "/empty",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .route("/echo", post(|body: Body| async move { body }))
        .route(
            "/headers",
            get(|h: HeaderMap| async move {
                let get = |n: &str| {
                    h.get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                axum::Json(serde_json::json!({
                    "x-forwarded-for": get("x-forwarded-for"),
                    "x-forwarded-host": get("x-forwarded-host"),
                    "x-api-key": get("x-api-key"),
                }))
            }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "late"
            }),
        )
        .route("/ip/own-headers", get(own_headers))
        .route("/free/own-headers", get(own_headers))
        .route(
            "/stall",
            get(|| async {
                // A head and a first piece, then nothing, ever.
                let first = futures_util::stream::iter([Ok::<_, std::io::Error>("first,")]);
                Body::from_stream(futures_util::StreamExt::chain(
                    first,
                    futures_util::stream::pending(),
                ))
            }),
        )
        .fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, exports)
}

fn rules(upstream: &str, trusted: &str) -> String {
    format!(
        r#"
proxy:
  upstream: {upstream}
  user: header:X-Api-Key
  trusted_proxies: [{trusted}]
  timeout: 500ms
rules:
  - name: per-user
    api: /hello
    by: user
    limits:
      - fixed_window: {{ limit: 3, window: 1h }}
  - name: per-ip
    api: GET /ip/*
    by: ip
    limits:
      - fixed_window: {{ limit: 2, window: 1h }}
  - name: per-user-ip
    api: /users/{{id}}
    by: user+ip
    limits:
      - fixed_window: {{ limit: 1, window: 1h }}
  - name: export
    api: POST /v1/export
    by: user
    queue: {{ max_wait: 1s }}
    limits:
      - leaky_bucket: {{ capacity: 10, leak: 5/s }}
"#
    )
}

async fn start(trusted: &str) -> (Server, TempDir) {
    let (s, d, _) = start_counting(trusted).await;
    (s, d)
}

async fn start_counting(trusted: &str) -> (Server, TempDir, Arc<AtomicUsize>) {
    let (up, exports) = upstream().await;
    let dir = TempDir::new("proxy");
    let file = dir.write("rules.yaml", &rules(&format!("http://{up}"), trusted));
    // One worker thread (a current-thread runtime), as benchmarked.
    let s = Server::start_cmd(
        "proxy",
        &["--config", file.to_str().unwrap(), "--threads", "1"],
    );
    (s, dir, exports)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_by_user_ip_and_user_plus_ip_with_headers_on_every_answer() {
    let (s, _dir) = start("10.0.0.0/8").await;
    let c = client();
    for i in 0..3 {
        let r = c
            .get(s.url("/hello"))
            .header("x-api-key", "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{i}");
        assert_eq!(
            header(r.headers(), "x-ratelimit-remaining"),
            (2 - i).to_string()
        );
        assert_eq!(
            header(r.headers(), "ratelimit-policy"),
            "\"per-user\";q=3;w=3600"
        );
        assert_eq!(r.text().await.unwrap(), "hello");
    }
    let r = c
        .get(s.url("/hello"))
        .header("x-api-key", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        header(r.headers(), "content-type"),
        "application/problem+json"
    );
    assert!(header(r.headers(), "retry-after").parse::<u64>().unwrap() > 0);
    let j: serde_json::Value = r.json().await.unwrap();
    assert_eq!(j["status"], 429);
    let r = c
        .get(s.url("/hello"))
        .header("x-api-key", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // By IP: the test client is 127.0.0.1, which is not trusted here, so a
    // spoofed X-Forwarded-For changes nothing.
    for (i, spoof) in ["1.1.1.1", "2.2.2.2", "3.3.3.3"].iter().enumerate() {
        let r = c
            .get(s.url("/ip/x"))
            .header("x-forwarded-for", *spoof)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), if i < 2 { 200 } else { 429 }, "{spoof}");
    }
    // The upstream sees the real peer, not the spoofed chain.
    let j: serde_json::Value = util::json(
        c.get(s.url("/headers"))
            .header("x-forwarded-for", "6.6.6.6")
            .header("x-api-key", "k"),
    )
    .await;
    assert_eq!(j["x-forwarded-for"], "127.0.0.1");
    assert_eq!(j["x-api-key"], "k");
    assert!(
        j["x-forwarded-host"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    // user+ip on a parameterised route.
    let get = |user: &'static str| c.get(s.url("/users/42")).header("x-api-key", user).send();
    assert_eq!(get("carol").await.unwrap().status(), 200);
    assert_eq!(get("carol").await.unwrap().status(), 429);
    assert_eq!(get("dave").await.unwrap().status(), 200);
    // No identity for a user rule: the rule does not apply.
    assert_eq!(c.get(s.url("/hello")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_forwarded_address_is_the_client() {
    let (s, _dir) = start("127.0.0.1/32").await;
    let c = client();
    let hit = |ip: &'static str| c.get(s.url("/ip/y")).header("x-forwarded-for", ip).send();
    assert_eq!(hit("203.0.113.1").await.unwrap().status(), 200);
    assert_eq!(hit("203.0.113.1").await.unwrap().status(), 200);
    assert_eq!(hit("203.0.113.1").await.unwrap().status(), 429);
    assert_eq!(hit("203.0.113.2").await.unwrap().status(), 200);
    let j: serde_json::Value = util::json(
        c.get(s.url("/headers"))
            .header("x-forwarded-for", "203.0.113.7"),
    )
    .await;
    assert_eq!(j["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_requests_queue_and_leave_at_the_leak_rate_in_order() {
    let (s, _dir) = start("10.0.0.0/8").await;
    let c = client();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let (c, url) = (c.clone(), s.url("/v1/export"));
        tasks.push(tokio::spawn(async move {
            // Stagger so arrival order is known.
            tokio::time::sleep(Duration::from_millis(u64::from(i) * 10)).await;
            let r = c
                .post(url)
                .header("x-api-key", "erin")
                .send()
                .await
                .unwrap();
            (i, r.status().as_u16(), started.elapsed())
        }));
    }
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    // 5/s: one every 200 ms; max_wait 1 s admits waits of 0..=1000 ms: 6 pass.
    let ok: Vec<_> = done.iter().filter(|d| d.1 == 200).collect();
    let denied = done.iter().filter(|d| d.1 == 429).count();
    assert_eq!(ok.len(), 6, "{done:?}");
    assert_eq!(denied, 2, "{done:?}");
    for w in ok.windows(2) {
        assert!(w[0].0 < w[1].0, "in arrival order: {done:?}");
        let gap = w[1].2.saturating_sub(w[0].2);
        assert!(
            gap >= Duration::from_millis(120),
            "released too fast: {done:?}"
        );
    }
    let span = ok.last().unwrap().2 - ok[0].2;
    assert!(
        span >= Duration::from_millis(850) && span < Duration::from_millis(1600),
        "{span:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_that_disconnects_leaves_the_queue() {
    let (s, _dir, exports) = start_counting("10.0.0.0/8").await;
    // Fill the bucket so the next requests wait 200, 400, 600 ms...
    let c = client();
    assert_eq!(
        c.post(s.url("/v1/export"))
            .header("x-api-key", "frank")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // ...then give up on one long before its turn.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    for _ in 0..3 {
        let e = impatient
            .post(s.url("/v1/export"))
            .header("x-api-key", "frank")
            .send()
            .await;
        assert!(e.is_err(), "should have timed out while queued");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Only the first one reached the upstream.
    assert_eq!(exports.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_are_502_and_504_and_bodies_stream_unchanged() {
    let (s, _dir) = start("10.0.0.0/8").await;
    let c = client();
    let t = Instant::now();
    let r = c.get(s.url("/slow")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(
        header(r.headers(), "content-type"),
        "application/problem+json"
    );
    // 8 MiB of non-repeating bytes through /echo.
    let mut data = vec![0u8; 8 << 20];
    let mut x = 0x1234_5678_u32;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let r = c
        .post(s.url("/echo"))
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let back = r.bytes().await.unwrap();
    assert!(
        back.len() == data.len() && back[..] == data[..],
        "body changed"
    );
    // An upstream that is not there.
    let dir = TempDir::new("down");
    let port = spillway_testkit::free_port();
    let file = dir.write(
        "rules.yaml",
        &rules(&format!("http://127.0.0.1:{port}"), "10.0.0.0/8"),
    );
    let down = Server::start_cmd("proxy", &["--config", file.to_str().unwrap()]);
    for _ in 0..20 {
        let r = c.get(down.url("/anything")).send().await.unwrap();
        assert_eq!(r.status(), 502);
    }
    // Logged, but not once per request.
    down.wait_line(&format!("upstream http://127.0.0.1:{port}/ failed"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let more = down.drain_logs();
    assert!(
        !more.iter().any(|l| l.contains("failed")),
        "one warning per 10 s at most: {more:#?}"
    );
}

/// An answer carrying an upstream's own rate limit headers.
async fn own_headers() -> impl axum::response::IntoResponse {
    (
        [
            ("x-ratelimit-limit", "999"),
            ("ratelimit", "\"upstream\";r=5;t=9"),
        ],
        "own",
    )
}

/// Where a rule decided, the answer carries one value of each rate limit
/// header, the proxy's, on both paths; where none did, the upstream's
/// pass through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_rate_limit_headers_replace_the_upstreams() {
    let (s, _dir) = start("10.0.0.0/8").await;
    let h2 = h2_client();
    let values = |r: &reqwest::Response, name: &str| -> Vec<String> {
        r.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    for c in [client(), h2] {
        let r = c.get(s.url("/ip/own-headers")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(values(&r, "x-ratelimit-limit"), ["2"]);
        let rl = values(&r, "ratelimit");
        assert!(rl.len() == 1 && rl[0].starts_with("\"per-ip\";"), "{rl:?}");
        let r = c.get(s.url("/free/own-headers")).send().await.unwrap();
        assert_eq!(values(&r, "x-ratelimit-limit"), ["999"]);
        assert_eq!(values(&r, "ratelimit"), ["\"upstream\";r=5;t=9"]);
    }
}

/// An upstream that sends its head and then stalls does not hold the
/// client: after the timeout without a byte the connection is cut, on the
/// direct path (HTTP/1.1) and through hyper (HTTP/2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_stalled_midway_does_not_hold_the_client() {
    let (s, _dir) = start("10.0.0.0/8").await;
    let h2 = h2_client();
    for c in [client(), h2] {
        let t = Instant::now();
        let r = c.get(s.url("/stall")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let body = tokio::time::timeout(Duration::from_secs(10), r.bytes()).await;
        let body = body.expect("the proxy held the client past its timeout");
        assert!(body.is_err(), "a stalled body cannot end well: {body:?}");
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_served_and_limited_too() {
    let (s, _dir) = start("10.0.0.0/8").await;
    let h2 = h2_client();
    for i in 0..3 {
        let r = h2
            .get(s.url("/hello"))
            .header("x-api-key", "h2-user")
            .send()
            .await
            .unwrap();
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        assert_eq!(r.status(), 200, "{i}");
        assert_eq!(r.text().await.unwrap(), "hello");
    }
    let r = h2
        .get(s.url("/hello"))
        .header("x-api-key", "h2-user")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
}

/// `proxy.listen` in the file says where the proxy listens, before the
/// file's `listen` (which `serve` uses), and `check-config` shows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_listens_where_its_section_says() {
    let (up, _) = upstream().await;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (proxy_at, serve_at) = (free(), free());
    let dir = TempDir::new("proxy-listen");
    let file = dir.write(
        "rules.yaml",
        &format!("listen: {serve_at}\nproxy:\n  upstream: http://{up}\n  listen: {proxy_at}\n"),
    );
    let out = util::spillway(&["check-config", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("listen: {serve_at}")), "{text}");
    assert!(text.contains(&format!("  listen {proxy_at}")), "{text}");
    let s = Server::start_as_configured("proxy", &["--config", file.to_str().unwrap()]);
    assert_eq!(s.addr, proxy_at.to_string());
    let r = client().get(s.url("/hello")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello");
}

/// `--admin-listen`: the HTTP API beside the proxy, whose own address
/// forwards everything. Its metrics count the proxy's decisions on both
/// paths (HTTP/1.1 direct, HTTP/2 through hyper), its queued requests and
/// its 504s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_counts_what_the_proxy_does() {
    let (up, _) = upstream().await;
    let dir = TempDir::new("proxy-admin");
    let file = dir.write("rules.yaml", &rules(&format!("http://{up}"), "10.0.0.0/8"));
    let s = Server::start_cmd(
        "proxy",
        &[
            "--config",
            file.to_str().unwrap(),
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let line = s.wait_line("admin API");
    let admin = line
        .split("listening on http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let c = client();
    let h2 = h2_client();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = c.get(s.url("/hello")).header("x-api-key", "u1");
        statuses.push(r.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    let r = h2
        .get(s.url("/hello"))
        .header("x-api-key", "u2")
        .send()
        .await;
    assert_eq!(r.unwrap().status(), 200);
    // The second export waits its turn (5 per second).
    for _ in 0..2 {
        let r = c.post(s.url("/v1/export")).header("x-api-key", "u3");
        assert_eq!(r.send().await.unwrap().status(), 200);
    }
    // Too slow for the 500 ms timeout, on each path.
    assert_eq!(c.get(s.url("/slow")).send().await.unwrap().status(), 504);
    assert_eq!(h2.get(s.url("/slow")).send().await.unwrap().status(), 504);

    let metrics = util::text(c.get(format!("http://{admin}/metrics"))).await;
    for want in [
        "spillway_decisions_total{rule=\"per-user\",outcome=\"allowed\"} 4",
        "spillway_decisions_total{rule=\"per-user\",outcome=\"denied\"} 1",
        "spillway_decisions_total{rule=\"export\",outcome=\"allowed\"} 2",
        "spillway_delayed_total 1",
        "spillway_upstream_errors_total{status=\"504\"} 2",
        "spillway_upstream_errors_total{status=\"502\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == want),
            "no {want:?} in\n{metrics}"
        );
    }
    for path in ["/healthz", "/readyz", "/v1/status", "/v1/rules"] {
        let r = c.get(format!("http://{admin}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // The proxy's own address still forwards those paths upstream.
    let r = c.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
}

/// The shipped `examples/proxy.yaml` stays valid and means what its
/// comments say.
#[test]
fn the_example_proxy_file_is_valid() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/proxy.yaml");
    let out = util::spillway(&["check-config", file]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "3 rules",
        "proxy: upstream http://127.0.0.1:9000",
        "  listen 127.0.0.1:8081",
        "  admin API (metrics, health) on 127.0.0.1:9090",
        "  user from header x-api-key",
        "leaky_bucket (queue): capacity 10, leak 2 per 1s, max wait 5s",
    ] {
        assert!(text.contains(want), "no {want:?} in {text}");
    }
}

#[test]
fn proxy_flags_are_checked() {
    let out = util::spillway(&["proxy", "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--upstream"));
    let out = util::spillway(&["proxy", "--upstream", "ftp://x", "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2));
    // A taken admin port fails the start before anything says it listens.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap().to_string();
    let out = util::spillway(&[
        "proxy",
        "--upstream",
        "http://127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        &at,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("cannot listen for the admin API on {at}")),
        "{err}"
    );
    assert!(!err.contains("listening on"), "{err}");
}

/// A client that speaks HTTP/2 without asking (h2c).
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
}

/// One response read off a raw connection: status, headers, body (from
/// `Content-Length` or chunked framing; none for HEAD and 204).
async fn read_response(
    conn: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> (u16, std::collections::HashMap<String, String>, String) {
    use tokio::io::AsyncReadExt;
    async fn more(conn: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&chunk[..n]);
    }
    let (status, headers, head) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut hs);
        if let httparse::Status::Complete(n) = resp.parse(buf).unwrap() {
            let headers: std::collections::HashMap<String, String> = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (resp.code.unwrap(), headers, n);
        }
        more(conn, buf).await;
    };
    buf.drain(..head);
    let mut body = Vec::new();
    if head_request || status == 204 {
        // No body.
    } else if let Some(len) = headers.get("content-length") {
        let len: usize = len.parse().unwrap();
        while buf.len() < len {
            more(conn, buf).await;
        }
        body.extend(buf.drain(..len));
    } else {
        assert_eq!(
            headers.get("transfer-encoding").map(String::as_str),
            Some("chunked")
        );
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                more(conn, buf).await;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                more(conn, buf).await;
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    (status, headers, String::from_utf8(body).unwrap())
}

/// A path respelled on the wire (dot segments, doubled slashes, an
/// escaped letter) is still the rule's route: the client cannot step
/// around `/hello`'s limit of 3 by writing it another way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_respelled_path_is_limited_as_its_route() {
    use tokio::io::AsyncWriteExt;
    let (s, _dir) = start("127.0.0.1/32").await;
    let mut conn = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    let mut buf = Vec::new();
    let mut statuses = Vec::new();
    for path in ["/hello", "/x/../hello", "//hello", "/%68ello", "/./hello"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: respell\r\n\r\n");
        conn.write_all(req.as_bytes()).await.unwrap();
        statuses.push(read_response(&mut conn, &mut buf, false).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

/// A tunnel is not the upstream's business: the proxy refuses CONNECT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_is_refused_not_forwarded() {
    use tokio::io::AsyncWriteExt;
    let (s, _dir) = start("127.0.0.1/32").await;
    let mut conn = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    conn.write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await
        .unwrap();
    let (status, headers, _) = read_response(&mut conn, &mut Vec::new(), false).await;
    assert_eq!(status, 405);
    assert!(headers.contains_key("allow"), "{headers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_on_the_wire_chunked_head_204_and_pipelining() {
    use tokio::io::AsyncWriteExt;
    let (s, _dir) = start("127.0.0.1/32").await;
    let mut conn = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    let mut buf = Vec::new();
    let get = |path: &str, method: &str| {
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: wire\r\n\r\n")
    };
    // A body of unknown length comes back chunked, whole.
    conn.write_all(get("/stream", "GET").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (200, "one,two,three"));
    // HEAD: the length, no body; 204: nothing; then the connection still
    // frames the next answers right, two of them pipelined in one write.
    conn.write_all(get("/other", "HEAD").as_bytes())
        .await
        .unwrap();
    let (status, headers, body) = read_response(&mut conn, &mut buf, true).await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(headers.get("content-length").map(String::as_str), Some("2"));
    conn.write_all(get("/empty", "GET").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (204, ""));
    let two = format!("{}{}", get("/other", "GET"), get("/stream", "GET"));
    conn.write_all(two.as_bytes()).await.unwrap();
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (200, "one,two,three"));
    // The proxy's own 429 on the same connection (3 per hour for /hello),
    // with its rate limit headers, then another answer after it.
    for want in [200, 200, 200, 429] {
        conn.write_all(get("/hello", "GET").as_bytes())
            .await
            .unwrap();
        let (status, headers, body) = read_response(&mut conn, &mut buf, false).await;
        assert_eq!(status, want, "{body}");
        assert_eq!(
            headers.get("x-ratelimit-limit").map(String::as_str),
            Some("3")
        );
        if want == 429 {
            assert!(body.contains("per-user"), "{body}");
            assert!(headers.contains_key("retry-after"));
        }
    }
    conn.write_all(get("/other", "GET").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut conn, &mut buf, false).await.0, 200);
    assert!(
        buf.is_empty(),
        "stray bytes: {:?}",
        String::from_utf8_lossy(&buf)
    );
}

/// An upstream written by hand, for what a framework would not send: a
/// body that ends when the connection closes, an interim 103 before the
/// answer, and keep-alive connections it closes after 50 ms idle.
async fn raw_upstream() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // Read one request head (these requests have no body),
                    // giving up after 50 ms idle: the connection is closed.
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 1024];
                        match tokio::time::timeout(Duration::from_millis(50), conn.read(&mut chunk))
                            .await
                        {
                            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end);
                    if head.starts_with("GET /upgrade") {
                        // Switch to an echo protocol: every byte comes back.
                        let switched = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n";
                        if conn.write_all(switched).await.is_err() {
                            return;
                        }
                        let mut chunk = [0u8; 1024];
                        while let Ok(n) = conn.read(&mut chunk).await {
                            if n == 0 || conn.write_all(&chunk[..n]).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    let answer: &[u8] = if head.starts_with("GET /until-close") {
                        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close"
                    } else if head.starts_with("GET /interim") {
                        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    };
                    if conn.write_all(answer).await.is_err() {
                        return;
                    }
                    if head.starts_with("GET /until-close") {
                        let _ = conn.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// `spillway proxy` (2 s timeout) in front of a new [`raw_upstream`],
/// with `rules` (YAML from `rules:` on).
async fn proxy_on_raw_upstream(rules: &str) -> (Server, TempDir) {
    let up = raw_upstream().await;
    let dir = TempDir::new("proxy-raw");
    let file = dir.write(
        "rules.yaml",
        &format!(
            "proxy:\n  upstream: http://{up}\n  timeout: 2s\n  upgrades: [websocket, echo]\n{rules}"
        ),
    );
    let s = Server::start_cmd("proxy", &["--config", file.to_str().unwrap()]);
    (s, dir)
}

/// An upgrade (WebSocket and the like) goes through: the handshake is
/// decided and forwarded with its hop-by-hop headers, and after the 101
/// the bytes flow both ways, in several exchanges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_joined_through_to_the_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (s, _dir) = proxy_on_raw_upstream(
        "rules:\n  - name: ws\n    api: GET /upgrade\n    limits: [ { fixed_window: { limit: 1, window: 1h } } ]\n",
    )
    .await;
    let handshake =
        b"GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
    let mut conn = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    conn.write_all(handshake).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut byte))
            .await
            .expect("a 101 in time")
            .unwrap();
        assert_eq!(
            n,
            1,
            "closed during the handshake: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    assert!(head.contains("ratelimit-policy:"), "{head}");
    for word in ["ping", "a longer second message"] {
        conn.write_all(word.as_bytes()).await.unwrap();
        let mut back = vec![0u8; word.len()];
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut back))
            .await
            .expect("the echo in time")
            .unwrap();
        assert_eq!(back, word.as_bytes());
    }
    // The handshake was decided like any request: a second is over the limit.
    let mut again = tokio::net::TcpStream::connect(&s.addr).await.unwrap();
    again.write_all(handshake).await.unwrap();
    let (status, _, _) = read_response(&mut again, &mut Vec::new(), false).await;
    assert_eq!(status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_upstream_answers_and_connections_it_closed() {
    let (s, _dir) = proxy_on_raw_upstream("rules: []\n").await;
    let c = client();
    // An interim 103 is skipped; the final answer comes through.
    let r = c.get(s.url("/interim")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "final");
    // A body that ends with the upstream's connection arrives whole.
    let r = c.get(s.url("/until-close")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "until-close");
    // A pooled connection the upstream closed while idle is not used for
    // the next request (no 502).
    for _ in 0..3 {
        let r = c.get(s.url("/ok")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "ok");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // And back to back, on the same pooled connection.
    for _ in 0..20 {
        assert_eq!(c.get(s.url("/ok")).send().await.unwrap().status(), 200);
    }
}
