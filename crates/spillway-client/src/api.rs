//! A typed client for spillway's own decision API (`spillway serve`):
//! `POST /v1/check`, `GET /v1/limit` and `POST /v1/charge`
//! (docs/openapi.yaml).
//!
//! One [`DecisionClient`] holds one connection pool, so clones share
//! kept-alive connections to the server; every call has a deadline
//! ([`DecisionClient::with_timeout`], 2 s by default) covering connecting,
//! sending and reading the whole answer.
//!
//! A denial is an answer, not an error: a 429 is a [`Decision`] with
//! `allowed == false`. Errors are what leaves the caller without a
//! decision: no connection, no answer in time, a request the server
//! refused (400), a server failure, or an answer that is not a decision.
//! When the server's store failed and its failure policy decided instead,
//! the decision says so in [`Decision::store_error`].
//!
//! Only `http://` is supported: the decision API is meant for a sidecar or
//! a private network; put a TLS-terminating proxy in front otherwise.
//!
//! # Examples
//!
//! ```no_run
//! use spillway_client::api::{Check, DecisionClient};
//! # async fn run() -> Result<(), spillway_client::api::ApiError> {
//! let client = DecisionClient::new("http://127.0.0.1:8080")?;
//! let decision = client
//!     .check(&Check::new().api("POST /v1/login").user("alice"))
//!     .await?;
//! if !decision.allowed {
//!     println!("come back in {:?}", decision.retry_after);
//! }
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

/// The largest answer body read; a longer one is [`ApiError::Malformed`].
pub const MAX_ANSWER: usize = 1024 * 1024;

/// The deadline of a call unless [`DecisionClient::with_timeout`] says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// How much of an error body is kept in [`ApiError`] messages, in chars.
const SNIPPET: usize = 512;

/// A client of one spillway server's decision API.
///
/// Cloning is cheap and clones share the connection pool.
#[derive(Clone)]
pub struct DecisionClient {
    /// Pooled, kept-alive HTTP/1.1 connections.
    http: Client<HttpConnector, Full<Bytes>>,
    /// `http://host:port` plus any path prefix, without a trailing `/`.
    base: String,
    /// The deadline of one whole call.
    timeout: Duration,
    /// `Authorization: Bearer ...`, for a server behind a gateway that
    /// wants one (spillway's decision API itself needs none).
    bearer: Option<HeaderValue>,
}

impl fmt::Debug for DecisionClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token stays out of logs.
        f.debug_struct("DecisionClient")
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl DecisionClient {
    /// A client of the server at `base`, e.g. `http://127.0.0.1:8080`
    /// (a path prefix such as `http://gw/spillway` is kept in front of
    /// `/v1/...`).
    ///
    /// # Errors
    ///
    /// [`ApiError::Config`] when `base` is not an `http://` URL with a host,
    /// or has a query, a fragment or user info.
    pub fn new(base: &str) -> Result<DecisionClient, ApiError> {
        let bad = |why: &str| ApiError::Config(format!("base URL {base:?}: {why}"));
        let uri: Uri = base.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(bad(&format!("scheme {other:?}; only http:// is supported")));
            }
            None => return Err(bad("no scheme; expected http://host:port")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.host().is_empty() {
            return Err(bad("no host"));
        }
        if authority.as_str().contains('@') {
            return Err(bad("user info is not supported; use with_bearer"));
        }
        if uri.query().is_some() || base.contains('#') {
            return Err(bad("a base URL takes no query or fragment"));
        }
        let prefix = uri.path().trim_end_matches('/');
        let base = format!("http://{authority}{prefix}");
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Ok(DecisionClient {
            http,
            base,
            timeout: DEFAULT_TIMEOUT,
            bearer: None,
        })
    }

    /// Sets the deadline of each call: connecting, sending and reading the
    /// answer all count (default [`DEFAULT_TIMEOUT`]).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> DecisionClient {
        self.timeout = timeout;
        self
    }

    /// Sends `Authorization: Bearer <token>` with every call, for a server
    /// reached through a gateway that asks for one.
    ///
    /// # Errors
    ///
    /// [`ApiError::Config`] when the token cannot be a header value
    /// (control characters, non-ASCII).
    pub fn with_bearer(mut self, token: &str) -> Result<DecisionClient, ApiError> {
        let mut value = HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| ApiError::Config("the bearer token is not a valid header value".into()))?;
        value.set_sensitive(true);
        self.bearer = Some(value);
        Ok(self)
    }

    /// The base URL calls go to, as normalised by [`DecisionClient::new`].
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Decides a request (`POST /v1/check`): charged its cost when allowed,
    /// not charged when denied.
    ///
    /// # Errors
    ///
    /// See [`ApiError`]; a denial (429) is `Ok` with `allowed == false`.
    pub async fn check(&self, check: &Check) -> Result<Decision, ApiError> {
        self.post("/v1/check", check).await
    }

    /// Charges a cost known only after the request was served (`POST
    /// /v1/charge`): always counted, even past the limit. The answer is
    /// never a 429; [`Decision::over`] says whether the key is now past its
    /// limit.
    ///
    /// # Errors
    ///
    /// See [`ApiError`]. After [`ApiError::Transport`] or
    /// [`ApiError::Timeout`] the charge may or may not have been counted.
    pub async fn charge(&self, check: &Check) -> Result<Decision, ApiError> {
        self.post("/v1/charge", check).await
    }

    /// Decides a request of cost 1 for the user `key` (`GET
    /// /v1/limit?key=...`), matching only rules without an `api`.
    ///
    /// # Errors
    ///
    /// See [`ApiError`]; a denial (429) is `Ok` with `allowed == false`.
    pub async fn limit(&self, key: &str) -> Result<Decision, ApiError> {
        self.limit_with(Some(key), None, None).await
    }

    /// `GET /v1/limit` with each of its parameters optional: the user
    /// `key`, the `api` (`"METHOD /path"` or `"/path"`) and the `cost`
    /// (default 1; 0 only checks).
    ///
    /// # Errors
    ///
    /// See [`ApiError`]; a denial (429) is `Ok` with `allowed == false`.
    pub async fn limit_with(
        &self,
        key: Option<&str>,
        api: Option<&str>,
        cost: Option<u64>,
    ) -> Result<Decision, ApiError> {
        let mut query = String::new();
        let mut push = |name: &str, value: &str| {
            query.push(if query.is_empty() { '?' } else { '&' });
            query.push_str(name);
            query.push('=');
            percent_encode(&mut query, value);
        };
        if let Some(key) = key {
            push("key", key);
        }
        if let Some(api) = api {
            push("api", api);
        }
        if let Some(cost) = cost {
            push("cost", &cost.to_string());
        }
        let path = format!("/v1/limit{query}");
        self.call(Method::GET, &path, Bytes::new()).await
    }

    async fn post(&self, path: &str, check: &Check) -> Result<Decision, ApiError> {
        let body = serde_json::to_vec(check)
            .map_err(|e| ApiError::Config(format!("cannot encode the check: {e}")))?;
        self.call(Method::POST, path, Bytes::from(body)).await
    }

    async fn call(&self, method: Method, path: &str, body: Bytes) -> Result<Decision, ApiError> {
        let uri = format!("{}{path}", self.base);
        let mut req = Request::builder()
            .method(method)
            .uri(uri.as_str())
            .body(Full::new(body))
            .map_err(|e| ApiError::Config(format!("cannot build a request to {uri}: {e}")))?;
        let headers = req.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(bearer) = &self.bearer {
            headers.insert(AUTHORIZATION, bearer.clone());
        }
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| {
                let msg = format!("{uri}: {}", chain(&e));
                if e.is_connect() {
                    ApiError::Connect(msg)
                } else {
                    ApiError::Transport(msg)
                }
            })?;
            let (parts, body) = resp.into_parts();
            let bytes = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<LengthLimitError>() {
                        ApiError::Malformed(format!("{uri}: answer over {MAX_ANSWER} bytes"))
                    } else {
                        ApiError::Transport(format!("{uri}: reading the answer: {e}"))
                    }
                })?
                .to_bytes();
            Ok::<_, ApiError>((parts.status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ApiError::Timeout(self.timeout))??;
        decode(status, &bytes)
    }
}

/// `e` and its sources, joined with `: ` (hyper's own message is terse).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Percent-encodes a query value: everything but RFC 3986's unreserved
/// characters, so `+`, `&` and `=` reach the server as themselves.
fn percent_encode(out: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
}

/// Turns an answer into a decision or an error. Never panics, whatever
/// the bytes.
fn decode(status: StatusCode, body: &[u8]) -> Result<Decision, ApiError> {
    match status.as_u16() {
        200 | 429 => serde_json::from_slice::<Decision>(body).map_err(|e| {
            ApiError::Malformed(format!(
                "a {} answer that is not a decision ({e}): {}",
                status.as_u16(),
                snippet(body)
            ))
        }),
        400..=499 => {
            #[derive(Deserialize)]
            struct Problem {
                detail: Option<String>,
                title: Option<String>,
            }
            let detail = match serde_json::from_slice::<Problem>(body) {
                Ok(Problem {
                    detail: Some(d), ..
                }) => d,
                Ok(Problem { title: Some(t), .. }) => t,
                // A 413 is plain text; a gateway's 4xx may be anything.
                _ => snippet(body),
            };
            Err(ApiError::BadRequest { status, detail })
        }
        _ => Err(ApiError::Server {
            status,
            body: snippet(body),
        }),
    }
}

/// The start of a body as text, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(SNIPPET) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// What a request to decide is: the body of `POST /v1/check` and `POST
/// /v1/charge`. Every part is optional; a rule matches only requests that
/// have the parts its `api` and `by` name.
///
/// # Examples
///
/// ```
/// use spillway_client::api::Check;
/// let check = Check::new()
///     .api("POST /v1/chat")
///     .user("alice")
///     .header("x-tenant", "acme")
///     .cost(250);
/// assert_eq!(check.cost, Some(250));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `"METHOD /path"` or `"/path"`; absent matches only rules without `api`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// The user, for rules `by: user`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The client address, for rules `by: ip`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// What the request costs (the server's default is 1; 0 only checks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    /// Headers, for rules `by: header:<Name>` (names are case-insensitive).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Descriptors, for rules keyed by descriptor.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub descriptors: BTreeMap<String, String>,
}

impl Check {
    /// An empty check.
    pub fn new() -> Check {
        Check::default()
    }

    /// Sets the api: `"METHOD /path"` or `"/path"`.
    #[must_use]
    pub fn api(mut self, api: impl Into<String>) -> Check {
        self.api = Some(api.into());
        self
    }

    /// Sets the user.
    #[must_use]
    pub fn user(mut self, user: impl Into<String>) -> Check {
        self.user = Some(user.into());
        self
    }

    /// Sets the client address.
    #[must_use]
    pub fn ip(mut self, ip: impl Into<String>) -> Check {
        self.ip = Some(ip.into());
        self
    }

    /// Sets the cost.
    #[must_use]
    pub fn cost(mut self, cost: u64) -> Check {
        self.cost = Some(cost);
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Check {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Adds a descriptor.
    #[must_use]
    pub fn descriptor(mut self, name: impl Into<String>, value: impl Into<String>) -> Check {
        self.descriptors.insert(name.into(), value.into());
        self
    }
}

/// What happened to a request under a rule, or overall.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum Outcome {
    /// Admitted within the limit.
    Allowed,
    /// Refused.
    Denied,
    /// Admitted, but a shadow rule would have refused it.
    ShadowDenied,
    /// Admitted above a soft rule's limit.
    SoftExceeded,
    /// Admitted above an elastic rule's plain limit.
    ElasticAdmitted,
    /// An outcome this client does not know (a newer server).
    Other(String),
}

/// The outcomes spillway-core knows: their spellings are core's, so the
/// client reads exactly what the server writes.
const KNOWN: [spillway_core::Outcome; 5] = [
    spillway_core::Outcome::Allowed,
    spillway_core::Outcome::Denied,
    spillway_core::Outcome::ShadowDenied,
    spillway_core::Outcome::SoftExceeded,
    spillway_core::Outcome::ElasticAdmitted,
];

impl From<spillway_core::Outcome> for Outcome {
    fn from(o: spillway_core::Outcome) -> Outcome {
        match o {
            spillway_core::Outcome::Allowed => Outcome::Allowed,
            spillway_core::Outcome::Denied => Outcome::Denied,
            spillway_core::Outcome::ShadowDenied => Outcome::ShadowDenied,
            spillway_core::Outcome::SoftExceeded => Outcome::SoftExceeded,
            spillway_core::Outcome::ElasticAdmitted => Outcome::ElasticAdmitted,
        }
    }
}

impl From<String> for Outcome {
    fn from(s: String) -> Outcome {
        KNOWN
            .into_iter()
            .find(|o| o.as_str() == s)
            .map_or(Outcome::Other(s), Outcome::from)
    }
}

impl Outcome {
    /// The outcome as the server spells it.
    pub fn as_str(&self) -> &str {
        let known = match self {
            Outcome::Allowed => spillway_core::Outcome::Allowed,
            Outcome::Denied => spillway_core::Outcome::Denied,
            Outcome::ShadowDenied => spillway_core::Outcome::ShadowDenied,
            Outcome::SoftExceeded => spillway_core::Outcome::SoftExceeded,
            Outcome::ElasticAdmitted => spillway_core::Outcome::ElasticAdmitted,
            Outcome::Other(s) => return s,
        };
        known.as_str()
    }
}

/// Reads a millisecond count as a [`Duration`].
fn millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// The server's answer (`Decision` in docs/openapi.yaml). Fields the
/// client does not know are ignored, so a newer server still decodes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request may go through (false on a 429, and on a charge
    /// that left the key over its limit).
    pub allowed: bool,
    /// Answers to [`DecisionClient::charge`] only: the key is now past its
    /// limit, and checks are refused until it has paid the excess back.
    #[serde(default)]
    pub over: Option<bool>,
    /// The overall outcome.
    pub outcome: Outcome,
    /// The deciding rule; `None` when no rule applied.
    pub rule: Option<String>,
    /// The deciding rule's limit.
    pub limit: Option<u64>,
    /// What the deciding rule has left.
    pub remaining: Option<u64>,
    /// Until the deciding rule's limit is fully reset.
    #[serde(rename = "reset_ms", deserialize_with = "millis")]
    pub reset: Duration,
    /// When denied, how long to wait before asking again (zero when
    /// allowed; [`NEVER`] when the cost exceeds what the limit can ever
    /// admit).
    #[serde(rename = "retry_after_ms", deserialize_with = "millis")]
    pub retry_after: Duration,
    /// How long a queueing rule asks the request to wait before it is sent.
    #[serde(rename = "wait_ms", deserialize_with = "millis")]
    pub wait: Duration,
    /// Shadow rules that would have denied.
    pub shadow_denied: Vec<String>,
    /// Soft rules that admitted the request above their limit.
    pub soft_exceeded: Vec<String>,
    /// Elastic rules that admitted the request above their plain limit.
    pub elastic_admitted: Vec<String>,
    /// Rules whose key part the request lacked.
    pub skipped: Vec<String>,
    /// The server's store failed and its failure policy (`on_store_error`)
    /// decided instead of the counters.
    pub store_error: bool,
    /// Each matching rule's part of the decision.
    pub rules: Vec<RuleDecision>,
}

/// The `retry_after` of a request that can never be admitted (its cost is
/// over what the limit can hold): the server's `18446744073709` ms.
pub const NEVER: Duration = Duration::from_millis(u64::MAX / 1_000_000);

/// One rule's part of a [`Decision`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct RuleDecision {
    /// The rule's name.
    pub rule: String,
    /// What the rule made of the request.
    pub outcome: Outcome,
    /// The algorithm of the limit that decided, e.g. `fixed_window`.
    pub algorithm: String,
    /// That limit.
    pub limit: u64,
    /// What it has left.
    pub remaining: u64,
    /// Until it is fully reset.
    #[serde(rename = "reset_ms", deserialize_with = "millis")]
    pub reset: Duration,
    /// When it denied, how long to wait.
    #[serde(rename = "retry_after_ms", deserialize_with = "millis")]
    pub retry_after: Duration,
}

/// Why a call produced no decision.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiError {
    /// The client was given a base URL or token it cannot use.
    Config(String),
    /// No answer within the deadline (the client's timeout, in the field).
    Timeout(Duration),
    /// No connection to the server: nothing was sent.
    Connect(String),
    /// The connection failed after the request may have been sent.
    Transport(String),
    /// The server refused the request as sent (a 4xx other than 429):
    /// bad input (400), a body over 64 KiB (413), a wrong base path (404).
    BadRequest {
        /// The status.
        status: StatusCode,
        /// The problem document's `detail`, else the start of the body.
        detail: String,
    },
    /// The server failed (5xx) or answered with an unexpected status.
    Server {
        /// The status.
        status: StatusCode,
        /// The start of the body.
        body: String,
    },
    /// A 200 or 429 whose body is not a decision, or an answer over
    /// [`MAX_ANSWER`] bytes.
    Malformed(String),
}

impl ApiError {
    /// Whether asking again later may succeed: a timeout, no connection,
    /// a broken one, or a server error (5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Timeout(_) | ApiError::Connect(_) | ApiError::Transport(_) => true,
            ApiError::Server { status, .. } => status.is_server_error(),
            ApiError::Config(_) | ApiError::BadRequest { .. } | ApiError::Malformed(_) => false,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Config(m) => write!(f, "decision client: {m}"),
            ApiError::Timeout(t) => write!(f, "decision API: no answer within {t:?}"),
            ApiError::Connect(m) => write!(f, "decision API: cannot connect: {m}"),
            ApiError::Transport(m) => write!(f, "decision API: connection failed: {m}"),
            ApiError::BadRequest { status, detail } => {
                write!(f, "decision API refused the request ({status}): {detail}")
            }
            ApiError::Server { status, body } => {
                write!(f, "decision API failed ({status}): {body}")
            }
            ApiError::Malformed(m) => write!(f, "decision API: malformed answer: {m}"),
        }
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_validated() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
            "http://localhost",
        ] {
            let c = DecisionClient::new(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(!c.base().ends_with('/'), "{}", c.base());
        }
        assert_eq!(
            DecisionClient::new("http://gw:80/spillway/")
                .unwrap()
                .base(),
            "http://gw:80/spillway"
        );
        for bad in [
            "",
            "127.0.0.1:8080",
            "https://127.0.0.1:8080",
            "ftp://x",
            "http://",
            "http://u:p@host",
            "http://h/?a=b",
            "http://h/#x",
            "http://h o",
        ] {
            match DecisionClient::new(bad) {
                Err(ApiError::Config(m)) => assert!(m.contains("base URL"), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(matches!(
            DecisionClient::new("http://h").unwrap().with_bearer("a\nb"),
            Err(ApiError::Config(_))
        ));
        let c = DecisionClient::new("http://h")
            .unwrap()
            .with_bearer("s3cret")
            .unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn checks_serialize_only_what_is_set() {
        assert_eq!(serde_json::to_string(&Check::new()).unwrap(), "{}");
        let c = Check::new()
            .api("GET /x")
            .user("u")
            .ip("10.0.0.1")
            .cost(0)
            .header("x-k", "v")
            .descriptor("d", "e");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"api":"GET /x","user":"u","ip":"10.0.0.1","cost":0,"headers":{"x-k":"v"},"descriptors":{"d":"e"}}"#
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        let mut s = String::new();
        percent_encode(&mut s, "a b+c&d=é/~");
        assert_eq!(s, "a%20b%2Bc%26d%3D%C3%A9%2F~");
    }

    // Answers copied from a running `spillway serve` (a rule `per-user`,
    // fixed_window of 2 a minute by user on /x): allowed, denied (429), a
    // request lacking the user, a charge past the limit; and one from a
    // server whose Redis is down, with `on_store_error: allow`.
    const ALLOWED: &str = r#"{"allowed":true,"outcome":"allowed","rule":"per-user","limit":2,"remaining":1,"reset_ms":14065,"retry_after_ms":0,"wait_ms":0,"shadow_denied":[],"soft_exceeded":[],"elastic_admitted":[],"skipped":[],"store_error":false,"rules":[{"rule":"per-user","outcome":"allowed","algorithm":"fixed_window","limit":2,"remaining":1,"reset_ms":14065,"retry_after_ms":0}]}"#;
    const DENIED: &str = r#"{"allowed":false,"outcome":"denied","rule":"per-user","limit":2,"remaining":0,"reset_ms":14050,"retry_after_ms":14050,"wait_ms":0,"shadow_denied":[],"soft_exceeded":[],"elastic_admitted":[],"skipped":[],"store_error":false,"rules":[{"rule":"per-user","outcome":"denied","algorithm":"fixed_window","limit":2,"remaining":0,"reset_ms":14050,"retry_after_ms":14050}]}"#;
    const NO_RULE: &str = r#"{"allowed":true,"outcome":"allowed","rule":null,"limit":null,"remaining":null,"reset_ms":0,"retry_after_ms":0,"wait_ms":0,"shadow_denied":[],"soft_exceeded":[],"elastic_admitted":[],"skipped":["per-user"],"store_error":false,"rules":[]}"#;
    const CHARGED_OVER: &str = r#"{"allowed":false,"over":true,"outcome":"denied","rule":"per-user","limit":2,"remaining":0,"reset_ms":14029,"retry_after_ms":14029,"wait_ms":0,"shadow_denied":[],"soft_exceeded":[],"elastic_admitted":[],"skipped":[],"store_error":false,"rules":[{"rule":"per-user","outcome":"denied","algorithm":"fixed_window","limit":2,"remaining":0,"reset_ms":14029,"retry_after_ms":14029}]}"#;
    const STORE_FAILED: &str = r#"{"allowed":true,"outcome":"allowed","rule":"shared","limit":1,"remaining":0,"reset_ms":0,"retry_after_ms":0,"wait_ms":0,"shadow_denied":[],"soft_exceeded":[],"elastic_admitted":[],"skipped":[],"store_error":true,"rules":[{"rule":"shared","outcome":"allowed","algorithm":"fixed_window","limit":1,"remaining":0,"reset_ms":0,"retry_after_ms":0}]}"#;

    #[test]
    fn the_servers_answers_decode() {
        let d = decode(StatusCode::OK, ALLOWED.as_bytes()).unwrap();
        assert!(d.allowed && !d.store_error);
        assert_eq!(d.outcome, Outcome::Allowed);
        assert_eq!(d.rule.as_deref(), Some("per-user"));
        assert_eq!((d.limit, d.remaining), (Some(2), Some(1)));
        assert_eq!(d.reset, Duration::from_millis(14_065));
        assert_eq!((d.retry_after, d.wait), (Duration::ZERO, Duration::ZERO));
        assert_eq!(d.over, None);
        assert_eq!(d.rules.len(), 1);
        assert_eq!(d.rules[0].algorithm, "fixed_window");
        assert_eq!(d.rules[0].outcome, Outcome::Allowed);

        let d = decode(StatusCode::TOO_MANY_REQUESTS, DENIED.as_bytes()).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.outcome, Outcome::Denied);
        assert_eq!(d.retry_after, Duration::from_millis(14_050));

        let d = decode(StatusCode::OK, NO_RULE.as_bytes()).unwrap();
        assert_eq!((d.rule, d.limit, d.remaining), (None, None, None));
        assert_eq!(d.skipped, ["per-user"]);

        let d = decode(StatusCode::OK, CHARGED_OVER.as_bytes()).unwrap();
        assert_eq!((d.allowed, d.over), (false, Some(true)));

        assert!(
            decode(StatusCode::OK, STORE_FAILED.as_bytes())
                .unwrap()
                .store_error
        );
    }

    #[test]
    fn unknown_fields_and_outcomes_are_tolerated() {
        let body = ALLOWED
            .replace(
                r#""outcome":"allowed","rule""#,
                r#""outcome":"queued","rule""#,
            )
            .replace(
                r#""allowed":true,"#,
                r#""allowed":true,"new_field":{"x":[1]},"#,
            );
        let d = decode(StatusCode::OK, body.as_bytes()).unwrap();
        assert_eq!(d.outcome, Outcome::Other("queued".into()));
        assert_eq!(d.outcome.as_str(), "queued");
        let never = DENIED.replace(
            "\"retry_after_ms\":14050,\"wait",
            "\"retry_after_ms\":18446744073709,\"wait",
        );
        let d = decode(StatusCode::TOO_MANY_REQUESTS, never.as_bytes()).unwrap();
        assert_eq!(d.retry_after, NEVER);
    }

    #[test]
    fn problems_become_bad_requests() {
        let problem = br#"{"type":"about:blank","title":"bad request","status":400,"detail":"invalid JSON body: unknown field `usr`, expected one of `api`, `user`, `ip`, `descriptors`, `headers`, `cost` at line 1 column 6"}"#;
        assert_eq!(
            decode(StatusCode::BAD_REQUEST, problem),
            Err(ApiError::BadRequest {
                status: StatusCode::BAD_REQUEST,
                detail: "invalid JSON body: unknown field `usr`, expected one of `api`, `user`, \
                         `ip`, `descriptors`, `headers`, `cost` at line 1 column 6"
                    .into()
            })
        );
        match decode(StatusCode::PAYLOAD_TOO_LARGE, b"length limit exceeded") {
            Err(ApiError::BadRequest { status, detail }) => {
                assert_eq!(status, 413);
                assert_eq!(detail, "length limit exceeded");
            }
            other => panic!("{other:?}"),
        }
        match decode(StatusCode::BAD_GATEWAY, &[b'x'; 5000]) {
            Err(e @ ApiError::Server { .. }) => {
                assert!(e.is_transient());
                assert!(e.to_string().len() < 700, "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode(StatusCode::FOUND, b""),
            Err(ApiError::Server { .. })
        ));
    }

    #[test]
    fn garbage_is_malformed_never_a_panic() {
        let cut = &ALLOWED.as_bytes()[..ALLOWED.len() / 2];
        let missing = ALLOWED.replace(r#""store_error":false,"#, "");
        let wrong_type = ALLOWED.replace(
            r#""limit":2,"remaining":1,"reset_ms""#,
            r#""limit":"2","remaining":1,"reset_ms""#,
        );
        let negative = ALLOWED.replace(r#""reset_ms":14065,"retry"#, r#""reset_ms":-1,"retry"#);
        for body in [
            &b""[..],
            b"null",
            b"[]",
            b"<html>502</html>",
            b"\xff\xfe\x00",
            cut,
            missing.as_bytes(),
            wrong_type.as_bytes(),
            negative.as_bytes(),
        ] {
            for status in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
                match decode(status, body) {
                    Err(ApiError::Malformed(m)) => assert!(!m.is_empty()),
                    other => panic!("{:?}: {other:?}", String::from_utf8_lossy(body)),
                }
            }
            assert!(matches!(
                decode(StatusCode::BAD_REQUEST, body),
                Err(ApiError::BadRequest { .. })
            ));
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_any_status_no_panic(
            status in 100u16..600,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            if let Ok(status) = StatusCode::from_u16(status) {
                let _ = decode(status, &body);
            }
        }
    }

    /// A server on 127.0.0.1:0 that answers every request with `status` and
    /// `body`, keeping connections alive, and counts connections.
    async fn canned(
        status: u16,
        body: &'static [u8],
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let counted = conns.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| async move {
                        let mut resp = http::Response::new(Full::new(Bytes::from_static(body)));
                        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (format!("http://{addr}"), conns)
    }

    #[tokio::test]
    async fn sequential_calls_reuse_one_connection() {
        let (base, conns) = canned(200, ALLOWED.as_bytes()).await;
        let client = DecisionClient::new(&base).unwrap();
        for i in 0..20 {
            let c = if i % 2 == 0 {
                client.clone()
            } else {
                client.clone().with_timeout(Duration::from_secs(5))
            };
            assert!(c.check(&Check::new().user("u")).await.unwrap().allowed);
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_oversized_answer_is_malformed() {
        let big: &'static [u8] = Box::leak(vec![b' '; MAX_ANSWER + 1].into_boxed_slice());
        let (base, _) = canned(200, big).await;
        let client = DecisionClient::new(&base).unwrap();
        match client.limit("u").await {
            Err(ApiError::Malformed(m)) => assert!(m.contains("over"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let client = DecisionClient::new(&format!("http://{addr}")).unwrap();
        match client.check(&Check::new()).await {
            Err(e @ ApiError::Connect(_)) => assert!(e.is_transient()),
            other => panic!("{other:?}"),
        }
    }
}
