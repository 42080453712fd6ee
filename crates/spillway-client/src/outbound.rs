//! Limiting your own outbound calls: a tower layer that asks a decider
//! (spillway's rules and algorithms) before each request leaves, so a
//! caller stays within a third party's published limits.
//!
//! The decider is any [`Decider`]:
//! - a [`spillway_store::Limiter`] in-process (a `MemoryStore`), or over
//!   Redis (a `RedisStore` from `spillway-redis`): instances sharing the
//!   Redis share the limit;
//! - a spillway server's decision API (`api::DecisionClient`, with the
//!   `api` feature): every instance asking one server shares its rules.
//!
//! An outbound request is described to the rules as the decision API
//! describes an inbound one: its API is `METHOD /path` (so `api:` and
//! `by: route` match it), its headers are headers (`by: header:X-Api-Key`),
//! and its server is the descriptor `host` (`by: host`, with
//! `descriptors: [host]`: the authority, `api.example.com:443`).
//!
//! Excess requests wait until the limit admits them (a shaper's delay, or
//! the advised retry time) within [`OutboundConfig::max_wait`], or fail at
//! once with [`OutboundError::Limited`], as configured.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use spillway_core::Attributes;
use spillway_store::{Limiter, Store};
use tokio::time::Instant;

use crate::events::{Events, NoEvents};

/// A boxed future, as deciders return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a decider needs to know about an outbound request.
#[derive(Debug, Clone, Copy)]
pub struct Outbound<'a> {
    /// The method.
    pub method: &'a str,
    /// The path (without the query).
    pub path: &'a str,
    /// The server: the URI's authority, lower-cased (`""` if relative).
    pub host: &'a str,
    /// The request's headers.
    pub headers: &'a http::HeaderMap,
    /// What the request costs (1 unless the caller says otherwise with
    /// the [`Cost`] extension).
    pub cost: u64,
}

/// A request extension: what this request costs against the limits.
#[derive(Debug, Clone, Copy)]
pub struct Cost(pub u64);

impl Attributes for Outbound<'_> {
    fn user(&self) -> Option<&str> {
        None
    }
    fn ip(&self) -> Option<&str> {
        None
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    fn descriptor(&self, name: &str) -> Option<&str> {
        (name == "host" && !self.host.is_empty()).then_some(self.host)
    }
}

/// A decider's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Send, after waiting this long (a shaper's queue; zero mostly).
    Send {
        /// How long to hold the request first.
        wait: Duration,
    },
    /// Do not send yet: the limit admits it again after `retry_after`.
    Wait {
        /// When to ask again.
        retry_after: Duration,
        /// The rule that refused, if known.
        rule: Option<String>,
    },
}

/// Why a decider could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeciderError {
    /// What went wrong.
    pub message: String,
    /// A failure that may pass (a server down, a timeout): the only kind
    /// [`OutboundConfig::on_error_send`] lets a request through on. A
    /// refusal of the request itself (a 400 from the decision API) is not
    /// transient, and never sends the request unlimited.
    pub transient: bool,
}

impl std::fmt::Display for DeciderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Decides outbound requests: spillway's limiter, in-process or shared.
pub trait Decider: Send + Sync + 'static {
    /// Decides `req`. An error is a decider that could not answer (a
    /// server down): [`OutboundConfig::on_error_send`] says what then.
    fn decide<'a>(&'a self, req: &'a Outbound<'a>) -> BoxFuture<'a, Result<Verdict, DeciderError>>;
}

impl<S: Store> Decider for Limiter<S> {
    fn decide<'a>(&'a self, req: &'a Outbound<'a>) -> BoxFuture<'a, Result<Verdict, DeciderError>> {
        Box::pin(async move {
            let r = spillway_store::Request {
                method: Some(req.method),
                path: Some(req.path),
                attrs: req,
                cost: req.cost,
            };
            let checked = self.check(&r).await;
            let d = &checked.decision;
            if d.allowed {
                Ok(Verdict::Send {
                    wait: Duration::from_nanos(d.wait.as_u64()),
                })
            } else {
                let deciding = d.deciding.as_ref();
                let retry = deciding.map_or(spillway_core::Nanos(0), |r| r.verdict.retry_after);
                Ok(Verdict::Wait {
                    retry_after: if retry.is_never() {
                        Duration::MAX
                    } else {
                        Duration::from_nanos(retry.as_u64())
                    },
                    rule: deciding
                        .and_then(|r| checked.rule(r))
                        .map(|r| r.name().to_string()),
                })
            }
        })
    }
}

/// Headers never sent to a spillway server with a check: credentials.
#[cfg(feature = "api")]
const SECRET_HEADERS: [&str; 3] = ["authorization", "proxy-authorization", "cookie"];

/// A spillway server decides: every instance asking it shares the rules
/// of its rules file. The request goes as a check: `api` `METHOD /path`,
/// its headers (up to 64, without `Authorization`, `Proxy-Authorization`
/// and `Cookie`), and the descriptor `host`.
#[cfg(feature = "api")]
impl Decider for crate::api::DecisionClient {
    fn decide<'a>(&'a self, req: &'a Outbound<'a>) -> BoxFuture<'a, Result<Verdict, DeciderError>> {
        Box::pin(async move {
            // The decision API refuses an `api` over 1 KiB and a body
            // over 64 KiB: cut both to fit rather than be refused.
            let mut api = format!("{} {}", req.method, req.path);
            if api.len() > 1024 {
                let mut end = 1024;
                while !api.is_char_boundary(end) {
                    end -= 1;
                }
                api.truncate(end);
            }
            let mut check = crate::api::Check::new().api(api).cost(req.cost);
            let mut budget = 48 * 1024;
            // Credentials stay here; what the decision API refuses (over
            // 64 headers, values over 1 KiB) is not sent.
            for (name, value) in req
                .headers
                .iter()
                .filter(|(n, _)| !SECRET_HEADERS.contains(&n.as_str()))
                .take(64)
            {
                if let Ok(v) = value.to_str().map(|v| v.get(..1024).unwrap_or(v)) {
                    let size = name.as_str().len() + v.len() + 8;
                    if size > budget {
                        break;
                    }
                    budget -= size;
                    check = check.header(name.as_str(), v);
                }
            }
            if !req.host.is_empty() {
                check = check.descriptor("host", req.host);
            }
            let d = self.check(&check).await.map_err(|e| DeciderError {
                message: e.to_string(),
                transient: e.is_transient(),
            })?;
            if d.allowed {
                Ok(Verdict::Send { wait: d.wait })
            } else {
                Ok(Verdict::Wait {
                    retry_after: d.retry_after,
                    rule: d.rule,
                })
            }
        })
    }
}

/// The rule set of a spillway rules file's text, read exactly as `spillway
/// serve` reads it: `rules:`, `descriptors:`, `path_matching:` and
/// `on_store_error:` (a whole server rules file is fine; its other
/// sections are ignored). `file` names the text in errors.
///
/// # Errors
/// Every problem in the file, each with its line and column.
pub fn rule_set(file: &str, text: &str) -> Result<spillway_store::RuleSet, spillway_rules::Errors> {
    spillway_rules::parse(file, text).map(into_rule_set)
}

/// [`rule_set`] of the file at `path`.
///
/// # Errors
/// The file cannot be read, or has problems (each with its line and column).
pub fn load_rules(
    path: &std::path::Path,
) -> Result<spillway_store::RuleSet, spillway_rules::Errors> {
    spillway_rules::load(path).map(into_rule_set)
}

fn into_rule_set(f: spillway_rules::RuleFile) -> spillway_store::RuleSet {
    let mut set = spillway_store::RuleSet::with_path_matching(f.rules, f.path_matching);
    set.on_store_error = f.on_store_error;
    set
}

/// How the outbound layer behaves.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    /// Wait for the limit to admit a request, at most this long in all;
    /// zero: fail at once with [`OutboundError::Limited`].
    pub max_wait: Duration,
    /// When the decider cannot answer for a reason that may pass (a
    /// server down, a timeout): send anyway (fail open, true) or fail with
    /// [`OutboundError::Decider`] (false). A decider that refuses the
    /// request itself always fails it.
    pub on_error_send: bool,
}

impl Default for OutboundConfig {
    fn default() -> OutboundConfig {
        OutboundConfig {
            max_wait: Duration::from_secs(30),
            on_error_send: true,
        }
    }
}

/// Why an outbound request was not sent (or not answered).
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboundError<E> {
    /// The inner service failed.
    Inner(E),
    /// The limit refuses it for `retry_after` yet, more than the layer
    /// may wait.
    Limited {
        /// When the limit would admit it.
        retry_after: Duration,
        /// The rule that refused, if known.
        rule: Option<String>,
    },
    /// The decider could not answer, and the layer fails closed.
    Decider(String),
}

impl<E: std::fmt::Display> std::fmt::Display for OutboundError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutboundError::Inner(e) => write!(f, "{e}"),
            OutboundError::Limited { retry_after, rule } => write!(
                f,
                "outbound rate limit{} reached: admitted again in {} ms",
                rule.as_deref().map_or(String::new(), |r| format!(" {r:?}")),
                retry_after.as_millis()
            ),
            OutboundError::Decider(e) => write!(f, "the outbound limiter could not decide: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OutboundError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutboundError::Inner(e) => Some(e),
            _ => None,
        }
    }
}

/// The layer.
#[derive(Clone)]
pub struct OutboundLayer {
    decider: Arc<dyn Decider>,
    config: Arc<OutboundConfig>,
    events: Arc<dyn Events>,
}

impl std::fmt::Debug for OutboundLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OutboundLayer {
    /// A layer asking `decider` before every request.
    pub fn new(decider: Arc<dyn Decider>, config: OutboundConfig) -> OutboundLayer {
        OutboundLayer {
            decider,
            config: Arc::new(config),
            events: Arc::new(NoEvents),
        }
    }

    /// Reports waits and local refusals to `events`.
    pub fn with_events(mut self, events: Arc<dyn Events>) -> OutboundLayer {
        self.events = events;
        self
    }
}

impl<S> tower_layer::Layer<S> for OutboundLayer {
    type Service = OutboundService<S>;
    fn layer(&self, inner: S) -> OutboundService<S> {
        OutboundService {
            inner,
            layer: self.clone(),
        }
    }
}

/// A client service whose requests are limited before they leave.
#[derive(Clone, Debug)]
pub struct OutboundService<S> {
    inner: S,
    layer: OutboundLayer,
}

impl<S, B> tower_service::Service<Request<B>> for OutboundService<S>
where
    S: tower_service::Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    S::Response: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = OutboundError<S::Error>;
    type Future = BoxFuture<'static, Result<S::Response, OutboundError<S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(OutboundError::Inner)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let deadline = Instant::now().checked_add(layer.config.max_wait);
            let host = req
                .uri()
                .authority()
                .map_or_else(String::new, |a| a.as_str().to_ascii_lowercase());
            loop {
                let verdict = {
                    let out = Outbound {
                        method: req.method().as_str(),
                        path: req.uri().path(),
                        host: &host,
                        headers: req.headers(),
                        cost: req.extensions().get::<Cost>().map_or(1, |c| c.0),
                    };
                    layer.decider.decide(&out).await
                };
                match verdict {
                    Ok(Verdict::Send { wait }) => {
                        let late = !wait.is_zero()
                            && Instant::now()
                                .checked_add(wait)
                                .is_none_or(|at| deadline.is_some_and(|d| at > d));
                        if late {
                            // A shaper's slot past what the layer may wait
                            // (it stays reserved until it passes).
                            layer.events.rejected_locally("outbound limit");
                            return Err(OutboundError::Limited {
                                retry_after: wait,
                                rule: None,
                            });
                        }
                        if !wait.is_zero() {
                            layer.events.waited(wait);
                            tokio::time::sleep(wait).await;
                        }
                        break;
                    }
                    Ok(Verdict::Wait { retry_after, rule }) => {
                        let now = Instant::now();
                        let fits = now
                            .checked_add(retry_after)
                            .is_some_and(|at| deadline.is_none_or(|d| at <= d));
                        if !fits || retry_after.is_zero() && layer.config.max_wait.is_zero() {
                            layer.events.rejected_locally("outbound limit");
                            return Err(OutboundError::Limited { retry_after, rule });
                        }
                        layer.events.waited(retry_after);
                        // At least a millisecond: a limit that says "now"
                        // and refuses again must not spin.
                        tokio::time::sleep(retry_after.max(Duration::from_millis(1))).await;
                    }
                    Err(e) if e.transient && layer.config.on_error_send => break,
                    Err(e) => {
                        layer
                            .events
                            .rejected_locally("outbound limiter unavailable");
                        return Err(OutboundError::Decider(e.message));
                    }
                }
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(OutboundError::Inner)?;
            inner.call(req).await.map_err(OutboundError::Inner)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use spillway_core::{FixedWindow, KeySpec, Limit, ManualClock, Mode, Nanos, Rule};
    use spillway_store::{MemoryStore, RuleSet};
    use tower::{Service, ServiceExt};

    use super::*;

    fn limiter(by: &str, api: Option<&str>, limit: u64) -> Arc<Limiter<MemoryStore<ManualClock>>> {
        let rule = Rule::new(
            "third-party",
            api.map(|a| spillway_core::Route::parse(a).unwrap()),
            KeySpec::parse(by).unwrap(),
            vec![Limit::FixedWindow(
                FixedWindow::new(limit, Nanos::from_secs(3600)).unwrap(),
            )],
            Mode::Hard,
        )
        .unwrap();
        let clock = ManualClock::new(Nanos::from_secs(1_800_000_000));
        Arc::new(Limiter::new(
            MemoryStore::new(clock, Default::default()),
            RuleSet::new(vec![rule]),
        ))
    }

    fn counting() -> (
        Arc<AtomicU64>,
        impl tower_service::Service<
            Request<()>,
            Response = u16,
            Error = std::convert::Infallible,
            Future = impl Future<Output = Result<u16, std::convert::Infallible>> + Send,
        > + Clone
        + Send
        + 'static,
    ) {
        let n = Arc::new(AtomicU64::new(0));
        let m = n.clone();
        let svc = tower::service_fn(move |_req: Request<()>| {
            let m = m.clone();
            async move {
                m.fetch_add(1, Ordering::SeqCst);
                Ok::<u16, std::convert::Infallible>(200)
            }
        });
        (n, svc)
    }

    /// Whether `req` went through `svc`.
    async fn goes<S: Service<Request<()>>>(svc: &mut S, req: Request<()>) -> bool {
        match svc.ready().await {
            Ok(s) => s.call(req).await.is_ok(),
            Err(_) => false,
        }
    }

    #[tokio::test]
    async fn requests_past_the_limit_never_leave_and_fail_typed() {
        let (sent, inner) = counting();
        let layer = OutboundLayer::new(
            limiter("host", None, 3),
            OutboundConfig {
                max_wait: Duration::ZERO,
                on_error_send: true,
            },
        );
        let mut svc = tower_layer::Layer::layer(&layer, inner);
        let mut refused = 0;
        for _ in 0..5 {
            let req = Request::get("http://api.example.com/v1/x")
                .body(())
                .unwrap();
            match svc.ready().await.unwrap().call(req).await {
                Ok(_) => {}
                Err(OutboundError::Limited { rule, .. }) => {
                    assert_eq!(rule.as_deref(), Some("third-party"));
                    refused += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!((sent.load(Ordering::SeqCst), refused), (3, 2));
        // Another host has a budget of its own.
        let req = Request::get("http://other.example.com/v1/x")
            .body(())
            .unwrap();
        assert!(svc.ready().await.unwrap().call(req).await.is_ok());
    }

    #[tokio::test]
    async fn rules_match_the_outbound_api_and_headers() {
        let (sent, inner) = counting();
        let layer = OutboundLayer::new(
            limiter("header:X-Api-Key", Some("POST /v1/orders"), 1),
            OutboundConfig {
                max_wait: Duration::ZERO,
                on_error_send: true,
            },
        );
        let mut svc = tower_layer::Layer::layer(&layer, inner);
        let call = |method: &str, path: &str, key: &str| {
            Request::builder()
                .method(method)
                .uri(format!("http://api.example.com{path}"))
                .header("x-api-key", key)
                .body(())
                .unwrap()
        };
        assert!(goes(&mut svc, call("POST", "/v1/orders", "a")).await);
        assert!(!goes(&mut svc, call("POST", "/v1/orders", "a")).await);
        // Another key, and another API, are not limited by it.
        assert!(goes(&mut svc, call("POST", "/v1/orders", "b")).await);
        assert!(goes(&mut svc, call("GET", "/v1/orders", "a")).await);
        assert_eq!(sent.load(Ordering::SeqCst), 3);
    }

    /// The same YAML rules file as the server's: a partner's published
    /// limit per API key and per server, read with `rule_set`.
    #[tokio::test]
    async fn rules_come_from_the_same_yaml_as_the_servers() {
        let yaml = "
store: memory            # server sections are ignored here
descriptors: [host]
rules:
  - name: partner
    api: POST /v1/quote
    by: host+header:X-Api-Key
    limits:
      - sliding_window_log: { limit: 2, window: 1m }
";
        let set = rule_set("partner.yaml", yaml).unwrap();
        let limiter = Arc::new(Limiter::new(
            MemoryStore::new(
                ManualClock::new(Nanos::from_secs(1_800_000_000)),
                Default::default(),
            ),
            set,
        ));
        let (sent, inner) = counting();
        let layer = OutboundLayer::new(
            limiter,
            OutboundConfig {
                max_wait: Duration::ZERO,
                on_error_send: true,
            },
        );
        let mut svc = tower_layer::Layer::layer(&layer, inner);
        let quote = |key: &str| {
            Request::post("https://partner.example.com/v1/quote")
                .header("x-api-key", key)
                .body(())
                .unwrap()
        };
        for _ in 0..2 {
            assert!(goes(&mut svc, quote("k1")).await);
        }
        assert!(matches!(
            svc.ready().await.unwrap().call(quote("k1")).await,
            Err(OutboundError::Limited { .. })
        ));
        assert!(goes(&mut svc, quote("k2")).await);
        assert_eq!(sent.load(Ordering::SeqCst), 3);
        // The server's errors, with their places.
        let bad = rule_set(
            "bad.yaml",
            "rules:\n  - name: x\n    by: usr\n    limits: []\n",
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains("bad.yaml:3:"), "{bad}");
    }
}
