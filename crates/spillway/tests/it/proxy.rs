//! End-to-end: `spillway proxy` (the real binary) in front of a fake
//! upstream from `spillway_testkit::upstream`, on both of its transports.
//!
//! Every test that sends requests through the proxy runs twice, as
//! `<test>::direct` (the default: plain HTTP/1.1 on the direct path) and
//! `<test>::hyper` (the same rules with `server: { direct_path: false }`:
//! every connection goes to hyper from its first byte), by
//! [`on_both_paths!`]. A test that is about one transport only says why and
//! runs once. Regression tests are named after the bug they pin.

use std::time::{Duration, Instant};

use spillway_testkit::upstream::{HttpUpstream, Seen, raw_upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::{self as util};
use crate::util::{Server, TempDir, client, header};

/// Which of the proxy's transports a test's requests take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The default: plain HTTP/1.1 on the direct path (anything it does not
    /// take, such as HTTP/2 clients, still goes to hyper).
    Direct,
    /// `server: { direct_path: false }`: hyper from the first byte.
    Hyper,
}

impl Path {
    /// The rules file `yaml` for this path: as it is for the direct path;
    /// for hyper with `direct_path: false` in its `server:` section, which
    /// is added when the file has none.
    fn rules(self, yaml: &str) -> String {
        assert!(!yaml.contains("direct_path"), "chosen by the test: {yaml}");
        if self == Path::Direct {
            return yaml.to_string();
        }
        let lines: Vec<&str> = yaml.lines().collect();
        let mut out = String::with_capacity(yaml.len() + 32);
        let mut merged = false;
        for (i, line) in lines.iter().enumerate() {
            match line.strip_prefix("server:").map(str::trim) {
                // A flow mapping: `server: { head_timeout: 1s }`.
                Some(rest) if !merged && rest.starts_with('{') => {
                    let inner = rest[1..].trim_start();
                    let sep = if inner.starts_with('}') { " " } else { ", " };
                    out.push_str(&format!("server: {{ direct_path: false{sep}{inner}\n"));
                    merged = true;
                }
                // A block mapping: a first line indented as the next one.
                Some("") if !merged => {
                    let next = lines.get(i + 1).copied().unwrap_or("");
                    let indent = &next[..next.len() - next.trim_start().len()];
                    let indent = if indent.is_empty() { "  " } else { indent };
                    out.push_str(&format!("server:\n{indent}direct_path: false\n"));
                    merged = true;
                }
                Some(other) if !merged => panic!("a server section this cannot merge: {other}"),
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        if !merged {
            out.insert_str(0, "server: { direct_path: false }\n");
        }
        out
    }
}

/// Runs each named `async fn(Path)` as two tests, `<name>::direct` and
/// `<name>::hyper`, so a failure says which transport it was. The bodies
/// stay ordinary functions (rustfmt and the compiler see them as such).
macro_rules! on_both_paths {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            use super::Path;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn direct() {
                super::$name(Path::Direct).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hyper() {
                super::$name(Path::Hyper).await;
            }
        }
    )+};
}

/// The merge keeps every layout a valid file that says which path it
/// takes.
#[test]
fn the_hyper_variant_turns_the_direct_path_off_in_every_layout() {
    let dir = TempDir::new("proxy-paths");
    for yaml in [
        "rules: []\n",
        "\nproxy:\n  upstream: http://127.0.0.1:1\nrules: []\n",
        "server: {}\nrules: []\n",
        "server: { head_timeout: 2s }\nrules: []\n",
        "server:\n    idle_timeout: 3s\nrules: []\n",
    ] {
        for (path, want) in [(Path::Direct, "true"), (Path::Hyper, "false")] {
            let file = dir.write("rules.yaml", &path.rules(yaml));
            let out = util::spillway(&["check-config", file.to_str().unwrap()]);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains(&format!("direct_path {want}")),
                "{path:?} of {yaml:?}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

fn rules(upstream: &str, trusted: &str) -> String {
    rules_timed(upstream, trusted, "500ms")
}

/// The proxy's test rules, with the upstream `timeout`.
fn rules_timed(upstream: &str, trusted: &str, timeout: &str) -> String {
    format!(
        r#"
proxy:
  upstream: {upstream}
  user: header:X-Api-Key
  trusted_proxies: [{trusted}]
  timeout: {timeout}
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

/// `spillway proxy` on `path`, with the test rules (500 ms timeout), in
/// front of a new [`HttpUpstream`].
async fn start(path: Path, trusted: &str) -> (Server, HttpUpstream, TempDir) {
    start_timed(path, trusted, "500ms").await
}

async fn start_timed(path: Path, trusted: &str, timeout: &str) -> (Server, HttpUpstream, TempDir) {
    let up = HttpUpstream::start().await;
    let (s, dir) = proxy_with(path, &rules_timed(&up.url(), trusted, timeout), &[]);
    (s, up, dir)
}

/// `spillway proxy --config FILE --threads 1 ARGS...` on `path`, where
/// FILE holds `yaml` (one worker thread, a current-thread runtime, as
/// benchmarked).
fn proxy_with(path: Path, yaml: &str, args: &[&str]) -> (Server, TempDir) {
    let dir = TempDir::new("proxy");
    let file = dir.write("rules.yaml", &path.rules(yaml));
    let mut all = vec!["--config", file.to_str().unwrap(), "--threads", "1"];
    all.extend_from_slice(args);
    (Server::start_cmd("proxy", &all), dir)
}

/// The address `--admin-listen 127.0.0.1:0` took, from the log.
fn admin_address(s: &Server) -> String {
    s.listener("admin API")
}

/// The one request the upstream received for `path`.
fn only(up: &HttpUpstream, path: &str) -> Seen {
    let seen = up.requests_to(path);
    assert_eq!(seen.len(), 1, "requests to {path}: {seen:#?}");
    seen.into_iter().next().unwrap()
}

/// A client that speaks HTTP/2 without asking (h2c): always the hyper
/// transport.
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn limits_by_user_ip_and_user_plus_ip_with_headers_on_every_answer(path: Path) {
    let (s, up, _dir) = start(path, "10.0.0.0/8").await;
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
    let r = c
        .get(s.url("/headers"))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = only(&up, "/headers");
    assert_eq!(seen.all("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(seen.header("x-api-key"), Some("k"));
    assert_eq!(seen.header("x-forwarded-host"), Some(s.addr.as_str()));
    // user+ip on a parameterised route.
    let get = |user: &'static str| c.get(s.url("/users/42")).header("x-api-key", user).send();
    assert_eq!(get("carol").await.unwrap().status(), 200);
    assert_eq!(get("carol").await.unwrap().status(), 429);
    assert_eq!(get("dave").await.unwrap().status(), 200);
    // No identity for a user rule: the rule does not apply.
    assert_eq!(c.get(s.url("/hello")).send().await.unwrap().status(), 200);
}
on_both_paths!(limits_by_user_ip_and_user_plus_ip_with_headers_on_every_answer);

/// From a trusted peer, the forwarded chain is believed and extended, and
/// its `Forwarded` and `X-Real-IP` pass.
async fn behind_a_trusted_proxy_the_forwarded_address_is_the_client(path: Path) {
    let (s, up, _dir) = start(path, "127.0.0.1/32").await;
    let c = client();
    let hit = |ip: &'static str| c.get(s.url("/ip/y")).header("x-forwarded-for", ip).send();
    assert_eq!(hit("203.0.113.1").await.unwrap().status(), 200);
    assert_eq!(hit("203.0.113.1").await.unwrap().status(), 200);
    assert_eq!(hit("203.0.113.1").await.unwrap().status(), 429);
    assert_eq!(hit("203.0.113.2").await.unwrap().status(), 200);
    let r = c
        .get(s.url("/headers"))
        .header("x-forwarded-for", "203.0.113.7")
        .header("forwarded", "for=203.0.113.7")
        .header("x-real-ip", "203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = only(&up, "/headers");
    assert_eq!(seen.all("x-forwarded-for"), ["203.0.113.7, 127.0.0.1"]);
    assert_eq!(seen.all("forwarded"), ["for=203.0.113.7"]);
    assert_eq!(seen.all("x-real-ip"), ["203.0.113.7"]);
}
on_both_paths!(behind_a_trusted_proxy_the_forwarded_address_is_the_client);

/// A client's own `Forwarded` and `X-Real-IP` never reach the upstream
/// from an untrusted peer (an upstream that believed them would take the
/// client's word for its address), and the `X-Forwarded-*` headers it
/// sees are the proxy's own, on HTTP/1.1 and HTTP/2 alike.
async fn a_clients_own_forwarded_and_x_real_ip_do_not_reach_the_upstream(path: Path) {
    let (s, up, _dir) = start(path, "10.0.0.0/8").await;
    for (i, c) in [client(), h2_client()].into_iter().enumerate() {
        let at = format!("/spoof/{i}");
        let r = c
            .get(s.url(&at))
            .header("forwarded", "for=6.6.6.6;proto=https;host=evil.example")
            .header("x-real-ip", "6.6.6.6")
            .header("x-forwarded-for", "6.6.6.6")
            .header("x-forwarded-host", "evil.example")
            .header("x-forwarded-proto", "https")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{at}");
        let seen = only(&up, &at);
        assert_eq!(seen.all("forwarded"), Vec::<&str>::new(), "{seen:#?}");
        assert_eq!(seen.all("x-real-ip"), Vec::<&str>::new(), "{seen:#?}");
        assert_eq!(seen.all("x-forwarded-for"), ["127.0.0.1"], "{seen:#?}");
        assert_eq!(seen.all("x-forwarded-proto"), ["http"], "{seen:#?}");
        assert_eq!(seen.all("x-forwarded-host"), [s.addr.as_str()], "{seen:#?}");
    }
}
on_both_paths!(a_clients_own_forwarded_and_x_real_ip_do_not_reach_the_upstream);

async fn excess_requests_queue_and_leave_at_the_leak_rate_in_order(path: Path) {
    let (s, _up, _dir) = start(path, "10.0.0.0/8").await;
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
    // In the order they were released: the client staggers its sends by
    // 10 ms, but a busy machine may swap two neighbours on the way (a
    // request sent 10 ms later arriving first), so arrival order is not
    // the index order. What holds whatever the machine: one at a time,
    // at the leak rate, and the ones refused are from the last to arrive.
    let mut ok: Vec<_> = done.iter().filter(|d| d.1 == 200).collect();
    ok.sort_by_key(|d| d.2);
    let denied: Vec<u32> = done.iter().filter(|d| d.1 == 429).map(|d| d.0).collect();
    assert_eq!(ok.len(), 6, "{done:?}");
    assert_eq!(denied.len(), 2, "{done:?}");
    assert!(
        denied.iter().all(|&i| i >= 4),
        "refused early arrivals: {done:?}"
    );
    // The k-th release is no sooner than k leak intervals after the first
    // (less 80 ms of the client's own timing): a busy machine may delay
    // one answer so the next follows it closely, but never release early.
    for (k, d) in ok.iter().enumerate() {
        let since_first = d.2.saturating_sub(ok[0].2);
        let due = Duration::from_millis(200 * k as u64).saturating_sub(Duration::from_millis(80));
        assert!(since_first >= due, "released too fast: {done:?}");
    }
    let span = ok.last().unwrap().2 - ok[0].2;
    assert!(
        span >= Duration::from_millis(850) && span < Duration::from_millis(1600),
        "{span:?}"
    );
}
on_both_paths!(excess_requests_queue_and_leave_at_the_leak_rate_in_order);

async fn a_waiting_client_that_disconnects_leaves_the_queue(path: Path) {
    let (s, up, _dir) = start(path, "10.0.0.0/8").await;
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
    assert_eq!(up.count("/v1/export"), 1);
}
on_both_paths!(a_waiting_client_that_disconnects_leaves_the_queue);

async fn upstream_failures_are_502_and_504_and_bodies_stream_unchanged(path: Path) {
    let (s, _up, _dir) = start(path, "10.0.0.0/8").await;
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
    let port = spillway_testkit::free_port();
    let (down, _down_dir) = proxy_with(
        path,
        &rules(&format!("http://127.0.0.1:{port}"), "10.0.0.0/8"),
        &[],
    );
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
on_both_paths!(upstream_failures_are_502_and_504_and_bodies_stream_unchanged);

// ------------------------------------------------- parity regressions
//
// Five commits re-aligned the proxy's two copies after differences had
// shipped; each fix has a test here named after the bug, on both paths.

/// 9664377: on the direct path an upstream's own `RateLimit` /
/// `X-RateLimit-*` headers were relayed beside the proxy's (two values
/// each). Where a rule decided, the answer carries one value of each, the
/// proxy's; where none did, the upstream's pass through.
async fn regression_upstream_ratelimit_headers_are_replaced_not_doubled(path: Path) {
    let (s, _up, _dir) = start(path, "10.0.0.0/8").await;
    let values = |r: &reqwest::Response, name: &str| -> Vec<String> {
        r.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    for c in [client(), h2_client()] {
        let r = c.get(s.url("/ip/ratelimit-headers")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(values(&r, "x-ratelimit-limit"), ["2"]);
        let rl = values(&r, "ratelimit");
        assert!(rl.len() == 1 && rl[0].starts_with("\"per-ip\";"), "{rl:?}");
        let r = c
            .get(s.url("/free/ratelimit-headers"))
            .send()
            .await
            .unwrap();
        assert_eq!(values(&r, "x-ratelimit-limit"), ["999"]);
        assert_eq!(values(&r, "ratelimit"), ["\"upstream\";r=5;t=9"]);
    }
}
on_both_paths!(regression_upstream_ratelimit_headers_are_replaced_not_doubled);

/// 67f600c: an upstream that sent its head and then stalled held an
/// HTTP/2 client forever on the hyper path (the direct path's relay
/// already cut it). After the timeout without a byte the client's
/// connection is cut, on HTTP/1.1 and HTTP/2.
async fn regression_a_stalled_upstream_body_cuts_the_client_instead_of_holding_it(path: Path) {
    let (s, _up, _dir) = start(path, "10.0.0.0/8").await;
    for c in [client(), h2_client()] {
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
on_both_paths!(regression_a_stalled_upstream_body_cuts_the_client_instead_of_holding_it);

/// 62aa3d9: the proxy's decisions, queued admissions and 502/504s were
/// not all counted on both paths. `--admin-listen` serves the HTTP API
/// beside the proxy, whose own address forwards everything, and its
/// metrics count what either transport did (HTTP/1.1 and HTTP/2 here).
async fn regression_decisions_and_upstream_errors_are_counted_on_both_paths(path: Path) {
    let up = HttpUpstream::start().await;
    let (s, _dir) = proxy_with(
        path,
        &rules(&up.url(), "10.0.0.0/8"),
        &["--admin-listen", "127.0.0.1:0"],
    );
    let admin = admin_address(&s);
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
    // Too slow for the 500 ms timeout, on each client.
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
    for at in ["/healthz", "/readyz", "/v1/status", "/v1/rules"] {
        let r = c.get(format!("http://{admin}{at}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{at}");
    }
    // The proxy's own address still forwards those paths upstream.
    let r = c.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(up.count("/metrics"), 1);
}
on_both_paths!(regression_decisions_and_upstream_errors_are_counted_on_both_paths);

/// d0fc424: the proxy built its identity (user source, trusted proxies),
/// limiter handle and upstream client twice, once per transport. One
/// client's requests count on one counter whichever transport carries
/// them, and a trusted peer's forwarded address is the same client on
/// both.
async fn regression_one_identity_and_limiter_for_both_transports(path: Path) {
    let (s, up, _dir) = start(path, "127.0.0.1/32").await;
    let (h1, h2) = (client(), h2_client());
    // /hello: 3 per user per hour, shared by HTTP/1.1 and HTTP/2.
    let mut statuses = Vec::new();
    for c in [&h1, &h2, &h1, &h2] {
        let r = c.get(s.url("/hello")).header("x-api-key", "shared");
        statuses.push(r.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    // /ip/*: 2 per client address, the forwarded one from a trusted peer.
    let mut statuses = Vec::new();
    for c in [&h2, &h1, &h2] {
        let r = c
            .get(s.url("/ip/both"))
            .header("x-forwarded-for", "203.0.113.50");
        statuses.push(r.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    let chains: Vec<String> = up
        .requests_to("/ip/both")
        .iter()
        .map(|seen| seen.all("x-forwarded-for").join(" | "))
        .collect();
    assert_eq!(
        chains,
        ["203.0.113.50, 127.0.0.1", "203.0.113.50, 127.0.0.1"]
    );
}
on_both_paths!(regression_one_identity_and_limiter_for_both_transports);

/// 5f100cf: each transport made its own answer to an upstream failure.
/// Now there is one: the same status, problem body and count whichever
/// transport carried the request (HTTP/1.1 and HTTP/2 here), and the
/// body is generic (the upstream's address and the OS error go to the
/// log, not to the client).
async fn regression_an_upstream_failure_gets_one_answer_on_every_transport(path: Path) {
    let (slow, _up, _dir) = start(path, "10.0.0.0/8").await;
    let port = spillway_testkit::free_port();
    let (down, _down_dir) = proxy_with(
        path,
        &rules(&format!("http://127.0.0.1:{port}"), "10.0.0.0/8"),
        &[],
    );
    for (url, status) in [(slow.url("/slow"), 504), (down.url("/anything"), 502)] {
        let mut answers = Vec::new();
        for c in [client(), h2_client()] {
            let r = c.get(&url).send().await.unwrap();
            assert_eq!(r.status(), status, "{url}");
            assert_eq!(
                header(r.headers(), "content-type"),
                "application/problem+json"
            );
            let body = r.text().await.unwrap();
            let j: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(j["status"], status, "{body}");
            assert!(!body.contains("127.0.0.1"), "an address in {body}");
            answers.push(body);
        }
        assert_eq!(answers[0], answers[1], "{url}");
    }
}
on_both_paths!(regression_an_upstream_failure_gets_one_answer_on_every_transport);

/// 5f100cf also moved the empty-user check into the limiter alone (the
/// proxy had its own copy): an empty `X-Api-Key` is no user, so the
/// per-user rule does not apply, whichever transport carries it.
async fn regression_an_empty_user_is_no_user_on_every_transport(path: Path) {
    let (s, _up, _dir) = start(path, "10.0.0.0/8").await;
    for c in [client(), h2_client()] {
        for i in 0..5 {
            let r = c.get(s.url("/hello")).header("x-api-key", "");
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 200, "{i}");
            assert!(r.headers().get("ratelimit-policy").is_none(), "{i}");
        }
    }
}
on_both_paths!(regression_an_empty_user_is_no_user_on_every_transport);

/// Issue 35: a user, a client hop or a keyed header that cannot be read
/// was passed over (the rule then skipped as if the value were missing).
/// Each is refused with 400 on both transports, h1 and h2 alike, and
/// nothing reaches the upstream.
async fn a_name_that_cannot_be_read_is_refused_never_passed_over(path: Path) {
    let up = HttpUpstream::start().await;
    let yaml = format!(
        "{}  - name: per-key\n    api: /keyed\n    by: header:x-key\n    limits:\n      - fixed_window: {{ limit: 1, window: 1h }}\n",
        rules(&up.url(), "127.0.0.0/8")
    );
    let (s, _dir) = proxy_with(path, &yaml, &[]);
    let bad = |name: &'static str, value: &'static [u8]| {
        (
            name,
            reqwest::header::HeaderValue::from_bytes(value).unwrap(),
        )
    };
    for c in [client(), h2_client()] {
        for (path, (name, value)) in [
            ("/hello", bad("x-api-key", b"al\xffce")),
            ("/keyed", bad("x-key", b"k\xfe")),
            ("/ip/a", bad("x-forwarded-for", b"unknown")),
            ("/ip/a", bad("x-forwarded-for", b"1.2.3.4\xff")),
        ] {
            let r = c.get(s.url(path)).header(name, value.clone());
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 400, "{path} {name}: {value:?}");
        }
        // The same key twice with different values is refused; a key
        // that can be read is counted.
        let r = c
            .get(s.url("/keyed"))
            .header("x-key", "a")
            .header("x-key", "b")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }
    assert!(up.requests_to("/hello").is_empty() && up.requests_to("/keyed").is_empty());
    let c = client();
    let statuses = [
        c.get(s.url("/keyed"))
            .header("x-key", "k")
            .send()
            .await
            .unwrap()
            .status(),
        c.get(s.url("/keyed"))
            .header("x-key", "k")
            .send()
            .await
            .unwrap()
            .status(),
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [200, 429]);
}
on_both_paths!(a_name_that_cannot_be_read_is_refused_never_passed_over);

// Once: an HTTP/2 client always takes the hyper transport, whatever
// `direct_path` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_served_and_limited_too() {
    let (s, _up, _dir) = start(Path::Direct, "10.0.0.0/8").await;
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
async fn the_proxy_listens_where_its_section_says(path: Path) {
    let up = HttpUpstream::start().await;
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
        &path.rules(&format!(
            "listen: {serve_at}\nproxy:\n  upstream: {}\n  listen: {proxy_at}\nrules: []\n",
            up.url()
        )),
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
on_both_paths!(the_proxy_listens_where_its_section_says);

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
        "  request bodies up to 65536 bytes read whole first",
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

// ------------------------------------------------------------ the wire

/// One response read off a raw connection: status, headers, body (from
/// `Content-Length` or chunked framing; none for HEAD and 204). Bytes
/// that do not start an answer (a body after an answer to HEAD, say) fail
/// the test.
async fn read_response(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> (u16, std::collections::HashMap<String, String>, String) {
    async fn more(conn: &mut TcpStream, buf: &mut Vec<u8>) {
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
        let parsed = resp.parse(buf).unwrap_or_else(|e| {
            panic!(
                "not an answer ({e}): {:?}",
                String::from_utf8_lossy(&buf[..buf.len().min(200)])
            )
        });
        if let httparse::Status::Complete(n) = parsed {
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

/// Sends `bytes` on a new connection and reads one answer.
async fn exchange(
    addr: &str,
    bytes: &[u8],
) -> (u16, std::collections::HashMap<String, String>, String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    read_response(&mut conn, &mut Vec::new(), false).await
}

/// A path respelled on the wire (dot segments, doubled slashes, an
/// escaped letter) is still the rule's route: the client cannot step
/// around `/hello`'s limit of 3 by writing it another way.
async fn a_respelled_path_is_limited_as_its_route(path: Path) {
    let (s, _up, _dir) = start(path, "127.0.0.1/32").await;
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    let mut buf = Vec::new();
    let mut statuses = Vec::new();
    for target in ["/hello", "/x/../hello", "//hello", "/%68ello", "/./hello"] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\nX-Api-Key: respell\r\n\r\n");
        conn.write_all(req.as_bytes()).await.unwrap();
        statuses.push(read_response(&mut conn, &mut buf, false).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}
on_both_paths!(a_respelled_path_is_limited_as_its_route);

/// A tunnel is not the upstream's business: the proxy refuses CONNECT.
async fn connect_is_refused_not_forwarded(path: Path) {
    let (s, up, _dir) = start(path, "127.0.0.1/32").await;
    let (status, headers, _) = exchange(
        &s.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    .await;
    assert_eq!(status, 405);
    assert!(headers.contains_key("allow"), "{headers:?}");
    assert!(up.requests().is_empty(), "{:#?}", up.requests());
}
on_both_paths!(connect_is_refused_not_forwarded);

async fn framing_on_the_wire_chunked_head_204_and_pipelining(path: Path) {
    let (s, _up, _dir) = start(path, "127.0.0.1/32").await;
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    let mut buf = Vec::new();
    let get = |target: &str, method: &str| {
        format!("{method} {target} HTTP/1.1\r\nHost: x\r\nX-Api-Key: wire\r\n\r\n")
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
    conn.write_all(get("/no-content", "GET").as_bytes())
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
on_both_paths!(framing_on_the_wire_chunked_head_204_and_pipelining);

/// `spillway proxy` (2 s timeout) on `path` in front of a new
/// [`raw_upstream`], with `upgrades` (the default if `None`) and `rules`
/// (YAML from `rules:` on).
async fn proxy_on_raw_upstream(
    path: Path,
    upgrades: Option<&str>,
    rules: &str,
) -> (Server, TempDir) {
    let up = raw_upstream().await;
    let upgrades = upgrades.map_or(String::new(), |u| format!("  upgrades: {u}\n"));
    proxy_with(
        path,
        &format!("proxy:\n  upstream: http://{up}\n  timeout: 2s\n{upgrades}{rules}"),
        &[],
    )
}

/// Reads an answer's head byte by byte (nothing after it), in lower case.
async fn read_head(conn: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut byte))
            .await
            .expect("an answer in time")
            .unwrap();
        assert_eq!(
            n,
            1,
            "closed during the head: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

/// Writes each message and reads it back whole (an echo behind a 101).
async fn echoes(conn: &mut TcpStream, messages: &[&[u8]]) {
    for message in messages {
        conn.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut back))
            .await
            .expect("the echo in time")
            .unwrap();
        assert_eq!(back, *message);
    }
}

/// An upgrade (WebSocket and the like) goes through: the handshake is
/// decided and forwarded with its hop-by-hop headers, and after the 101
/// the bytes flow both ways, in several exchanges.
async fn an_upgrade_is_joined_through_to_the_upstream(path: Path) {
    let (s, _dir) = proxy_on_raw_upstream(
        path,
        Some("[websocket, echo]"),
        "rules:\n  - name: ws\n    api: GET /upgrade\n    limits: [ { fixed_window: { limit: 1, window: 1h } } ]\n",
    )
    .await;
    let handshake =
        b"GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    conn.write_all(handshake).await.unwrap();
    let head = read_head(&mut conn).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    assert!(head.contains("ratelimit-policy:"), "{head}");
    echoes(&mut conn, &[b"ping", b"a longer second message"]).await;
    // The handshake was decided like any request: a second is over the limit.
    let (status, _, _) = exchange(&s.addr, handshake).await;
    assert_eq!(status, 429);
}
on_both_paths!(an_upgrade_is_joined_through_to_the_upstream);

/// A WebSocket handshake is passed through with the default settings (no
/// `upgrades:`), and the frames after the 101 flow both ways.
async fn a_websocket_upgrade_still_works(path: Path) {
    let (s, _dir) = proxy_on_raw_upstream(path, None, "rules: []\n").await;
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    conn.write_all(
        b"GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let head = read_head(&mut conn).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    // A masked text frame "hi", then a longer one: opaque bytes to the proxy.
    echoes(
        &mut conn,
        &[
            &[0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2],
            &[0x81, 0x85, 0, 0, 0, 0, b'h', b'e', b'l', b'l', b'o'],
        ],
    )
    .await;
}
on_both_paths!(a_websocket_upgrade_still_works);

async fn unusual_upstream_answers_and_connections_it_closed(path: Path) {
    let (s, _dir) = proxy_on_raw_upstream(path, None, "rules: []\n").await;
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
on_both_paths!(unusual_upstream_answers_and_connections_it_closed);

// ------------------------------------------- what the proxy refuses

/// A request without `Host`, with two, or with one that is not a host is
/// the client's 400 (problem+json), answered by the proxy: it never
/// reaches the upstream, which would pick a host of its own.
async fn requests_without_one_valid_host_are_refused_before_the_upstream(path: Path) {
    let (s, up, _dir) = start(path, "10.0.0.0/8").await;
    for (target, host_lines) in [
        ("/no-host", ""),
        ("/two-hosts", "Host: a.example\r\nHost: b.example\r\n"),
        ("/bad-host-space", "Host: a b.example\r\n"),
        ("/bad-host-at", "Host: user@a.example\r\n"),
        ("/bad-host-port", "Host: a.example:port\r\n"),
    ] {
        let req = format!("GET {target} HTTP/1.1\r\n{host_lines}X-Api-Key: h\r\n\r\n");
        let (status, headers, body) = exchange(&s.addr, req.as_bytes()).await;
        assert_eq!(status, 400, "{target}: {body}");
        assert_eq!(
            headers.get("content-type").map(String::as_str),
            Some("application/problem+json"),
            "{target}"
        );
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["status"], 400, "{target}: {body}");
        assert_eq!(up.count(target), 0, "{target} reached the upstream");
    }
    // The same request with one good Host goes through.
    let (status, _, body) = exchange(
        &s.addr,
        b"GET /one-host HTTP/1.1\r\nHost: a.example\r\n\r\n",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(up.count("/one-host"), 1);
}
on_both_paths!(requests_without_one_valid_host_are_refused_before_the_upstream);

/// The proxy's own 429 and 502 answers to HEAD carry no body (a body
/// would be read as the start of the next answer on the connection).
async fn the_proxys_own_429_and_502_answers_to_head_have_no_body(path: Path) {
    let (s, _up, _dir) = start(path, "10.0.0.0/8").await;
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    let mut buf = Vec::new();
    let req = |method: &str, target: &str| {
        format!("{method} {target} HTTP/1.1\r\nHost: x\r\nX-Api-Key: head\r\n\r\n")
    };
    for want in [200, 200, 200, 429] {
        conn.write_all(req("HEAD", "/hello").as_bytes())
            .await
            .unwrap();
        let (status, headers, _) = read_response(&mut conn, &mut buf, true).await;
        assert_eq!(status, want);
        if want == 429 {
            assert_eq!(
                headers.get("content-type").map(String::as_str),
                Some("application/problem+json")
            );
        }
    }
    // The next answer on the connection starts right after that head.
    conn.write_all(req("GET", "/other").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    let port = spillway_testkit::free_port();
    let (down, _down_dir) = proxy_with(
        path,
        &rules(&format!("http://127.0.0.1:{port}"), "10.0.0.0/8"),
        &[],
    );
    let mut conn = TcpStream::connect(&down.addr).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(req("HEAD", "/anything").as_bytes())
        .await
        .unwrap();
    let (status, _, _) = read_response(&mut conn, &mut buf, true).await;
    assert_eq!(status, 502);
    conn.write_all(req("GET", "/anything").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("\"status\":502"), "{body}");
    assert!(
        buf.is_empty(),
        "stray bytes: {:?}",
        String::from_utf8_lossy(&buf)
    );
}
on_both_paths!(the_proxys_own_429_and_502_answers_to_head_have_no_body);

/// `Upgrade: h2c` is never passed through: the request is served as a
/// plain HTTP/1.1 request (no 101, no tunnel), the upstream sees no
/// `Upgrade` or `HTTP2-Settings`, and the connection carries the next
/// request as usual.
async fn an_h2c_upgrade_is_served_as_a_plain_request(path: Path) {
    let (s, up, _dir) = start(path, "10.0.0.0/8").await;
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(
        b"GET /h2c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n\
          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    )
    .await
    .unwrap();
    let (status, headers, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (200, "ok"), "{headers:?}");
    assert!(!headers.contains_key("upgrade"), "{headers:?}");
    let seen = only(&up, "/h2c");
    assert_eq!(seen.header("upgrade"), None, "{seen:#?}");
    assert_eq!(seen.header("http2-settings"), None, "{seen:#?}");
    assert!(
        !seen
            .all("connection")
            .iter()
            .any(|v| v.to_ascii_lowercase().contains("upgrade")),
        "{seen:#?}"
    );
    conn.write_all(b"GET /after-h2c HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut conn, &mut buf, false).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(up.count("/after-h2c"), 1);
}
on_both_paths!(an_h2c_upgrade_is_served_as_a_plain_request);

/// A user field sent twice is the client's 400: the limit could not tell
/// which one counts ("count when in doubt" would pick one the client
/// chose). Two `X-Api-Key` headers with `user: header:X-Api-Key`, and
/// `?key=a&key=b` with `user: query:key`; neither reaches the upstream.
async fn a_user_field_sent_twice_is_refused(path: Path) {
    let (s, up, _dir) = start(path, "10.0.0.0/8").await;
    let (status, _, body) = exchange(
        &s.addr,
        b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Api-Key: a\r\nX-Api-Key: b\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"status\":400"), "{body}");
    assert_eq!(up.count("/hello"), 0);

    let up = HttpUpstream::start().await;
    let (q, _q_dir) = proxy_with(
        path,
        &format!(
            "proxy:\n  upstream: {}\n  user: query:key\nrules:\n  - name: by-key\n    api: /q\n    by: user\n    limits: [ {{ fixed_window: {{ limit: 5, window: 1h }} }} ]\n",
            up.url()
        ),
        &[],
    );
    let (status, _, body) =
        exchange(&q.addr, b"GET /q?key=a&key=b HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(up.count("/q"), 0);
    let (status, headers, _) = exchange(&q.addr, b"GET /q?key=a HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("x-ratelimit-remaining").map(String::as_str),
        Some("4")
    );
    assert_eq!(up.count("/q"), 1);
}
on_both_paths!(a_user_field_sent_twice_is_refused);

/// A streamed answer (server-sent events) reaches the client as it is
/// written: the upstream holds its second event until the client has the
/// first, so a proxy that waited for the end would never deliver it.
/// Ordering, not timing: the deadlines are generous (the proxy's timeout
/// here is 5 s).
async fn a_streamed_answer_reaches_the_client_as_it_is_written(path: Path) {
    let (s, up, _dir) = start_timed(path, "10.0.0.0/8", "5s").await;
    for c in [client(), h2_client()] {
        let mut r = c.get(s.url("/events")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(header(r.headers(), "content-type"), "text/event-stream");
        let mut got = Vec::new();
        while !got.ends_with(b"data: first\n\n") {
            let chunk = tokio::time::timeout(Duration::from_secs(10), r.chunk())
                .await
                .expect("the first event while the upstream holds the rest")
                .expect("a readable body")
                .expect("the body goes on after the first event");
            got.extend_from_slice(&chunk);
        }
        up.release();
        let rest = tokio::time::timeout(Duration::from_secs(10), r.bytes())
            .await
            .expect("the rest once the upstream sends it")
            .unwrap();
        got.extend_from_slice(&rest);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "data: first\n\ndata: second\n\n"
        );
    }
}
on_both_paths!(a_streamed_answer_reaches_the_client_as_it_is_written);

/// Rules that charge what the answer says it cost (`x-tokens-used`), on a
/// budget of 1,000 tokens an hour per user.
fn token_rules(upstream: &str) -> String {
    format!(
        r#"
proxy:
  upstream: {upstream}
  user: header:X-Api-Key
rules:
  - name: tokens
    by: user
    cost: {{ response_header: X-Tokens-Used }}
    limits:
      - token_bucket: {{ capacity: 1000, refill: 1000/1h }}
"#
    )
}

/// Issue 16: answers that cost 600 tokens each, on 1,000 an hour: each
/// request is checked before it goes up and charged when the answer's
/// header (or, streamed, its trailer) says what it cost, past the budget
/// if need be, so exactly two are served, not ten. (On the direct
/// configuration such requests are handed to the hyper transport, which
/// reads trailers.)
async fn costs_from_the_answer_are_charged_after_it(path: Path) {
    let up = HttpUpstream::start().await;
    let (s, _dir) = proxy_with(path, &token_rules(&up.url()), &[]);
    let c = client();
    for (user, route) in [("alice", "/tokens/600"), ("bob", "/trailer-tokens/600")] {
        let mut served = 0;
        for i in 0..10 {
            let r = c
                .get(s.url(route))
                .header("x-api-key", user)
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body = r.text().await.unwrap();
            match status.as_u16() {
                200 => served += 1,
                429 => {}
                other => panic!("{user} {i}: {other} {body}"),
            }
        }
        assert_eq!(served, 2, "{user} on {route}");
        assert_eq!(up.count(route), 2, "{route}");
    }
    // A charge is counted against its own user only.
    let r = c
        .get(s.url("/tokens/1"))
        .header("x-api-key", "carol")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
on_both_paths!(costs_from_the_answer_are_charged_after_it);
