//! End-to-end: spillway-client's `HonourLayer` and its `fetch` example
//! against servers that limit the caller and say so: a third-party server
//! written here (one per header form), the real `spillway serve` and the
//! real `spillway proxy`.
//!
//! The third-party server keeps its own quota and a log of every request
//! it received, so a test can ask it the question that matters: did a
//! request arrive while the server had already said the quota was spent,
//! or before the moment it advised? Timings are only ever lower bounds.

use std::convert::Infallible;
use std::pin::Pin;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper::body::{Body, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use spillway_client::honour::{self, Config, HonourLayer};
use spillway_testkit::upstream::HttpUpstream;
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::util::{Server, TempDir};

/// Slack for lower bounds on waits: clock reads on either side of a
/// socket, and timer rounding. Never an upper bound.
const SLACK: Duration = Duration::from_millis(50);

/// How the third-party server says where the caller stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `Retry-After: <seconds to the window's end, rounded up>`, on 429 only.
    RetryAfterSecs,
    /// `Retry-After: <the window's end as an HTTP date>`, on 429 only.
    RetryAfterDate,
    /// `RateLimit` and `RateLimit-Policy` on every answer, with two
    /// policies: the enforced burst and a day quota that is never spent.
    RateLimit,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds) on every
    /// answer, nothing else.
    XRateLimit,
    /// `Retry-After: N` on 429, whatever the window says.
    FixedRetryAfter(u64),
}

/// One request as the third-party server saw it.
#[derive(Debug, Clone)]
struct Arrival {
    at: SystemTime,
    method: Method,
    status: u16,
    /// The server had already told the caller, before this request, that
    /// the quota of this window was spent.
    after_told: bool,
    /// The latest moment an earlier answer advised waiting for, if any.
    advised_until: Option<SystemTime>,
    api_key: Option<String>,
    body: Vec<u8>,
}

/// The third-party server's quota and log.
#[derive(Debug)]
struct Book {
    form: Form,
    /// Requests admitted per window.
    quota: u32,
    /// The window, in whole seconds, aligned to the Unix epoch (so an HTTP
    /// date, which has one-second resolution, names its end exactly).
    window: u64,
    current: u64,
    used: u32,
    told: bool,
    admitted: u64,
    advised_until: Option<SystemTime>,
    log: Vec<Arrival>,
    /// Answers to `/held` wait for a permit (after being decided and
    /// logged), so a test can order answers.
    hold: Arc<tokio::sync::Semaphore>,
}

/// A third-party API that enforces `quota` requests per `window` seconds
/// itself, answers 429 past it, and says so in `form`.
#[derive(Debug, Clone)]
struct ThirdParty {
    addr: std::net::SocketAddr,
    book: Arc<Mutex<Book>>,
}

/// The day policy's quota in the `RateLimit` form: never reached here, so
/// its long reset must not make the client wait.
const DAY_QUOTA: u64 = 50;

impl ThirdParty {
    async fn start(form: Form, quota: u32, window: u64) -> ThirdParty {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("its address");
        let book = Arc::new(Mutex::new(Book {
            form,
            quota,
            window,
            current: 0,
            used: 0,
            told: false,
            admitted: 0,
            advised_until: None,
            log: Vec::new(),
            hold: Arc::new(tokio::sync::Semaphore::new(0)),
        }));
        let shared = book.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let _ = conn.set_nodelay(true);
                let book = shared.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| answer(book.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        ThirdParty { addr, book }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Lets one answer to `/held` go.
    fn release(&self) {
        self.book.lock().hold.add_permits(1);
    }

    fn log(&self) -> Vec<Arrival> {
        self.book.lock().log.clone()
    }

    /// What went wrong in the log: requests that arrived in a window the
    /// server had already said was spent, or before an advised moment
    /// (less [`SLACK`]).
    fn breaches(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, a) in self.log().iter().enumerate() {
            if a.after_told {
                out.push(format!(
                    "request {i} arrived after the server said the quota was spent"
                ));
            }
            if let Some(until) = a.advised_until.filter(|u| a.at + SLACK < *u) {
                out.push(format!(
                    "request {i} arrived {:?} before the advised moment",
                    until.duration_since(a.at).unwrap_or_default()
                ));
            }
        }
        out
    }

    /// Asserts there are no [`breaches`](ThirdParty::breaches); returns
    /// the number of 429s.
    fn assert_honoured(&self, what: &str) -> usize {
        let breaches = self.breaches();
        let log = self.log();
        assert!(breaches.is_empty(), "{what}: {breaches:#?} in {log:#?}");
        log.iter().filter(|a| a.status == 429).count()
    }
}

/// Reads a whole body (the tests' bodies are small).
async fn read_body<B>(mut body: B) -> Vec<u8>
where
    B: Body + Unpin,
    B::Data: bytes::Buf,
{
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(frame) = frame else { break };
        if let Ok(mut data) = frame.into_data() {
            while bytes::Buf::has_remaining(&data) {
                let chunk = bytes::Buf::chunk(&data);
                out.extend_from_slice(chunk);
                let n = chunk.len();
                bytes::Buf::advance(&mut data, n);
            }
        }
    }
    out
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

async fn answer(
    book: Arc<Mutex<Book>>,
    req: Request<Incoming>,
) -> Result<Response<String>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = read_body(body).await;
    let (resp, hold) = decide(&book, &parts, body);
    if parts.uri.path() == "/held" {
        let _ = hold.acquire().await.map(|p| p.forget());
    }
    Ok(resp)
}

/// Counts, logs and answers one request (see [`Book`]); also returns the
/// semaphore `/held` answers wait on.
fn decide(
    book: &Mutex<Book>,
    parts: &http::request::Parts,
    body: Vec<u8>,
) -> (Response<String>, Arc<tokio::sync::Semaphore>) {
    let mut b = book.lock();
    let now = SystemTime::now();
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let index = since.as_secs() / b.window;
    if index != b.current {
        b.current = index;
        b.used = 0;
        b.told = false;
    }
    let end = UNIX_EPOCH + Duration::from_secs((index + 1) * b.window);
    let to_end = end.duration_since(now).unwrap_or_default();
    let admitted = b.used < b.quota;
    let mut arrival = Arrival {
        at: now,
        method: parts.method.clone(),
        status: if admitted { 200 } else { 429 },
        after_told: b.told,
        advised_until: b.advised_until,
        api_key: parts
            .headers
            .get("x-api-key")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        body,
    };
    if admitted {
        b.used += 1;
        b.admitted += 1;
    }
    let remaining = b.quota - b.used;
    let mut resp = Response::new(if admitted { "ok" } else { "slow down" }.to_string());
    if !admitted {
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    }
    let h = resp.headers_mut();
    let mut put = |k: &'static str, v: String| {
        h.insert(k, v.parse().expect("a header value"));
    };
    // What this answer advises: wait until then.
    let advised = match b.form {
        Form::RetryAfterSecs if !admitted => {
            put("retry-after", ceil_secs(to_end).to_string());
            Some(now + Duration::from_secs(ceil_secs(to_end)))
        }
        Form::RetryAfterDate if !admitted => {
            put("retry-after", httpdate::fmt_http_date(end));
            Some(end)
        }
        Form::FixedRetryAfter(n) if !admitted => {
            put("retry-after", n.to_string());
            Some(now + Duration::from_secs(n))
        }
        Form::RateLimit => {
            put(
                "ratelimit-policy",
                format!(
                    "\"burst\";q={};w={}, \"day\";q={DAY_QUOTA};w=86400",
                    b.quota, b.window
                ),
            );
            put(
                "ratelimit",
                format!(
                    "\"burst\";r={remaining};t={}, \"day\";r={};t=3600",
                    ceil_secs(to_end),
                    DAY_QUOTA.saturating_sub(b.admitted)
                ),
            );
            (remaining == 0).then(|| now + Duration::from_secs(ceil_secs(to_end)))
        }
        Form::XRateLimit => {
            put("x-ratelimit-remaining", remaining.to_string());
            put("x-ratelimit-reset", ceil_secs(to_end).to_string());
            (remaining == 0).then(|| now + Duration::from_secs(ceil_secs(to_end)))
        }
        _ => None,
    };
    if let Some(until) = advised {
        b.told = true;
        b.advised_until = Some(b.advised_until.map_or(until, |u| u.max(until)));
    }
    arrival.status = resp.status().as_u16();
    b.log.push(arrival);
    (resp, b.hold.clone())
}

/// What reached the network under the layer.
#[derive(Debug, Default)]
struct Tally {
    sent: AtomicU64,
    refused: AtomicU64,
}

type ClientError = hyper_util::client::legacy::Error;

/// A hyper-util client under a [`HonourLayer`] with `config`, counting
/// what reaches the network in the returned [`Tally`].
fn honouring(
    config: Config,
) -> (
    impl Service<
        Request<String>,
        Response = Response<Incoming>,
        Error = honour::Error<ClientError>,
        Future: Send,
    > + Clone
    + Send,
    Arc<Tally>,
) {
    let client: Client<HttpConnector, String> = Client::builder(TokioExecutor::new()).build_http();
    let tally = Arc::new(Tally::default());
    let counted = {
        let tally = tally.clone();
        tower::service_fn(move |req: Request<String>| {
            let client = client.clone();
            let tally = tally.clone();
            async move {
                tally.sent.fetch_add(1, Ordering::Relaxed);
                let resp = client.request(req).await?;
                if resp.status() == StatusCode::TOO_MANY_REQUESTS {
                    tally.refused.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, ClientError>(resp)
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(HonourLayer::new(config))
        .service(counted);
    (svc, tally)
}

/// Sends `req` through `svc` and reads the answer's body; the status.
async fn send<S>(
    svc: &mut S,
    req: Request<String>,
) -> Result<StatusCode, honour::Error<ClientError>>
where
    S: Service<Request<String>, Response = Response<Incoming>, Error = honour::Error<ClientError>>,
{
    let resp = svc.ready().await?.call(req).await?;
    let status = resp.status();
    read_body(resp.into_body()).await;
    Ok(status)
}

fn get(url: &str, headers: &[(&str, &str)]) -> Request<String> {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(String::new()).expect("a request")
}

/// Sends `n` GETs to `url` one after another through a default layer;
/// asserts each ends in a 200 and returns the tally and the time taken.
async fn get_n(url: &str, n: usize, headers: &[(&str, &str)]) -> (Arc<Tally>, Duration) {
    let (mut svc, tally) = honouring(Config::default());
    let started = Instant::now();
    for i in 0..n {
        let status =
            tokio::time::timeout(Duration::from_secs(30), send(&mut svc, get(url, headers)))
                .await
                .unwrap_or_else(|_| panic!("request {i} to {url}: no answer within 30 s"))
                .unwrap_or_else(|e| panic!("request {i} to {url}: {e}"));
        assert_eq!(status, StatusCode::OK, "request {i} to {url}");
    }
    (tally, started.elapsed())
}

// --- 1. a third-party server, one test per header form ---

const QUOTA: u32 = 3;
/// Requests per run: more than two windows' quota, so at least three
/// windows are used and the run spans more than one whole window.
const N: usize = 7;

/// Runs [`N`] GETs against a third party answering in `form` and checks
/// that it was honoured; returns the number of 429s it sent.
async fn honoured_against(form: Form) -> usize {
    let tp = ThirdParty::start(form, QUOTA, 1).await;
    let (tally, elapsed) = get_n(&tp.url("/items"), N, &[]).await;
    let refused = tp.assert_honoured(&format!("{form:?}"));
    let log = tp.log();
    assert_eq!(log.len() as u64, tally.sent.load(Ordering::Relaxed));
    assert_eq!(refused as u64, tally.refused.load(Ordering::Relaxed));
    assert_eq!(
        log.iter().filter(|a| a.status == 200).count(),
        N,
        "{log:#?}"
    );
    // Three windows of one second at least: more than one whole window
    // between the first request and the last.
    assert!(
        elapsed + SLACK >= Duration::from_secs(1),
        "{form:?}: {N} requests in {elapsed:?}, within a quota of {QUOTA}/s"
    );
    refused
}

/// Retry-After only comes with a 429, so each window costs one refusal,
/// and after it nothing until the advised time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_in_seconds_is_waited_out_after_each_refusal() {
    let refused = honoured_against(Form::RetryAfterSecs).await;
    // A window with a refusal admitted three first: at most two of them.
    assert!((1..=2).contains(&refused), "{refused} refusals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_as_an_http_date_is_waited_out_after_each_refusal() {
    let refused = honoured_against(Form::RetryAfterDate).await;
    assert!((1..=2).contains(&refused), "{refused} refusals");
}

/// The last admitted answer says `r=0`: the client waits before it is ever
/// refused; the day policy, not spent, imposes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimit_with_several_policies_is_never_refused() {
    assert_eq!(honoured_against(Form::RateLimit).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_ratelimit_remaining_and_reset_are_never_refused() {
    assert_eq!(honoured_against(Form::XRateLimit).await, 0);
}

/// The check itself: a client without the layer, sending as fast as it
/// can, is caught going on after `r=0` and after a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_layer_is_caught_ignoring_the_server() {
    for form in [Form::RateLimit, Form::RetryAfterSecs] {
        let tp = ThirdParty::start(form, QUOTA, 60).await;
        let client: Client<HttpConnector, String> =
            Client::builder(TokioExecutor::new()).build_http();
        for _ in 0..5 {
            let resp = client
                .request(get(&tp.url("/items"), &[]))
                .await
                .expect("an answer");
            read_body(resp.into_body()).await;
        }
        let breaches = tp.breaches();
        assert!(!breaches.is_empty(), "{form:?}: {:#?}", tp.log());
    }
}

// --- 2. the real spillway serve and spillway proxy ---

/// `spillway serve` says `r=0` on the last admitted answer, so the layer
/// never meets its 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spillway_serve_is_never_refused_through_the_layer() {
    let dir = TempDir::new("client-serve");
    let file = dir.write(
        "rules.yaml",
        "rules:\n  - name: per-user\n    by: user\n    limits:\n      - fixed_window: { limit: 3, window: 2s }\n",
    );
    let s = Server::start(&["--config", file.to_str().unwrap(), "--threads", "1"]);
    let (tally, elapsed) = get_n(&s.url("/v1/limit?key=alice"), N, &[]).await;
    assert_eq!(tally.refused.load(Ordering::Relaxed), 0);
    assert_eq!(tally.sent.load(Ordering::Relaxed), N as u64);
    // Seven requests at three per fixed window: three windows, so more
    // than one whole window of 2 s.
    assert!(elapsed + SLACK >= Duration::from_secs(2), "{elapsed:?}");
}

/// Through `spillway proxy`: the upstream receives every request once,
/// and the client meets at most one 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spillway_proxy_is_refused_at_most_once_through_the_layer() {
    let up = HttpUpstream::start().await;
    let dir = TempDir::new("client-proxy");
    let file = dir.write(
        "rules.yaml",
        &format!(
            "proxy:\n  upstream: {}\n  user: header:X-Api-Key\nrules:\n  - name: per-user\n    api: /hello\n    by: user\n    limits:\n      - fixed_window: {{ limit: 3, window: 1s }}\n",
            up.url()
        ),
    );
    let s = Server::start_cmd(
        "proxy",
        &["--config", file.to_str().unwrap(), "--threads", "1"],
    );
    let (tally, elapsed) = get_n(&s.url("/hello"), N, &[("x-api-key", "alice")]).await;
    let refused = tally.refused.load(Ordering::Relaxed);
    assert!(refused <= 1, "{refused} refusals");
    assert_eq!(tally.sent.load(Ordering::Relaxed), N as u64 + refused);
    // Only admitted requests reach the upstream: all N, each once.
    assert_eq!(up.count("/hello"), N);
    assert!(elapsed + SLACK >= Duration::from_secs(1), "{elapsed:?}");
}

// --- 4. non-idempotent requests and 5. the time budget ---

/// A POST refused with 429 is returned as is: the server sees it once.
/// With `retry_non_idempotent` it is sent again, body and all, after the
/// advised wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_post_is_retried_only_when_asked() {
    for (retry, want) in [(false, 1), (true, 2)] {
        let tp = ThirdParty::start(Form::RetryAfterSecs, 0, 1).await;
        let (mut svc, _) = honouring(Config {
            max_retries: 1,
            retry_non_idempotent: retry,
            ..Config::default()
        });
        let req = Request::post(tp.url("/orders"))
            .body("one order".to_string())
            .expect("a request");
        let status = tokio::time::timeout(Duration::from_secs(30), send(&mut svc, req))
            .await
            .expect("an answer within 30 s")
            .expect("an answer");
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        tp.assert_honoured("POST");
        let log = tp.log();
        assert_eq!(log.len(), want, "retry_non_idempotent {retry}: {log:#?}");
        for a in &log {
            assert_eq!(a.method, Method::POST);
            assert_eq!(a.body, b"one order");
        }
    }
}

/// The server says come back in 30 s; with a budget of 500 ms the first
/// call returns its 429 without waiting, and the second fails at once
/// with `QuotaSpent`, never reaching the server, whether the layer is
/// configured to wait or not (waiting would overrun the budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_quota_beyond_the_budget_fails_fast() {
    for wait_when_spent in [false, true] {
        let tp = ThirdParty::start(Form::FixedRetryAfter(30), 0, 60).await;
        let (mut svc, tally) = honouring(Config {
            budget: Duration::from_millis(500),
            wait_when_spent,
            ..Config::default()
        });
        let guard = Duration::from_secs(10);
        let first = tokio::time::timeout(guard, send(&mut svc, get(&tp.url("/a"), &[])))
            .await
            .expect("the first call returns without waiting 30 s");
        assert_eq!(first.expect("an answer"), StatusCode::TOO_MANY_REQUESTS);
        let second = tokio::time::timeout(guard, send(&mut svc, get(&tp.url("/b"), &[])))
            .await
            .expect("the second call returns without waiting 30 s");
        match second {
            Err(honour::Error::QuotaSpent { wait }) => {
                assert!(
                    wait > Duration::from_secs(20) && wait <= Duration::from_secs(30),
                    "{wait:?}"
                );
            }
            other => panic!("wait_when_spent {wait_when_spent}: {other:?}"),
        }
        assert_eq!(tp.log().len(), 1);
        assert_eq!(tally.sent.load(Ordering::Relaxed), 1);
    }
}

/// A window that never ends in these tests (2^40 s, aligned to the epoch).
const FOREVER: u64 = 1 << 40;

/// Regression: an answer to a request sent before the server said its
/// quota was spent (a 200 still on its way) must not erase that news, or
/// the next request goes out while the server says to stay away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_answer_does_not_erase_a_newer_refusal() {
    let tp = ThirdParty::start(Form::FixedRetryAfter(30), 1, FOREVER).await;
    let (svc, tally) = honouring(Config {
        wait_when_spent: false,
        ..Config::default()
    });
    let guard = Duration::from_secs(10);
    // A: admitted (the quota's one request), its answer held back.
    let mut a = svc.clone();
    let url = tp.url("/held");
    let held = tokio::spawn(async move { send(&mut a, get(&url, &[])).await });
    crate::util::eventually("the held request arrives", || {
        let n = tp.log().len();
        async move { n == 1 }
    })
    .await;
    // B: a POST (not retried), refused with Retry-After: 30.
    let post = Request::post(tp.url("/b"))
        .body(String::new())
        .expect("a request");
    let b = tokio::time::timeout(guard, send(&mut svc.clone(), post))
        .await
        .expect("B's answer");
    assert_eq!(b.expect("an answer"), StatusCode::TOO_MANY_REQUESTS);
    // Now A's 200 comes back, older news than B's 429.
    tp.release();
    let a = tokio::time::timeout(guard, held)
        .await
        .expect("A's answer")
        .expect("A's task");
    assert_eq!(a.expect("an answer"), StatusCode::OK);
    // C: the server still says 30 s; the layer must not send it.
    let c = tokio::time::timeout(guard, send(&mut svc.clone(), get(&tp.url("/c"), &[])))
        .await
        .expect("C returns at once");
    let log = tp.log();
    assert_eq!(log.len(), 2, "C reached the server: {log:#?}");
    assert_eq!(tally.sent.load(Ordering::Relaxed), 2);
    assert!(
        matches!(c, Err(honour::Error::QuotaSpent { .. })),
        "C: {c:?}"
    );
}

// --- 3. the runnable example's contract ---

/// Runs the built `fetch` example with `args` (a hang guard of 60 s).
fn run_fetch(args: &[&str]) -> Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/debug/deps/it-HASH -> target/debug/examples/fetch
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|debug| debug.join("examples").join("fetch"))
        .filter(|p| p.is_file())
        .expect("build it: cargo build -p spillway-client --example fetch");
    let mut child = Command::new(&bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the fetch example");
    let started = Instant::now();
    while child.try_wait().expect("wait for fetch").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("fetch {args:?} ran for more than 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("fetch's output")
}

/// The example's output: each request's status and elapsed time, then S
/// and T.
#[derive(Debug)]
struct Fetched {
    lines: Vec<(u16, u64)>,
    sent: u64,
    refused: u64,
}

fn parse_fetch(out: &Output) -> Fetched {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fetch failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<&str> = text.lines().collect();
    let last = lines.pop().unwrap_or_else(|| panic!("no output: {text}"));
    let (sent, refused) = last
        .strip_prefix("sent ")
        .and_then(|r| r.split_once(", 429 "))
        .and_then(|(s, t)| Some((s.parse().ok()?, t.parse().ok()?)))
        .unwrap_or_else(|| panic!("last line {last:?} is not `sent S, 429 T`"));
    let lines = lines
        .iter()
        .map(|l| {
            l.split_once(' ')
                .and_then(|(s, ms)| Some((s.parse().ok()?, ms.parse().ok()?)))
                .unwrap_or_else(|| panic!("line {l:?} is not `STATUS ELAPSED_MS`"))
        })
        .collect();
    Fetched {
        lines,
        sent,
        refused,
    }
}

fn assert_contract(f: &Fetched, n: usize) {
    assert_eq!(f.lines.len(), n, "{f:?}");
    assert!(f.lines.iter().all(|(s, _)| *s == 200), "{f:?}");
    assert!(f.refused <= 1, "{f:?}");
    assert_eq!(f.sent, n as u64 + f.refused, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fetch_example_keeps_within_spillway_serve() {
    let dir = TempDir::new("client-fetch");
    let file = dir.write(
        "rules.yaml",
        "rules:\n  - name: per-user\n    by: user\n    limits:\n      - fixed_window: { limit: 3, window: 2s }\n",
    );
    let s = Server::start(&["--config", file.to_str().unwrap(), "--threads", "1"]);
    let url = s.url("/v1/limit?key=alice");
    let out = tokio::task::spawn_blocking(move || run_fetch(&[&url, "7"]))
        .await
        .expect("fetch ran");
    let f = parse_fetch(&out);
    assert_contract(&f, 7);
    // Three fixed windows of 2 s: the requests that waited for the next
    // one took, together, more than one whole window.
    let total: u64 = f.lines.iter().map(|(_, ms)| ms).sum();
    assert!(total + 50 >= 2000, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fetch_example_sends_its_headers_and_keeps_within_a_third_party() {
    let tp = ThirdParty::start(Form::RateLimit, QUOTA, 1).await;
    let url = tp.url("/items");
    let out =
        tokio::task::spawn_blocking(move || run_fetch(&[&url, "7", "--header", "X-Api-Key: k1"]))
            .await
            .expect("fetch ran");
    let f = parse_fetch(&out);
    assert_contract(&f, 7);
    let refused = tp.assert_honoured("fetch");
    let log = tp.log();
    assert_eq!(refused as u64, f.refused);
    assert_eq!(log.len() as u64, f.sent);
    for a in &log {
        assert_eq!(a.api_key.as_deref(), Some("k1"), "{log:#?}");
    }
}
