//! An open-loop HTTP/1.1 load driver, and the per-second figures a test or
//! a plot reads from what it recorded.
//!
//! Open loop: requests leave on a schedule (a rate that may change with
//! time), whether or not earlier ones were answered, as real clients'
//! requests do. A closed loop (each client waiting for its answer before
//! sending again) would slow down with the target and hide its overload;
//! an open one keeps sending, so a queue that grows shows as latency and a
//! limit that sheds shows as refusals.
//!
//! One bound keeps an overloaded target from exhausting the driver's
//! sockets: at most [`LoadPlan::max_outstanding`] requests wait for their
//! answers at once. A request due while that many are outstanding is not
//! sent and is recorded as failed (status 0, zero latency), so the offered
//! rate stays what the plan says.
//!
//! Connections are kept alive and reused (one request at a time on each,
//! HTTP/1.1), opened as needed.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//!
//! use spillway_testkit::load::{self, LoadPlan};
//! use spillway_testkit::queueing::QueueingUpstream;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let up = QueueingUpstream::start(4, Duration::from_millis(1)).await;
//! let plan = LoadPlan::new(&up.url(), Duration::from_millis(500))
//!     .unwrap()
//!     .constant(40.0)
//!     .header("x-user", "alice");
//! let samples = load::drive(plan).await;
//! assert!(samples.len() >= 15, "{}", samples.len());
//! assert!(samples.iter().all(|s| s.status == 200));
//! # });
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::queueing::Text;

use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The highest rate the driver schedules (requests a second); more is
/// clamped. Far above what one process can send, so only a mistake
/// reaches it.
pub const MAX_RATE: f64 = 1e6;

/// How far the schedule moves on while the rate is zero, before it asks
/// the rate again.
const IDLE_STEP: Duration = Duration::from_millis(10);

/// One request's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it was sent, from the start of the run.
    pub sent_at: Duration,
    /// From sending to the end of its answer's body (zero if never sent).
    pub latency: Duration,
    /// The answer's status; 0 when there was none: connection refused or
    /// cut, timed out, or not sent because too many were outstanding.
    pub status: u16,
    /// The class its [`Outgoing`] named (0 without a request closure).
    pub class: usize,
}

impl Sample {
    /// A 2xx answer.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// What one request carries beyond the plan's fixed headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outgoing {
    /// A label the samples keep, to tell kinds of traffic apart (users,
    /// priorities).
    pub class: usize,
    /// The path and query to send to instead of the URL's.
    pub path: Option<String>,
    /// Extra headers, after the plan's. An invalid name or value makes the
    /// request fail (status 0).
    pub headers: Vec<(String, String)>,
}

/// A request rate (a second) at each moment from the start of the run.
type RateFn = Arc<dyn Fn(Duration) -> f64 + Send + Sync>;
/// The `n`th request's class, path and headers.
type RequestFn = Arc<dyn Fn(u64) -> Outgoing + Send + Sync>;

/// What [`drive`] sends: where, for how long, how fast, with what.
#[derive(Clone)]
pub struct LoadPlan {
    target: Target,
    duration: Duration,
    rate: RateFn,
    headers: Vec<(String, String)>,
    request: Option<RequestFn>,
    timeout: Duration,
    max_outstanding: usize,
}

impl fmt::Debug for LoadPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadPlan")
            .field("target", &self.target)
            .field("duration", &self.duration)
            .field("headers", &self.headers)
            .field("request", &self.request.as_ref().map(|_| "closure"))
            .field("timeout", &self.timeout)
            .field("max_outstanding", &self.max_outstanding)
            .finish_non_exhaustive()
    }
}

/// Where requests go: a socket address and what to put in `Host` and the
/// request line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    addr: SocketAddr,
    host: String,
    path: String,
}

/// A URL [`LoadPlan::new`] cannot send to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadUrl {
    /// The URL as given.
    pub url: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for BadUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot drive load at {:?}: {} (want http://IP:PORT[/path])",
            self.url, self.reason
        )
    }
}

impl std::error::Error for BadUrl {}

impl LoadPlan {
    /// A plan to send to `url` (`http://IP:PORT[/path][?query]`: plain
    /// HTTP to a literal address, as tests use) for `duration`, at 100
    /// requests a second until told otherwise, each request timing out
    /// after 5 s, at most 1024 outstanding.
    ///
    /// # Errors
    /// A URL that is not `http://`, has no literal IP address and port, or
    /// a path that does not start with `/`.
    pub fn new(url: &str, duration: Duration) -> Result<LoadPlan, BadUrl> {
        Ok(LoadPlan {
            target: parse_url(url)?,
            duration,
            rate: Arc::new(|_| 100.0),
            headers: Vec::new(),
            request: None,
            timeout: Duration::from_secs(5),
            max_outstanding: 1024,
        })
    }

    /// The rate (requests a second) as a function of the time since the
    /// start. Negative or NaN rates are zero, rates above [`MAX_RATE`] are
    /// clamped to it.
    pub fn rate(mut self, rate: impl Fn(Duration) -> f64 + Send + Sync + 'static) -> LoadPlan {
        self.rate = Arc::new(rate);
        self
    }

    /// The same rate throughout.
    pub fn constant(self, rps: f64) -> LoadPlan {
        self.rate(move |_| rps)
    }

    /// A rate that rises (or falls) in a straight line from `from` at the
    /// start to `to` at the end of the plan's duration.
    pub fn ramp(self, from: f64, to: f64) -> LoadPlan {
        let total = self.duration.as_secs_f64();
        self.rate(move |t| {
            if total <= 0.0 {
                return from;
            }
            let x = (t.as_secs_f64() / total).clamp(0.0, 1.0);
            from + (to - from) * x
        })
    }

    /// Steps of `(how long, rate)`, one after the other; after the last,
    /// its rate holds (zero for no steps).
    pub fn steps(self, steps: &[(Duration, f64)]) -> LoadPlan {
        let steps = steps.to_vec();
        self.rate(move |t| step_rate(&steps, t))
    }

    /// A header every request carries.
    pub fn header(mut self, name: &str, value: &str) -> LoadPlan {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The `n`th request's (from 0) class, path and extra headers: for
    /// mixes of users or priorities.
    pub fn request(mut self, each: impl Fn(u64) -> Outgoing + Send + Sync + 'static) -> LoadPlan {
        self.request = Some(Arc::new(each));
        self
    }

    /// How long a request may take, from sending to the end of its answer,
    /// before it counts as failed (status 0).
    pub fn timeout(mut self, timeout: Duration) -> LoadPlan {
        self.timeout = timeout;
        self
    }

    /// The most requests outstanding at once (at least 1): also the most
    /// connections the driver opens.
    pub fn max_outstanding(mut self, n: usize) -> LoadPlan {
        self.max_outstanding = n.clamp(1, Semaphore::MAX_PERMITS);
        self
    }

    /// How long the plan sends.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The planned rate at `t` from the start, as the driver uses it.
    pub fn rate_at(&self, t: Duration) -> f64 {
        sane_rate((self.rate)(t))
    }
}

/// `http://IP:PORT[/path]` into an address, a `Host` and a path.
fn parse_url(url: &str) -> Result<Target, BadUrl> {
    let bad = |reason| BadUrl {
        url: url.to_string(),
        reason,
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only plain http:// is supported"))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let addr: SocketAddr = authority
        .parse()
        .map_err(|_| bad("the host must be a literal IP address with a port"))?;
    if path
        .chars()
        .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
    {
        return Err(bad("the path has spaces or control characters"));
    }
    Ok(Target {
        addr,
        host: authority.to_string(),
        path,
    })
}

/// The rate of `steps` at `t`.
fn step_rate(steps: &[(Duration, f64)], t: Duration) -> f64 {
    let mut end = Duration::ZERO;
    for &(len, rate) in steps {
        end = end.saturating_add(len);
        if t < end {
            return rate;
        }
    }
    steps.last().map_or(0.0, |&(_, rate)| rate)
}

fn sane_rate(rate: f64) -> f64 {
    if rate.is_nan() || rate <= 0.0 {
        0.0
    } else {
        rate.min(MAX_RATE)
    }
}

/// When the request after one due at `due` is due, at `rate` a second
/// (a sane one, see [`LoadPlan::rate`]): a fixed spacing keeps the offered
/// rate exact even when the timer wakes late (late requests go out at
/// once, catching up).
fn next_due(due: Duration, rate: f64) -> Duration {
    let rate = sane_rate(rate);
    if rate == 0.0 {
        return due.saturating_add(IDLE_STEP);
    }
    due.saturating_add(Duration::from_secs_f64(1.0 / rate))
}

/// Sends the plan's requests and returns one sample per request due, in
/// the order they were sent. Returns once the plan's duration is over and
/// every request sent has its answer or timed out.
pub async fn drive(plan: LoadPlan) -> Vec<Sample> {
    let pool = Arc::new(Pool {
        target: plan.target.clone(),
        idle: Mutex::new(Vec::new()),
        keep: plan.max_outstanding,
    });
    let outstanding = Arc::new(Semaphore::new(plan.max_outstanding));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut due = Duration::ZERO;
    let mut n = 0u64;
    while due < plan.duration {
        let rate = plan.rate_at(due);
        if rate == 0.0 {
            due = next_due(due, rate);
            continue;
        }
        tokio::time::sleep_until((start + due).into()).await;
        let sent_at = start.elapsed();
        let out = match &plan.request {
            Some(each) => each(n),
            None => Outgoing::default(),
        };
        n += 1;
        due = next_due(due, rate);
        let Ok(permit) = outstanding.clone().try_acquire_owned() else {
            lock(&samples).push(Sample {
                sent_at,
                latency: Duration::ZERO,
                status: 0,
                class: out.class,
            });
            continue;
        };
        let pool = pool.clone();
        let samples = samples.clone();
        let headers = plan.headers.clone();
        let timeout = plan.timeout;
        tokio::spawn(async move {
            let began = Instant::now();
            let status = tokio::time::timeout(timeout, pool.send(&headers, &out))
                .await
                .unwrap_or(0);
            lock(&samples).push(Sample {
                sent_at,
                latency: began.elapsed(),
                status,
                class: out.class,
            });
            drop(permit);
        });
    }
    // Every request is bounded by its timeout; the margin covers a busy
    // runtime.
    let all = u32::try_from(plan.max_outstanding).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(
        plan.timeout.saturating_add(Duration::from_secs(5)),
        outstanding.acquire_many(all),
    )
    .await;
    let mut samples = std::mem::take(&mut *lock(&samples));
    samples.sort_by_key(|s| s.sent_at);
    samples
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keep-alive connections to the target, each carrying one request at a
/// time.
struct Pool {
    target: Target,
    idle: Mutex<Vec<SendRequest<Text>>>,
    /// The most idle connections kept.
    keep: usize,
}

impl Pool {
    /// Sends one GET and reads its answer to the end: its status, or 0.
    async fn send(&self, headers: &[(String, String)], out: &Outgoing) -> u16 {
        // An idle connection the target closed fails at once: then once
        // more on a new one.
        for _ in 0..2 {
            let (mut conn, reused) = match self.take().await {
                Some(c) => (c, true),
                None => match self.connect().await {
                    Some(c) => (c, false),
                    None => return 0,
                },
            };
            let Some(req) = self.request(headers, out) else {
                return 0;
            };
            match conn.send_request(req).await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    if read_to_end(resp).await {
                        self.put(conn);
                        return status;
                    }
                    return 0;
                }
                Err(_) if reused => continue,
                Err(_) => return 0,
            }
        }
        0
    }

    fn request(&self, headers: &[(String, String)], out: &Outgoing) -> Option<Request<Text>> {
        let mut req = Request::get(out.path.as_deref().unwrap_or(&self.target.path))
            .header("host", &self.target.host);
        for (name, value) in headers.iter().chain(&out.headers) {
            req = req.header(name, value);
        }
        req.body(Text(None)).ok()
    }

    async fn take(&self) -> Option<SendRequest<Text>> {
        loop {
            let mut conn = lock(&self.idle).pop()?;
            if conn.ready().await.is_ok() {
                return Some(conn);
            }
        }
    }

    fn put(&self, conn: SendRequest<Text>) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.keep && !conn.is_closed() {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Option<SendRequest<Text>> {
        let stream = TcpStream::connect(self.target.addr).await.ok()?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        // Ends when the connection closes or every sender is dropped.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Some(send)
    }
}

/// Reads a body to its end; false if it broke off.
async fn read_to_end(resp: Response<Incoming>) -> bool {
    let mut body = resp.into_body();
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            None => return true,
            Some(Ok(_)) => {}
            Some(Err(_)) => return false,
        }
    }
}

// ---- What a run's samples say, second by second ----

/// How many whole seconds the samples span (by `sent_at`): the length of
/// the per-second vectors below.
pub fn seconds(samples: &[Sample]) -> usize {
    samples
        .iter()
        .map(|s| s.sent_at.as_secs() as usize + 1)
        .max()
        .unwrap_or(0)
}

/// How many samples sent in each second (by `sent_at`) `pick` keeps.
pub fn per_second(samples: &[Sample], pick: impl Fn(&Sample) -> bool) -> Vec<u64> {
    let mut out = vec![0; seconds(samples)];
    for s in samples.iter().filter(|s| pick(s)) {
        out[s.sent_at.as_secs() as usize] += 1;
    }
    out
}

/// Requests sent in each second: the offered rate.
pub fn sent_per_second(samples: &[Sample]) -> Vec<u64> {
    per_second(samples, |_| true)
}

/// 2xx answers to the requests sent in each second: the admitted rate.
pub fn admitted_per_second(samples: &[Sample]) -> Vec<u64> {
    per_second(samples, Sample::ok)
}

/// The `q` quantile (0 to 1, e.g. 0.99) of the latencies of the 2xx
/// answers to the requests sent in each second; `None` for a second
/// without one.
pub fn latency_per_second(samples: &[Sample], q: f64) -> Vec<Option<Duration>> {
    let mut by_second = vec![Vec::new(); seconds(samples)];
    for s in samples.iter().filter(|s| s.ok()) {
        by_second[s.sent_at.as_secs() as usize].push(s.latency);
    }
    by_second.iter_mut().map(|l| percentile(l, q)).collect()
}

/// The `q` quantile (0 to 1; clamped, NaN is the median) of `values` by
/// nearest rank: the smallest value with at least `q` of them at or below
/// it. `None` for no values. Sorts `values`.
pub fn percentile(values: &mut [Duration], q: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
    values.sort_unstable();
    let rank = (q * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

/// How many samples had each status (0: no answer).
pub fn by_status(samples: &[Sample]) -> BTreeMap<u16, u64> {
    let mut out = BTreeMap::new();
    for s in samples {
        *out.entry(s.status).or_insert(0) += 1;
    }
    out
}

/// [`by_status`] for each class.
pub fn by_class(samples: &[Sample]) -> BTreeMap<usize, BTreeMap<u16, u64>> {
    let mut out: BTreeMap<usize, BTreeMap<u16, u64>> = BTreeMap::new();
    for s in samples {
        *out.entry(s.class).or_default().entry(s.status).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queueing::QueueingUpstream;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn sample(sent_ms: u64, latency_ms: u64, status: u16, class: usize) -> Sample {
        Sample {
            sent_at: ms(sent_ms),
            latency: ms(latency_ms),
            status,
            class,
        }
    }

    use crate::test_runtime as rt;

    #[test]
    fn urls_parse_or_say_why_not() {
        let t = parse_url("http://127.0.0.1:8080").unwrap();
        assert_eq!((t.host.as_str(), t.path.as_str()), ("127.0.0.1:8080", "/"));
        let t = parse_url("http://[::1]:9/a/b?c=d").unwrap();
        assert_eq!((t.host.as_str(), t.path.as_str()), ("[::1]:9", "/a/b?c=d"));
        assert_eq!(parse_url("http://127.0.0.1:1?x").unwrap().path, "/?x");
        for bad in [
            "https://127.0.0.1:1",
            "127.0.0.1:1",
            "http://localhost:1",
            "http://127.0.0.1",
            "http://127.0.0.1:1/a b",
            "",
        ] {
            let e = LoadPlan::new(bad, ms(1)).unwrap_err();
            assert!(e.to_string().contains("cannot drive load"), "{e}");
        }
    }

    #[test]
    fn rates_are_sane_and_steps_hold_their_last() {
        let steps = [(ms(1000), 10.0), (ms(500), 20.0)];
        assert_eq!(step_rate(&steps, ms(0)), 10.0);
        assert_eq!(step_rate(&steps, ms(999)), 10.0);
        assert_eq!(step_rate(&steps, ms(1000)), 20.0);
        assert_eq!(step_rate(&steps, ms(9000)), 20.0);
        assert_eq!(step_rate(&[], ms(0)), 0.0);
        let plan = LoadPlan::new("http://127.0.0.1:1", ms(2000))
            .unwrap()
            .ramp(100.0, 300.0);
        assert_eq!(plan.rate_at(ms(0)), 100.0);
        assert_eq!(plan.rate_at(ms(1000)), 200.0);
        assert_eq!(plan.rate_at(ms(5000)), 300.0);
        for (bad, want) in [(f64::NAN, 0.0), (-3.0, 0.0), (1e12, MAX_RATE)] {
            assert_eq!(sane_rate(bad), want);
        }
    }

    /// The schedule, on a virtual clock: the number of requests due in a
    /// window is the rate's integral over it.
    #[test]
    fn the_schedule_offers_the_planned_rate() {
        for rate in [1.0, 7.0, 100.0, 1234.0] {
            let mut due = Duration::ZERO;
            let mut n = 0;
            while due < Duration::from_secs(10) {
                n += 1;
                due = next_due(due, rate);
            }
            let want = rate * 10.0;
            assert!((n as f64 - want).abs() <= 1.0, "{rate}: {n}");
        }
        assert_eq!(next_due(ms(5), 0.0), ms(5) + IDLE_STEP);
        assert_eq!(next_due(Duration::MAX, 10.0), Duration::MAX);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<Duration> = (1..=100).rev().map(ms).collect();
        assert_eq!(percentile(&mut v, 0.5), Some(ms(50)));
        assert_eq!(percentile(&mut v, 0.99), Some(ms(99)));
        assert_eq!(percentile(&mut v, 1.0), Some(ms(100)));
        assert_eq!(percentile(&mut v, 0.0), Some(ms(1)));
        assert_eq!(percentile(&mut v, 7.0), Some(ms(100)));
        assert_eq!(percentile(&mut v, f64::NAN), Some(ms(50)));
        assert_eq!(percentile(&mut [], 0.5), None);
        assert_eq!(percentile(&mut [ms(3)], 0.99), Some(ms(3)));
    }

    /// Every quantile is one of the values, and a higher quantile is never
    /// a lower value.
    #[test]
    fn percentiles_are_values_and_monotone() {
        let mut seed = 12345u64;
        for len in 1..60 {
            let values: Vec<Duration> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ms(seed >> 54)
                })
                .collect();
            let mut last = Duration::ZERO;
            for q in 0..=100 {
                let mut v = values.clone();
                let p = percentile(&mut v, q as f64 / 100.0).unwrap();
                assert!(values.contains(&p));
                assert!(p >= last);
                last = p;
            }
        }
    }

    #[test]
    fn per_second_figures() {
        let s = [
            sample(10, 5, 200, 0),
            sample(900, 7, 200, 1),
            sample(950, 0, 0, 1),
            sample(2100, 30, 503, 0),
            sample(2200, 40, 200, 0),
        ];
        assert_eq!(seconds(&s), 3);
        assert_eq!(seconds(&[]), 0);
        assert_eq!(sent_per_second(&s), [3, 0, 2]);
        assert_eq!(admitted_per_second(&s), [2, 0, 1]);
        assert_eq!(per_second(&s, |s| s.status == 503), [0, 0, 1]);
        assert_eq!(
            latency_per_second(&s, 0.99),
            [Some(ms(7)), None, Some(ms(40))]
        );
        assert_eq!(by_status(&s), BTreeMap::from([(0, 1), (200, 3), (503, 1)]));
        let c = by_class(&s);
        assert_eq!(c[&0], BTreeMap::from([(200, 2), (503, 1)]));
        assert_eq!(c[&1], BTreeMap::from([(0, 1), (200, 1)]));
    }

    #[test]
    fn requests_carry_their_headers_class_and_path() {
        rt().block_on(async {
            let up = crate::upstream::HttpUpstream::start().await;
            let plan = LoadPlan::new(&format!("{}/base", up.url()), ms(300))
                .unwrap()
                .constant(20.0)
                .header("x-user", "u")
                .request(|n| Outgoing {
                    class: (n % 2) as usize,
                    path: (n % 2 == 1).then(|| "/other/hello".to_string()),
                    headers: vec![("x-n".to_string(), n.to_string())],
                });
            let samples = drive(plan).await;
            assert!(samples.len() >= 5, "{samples:?}");
            assert!(samples.iter().all(|s| s.status == 200), "{samples:?}");
            let seen = up.requests();
            assert_eq!(seen.len(), samples.len());
            for s in &seen {
                assert_eq!(s.header("x-user"), Some("u"));
                let n: u64 = s.header("x-n").unwrap().parse().unwrap();
                let want = if n % 2 == 1 { "/other/hello" } else { "/base" };
                assert_eq!(s.target, want);
            }
            let classes = by_class(&samples);
            assert_eq!(classes.len(), 2);
        });
    }

    #[test]
    fn nothing_listening_is_status_zero_not_a_panic() {
        rt().block_on(async {
            let port = crate::free_port();
            let plan = LoadPlan::new(&format!("http://127.0.0.1:{port}"), ms(100))
                .unwrap()
                .constant(50.0)
                // Invalid as a header name: that request fails alone.
                .request(|n| Outgoing {
                    headers: vec![("bad name".to_string(), n.to_string())],
                    ..Outgoing::default()
                });
            let samples = drive(plan).await;
            assert!(!samples.is_empty());
            assert!(samples.iter().all(|s| s.status == 0));
        });
    }

    /// A slow target: requests past the cap are not sent and count as
    /// failed; those past the timeout fail too; the run still ends.
    #[test]
    fn the_outstanding_cap_and_the_timeout_bound_a_run() {
        rt().block_on(async {
            let up = QueueingUpstream::start(1, ms(400)).await;
            let plan = LoadPlan::new(&up.url(), ms(200))
                .unwrap()
                .constant(50.0)
                .max_outstanding(3)
                .timeout(ms(600));
            let began = Instant::now();
            let samples = drive(plan).await;
            assert!(began.elapsed() < Duration::from_secs(3));
            let statuses = by_status(&samples);
            // One answered within 600 ms (400), the other two of the three
            // sent time out; everything else was never sent.
            assert_eq!(statuses.get(&200), Some(&1), "{statuses:?}");
            assert_eq!(statuses.len(), 2, "{statuses:?}");
            assert!(up.max_in_flight() <= 3);
        });
    }
}
