//! No way past a limit, no way to take the limiter down: slow and idle
//! clients, descriptor exhaustion, hostile costs, strict query decoding,
//! a flooded key table, a full Redis, the admin endpoints off the public
//! port. Each test is named after what an attacker tried.

use std::time::{Duration, Instant};

use serde_json::json;
use spillway_testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::{self, Server, TempDir, check, client};

/// A file with one tight rule by user and the given extra sections.
fn rules(extra: &str) -> String {
    format!(
        "{extra}\nrules:\n  - name: login\n    by: user\n    limits:\n      - sliding_window_counter: {{ limit: 2, window: 1h }}\n"
    )
}

fn start(extra: &str) -> (Server, TempDir) {
    let dir = TempDir::new("hardening");
    let file = dir.write("rules.yaml", &rules(extra));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    (s, dir)
}

/// As [`start`], with a gRPC listener too, and its address.
fn start_with_grpc(extra: &str) -> (Server, String, TempDir) {
    let dir = TempDir::new("hardening-grpc");
    let file = dir.write("rules.yaml", &rules(extra));
    let s = Server::start(&[
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let grpc = s.listener("gRPC");
    (s, grpc, dir)
}

/// Reads until the peer closes (true) or `limit` passes (false).
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> bool {
    read_until_closed(conn, limit, &mut Vec::new()).await
}

/// As [`closed_within`], keeping what was read.
async fn read_until_closed(conn: &mut TcpStream, limit: Duration, into: &mut Vec<u8>) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(n)) => into.extend_from_slice(&buf[..n]),
        }
    }
}

/// The types of the HTTP/2 frames in `bytes` (a server's side of a
/// connection, from its first frame).
fn frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

/// A head trickled one byte at a time never completes: the whole head has
/// a deadline, not each read (before, 30 s per read let it live forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_head_is_cut_at_the_head_deadline() {
    for direct in ["true", "false"] {
        let (s, _d) = start(&format!(
            "server: {{ head_timeout: 1s, idle_timeout: 30s, direct_path: {direct} }}"
        ));
        let mut conn = TcpStream::connect(&s.addr).await.unwrap();
        let started = Instant::now();
        let head = b"GET /v1/limit?key=a HTTP/1.1\r\nX-Slow: ";
        let mut closed = false;
        // Far more bytes than fit in the deadline, one every 200 ms.
        for b in head
            .iter()
            .chain(b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter())
        {
            if conn.write_all(&[*b]).await.is_err() {
                closed = true;
                break;
            }
            if closed_within(&mut conn, Duration::from_millis(200)).await {
                closed = true;
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "direct_path {direct}: still open after 20 s of trickling"
            );
        }
        assert!(
            closed,
            "direct_path {direct}: a trickled head was never cut"
        );
    }
}

/// A connection that sends nothing is closed after the idle timeout, so
/// idle sockets cannot pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed() {
    for direct in ["true", "false"] {
        let (s, _d) = start(&format!(
            "server: {{ idle_timeout: 1s, direct_path: {direct} }}"
        ));
        // Idle from the start, and idle after one answered request.
        let mut fresh = TcpStream::connect(&s.addr).await.unwrap();
        assert!(
            closed_within(&mut fresh, Duration::from_secs(20)).await,
            "direct_path {direct}: a silent connection stayed open"
        );
        let mut used = TcpStream::connect(&s.addr).await.unwrap();
        used.write_all(b"GET /v1/limit?key=a HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(
            closed_within(&mut used, Duration::from_secs(20)).await,
            "direct_path {direct}: a kept-alive connection stayed open"
        );
    }
}

/// A client that sends requests and never reads the answers does not hold
/// the server: the write timeout ends the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_at_the_write_timeout() {
    let (s, _d) = start("server: { write_timeout: 1s }");
    let conn = TcpStream::connect(&s.addr).await.unwrap();
    let (_read_half, mut write_half) = conn.into_split();
    let one = b"GET /v1/limit?key=reader HTTP/1.1\r\nHost: x\r\n\r\n";
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 512).collect();
    let started = Instant::now();
    let cut = loop {
        match tokio::time::timeout(Duration::from_secs(30), write_half.write_all(&batch)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break true,
            Err(_) => break false,
        }
        if started.elapsed() > Duration::from_secs(60) {
            break false;
        }
    };
    assert!(
        cut,
        "the server kept a connection whose answers were never read"
    );
}

/// With the descriptor limit lowered (systemd's 1,024, here 128), a crowd
/// of idle sockets does not stop a new client from being answered: the
/// cap is below the limit, and at the cap the connection that waited
/// longest for a request makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_cannot_use_up_the_descriptors() {
    let dir = TempDir::new("nofile");
    let file = dir.write("rules.yaml", &rules("server: { idle_timeout: 5m }"));
    let s = Server::start_wrapped(
        &["prlimit", "--nofile=128:128", "--"],
        "serve",
        &["--config", file.to_str().unwrap()],
    );
    let mut idle = Vec::new();
    for _ in 0..400 {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&s.addr)).await {
            Ok(Ok(c)) => idle.push(c),
            _ => break,
        }
    }
    let c = client();
    let r = c
        .get(s.url("/v1/limit?key=newcomer"))
        .send()
        .await
        .expect("a new client is answered");
    assert_eq!(r.status(), 200);
    drop(idle);
}

/// A cost no limit can ever admit is a plain 429 on every way in, never a
/// store error that the default fail-open policy would admit (it was, on
/// Redis: 4294967297 against a limit of 10 answered 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_cost_is_denied_on_both_stores() {
    let redis = RedisServer::start();
    for store in [
        "memory".to_string(),
        format!("{{ redis: {{ url: {} }} }}", redis.url()),
    ] {
        let (s, _d) = start(&format!("store: {store}\non_store_error: allow"));
        let c = client();
        for cost in [4_294_967_297u64, u64::MAX, 3] {
            let (status, _, j) = check(&c, &s, json!({"user": "u", "cost": cost})).await;
            assert_eq!(status, 429, "{store}, cost {cost}: {j}");
            assert_eq!(j["store_error"], false, "{store}, cost {cost}: {j}");
            let r = c
                .get(s.url(&format!("/v1/limit?key=u&cost={cost}")))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 429, "{store}, /v1/limit cost {cost}");
        }
        // The refused costs charged nothing.
        let (status, _, j) = check(&c, &s, json!({"user": "u", "cost": 2})).await;
        assert_eq!(status, 200, "{store}: {j}");
    }
}

/// Query values are decoded strictly: a `%` escape that is not UTF-8 is a
/// 400 (decoded lossily, distinct keys shared one counter), and so is a
/// key given twice (which one counts would be a guess).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_keys_are_decoded_strictly() {
    let (s, _d) = start("");
    let c = client();
    for q in [
        "key=%FF",
        "key=%C3",
        "key=a&key=b",
        "cost=1&cost=2",
        "cost=-1",
    ] {
        let r = c
            .get(s.url(&format!("/v1/limit?{q}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert_eq!(ct, "application/problem+json", "{q}");
    }
    // A real U+FFFD, escaped properly, is a key like any other.
    let r = c
        .get(s.url("/v1/limit?key=%EF%BF%BD"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A limited client stays limited however many fresh keys an attacker
/// sends to fill the table (eviction used to pick the denied client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_does_not_readmit_a_limited_user() {
    let (s, _d) = start("store: { memory: { max_keys: 50 } }");
    let c = client();
    for _ in 0..2 {
        let (status, _, _) = check(&c, &s, json!({"user": "victim-target"})).await;
        assert_eq!(status, 200);
    }
    let (status, _, _) = check(&c, &s, json!({"user": "victim-target"})).await;
    assert_eq!(status, 429);
    for i in 0..1500 {
        let (status, _, j) = check(&c, &s, json!({"user": format!("fresh-{i}")})).await;
        assert!(status == 200 || status == 429, "{j}");
        if i % 100 == 0 {
            let (status, _, j) = check(&c, &s, json!({"user": "victim-target"})).await;
            assert_eq!(status, 429, "re-admitted after {i} fresh keys: {j}");
        }
    }
    let metrics = util::text(c.get(s.url("/metrics"))).await;
    assert!(
        metrics.contains("spillway_memory_overflow_decisions_total"),
        "{metrics}"
    );
}

/// A Redis that refuses writes (maxmemory reached, noeviction) is no
/// silent fail-open: /readyz says degraded and why, the breaker opens, and
/// each rule's failure policy decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_is_visible_and_decided_by_policy() {
    let redis = RedisServer::start();
    let (s, _d) = start(&format!(
        "store: {{ redis: {{ url: {}, timeout: 5s, breaker_failures: 2, probe_interval: 200ms }} }}\non_store_error: deny",
        redis.url()
    ));
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(30);
    while util::json(c.get(s.url("/readyz"))).await["status"] != "ready" {
        assert!(Instant::now() < deadline, "never connected to redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _, _) = check(&c, &s, json!({"user": "a"})).await;
    assert_eq!(status, 200);
    redis.cli(&["SETRANGE", "filler", "2000000", "x"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1mb"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut denied = 0;
    loop {
        let (status, _, j) = check(&c, &s, json!({"user": "a"})).await;
        if status == 429 && j["store_error"] == true {
            denied += 1;
        }
        let ready = util::json(c.get(s.url("/readyz"))).await;
        if denied > 0 && ready["status"] == "degraded" {
            assert!(
                ready["reason"].as_str().unwrap_or("").contains("OOM"),
                "{ready}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never degraded: {ready} {j}");
    }
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = util::json(c.get(s.url("/readyz"))).await;
        if ready["status"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {ready}");
        let _ = check(&c, &s, json!({"user": "b"})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With admin_listen, metrics, status and rules leave the decision port
/// (which may face the internet); health stays on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_leave_the_decision_port_when_asked() {
    let (s, _d) = start("admin_listen: 127.0.0.1:0");
    let admin = s.listener("admin API");
    let c = client();
    for path in ["/metrics", "/v1/rules", "/v1/status"] {
        let public = c.get(s.url(path)).send().await.unwrap().status();
        assert_eq!(public, 404, "{path} on the decision port");
        let private = c
            .get(format!("http://{admin}{path}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(private, 200, "{path} on the admin port");
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(c.get(s.url(path)).send().await.unwrap().status(), 200);
    }
    let (status, _, _) = check(&c, &s, json!({"user": "a"})).await;
    assert_eq!(status, 200);
}

/// A client's malformed chunked body is the client's 400, not a 502
/// counted against the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_is_a_400_not_an_upstream_error() {
    let app = axum::Router::new().fallback(|body: axum::body::Bytes| async move { body });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    let dir = TempDir::new("bad-chunks");
    let file = dir.write(
        "rules.yaml",
        &format!(
            "proxy: {{ upstream: http://{up}, admin_listen: 127.0.0.1:0 }}\nrules:\n  - name: all\n    limits: [ {{ fixed_window: {{ limit: 1000, window: 1h }} }} ]\n"
        ),
    );
    let s = Server::start_cmd("proxy", &["--config", file.to_str().unwrap()]);
    let admin = s.listener("admin API");
    let mut conn = TcpStream::connect(&s.addr).await.unwrap();
    conn.write_all(
        b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(head.contains("application/problem+json"), "{head}");
    let metrics = util::text(client().get(format!("http://{admin}/metrics"))).await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("spillway_upstream_errors_total{") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// An HTTP/2 connection with no request in flight is closed at the idle
/// timeout however many PINGs it sends (before, any byte moving pushed the
/// deadline on, so a PING every few seconds held a connection forever),
/// and one that sends only the preface at the head timeout: on the
/// decision port (h2c) and on the gRPC port alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_with_no_request_are_closed_however_they_ping() {
    use spillway_testkit::attack;
    let (s, grpc, _d) = start_with_grpc("server: { head_timeout: 1s, idle_timeout: 4s }");
    for addr in [s.addr.clone(), grpc] {
        // The preface alone: closed at the head timeout (1 s), well
        // before the idle timeout (4 s) would.
        let mut quiet = TcpStream::connect(&addr).await.unwrap();
        quiet.write_all(&attack::preface()).await.unwrap();
        let started = Instant::now();
        assert!(
            closed_within(&mut quiet, Duration::from_secs(20)).await,
            "{addr}: a connection that sent only the preface stayed open"
        );
        assert!(
            started.elapsed() < Duration::from_millis(3500),
            "{addr}: a connection that sent only the preface was closed after {:?}, not at the head timeout",
            started.elapsed()
        );
        // One request answered, then PINGs every 300 ms: closed at the
        // idle timeout all the same.
        let mut pinger = TcpStream::connect(&addr).await.unwrap();
        let mut hello = attack::preface();
        hello.extend(attack::headers(
            1,
            "GET",
            "x",
            "/v1/limit?key=p",
            true,
            true,
        ));
        pinger.write_all(&hello).await.unwrap();
        let started = Instant::now();
        let mut closed = false;
        let mut heard = Vec::new();
        while started.elapsed() < Duration::from_secs(20) {
            if pinger
                .write_all(&attack::frame(6, 0, 0, &[1; 8]))
                .await
                .is_err()
                || read_until_closed(&mut pinger, Duration::from_millis(300), &mut heard).await
            {
                closed = true;
                break;
            }
        }
        // Told first: a GOAWAY (type 7) before the close, so a client
        // sending a call at that moment retries it elsewhere.
        assert!(
            frame_types(&heard).contains(&7),
            "{addr}: closed without a GOAWAY (frames {:?})",
            frame_types(&heard)
        );
        assert!(
            closed,
            "{addr}: a pinging connection with no request stayed open"
        );
    }
}

/// The gRPC port speaks HTTP/2 only, as tonic's own server did: an
/// HTTP/1.1 request gets no answer from a gRPC route and its connection
/// ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_on_the_grpc_port_ends_the_connection() {
    let (_s, grpc, _d) = start_with_grpc("");
    let mut conn = TcpStream::connect(&grpc).await.unwrap();
    conn.write_all(b"GET /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "an HTTP/1.1 request held the gRPC connection open"
    );
    let text = String::from_utf8_lossy(&out);
    assert!(
        !text.starts_with("HTTP/1.1 200"),
        "answered over HTTP/1.1: {text}"
    );
}
