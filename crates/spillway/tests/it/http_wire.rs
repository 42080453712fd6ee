//! The HTTP/1.1 wire, byte by byte, against the real binary: the direct path
//! for the decision endpoints and hyper's must answer alike; pipelined, split
//! and mixed requests on one connection all get their answers.

use std::collections::BTreeMap;
use std::time::Duration;

use spillway_server::config::Source;
use spillway_server::{ServeOptions, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::{Server, TempDir};

const RULES: &str = "
rules:
  - name: one
    by: user
    limits:
      - sliding_window_log: { limit: 1, window: 1h }
";

/// One parsed response.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: serde_json::Value,
}

/// Reads one response (with a Content-Length body) from `conn`, keeping
/// whatever follows in `buf`.
async fn read_answer(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Answer {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head) = resp.parse(buf).expect("a valid response head") {
            let headers: BTreeMap<String, String> = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8(h.value.to_vec()).unwrap(),
                    )
                })
                .collect();
            let status = resp.code.unwrap();
            let len: usize = headers["content-length"].parse().unwrap();
            while buf.len() < head + len {
                read_some(conn, buf).await;
            }
            let body = serde_json::from_slice(&buf[head..head + len]).unwrap();
            buf.drain(..head + len);
            return Answer {
                status,
                headers,
                body,
            };
        }
        read_some(conn, buf).await;
    }
}

async fn read_some(conn: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    assert!(
        n > 0,
        "connection closed early; got {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&chunk[..n]);
}

fn post_check(body: &str) -> String {
    format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The same request with a chunked body, which the direct path leaves to hyper.
fn post_check_chunked(body: &str) -> String {
    format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    )
}

async fn connect(s: &Server) -> TcpStream {
    TcpStream::connect(&s.addr).await.unwrap()
}

/// Everything but what may tick between the two: the date, and times in
/// milliseconds (rounded up to tens of seconds: the times here are 0 or just
/// under an hour).
fn comparable(a: &Answer) -> (u16, BTreeMap<String, String>, serde_json::Value) {
    fn round_ms(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m.iter_mut() {
                    if k.ends_with("_ms") {
                        *v = (v.as_u64().unwrap().div_ceil(10_000)).into();
                    } else {
                        round_ms(v);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(round_ms),
            _ => {}
        }
    }
    let mut h = a.headers.clone();
    let date = h
        .remove("date")
        .unwrap_or_else(|| panic!("a date header: {h:?}"));
    let at = httpdate::parse_http_date(&date).expect("an HTTP date");
    let now = std::time::SystemTime::now();
    let off = now.duration_since(at).unwrap_or_else(|e| e.duration());
    assert!(
        off < std::time::Duration::from_secs(3),
        "date {date} is off by {off:?}"
    );
    let mut body = a.body.clone();
    round_ms(&mut body);
    (a.status, h, body)
}

#[tokio::test]
async fn direct_and_hyper_paths_give_the_same_answers() {
    let dir = TempDir::new("wire");
    let rules = dir.write("rules.yaml", RULES);
    let s = Server::start(&["--config", rules.to_str().unwrap()]);
    let mut buf = Vec::new();
    let mut direct = connect(&s).await;
    let mut hyper = connect(&s).await;
    // Two users in the same state, one per path: admitted, then denied,
    // then a bad body.
    let mut answers = Vec::new();
    for (user, chunked) in [("a", false), ("b", true)] {
        let conn = if chunked { &mut hyper } else { &mut direct };
        let mut got = Vec::new();
        for body in [
            format!(r#"{{"user":"{user}"}}"#),
            format!(r#"{{"user":"{user}"}}"#),
            r#"{"cost": -1}"#.to_string(),
        ] {
            let req = if chunked {
                post_check_chunked(&body)
            } else {
                post_check(&body)
            };
            conn.write_all(req.as_bytes()).await.unwrap();
            got.push(read_answer(conn, &mut buf).await);
        }
        answers.push(got);
    }
    let statuses: Vec<u16> = answers[0].iter().map(|a| a.status).collect();
    assert_eq!(statuses, [200, 429, 400]);
    assert_eq!(answers[0][1].headers["retry-after"], "3600");
    for (d, h) in answers[0].iter().zip(&answers[1]) {
        assert_eq!(comparable(d), comparable(h));
    }
}

#[tokio::test]
async fn pipelined_split_and_mixed_requests_on_one_connection() {
    let s = Server::start(&[]);
    let mut conn = connect(&s).await;
    let mut buf = Vec::new();
    // Two requests in one write.
    let two = format!(
        "{}{}",
        post_check(r#"{"user":"p1"}"#),
        post_check(r#"{"user":"p2"}"#)
    );
    conn.write_all(two.as_bytes()).await.unwrap();
    for _ in 0..2 {
        assert_eq!(read_answer(&mut conn, &mut buf).await.status, 200);
    }
    // One request in small pieces, a little apart so they travel separately.
    let req = post_check(r#"{"user":"split"}"#);
    for piece in req.as_bytes().chunks(7) {
        conn.write_all(piece).await.unwrap();
        conn.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let a = read_answer(&mut conn, &mut buf).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["allowed"], true);
    // The minimal GET form, then another endpoint (hyper takes over the
    // connection), then a decision again on the same connection.
    conn.write_all(b"GET /v1/limit?key=q HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let a = read_answer(&mut conn, &mut buf).await;
    assert_eq!(
        (a.status, &a.body["rule"]),
        (200, &serde_json::json!("default"))
    );
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let a = read_answer(&mut conn, &mut buf).await;
    assert_eq!(
        (a.status, &a.body["status"]),
        (200, &serde_json::json!("ok"))
    );
    conn.write_all(post_check(r#"{"user":"after"}"#).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut conn, &mut buf).await.status, 200);
}

#[tokio::test]
async fn connection_close_is_honoured() {
    let s = Server::start(&[]);
    let mut conn = connect(&s).await;
    let body = r#"{"user":"c"}"#;
    let req = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let a = read_answer(&mut conn, &mut buf).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.headers["connection"], "close");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
        .await
        .expect("closed within 5 s")
        .unwrap();
    assert_eq!((n, buf.len()), (0, 0));
}

#[tokio::test]
async fn malformed_heads_get_hypers_errors_and_never_hang() {
    let s = Server::start(&[]);
    for (req, want) in [
        (&b"GARBAGE\x00\r\n\r\n"[..], 400u16),
        (b"POST /v1/check HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
    ] {
        let mut conn = connect(&s).await;
        conn.write_all(req).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out))
            .await
            .expect("an answer, then close")
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {want}")),
            "{:?}: {text}",
            String::from_utf8_lossy(req)
        );
    }
    // Still serving.
    let mut conn = connect(&s).await;
    conn.write_all(post_check("{}").as_bytes()).await.unwrap();
    assert_eq!(read_answer(&mut conn, &mut Vec::new()).await.status, 200);
}

/// `spillway_server::run` in this process on a free port: its address, the
/// sender that shuts it down, and its task.
async fn in_process(
    source: Source,
    poll_interval: Duration,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let config = ServeOptions::load(&source, &[], false).unwrap();
    let opts = ServeOptions {
        source,
        config,
        poll_interval,
        envoy_files: Vec::new(),
        as_read: None,
        parts: None,
        shutdown_delay: Duration::ZERO,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(opts, listener, async {
        let _ = stopped.await;
    }));
    (addr, stop, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_and_returns() {
    let (addr, stop, server) = in_process(Source::Example, Duration::from_millis(500)).await;
    // A keep-alive connection that has been answered once and now idles.
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    conn.write_all(post_check(r#"{"user":"idle"}"#).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut conn, &mut buf).await.status, 200);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("run returns within 5 s of shutdown")
        .unwrap()
        .unwrap();
    // The idle connection was closed, not left serving.
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
        .await
        .expect("closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_changes_reload_at_once_without_waiting_for_a_poll() {
    let rules = |n: u32| {
        format!(
            "reload: {{ quiet: 300ms }}\nrules:\n  - name: w\n    by: user\n    limits:\n      - fixed_window: {{ limit: {n}, window: 1h }}\n"
        )
    };
    let dir = TempDir::new("watch");
    let file = dir.write("rules.yaml", &rules(5));
    // Polling alone would take an hour.
    let (addr, stop, server) =
        in_process(Source::File(file.clone()), Duration::from_secs(3600)).await;
    let limit_now = || async move {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(post_check(r#"{"user":"w"}"#).as_bytes())
            .await
            .unwrap();
        read_answer(&mut conn, &mut Vec::new()).await.body["limit"].clone()
    };
    assert_eq!(limit_now().await, 5);
    let wait_for = |want: u32| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if limit_now().await == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "limit {want} not loaded"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // Written in place...
    std::fs::write(&file, rules(7)).unwrap();
    wait_for(7).await;
    // ...and replaced by a rename, as editors and config management do.
    let tmp = dir.write("rules.yaml.new", &rules(9));
    std::fs::rename(&tmp, &file).unwrap();
    wait_for(9).await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
