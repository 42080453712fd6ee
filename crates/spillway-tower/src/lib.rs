//! # spillway-tower
//!
//! A [`tower`](https://docs.rs/tower) layer that rate limits every request
//! with a shared spillway [`Limiter`]: put it in front of an axum router, a
//! tonic service or a hyper service.
//!
//! - The limiter is shared behind an `Arc`: every clone of the service sees
//!   the same counters (a per-clone limiter would silently multiply limits).
//! - The API is the request's method and path, matched against the rules'
//!   routes; who the client is comes from your [`Identify`] (a closure).
//! - Denied requests get `429` with the `RateLimit`, `RateLimit-Policy`,
//!   `X-RateLimit-*` and `Retry-After` headers and an RFC 9457 problem body;
//!   admitted responses carry the rate limit headers too. Or, with
//!   [`RateLimitLayer::pass_denied`], denied requests reach your service with
//!   the decision in their extensions ([`RateLimitInfo`]) and you answer.
//! - A rule with `queue:` (a leaky bucket shaper) makes the request wait its
//!   turn before it reaches your service, instead of failing.
//! - A rule whose cost is known only after the answer
//!   ([`spillway_core::Rule::with_response_cost`]: tokens an LLM used, rows
//!   a query returned) is checked before the request (or charged its
//!   estimate), and charged what the response header your service sets
//!   says, after the fact: counted even past the limit, so the key is in
//!   debt and refused until it is paid back.
//!
//! ```
//! use std::sync::Arc;
//! use spillway_core::{Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule};
//! use spillway_store::{Limiter, MemoryStore, RuleSet, SystemClock};
//! use spillway_tower::{Identity, RateLimitLayer};
//!
//! let rule = Rule::new("api", None, KeySpec::parse("user")?,
//!     vec![Limit::Gcra(Gcra::new(Rate::new(10, Nanos::from_secs(1))?, 5)?)], Mode::Hard)?;
//! let limiter = Arc::new(Limiter::new(
//!     MemoryStore::new(SystemClock::new(), Default::default()),
//!     RuleSet::new(vec![rule]),
//! ));
//! let layer = RateLimitLayer::new(limiter, |req: &http::Request<axum::body::Body>| Identity {
//!     user: req.headers().get("x-user-id").and_then(|v| v.to_str().ok()).map(String::from),
//!     ..Identity::default()
//! });
//! let app: axum::Router = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .layer(layer);
//! # Ok::<(), spillway_core::Error>(())
//! ```
//!
//! [`Limiter`]: spillway_store::Limiter

#![warn(missing_docs, unreachable_pub)]

mod headers;
mod problem;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use spillway_core::Attributes;
use spillway_store::{Checked, Limiter, Store};
use tower_layer::Layer;
use tower_service::Service;

use headers::insert_rate_limit_headers;
use problem::{PROBLEM_JSON, problem_body};

pub mod render {
    //! What a server that writes its own answers needs to write them as
    //! the layer does: the rate limit headers (`RateLimit`,
    //! `RateLimit-Policy`, `X-RateLimit-*`, `Retry-After`) and the RFC 9457
    //! problem body of a denial or an error, as values or appended to a
    //! reused buffer. spillway's decision API, reverse proxy and gRPC JSON
    //! endpoint write with these, so every way in answers alike.
    pub use crate::headers::{
        DECISION_HEADERS, ZONE, insert_rate_limit_headers, push_rate_limit_headers,
        rate_limit_headers, retry_after_secs, zone,
    };
    pub use crate::problem::{
        PROBLEM_JSON, Problem, problem_body, push_json_escaped, push_problem_body,
    };
}

/// Who a request comes from, as the application sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The user or API key.
    pub user: Option<String>,
    /// The client IP.
    pub ip: Option<String>,
    /// Other named values for rules keyed by a descriptor.
    pub descriptors: Vec<(String, String)>,
    /// The request's cost (0 is taken as 1).
    pub cost: u64,
    /// The API the request belongs to, as rules' `api` routes see it:
    /// `"METHOD /path"` or `"/path"` (a matched route template such as
    /// `/users/{id}`, or a name of the application's own). `None`: the
    /// request's method and path.
    pub api: Option<String>,
}

/// Extracts an [`Identity`] from a request. Any
/// `Fn(&http::Request<B>) -> Identity` is one.
pub trait Identify<B>: Send + Sync + 'static {
    /// The identity of `req`.
    fn identify(&self, req: &Request<B>) -> Identity;
}

impl<B, F> Identify<B> for F
where
    F: Fn(&Request<B>) -> Identity + Send + Sync + 'static,
{
    fn identify(&self, req: &Request<B>) -> Identity {
        self(req)
    }
}

/// The decision, in the request's extensions (always) and, when the layer
/// answers a denial itself, in the 429 response's extensions.
#[derive(Debug, Clone)]
pub struct RateLimitInfo(pub Arc<Checked>);

/// Builds the response for a denied request.
pub trait Deny<ResBody>: Send + Sync + 'static {
    /// The response for `checked` (denied).
    fn deny(&self, checked: &Checked) -> Response<ResBody>;

    /// The response for a request refused before it was decided, because
    /// a header a rule in force is keyed by cannot be read as one value:
    /// it is not UTF-8, or it was sent twice with different values (which
    /// one the service reads is not known: counting either would let the
    /// other pass). `refused` is a denial no rule decided; `detail` says
    /// why. By default the denial of `refused`; [`ProblemJson`] answers
    /// 400 with `detail`. Never skipped: a value that cannot be read is
    /// refused, not passed over.
    fn refuse(&self, refused: &Checked, detail: &str) -> Response<ResBody> {
        let _ = detail;
        self.deny(refused)
    }
}

/// 429 with an RFC 9457 `application/problem+json` body and the rate limit
/// headers; for any body type that can be made from a `String` (axum's,
/// hyper's `Full`, ...).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

/// What [`admit`] decided.
#[derive(Debug)]
pub enum Admission {
    /// Go on: any queue wait is over.
    Admitted(Checked),
    /// Answer 429 (or, with `pass_denied`, let the service answer).
    Denied(Checked),
}

/// The transport-neutral admit step every HTTP way in shares (this
/// layer, and both of the proxy's transports): decide `request`, tell
/// `observe` the decision and how long it took, and for an admitted request
/// that a shaper queued, wait its turn. Dropping the future (the client
/// went away) leaves the queue.
pub async fn admit<S: Store>(
    limiter: &Limiter<S>,
    request: &spillway_store::Request<'_>,
    observe: impl FnOnce(&Checked, std::time::Duration),
) -> Admission {
    let started = std::time::Instant::now();
    let checked = limiter.check(request).await;
    observe(&checked, started.elapsed());
    if !checked.decision.allowed {
        return Admission::Denied(checked);
    }
    let wait = checked.decision.wait;
    if wait.as_u64() > 0 {
        tokio::time::sleep(wait.into()).await;
    }
    Admission::Admitted(checked)
}

impl<B: From<String>> Deny<B> for ProblemJson {
    fn refuse(&self, _: &Checked, detail: &str) -> Response<B> {
        let body = problem::Problem::new(StatusCode::BAD_REQUEST, detail.to_string()).to_json();
        let mut resp = Response::new(B::from(body));
        *resp.status_mut() = StatusCode::BAD_REQUEST;
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(PROBLEM_JSON),
        );
        resp
    }

    fn deny(&self, checked: &Checked) -> Response<B> {
        let mut resp = Response::new(B::from(problem_body(checked)));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(PROBLEM_JSON),
        );
        insert_rate_limit_headers(checked, resp.headers_mut());
        resp
    }
}

/// Called with every decision and how long it took (see [`RateLimitLayer::observe`]).
pub type Observer = Arc<dyn Fn(&Checked, std::time::Duration) + Send + Sync>;

/// The layer. Cheap to clone: the limiter and extractor are shared.
pub struct RateLimitLayer<S, I, D = ProblemJson> {
    limiter: Arc<Limiter<S>>,
    identify: Arc<I>,
    deny: Arc<D>,
    pass_denied: bool,
    observe: Option<Observer>,
}

impl<S, I, D> Clone for RateLimitLayer<S, I, D> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            identify: self.identify.clone(),
            deny: self.deny.clone(),
            pass_denied: self.pass_denied,
            observe: self.observe.clone(),
        }
    }
}

impl<S, I, D> fmt::Debug for RateLimitLayer<S, I, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("pass_denied", &self.pass_denied)
            .finish_non_exhaustive()
    }
}

impl<S, I> RateLimitLayer<S, I, ProblemJson> {
    /// A layer deciding with `limiter`, identifying clients with `identify`.
    pub fn new(limiter: Arc<Limiter<S>>, identify: I) -> Self {
        RateLimitLayer {
            limiter,
            identify: Arc::new(identify),
            deny: Arc::new(ProblemJson),
            pass_denied: false,
            observe: None,
        }
    }
}

impl<S, I, D> RateLimitLayer<S, I, D> {
    /// Let denied requests through to the service, with the decision in
    /// their extensions ([`RateLimitInfo`]), for services that answer themselves.
    pub fn pass_denied(mut self, pass: bool) -> Self {
        self.pass_denied = pass;
        self
    }

    /// Answer denials with `deny` (e.g. a gRPC status for tonic services).
    pub fn on_deny<D2>(self, deny: D2) -> RateLimitLayer<S, I, D2> {
        RateLimitLayer {
            limiter: self.limiter,
            identify: self.identify,
            deny: Arc::new(deny),
            pass_denied: self.pass_denied,
            observe: self.observe,
        }
    }

    /// Calls `f` with every decision and the time it took, before the
    /// request goes on or is answered: for metrics or logs.
    pub fn observe(
        mut self,
        f: impl Fn(&Checked, std::time::Duration) + Send + Sync + 'static,
    ) -> Self {
        self.observe = Some(Arc::new(f));
        self
    }
}

impl<Svc, S, I, D> Layer<Svc> for RateLimitLayer<S, I, D> {
    type Service = RateLimit<Svc, S, I, D>;

    fn layer(&self, inner: Svc) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service the layer wraps around yours.
pub struct RateLimit<Svc, S, I, D = ProblemJson> {
    inner: Svc,
    layer: RateLimitLayer<S, I, D>,
}

impl<Svc: Clone, S, I, D> Clone for RateLimit<Svc, S, I, D> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc, S, I, D> fmt::Debug for RateLimit<Svc, S, I, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

/// The identity of a request, with its headers for `header:` keys.
struct Attrs<'a> {
    id: &'a Identity,
    headers: &'a HeaderMap,
}

impl Attributes for Attrs<'_> {
    fn user(&self) -> Option<&str> {
        self.id.user.as_deref()
    }
    fn ip(&self) -> Option<&str> {
        self.id.ip.as_deref()
    }
    fn header(&self, name: &str) -> Option<&str> {
        // As bytes: `to_str` refuses every byte past ASCII, so `é` would
        // read as missing and skip the rule. An unreadable value was
        // refused before the limiter was asked, unless the rules were
        // replaced in between: then it is one key, never missing.
        let mut values = self.headers.get_all(name).iter();
        let first = values.next()?;
        if !values.all(|v| v == first) {
            return Some(spillway_core::UNREADABLE_HEADER);
        }
        Some(std::str::from_utf8(first.as_bytes()).unwrap_or(spillway_core::UNREADABLE_HEADER))
    }
    fn descriptor(&self, name: &str) -> Option<&str> {
        self.id
            .descriptors
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Whether `name` is absent from `headers` or reads as one text value:
/// UTF-8, every copy the same.
fn one_text_value(headers: &HeaderMap, name: &str) -> bool {
    let mut values = headers.get_all(name).iter();
    match values.next() {
        None => true,
        Some(first) => std::str::from_utf8(first.as_bytes()).is_ok() && values.all(|v| v == first),
    }
}

/// The boxed future of [`RateLimit`].
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<Svc, S, I, D, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<Svc, S, I, D>
where
    Svc: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    S: Store,
    I: Identify<ReqBody>,
    D: Deny<ResBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // Take the service that was driven to readiness; leave a clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let unreadable = layer
                .limiter
                .unreadable_key_header(|name| one_text_value(req.headers(), name));
            if let Some(name) = unreadable {
                let refused = Checked {
                    decision: spillway_core::Decision {
                        allowed: false,
                        ..spillway_core::Decision::unlimited()
                    },
                    rules: layer.limiter.rules(),
                    skipped: Vec::new(),
                    store_error: None,
                };
                let detail = format!(
                    "header {name} is not one UTF-8 value (not text, or sent twice with different values): a rule is keyed by it"
                );
                return Ok(layer.deny.refuse(&refused, &detail));
            }
            let id = layer.identify.identify(&req);
            let admission = {
                let attrs = Attrs {
                    id: &id,
                    headers: req.headers(),
                };
                let (method, path) = match id.api.as_deref() {
                    Some(api) => spillway_core::rule::split_api(api),
                    None => (Some(req.method().as_str()), req.uri().path()),
                };
                let api = spillway_store::Request {
                    method,
                    path: Some(path),
                    attrs: &attrs,
                    cost: id.cost.max(1),
                };
                admit(&layer.limiter, &api, |checked, took| {
                    if let Some(f) = &layer.observe {
                        f(checked, took);
                    }
                })
                .await
            };
            let checked = match admission {
                Admission::Admitted(c) => Arc::new(c),
                Admission::Denied(c) => {
                    let checked = Arc::new(c);
                    if !layer.pass_denied {
                        let mut resp = layer.deny.deny(&checked);
                        resp.extensions_mut().insert(RateLimitInfo(checked));
                        return Ok(resp);
                    }
                    checked
                }
            };
            req.extensions_mut().insert(RateLimitInfo(checked.clone()));
            // A rule that reads its cost from the answer: keep what its key
            // needs, and charge once the answer's head says.
            let settle = checked
                .decision
                .rules
                .iter()
                .any(|rd| {
                    checked
                        .rule(rd)
                        .is_some_and(|r| r.response_cost().is_some())
                })
                .then(|| {
                    let (method, path) = match id.api.clone() {
                        Some(api) => {
                            let (m, p) = spillway_core::rule::split_api(&api);
                            (m.map(str::to_string), p.to_string())
                        }
                        None => (
                            Some(req.method().as_str().to_string()),
                            req.uri().path().to_string(),
                        ),
                    };
                    (method, path, req.headers().clone())
                });
            let mut resp = inner.call(req).await?;
            if let Some((method, path, headers)) = settle {
                let attrs = Attrs {
                    id: &id,
                    headers: &headers,
                };
                let request = spillway_store::Request {
                    method: method.as_deref(),
                    path: Some(&path),
                    attrs: &attrs,
                    cost: 0,
                };
                let answer = resp.headers();
                let cost_of = |rule: &spillway_core::Rule| -> Option<u64> {
                    let name = &rule.response_cost()?.header;
                    let mut values = answer.get_all(name).iter();
                    let first = values.next()?;
                    // Two copies that disagree say nothing readable.
                    let value = if values.all(|v| v == first) {
                        first.as_bytes()
                    } else {
                        b"(disagreeing copies)"
                    };
                    // Not a whole number: the rule's largest limit.
                    Some(rule.answered_cost(value).unwrap_or_else(|most| most))
                };
                layer.limiter.settle(&request, &cost_of).await;
            }
            insert_rate_limit_headers(&checked, resp.headers_mut());
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use spillway_core::{Attributes, UNREADABLE_HEADER};

    #[test]
    fn an_unreadable_header_is_one_key_never_missing() {
        let mut h = HeaderMap::new();
        h.insert("x-raw", HeaderValue::from_bytes(b"a\xffb").unwrap());
        h.append("x-twice", HeaderValue::from_static("a"));
        h.append("x-twice", HeaderValue::from_static("b"));
        h.append(
            "x-same",
            HeaderValue::from_bytes("\u{e9}t\u{e9}".as_bytes()).unwrap(),
        );
        h.append(
            "x-same",
            HeaderValue::from_bytes("\u{e9}t\u{e9}".as_bytes()).unwrap(),
        );
        let id = Identity::default();
        let attrs = Attrs {
            id: &id,
            headers: &h,
        };
        assert_eq!(attrs.header("x-raw"), Some(UNREADABLE_HEADER));
        assert_eq!(attrs.header("x-twice"), Some(UNREADABLE_HEADER));
        assert_eq!(attrs.header("x-same"), Some("\u{e9}t\u{e9}"));
        assert_eq!(attrs.header("x-absent"), None);
    }
}
