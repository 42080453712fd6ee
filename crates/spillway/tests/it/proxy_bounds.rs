//! Issue 28, the proxy's part: what a client cannot escape or take from
//! the others by the way it talks (leaving before a trailer, many
//! requests at once, a garbage answer retried, an absolute-form target),
//! against the real binary and a real upstream.

use std::time::Duration;

use spillway_testkit::upstream::HttpUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::{Server, TempDir, client, eventually};

/// `spillway proxy --config FILE --threads 1` where FILE holds `yaml`.
fn proxy(yaml: &str) -> (Server, TempDir) {
    let dir = TempDir::new("proxy-bounds");
    let file = dir.write("rules.yaml", yaml);
    let s = Server::start_cmd(
        "proxy",
        &["--config", file.to_str().unwrap(), "--threads", "1"],
    );
    (s, dir)
}

/// 100 tokens an hour per user, each answer charged what its
/// `x-tokens-used` (header or trailer) says, beyond `estimate`.
fn budget(upstream: &str, estimate: u64) -> String {
    format!(
        r#"
proxy:
  upstream: {upstream}
  user: header:X-Api-Key
  timeout: 5s
rules:
  - name: tokens
    by: user
    cost: {{ response_header: X-Tokens-Used, estimate: {estimate} }}
    limits:
      - token_bucket: {{ capacity: 100, refill: 100/1h }}
"#
    )
}

/// Whether `user` is refused now (a probe that costs nothing).
async fn refused(s: &Server, user: &str) -> bool {
    let r = client()
        .get(s.url("/tokens/0"))
        .header("x-api-key", user)
        .send()
        .await
        .unwrap();
    r.status() == 429
}

/// Issue 28: five requests of 50 tokens on a 100-token budget, each
/// client closing its HTTP/1.1 connection once the body is in and before
/// the trailer (sent `upstream::LATE` after it) that says what it cost: the proxy
/// reads on to the trailer and charges it, so the key ends in debt (it was
/// charged 0 before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_trailer_cost_is_charged_when_an_http1_client_leaves_first() {
    let up = HttpUpstream::start().await;
    let (s, _dir) = proxy(&budget(&up.url(), 0));
    let addr = s.url("").trim_start_matches("http://").to_string();
    for i in 0..5 {
        let mut conn = TcpStream::connect(&addr).await.unwrap();
        conn.write_all(
            b"GET /late-trailer-tokens/50 HTTP/1.1\r\nhost: x\r\nx-api-key: leaver\r\n\r\n",
        )
        .await
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("streamed tokens") {
            let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
                .await
                .expect("the body within 10 s")
                .unwrap();
            assert!(
                n > 0,
                "{i}: closed early: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200"), "{i}");
        // Gone before the trailer.
        drop(conn);
    }
    assert_eq!(up.count("/late-trailer-tokens/50"), 5);
    eventually("the trailers' 250 tokens charged", || refused(&s, "leaver")).await;
    assert!(
        !refused(&s, "stayer").await,
        "a charge is its own key's only"
    );
}

/// The same over HTTP/2: each client resets its stream (RST_STREAM) once
/// the body is in, before the trailer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_trailer_cost_is_charged_when_an_h2_client_resets_first() {
    let up = HttpUpstream::start().await;
    let (s, _dir) = proxy(&budget(&up.url(), 0));
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for i in 0..5 {
        let mut r = h2
            .get(s.url("/late-trailer-tokens/50"))
            .header("x-api-key", "leaver")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{i}");
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        let first = r.chunk().await.unwrap().unwrap_or_default();
        assert_eq!(&first[..], b"streamed tokens", "{i}");
        // Dropped before its end: the stream is reset.
        drop(r);
    }
    assert_eq!(up.count("/late-trailer-tokens/50"), 5);
    eventually("the trailers' 250 tokens charged", || refused(&s, "leaver")).await;
}

/// Issue 28: 20 requests of a fresh key at once, each answer costing 50
/// tokens on a budget of 100. With the estimate (50) charged at
/// admission, at most two pass, however the requests interleave; with
/// none (estimate 0: only checked), all 20 pass before the first charge
/// lands, which is why the estimate exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_pass_no_more_than_the_budget_with_an_estimate() {
    let up = HttpUpstream::start().await;
    let (s, _dir) = proxy(&budget(&up.url(), 50));
    let c = client();
    let sends = (0..20).map(|_| {
        c.get(s.url("/late-trailer-tokens/50"))
            .header("x-api-key", "fresh")
            .send()
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut served = 0;
    for r in answers {
        let r = r.unwrap();
        match r.status().as_u16() {
            200 => served += 1,
            429 => {}
            other => panic!("{other}: {}", r.text().await.unwrap()),
        }
    }
    assert_eq!(served, 2, "the budget holds two answers of 50");
    assert_eq!(up.count("/late-trailer-tokens/50"), 2);
}

/// An upstream written by hand that counts the request heads it reads
/// (by request line) and answers `/garbage` with bytes that are not HTTP
/// (then closes), anything else `ok` on a kept connection.
async fn garbage_upstream() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let line = head.lines().next().unwrap_or("").to_string();
                    let garbage = line.contains("/garbage");
                    log.lock().unwrap().push(line);
                    if garbage {
                        let _ = conn.write_all(b"NOT HTTP AT ALL\r\n\r\n").await;
                        return;
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if conn.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Issue 28: an idempotent PUT answered with garbage on a kept upstream
/// connection was sent a second time on a new one (the upstream acted on
/// it twice). It is retried only when the connection closed before any
/// byte of the answer; here the upstream receives it exactly once, and
/// the client gets 502. On both transports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_request_answered_with_garbage_is_sent_upstream_once() {
    for server in ["", "server: { direct_path: false }\n"] {
        let (addr, seen) = garbage_upstream().await;
        let (s, _dir) = proxy(&format!(
            "{server}proxy:\n  upstream: http://{addr}\n  timeout: 5s\nrules: []\n"
        ));
        let c = client();
        // A kept connection in the proxy's pool first.
        let r = c.get(s.url("/warm")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{server}");
        let r = c.put(s.url("/garbage")).body("x").send().await.unwrap();
        assert_eq!(r.status(), 502, "{server}");
        let puts = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("PUT /garbage"))
            .count();
        assert_eq!(puts, 1, "{server:?}: {:?}", seen.lock().unwrap());
    }
}

/// Sends `request` (which asks to close) on a fresh connection and
/// returns the answer's status code.
async fn status_of(s: &Server, request: &str) -> u16 {
    let addr = s.url("").trim_start_matches("http://").to_string();
    let mut conn = TcpStream::connect(&addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut got))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    text.get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{request:?}: {text}"))
}

/// Issue 28: an absolute-form target (`GET http://x/a`, which RFC 9112
/// §3.2.2 says a server MUST accept) was refused. It is now served as
/// the origin-form request it stands for, its authority in place of
/// `Host`, and counted as that request: under the same route, and under
/// the authority's key for a rule keyed by `Host`, on both transports.
/// What a reverse proxy must not guess at is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_form_target_is_counted_as_its_origin_form() {
    for server in ["", "server: { direct_path: false }\n"] {
        let up = HttpUpstream::start().await;
        let url = up.url();
        let (s, _dir) = proxy(&format!(
            "{server}proxy:\n  upstream: {url}\nrules:\n  - name: per-host\n    api: GET /a\n    \
             by: header:Host\n    limits:\n      - fixed_window: {{ limit: 2, window: 1h }}\n"
        ));
        let get = |target: &str, host: &str| {
            format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
        };
        assert_eq!(status_of(&s, &get("/a", "x")).await, 200, "{server}");
        // Counted under `x` (the authority), not the `Host` sent.
        assert_eq!(
            status_of(&s, &get("http://x/a", "y")).await,
            200,
            "{server}"
        );
        assert_eq!(status_of(&s, &get("/a", "x")).await, 429, "{server}");
        assert_eq!(
            status_of(&s, &get("HTTP://x/b/../a", "x")).await,
            429,
            "{server}"
        );
        assert_eq!(
            status_of(&s, &get("http://y/a?q", "x")).await,
            200,
            "{server}"
        );
        let seen = up.requests_to("/a");
        assert_eq!(seen.len(), 3, "{server}: {seen:#?}");
        assert_eq!(seen[1].header("x-forwarded-host"), Some("x"), "{server}");
        assert_eq!(seen[2].target, "/a?q", "{server}");
        for refused in [
            get("http://u:p@x/a", "x"),
            get("http://x@evil/a", "x"),
            get("ftp://x/a", "x"),
            get("http:///a", "x"),
            get("x:80", "x"),
            get("*", "x"),
            "GET http://x/a HTTP/1.1\r\nConnection: close\r\n\r\n".to_string(),
            "GET http://x/a HTTP/1.1\r\nHost: x\r\nHost: y\r\nConnection: close\r\n\r\n".into(),
        ] {
            assert_eq!(status_of(&s, &refused).await, 400, "{server}{refused:?}");
        }
        assert_eq!(up.requests().len(), 3, "{server}: nothing refused went up");
    }
}

/// The most connections a [`counting_upstream`] had open at once.
#[derive(Debug, Default)]
struct Connections {
    most: std::sync::atomic::AtomicUsize,
}

/// An upstream written by hand that answers every request `ok` after
/// `delay`, on kept connections, and records the most connections it had
/// open at once. Counted when one is accepted: of the ones before, those
/// whose peer has closed (a non-blocking peek on a duplicate of the socket
/// reads its end) no longer count, so a proxy that closed a connection
/// before opening the next is not charged for both, whichever task runs
/// first here.
async fn counting_upstream(delay: Duration) -> (std::net::SocketAddr, std::sync::Arc<Connections>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = std::sync::Arc::new(Connections::default());
    let counted = count.clone();
    tokio::spawn(async move {
        let mut live: Vec<std::net::TcpStream> = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            let std_conn = conn.into_std().unwrap();
            live.retain(|c| {
                let mut probe = [0u8; 1];
                match c.peek(&mut probe) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                }
            });
            live.push(std_conn.try_clone().unwrap());
            counted
                .most
                .fetch_max(live.len(), std::sync::atomic::Ordering::SeqCst);
            let mut conn = tokio::net::TcpStream::from_std(std_conn).unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        tokio::time::sleep(delay).await;
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if conn.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, count)
}

/// Issue 28: 100 h2c connections with slow requests made the proxy open
/// 19,888 upstream connections. With `proxy.upstream.max_connections: 2`,
/// twelve concurrent slow requests (over HTTP/1.1 on the direct path, and
/// over HTTP/2 on the hyper one) never hold more than two upstream
/// connections: the rest wait for one within `proxy.timeout`, then get
/// 503 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_never_opens_more_upstream_connections_than_its_bound() {
    for h2 in [false, true] {
        let (addr, count) = counting_upstream(Duration::from_millis(700)).await;
        let (s, _dir) = proxy(&format!(
            "proxy:\n  upstream: {{ url: http://{addr}, max_connections: 2 }}\n  \
             timeout: 2s\n  admin_listen: 127.0.0.1:0\nrules: []\n"
        ));
        let c = if h2 {
            reqwest::Client::builder()
                .http2_prior_knowledge()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap()
        } else {
            client()
        };
        let sends = (0..12).map(|_| c.get(s.url("/slow")).send());
        let answers = futures_util::future::join_all(sends).await;
        let (mut served, mut busy) = (0, 0);
        for r in answers {
            let r = r.unwrap();
            match r.status().as_u16() {
                200 => served += 1,
                503 => {
                    assert_eq!(r.headers()["retry-after"], "1", "h2 {h2}");
                    busy += 1;
                }
                // Got a connection late, then waited its head too long.
                504 => {}
                other => panic!("h2 {h2}: {other} {}", r.text().await.unwrap()),
            }
        }
        let most = count.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most <= 2, "h2 {h2}: {most} upstream connections at once");
        assert!(served >= 2, "h2 {h2}: {served} served");
        assert!(busy >= 1, "h2 {h2}: none waited past the timeout");
        let admin = s.listener("admin API");
        let metrics = client()
            .get(format!("http://{admin}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("\nspillway_upstream_connections_max 2\n"),
            "{metrics}"
        );
        let open: u32 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("spillway_upstream_connections "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no gauge in {metrics}"));
        assert!(open <= 2, "h2 {h2}: {open} open");
    }
}

/// A request body that sends its first piece, then nothing until the
/// test ends (a slow-body client).
struct Trickle(Option<bytes::Bytes>, tokio::sync::oneshot::Receiver<()>);

impl hyper::body::Body for Trickle {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        if let Some(b) = self.0.take() {
            return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(b))));
        }
        std::pin::Pin::new(&mut self.1).poll(cx).map(|_| None)
    }
}

/// Issue 28: slow-body clients (an HTTP/1.1 chunked body, HTTP/2 streams,
/// an HTTP/1.1 body shorter than its length) held the only in-flight
/// slot and the only upstream connection while they trickled, so a
/// legitimate client got 503. Bodies up to `proxy.buffer_body` are now
/// read whole first: the legitimate client is answered. With
/// `buffer_body: 0` (no buffering) the same attack still wins, which shows
/// the test can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_slot_and_no_upstream_connection() {
    for (buffer, want) in [("", 200), ("\n  buffer_body: 0", 503)] {
        let up = HttpUpstream::start().await;
        let (s, _dir) = proxy(&format!(
            "proxy:\n  upstream: {{ url: {}, max_connections: 1 }}\n  timeout: 10s\n  \
             concurrency: {{ limit: 1, queue: {{ max_wait: 500ms }} }}{buffer}\nrules: []\n",
            up.url()
        ));
        let addr = s.url("").trim_start_matches("http://").to_string();
        let mut held = Vec::new();
        // HTTP/1.1, chunked (the hyper transport), one chunk then nothing.
        let mut chunked = TcpStream::connect(&addr).await.unwrap();
        chunked
            .write_all(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            )
            .await
            .unwrap();
        // HTTP/1.1 with a length (the direct transport), cut short.
        let mut short = TcpStream::connect(&addr).await.unwrap();
        short
            .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhello")
            .await
            .unwrap();
        // HTTP/2: two streams of one connection, one piece each.
        let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http::<Trickle>();
        for _ in 0..2 {
            let (stop, hold) = tokio::sync::oneshot::channel();
            let req = hyper::Request::post(s.url("/echo"))
                .body(Trickle(Some(bytes::Bytes::from_static(b"hello")), hold))
                .unwrap();
            let sent = h2.request(req);
            held.push((stop, tokio::spawn(sent)));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let c = client();
        let r = c.get(s.url("/hello")).send().await.unwrap();
        assert_eq!(r.status(), want, "buffer_body {buffer:?}: HTTP/1.1");
        let h2c = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        let r = h2c.post(s.url("/echo")).body("hi").send().await.unwrap();
        assert_eq!(r.status(), want, "buffer_body {buffer:?}: HTTP/2");
        if want == 200 {
            assert_eq!(r.text().await.unwrap(), "hi");
            // The slow bodies never reached the upstream.
            assert_eq!(up.count("/echo"), 1);
        }
        drop((chunked, short, held));
    }
}

/// Issue 28: with `proxy.concurrency: { limit: 64 }` an attacker holding
/// every slot and queueing more turned every legitimate request into a
/// 503. Slots are now shared between client addresses while requests
/// wait: a network that keeps the queue full (here 30 senders of 400 ms
/// requests on 2 slots, from 127.0.0.1) does not keep another
/// (127.0.1.2) out; each of the other's requests gets the next freed
/// slot, ahead of the flood (first come, first served, it waited behind
/// 28 requests, 5.6 s, past `max_wait`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_every_in_flight_slot() {
    let (addr, _) = counting_upstream(Duration::from_millis(400)).await;
    let (s, _dir) = proxy(&format!(
        "proxy:\n  upstream: http://{addr}\n  timeout: 10s\n  \
         concurrency: {{ limit: 2, queue: {{ max_wait: 2s }} }}\nrules: []\n"
    ));
    let flood_client = client();
    let url = s.url("/flood");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Thirty senders, each sending again as soon as it is answered: the
    // queue stays full of the flood's requests, with fresh deadlines.
    let flood: Vec<_> = (0..30)
        .map(|_| {
            let (c, url, stop) = (flood_client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut shed = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if c.get(&url).send().await.unwrap().status() == 503 {
                        shed += 1;
                    }
                }
                shed
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Another network (slots are shared by /24, not by address: 127.0.0.2
    // would be the flood's own network).
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 1, 2]))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for i in 0..3 {
        let r = other.get(s.url("/legit")).send().await.unwrap();
        assert_eq!(r.status(), 200, "request {i} of the other address");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut shed = 0;
    for f in flood {
        shed += f.await.unwrap();
    }
    assert!(shed > 0, "the flood was shed in part: it did wait its turn");
}
