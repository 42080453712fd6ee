//! Honouring what a server says about its limits: a tower layer around an
//! HTTP client service.
//!
//! - **Before sending**: when an earlier answer from the same server (its
//!   authority, `host:port`) said the quota is used up (`remaining` 0, or
//!   a `Retry-After`), the request waits until the advised time, or fails
//!   at once with [`Error::QuotaSpent`] if so configured, instead of
//!   spending a call the server would refuse.
//! - **On 429 or 503**: an idempotent request (GET, HEAD, PUT, DELETE,
//!   OPTIONS, TRACE) is sent again after the longer of the advised time
//!   and a capped exponential backoff with full jitter, within a total
//!   time budget; other methods only if [`Config::retry_non_idempotent`].
//!   When the budget or the retries run out, the last answer is returned.
//!
//! Retrying needs a second copy of the request, so the body type must be
//! `Clone` (`String`, `Bytes`, `Full<Bytes>`, `Empty<Bytes>`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::events::{Events, NoEvents};
use crate::headers::Advice;

/// How the layer behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most times a request is sent again after a 429 or 503.
    pub max_retries: u32,
    /// The first backoff step; each retry doubles it, up to `max_backoff`.
    pub base_backoff: Duration,
    /// The largest backoff step (before jitter).
    pub max_backoff: Duration,
    /// The longest a request may take in all, waits and retries included.
    pub budget: Duration,
    /// When the quota is known to be spent: wait until it resets (true),
    /// or fail at once with [`Error::QuotaSpent`] (false).
    pub wait_when_spent: bool,
    /// Also retry methods that are not idempotent (POST, PATCH).
    pub retry_non_idempotent: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_retries: 3,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            budget: Duration::from_secs(60),
            wait_when_spent: true,
            retry_non_idempotent: false,
        }
    }
}

/// Why a request was not answered by the server.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// The inner service failed.
    Inner(E),
    /// The server said its quota is used up for this long yet, and the
    /// layer is configured to fail fast (or waiting would exceed the budget).
    QuotaSpent {
        /// How long until the server said to come back.
        wait: Duration,
    },
}

impl<E: std::fmt::Display> std::fmt::Display for Error<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Inner(e) => write!(f, "{e}"),
            Error::QuotaSpent { wait } => write!(
                f,
                "the server's rate limit quota is used up for {} ms more",
                wait.as_millis()
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Inner(e) => Some(e),
            Error::QuotaSpent { .. } => None,
        }
    }
}

/// What the layer has learnt, shared by every clone: per server, until
/// when its quota is spent.
#[derive(Debug, Default)]
struct Learnt {
    spent_until: HashMap<String, Spent>,
    /// State of the jitter's generator.
    seed: u64,
}

/// Which partition of a server's quota a request spends: by default the
/// server alone; see [`HonourLayer::with_partition`].
pub type Partition = Arc<dyn Fn(&http::Uri, &http::HeaderMap) -> String + Send + Sync>;

/// The layer: wraps a client service in [`Honour`].
#[derive(Clone)]
pub struct HonourLayer {
    config: Arc<Config>,
    learnt: Arc<Mutex<Learnt>>,
    partition: Option<Partition>,
    events: Arc<dyn Events>,
}

impl std::fmt::Debug for HonourLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HonourLayer")
            .field("config", &self.config)
            .field("partitioned", &self.partition.is_some())
            .finish_non_exhaustive()
    }
}

impl HonourLayer {
    /// A layer with `config`.
    pub fn new(config: Config) -> HonourLayer {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            | 1;
        HonourLayer {
            config: Arc::new(config),
            learnt: Arc::new(Mutex::new(Learnt {
                spent_until: HashMap::new(),
                seed,
            })),
            partition: None,
            events: Arc::new(NoEvents),
        }
    }

    /// Keeps what the server says per partition of its quota, not per
    /// server: `partition` names the part a request spends, e.g. the API
    /// key it sends, so a caller acting for several keys waits only for
    /// the key that is spent. By default every request to one server
    /// (its authority) shares one quota: the safe choice when the caller
    /// does not know how the server counts.
    pub fn with_partition(
        mut self,
        partition: impl Fn(&http::Uri, &http::HeaderMap) -> String + Send + Sync + 'static,
    ) -> HonourLayer {
        self.partition = Some(Arc::new(partition));
        self
    }

    /// Reports retries, waits and local refusals to `events`.
    pub fn with_events(mut self, events: Arc<dyn Events>) -> HonourLayer {
        self.events = events;
        self
    }
}

impl Default for HonourLayer {
    fn default() -> HonourLayer {
        HonourLayer::new(Config::default())
    }
}

impl<S> tower_layer::Layer<S> for HonourLayer {
    type Service = Honour<S>;
    fn layer(&self, inner: S) -> Honour<S> {
        Honour {
            inner,
            config: self.config.clone(),
            learnt: self.learnt.clone(),
            partition: self.partition.clone(),
            events: self.events.clone(),
        }
    }
}

/// A client service that honours the server's rate limit signals.
#[derive(Clone)]
pub struct Honour<S> {
    inner: S,
    config: Arc<Config>,
    learnt: Arc<Mutex<Learnt>>,
    partition: Option<Partition>,
    events: Arc<dyn Events>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Honour<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Honour")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// The server a request goes to: its authority, or "" for a relative URI.
fn server_of<B>(req: &Request<B>) -> String {
    req.uri()
        .authority()
        .map_or_else(String::new, |a| a.as_str().to_ascii_lowercase())
}

/// A server's quota is spent until `until`, as the answer to a request
/// sent at `since` said.
#[derive(Debug, Clone, Copy)]
struct Spent {
    until: Instant,
    /// When the request whose answer said so was sent: only the answer to
    /// a request sent later may say the quota is back. Clones share what
    /// is learnt, so answers come back out of order; a 200 to a request
    /// sent before a 429 is older news and must not erase it.
    since: Instant,
}

impl Learnt {
    /// Until when `server`'s quota is spent, if it is at `now`; a spell
    /// that is over is forgotten (the map would otherwise only grow with
    /// one entry per partition ever spent).
    fn spent_until(&mut self, server: &str, now: Instant) -> Option<Instant> {
        match self.spent_until.get(server) {
            Some(s) if s.until > now => Some(s.until),
            Some(_) => {
                self.spent_until.remove(server);
                None
            }
            None => None,
        }
    }

    /// Takes in what the answer to a request sent at `sent` said: spent
    /// for `wait` more from `now`, or not spent (`wait` None, `refused`
    /// false). A spent quota keeps the later end of what is known: waiting
    /// too long costs time, not a refused call.
    fn learn(
        &mut self,
        server: &str,
        sent: Instant,
        now: Instant,
        wait: Option<Duration>,
        refused: bool,
    ) {
        match wait {
            Some(w) if !w.is_zero() => {
                let until = now + w;
                self.spent_until
                    .entry(server.to_owned())
                    .and_modify(|s| {
                        s.until = s.until.max(until);
                        s.since = s.since.max(sent);
                    })
                    .or_insert(Spent { until, since: sent });
            }
            _ if !refused
                && self
                    .spent_until
                    .get(server)
                    .is_some_and(|s| s.since <= sent) =>
            {
                self.spent_until.remove(server);
            }
            _ => {}
        }
    }

    /// A uniform draw in `[0, 1)` (xorshift; jitter needs no more).
    fn uniform(&mut self) -> f64 {
        let mut x = self.seed;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.seed = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Full jitter: a uniform draw between 0 and the capped exponential step.
pub fn full_jitter(config: &Config, attempt: u32, uniform: f64) -> Duration {
    let step = config
        .base_backoff
        .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .min(config.max_backoff);
    step.mul_f64(uniform.clamp(0.0, 1.0 - f64::EPSILON))
}

impl<S, B, R> tower_service::Service<Request<B>> for Honour<S>
where
    S: tower_service::Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Clone + Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = Error<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, Error<S::Error>>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Error::Inner)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The inner service was made ready for this call; keep that one and
        // leave a fresh clone in its place (tower's usual pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let learnt = self.learnt.clone();
        let events = self.events.clone();
        let mut server = server_of(&req);
        if let Some(p) = &self.partition {
            server.push(' ');
            server.push_str(&p(req.uri(), req.headers()));
        }
        Box::pin(async move {
            let started = Instant::now();
            // A budget past what the clock can hold is no budget.
            let deadline = started.checked_add(config.budget);
            let past = |t: Instant| deadline.is_some_and(|d| t > d);
            let retryable = idempotent(req.method()) || config.retry_non_idempotent;
            let mut attempt = 0u32;
            // The answer being retried: returned as it is if the quota
            // turns out to be spent past the budget before the retry.
            let mut last: Option<Response<R>> = None;
            loop {
                // Wait out a spent quota first.
                let until = learnt.lock().spent_until(&server, Instant::now());
                if let Some(until) = until {
                    let wait = until.saturating_duration_since(Instant::now());
                    if past(until) || (!config.wait_when_spent && last.is_none()) {
                        if let Some(resp) = last {
                            return Ok(resp);
                        }
                        events.rejected_locally("quota spent");
                        return Err(Error::QuotaSpent { wait });
                    }
                    // A retry waits even when failing fast: the caller
                    // asked for retries, and this is the advised time.
                    events.waited(wait);
                    tokio::time::sleep_until(until).await;
                }
                std::future::poll_fn(|cx| inner.poll_ready(cx))
                    .await
                    .map_err(Error::Inner)?;
                let sent = Instant::now();
                let resp = inner
                    .call(clone_request(&req))
                    .await
                    .map_err(Error::Inner)?;
                let advice = Advice::from_headers(resp.headers(), SystemTime::now());
                let refused = matches!(
                    resp.status(),
                    StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
                );
                let now = Instant::now();
                // Retry-After speaks of a refusal; on other answers (a 202
                // to poll, a 413) it is not about the quota. A quota at 0
                // counts on any answer.
                let advised = if refused {
                    advice.wait()
                } else {
                    advice.quota_wait()
                };
                let backoff = {
                    let mut l = learnt.lock();
                    l.learn(&server, sent, now, advised, refused);
                    full_jitter(&config, attempt, l.uniform())
                };
                if !refused || !retryable || attempt >= config.max_retries {
                    return Ok(resp);
                }
                let delay = advised.unwrap_or(Duration::ZERO).max(backoff);
                let Some(at) = now.checked_add(delay).filter(|&at| !past(at)) else {
                    return Ok(resp);
                };
                events.waited(delay);
                tokio::time::sleep_until(at).await;
                last = Some(resp);
                attempt += 1;
                events.retried(attempt);
            }
        })
    }
}

/// A copy of `req` to send (its extensions are not copied).
fn clone_request<B: Clone>(req: &Request<B>) -> Request<B> {
    let mut r = Request::new(req.body().clone());
    *r.method_mut() = req.method().clone();
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_the_capped_step() {
        let c = Config::default();
        assert_eq!(
            full_jitter(&c, 0, 0.999_999),
            c.base_backoff.mul_f64(0.999_999)
        );
        assert!(full_jitter(&c, 3, 1.0) <= Duration::from_millis(800));
        assert_eq!(full_jitter(&c, 40, 1.0), c.max_backoff);
        assert_eq!(full_jitter(&c, 5, 0.0), Duration::ZERO);
    }

    #[test]
    fn an_older_answer_does_not_clear_newer_news_of_a_spent_quota() {
        let mut l = Learnt::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // Sent at 2, answered at 3: spent for 30 s.
        l.learn("h", at(2), at(3), Some(Duration::from_secs(30)), true);
        // A 200 to a request sent at 1 (before): older news, kept.
        l.learn("h", at(1), at(4), None, false);
        assert_eq!(l.spent_until["h"].until, at(3) + Duration::from_secs(30));
        // An older answer with a shorter wait does not shorten it.
        l.learn("h", at(1), at(5), Some(Duration::from_secs(1)), false);
        assert_eq!(l.spent_until["h"].until, at(3) + Duration::from_secs(30));
        // A refusal without advice changes nothing; a 200 sent later clears.
        l.learn("h", at(6), at(7), None, true);
        assert!(l.spent_until.contains_key("h"));
        l.learn("h", at(6), at(7), None, false);
        assert!(!l.spent_until.contains_key("h"));
    }

    #[test]
    fn only_idempotent_methods_are_retried_by_default() {
        assert!(idempotent(&Method::GET) && idempotent(&Method::PUT));
        assert!(!idempotent(&Method::POST) && !idempotent(&Method::PATCH));
    }

    /// With a partition by API key, a key the server says is spent waits
    /// (here: fails fast) and another key still goes; the events count it.
    #[tokio::test]
    async fn a_spent_partition_does_not_hold_up_another() {
        use std::sync::atomic::Ordering;
        use tower::{Service, ServiceExt};
        let server = tower::service_fn(|req: Request<()>| async move {
            let spent = req.headers().get("x-api-key").is_some_and(|k| k == "alice");
            let resp = if spent {
                Response::builder()
                    .status(429)
                    .header("retry-after", "30")
                    .body(())
            } else {
                Response::builder().status(200).body(())
            };
            Ok::<_, std::convert::Infallible>(resp.unwrap_or_default())
        });
        let counters = Arc::new(crate::events::Counters::default());
        let layer = HonourLayer::new(Config {
            budget: Duration::from_secs(1),
            wait_when_spent: false,
            ..Config::default()
        })
        .with_partition(|_uri, headers| {
            headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        })
        .with_events(counters.clone());
        let mut svc = tower_layer::Layer::layer(&layer, server);
        let call = |key: &str| {
            Request::get("http://api.example.com/x")
                .header("x-api-key", key)
                .body(())
                .unwrap()
        };
        let first = svc
            .ready()
            .await
            .unwrap()
            .call(call("alice"))
            .await
            .unwrap();
        assert_eq!(first.status(), 429);
        assert!(matches!(
            svc.ready().await.unwrap().call(call("alice")).await,
            Err(Error::QuotaSpent { .. })
        ));
        let bob = svc.ready().await.unwrap().call(call("bob")).await.unwrap();
        assert_eq!(bob.status(), 200);
        assert_eq!(counters.rejected.load(Ordering::Relaxed), 1);
    }
}
