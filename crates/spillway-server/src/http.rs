//! The HTTP API (axum): `/v1/check`, `/v1/limit`, `/v1/rules`, `/v1/status`,
//! `/metrics`, `/healthz`, `/readyz`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use spillway_core::{Limit, Outcome, Rule};
use spillway_store::{Checked, Request, SimpleAttributes};

use crate::AppState;
use spillway_tower::insert_rate_limit_headers;

/// Largest accepted request body.
pub const MAX_BODY: usize = 64 * 1024;
/// Largest accepted identity value (user, ip, header, descriptor), in bytes.
pub const MAX_VALUE: usize = 1024;
/// Most descriptors or headers in one check.
pub const MAX_ENTRIES: usize = 64;

/// The router, with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/limit", get(limit))
        .route("/v1/rules", get(rules))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// An API error, rendered as an RFC 9457 problem document.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    title: &'static str,
    detail: String,
}

impl ApiError {
    pub(crate) fn bad_request(detail: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            title: "bad request",
            detail: detail.into(),
        }
    }
}

impl ApiError {
    /// The HTTP status.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem document.
    pub(crate) fn body(&self) -> Vec<u8> {
        json!({
            "type": "about:blank",
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
            "error": self.detail,
        })
        .to_string()
        .into_bytes()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, self.body()).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        resp
    }
}

/// The body of `POST /v1/check`. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    api: Option<String>,
    user: Option<String>,
    ip: Option<String>,
    #[serde(default)]
    descriptors: BTreeMap<String, String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    cost: Option<u64>,
}

async fn check(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = body.map_err(|e| {
        state.metrics.bad_request();
        ApiError {
            status: e.status(),
            title: "bad request body",
            detail: format!("{} (bodies are capped at {MAX_BODY} bytes)", e.body_text()),
        }
    })?;
    let checked = check_json(&state, &body, started).await?;
    Ok(render(&checked))
}

/// Decides a `POST /v1/check` body (shared with the direct HTTP/1.1 path).
pub(crate) async fn check_json(
    state: &AppState,
    body: &[u8],
    started: Instant,
) -> Result<Checked, ApiError> {
    // Any content type is read as JSON: `curl -d` sends form encoding by
    // default, and refusing it would only trip people up.
    let body: CheckBody = if body.is_empty() {
        CheckBody::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            state.metrics.bad_request();
            ApiError::bad_request(format!("invalid JSON body: {e}"))
        })?
    };
    decide_body(state, body, started).await
}

fn pairs(m: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Validates a check, decides it, counts it and renders the answer: the
/// shared tail of `POST /v1/check` and `GET /v1/limit`.
async fn decide_body(
    state: &AppState,
    body: CheckBody,
    started: Instant,
) -> Result<Checked, ApiError> {
    validate_body(&body).inspect_err(|_| state.metrics.bad_request())?;
    let (method, path) = split_api(body.api.as_deref());
    let descriptors = pairs(&body.descriptors);
    let hdrs = pairs(&body.headers);
    let attrs = SimpleAttributes {
        user: body.user.as_deref(),
        ip: body.ip.as_deref(),
        headers: &hdrs,
        descriptors: &descriptors,
    };
    let req = Request {
        method,
        path,
        attrs: &attrs,
        cost: body.cost.unwrap_or(1),
    };
    let checked = state.limiter.check(&req).await;
    state.record(&checked, started.elapsed());
    Ok(checked)
}

fn validate_body(b: &CheckBody) -> Result<(), ApiError> {
    let too_long = |what: &str, v: &str| -> Result<(), ApiError> {
        if v.len() > MAX_VALUE {
            Err(ApiError::bad_request(format!(
                "{what} is {} bytes; at most {MAX_VALUE}",
                v.len()
            )))
        } else {
            Ok(())
        }
    };
    if let Some(api) = &b.api {
        too_long("api", api)?;
        if api.trim().is_empty() {
            return Err(ApiError::bad_request("api is empty"));
        }
        let (_, path) = split_api(Some(api));
        if !path.is_some_and(|p| p.starts_with('/')) {
            return Err(ApiError::bad_request(format!(
                "api {api:?}: expected \"METHOD /path\" or \"/path\""
            )));
        }
    }
    for (what, v) in [("user", &b.user), ("ip", &b.ip)] {
        if let Some(v) = v {
            too_long(what, v)?;
        }
    }
    for (what, map) in [("descriptors", &b.descriptors), ("headers", &b.headers)] {
        if map.len() > MAX_ENTRIES {
            return Err(ApiError::bad_request(format!(
                "{what} has {} entries; at most {MAX_ENTRIES}",
                map.len()
            )));
        }
        for (k, v) in map {
            too_long(what, k)?;
            too_long(what, v)?;
        }
    }
    if b.cost == Some(0) {
        return Err(ApiError::bad_request("cost must be at least 1"));
    }
    Ok(())
}

/// Splits `"POST /v1/login"` into method and path; `"/v1/x"` has no method.
fn split_api(api: Option<&str>) -> (Option<&str>, Option<&str>) {
    match api.map(spillway_core::rule::split_api) {
        None => (None, None),
        Some((m, p)) => (m, Some(p)),
    }
}

#[derive(Debug, Deserialize)]
struct LimitQuery {
    key: Option<String>,
    api: Option<String>,
    cost: Option<u64>,
}

async fn limit(
    State(state): State<Arc<AppState>>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let checked = check_query(&state, q.as_deref().unwrap_or(""), started).await?;
    Ok(render(&checked))
}

/// Decides a `GET /v1/limit` query string (shared with the direct HTTP/1.1 path).
pub(crate) async fn check_query(
    state: &AppState,
    query: &str,
    started: Instant,
) -> Result<Checked, ApiError> {
    let q: LimitQuery = serde_urlencoded::from_str(query).map_err(|e| {
        state.metrics.bad_request();
        ApiError::bad_request(format!("Failed to deserialize query string: {e}"))
    })?;
    let body = CheckBody {
        api: q.api,
        user: q.key,
        cost: q.cost,
        ..CheckBody::default()
    };
    decide_body(state, body, started).await
}

/// The decision as JSON with its status and headers.
fn render(checked: &Checked) -> Response {
    let (status, bytes) = decision_json(checked);
    let mut resp = (status, bytes).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    insert_rate_limit_headers(checked, h);
    resp
}

/// The decision's status (200, or 429 when denied) and JSON body
/// (`Decision` in docs/openapi.yaml), written out by hand: through serde
/// it was 7 % of the server's time per request.
pub(crate) fn decision_json(checked: &Checked) -> (StatusCode, Vec<u8>) {
    let d = &checked.decision;
    let name_of = |rd: &spillway_core::RuleDecision| checked.rule(rd).map_or("", Rule::name);
    let mut out = String::with_capacity(256 + 160 * d.rules.len());
    let mut num = itoa::Buffer::new();
    let field = |out: &mut String, key: &str| {
        out.push_str(if out.is_empty() { "{\"" } else { ",\"" });
        out.push_str(key);
        out.push_str("\":");
    };
    let string = |out: &mut String, s: &str| {
        out.push('"');
        spillway_tower::push_json_escaped(out, s);
        out.push('"');
    };
    let names = |out: &mut String, names: &mut dyn Iterator<Item = &str>| {
        out.push('[');
        for (i, n) in names.enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(out, n);
        }
        out.push(']');
    };
    let deciding = d.deciding.as_ref();
    field(&mut out, "allowed");
    out.push_str(if d.allowed { "true" } else { "false" });
    field(&mut out, "outcome");
    string(&mut out, d.outcome().as_str());
    field(&mut out, "rule");
    match deciding {
        Some(rd) => string(&mut out, name_of(rd)),
        None => out.push_str("null"),
    }
    for (key, value) in [
        ("limit", deciding.map(|r| r.verdict.limit)),
        ("remaining", deciding.map(|r| r.verdict.remaining)),
        (
            "reset_ms",
            Some(deciding.map_or(0, |r| r.verdict.reset.as_millis_ceil())),
        ),
        (
            "retry_after_ms",
            Some(deciding.filter(|_| !d.allowed).map_or(0, retry_ms)),
        ),
        ("wait_ms", Some(d.wait.as_millis_ceil())),
    ] {
        field(&mut out, key);
        match value {
            Some(v) => out.push_str(num.format(v)),
            None => out.push_str("null"),
        }
    }
    for (key, o) in [
        ("shadow_denied", Outcome::ShadowDenied),
        ("soft_exceeded", Outcome::SoftExceeded),
    ] {
        field(&mut out, key);
        names(
            &mut out,
            &mut d.rules.iter().filter(|r| r.outcome == o).map(name_of),
        );
    }
    field(&mut out, "skipped");
    names(
        &mut out,
        &mut checked
            .skipped
            .iter()
            .filter_map(|&i| checked.rules.get(i).map(Rule::name)),
    );
    field(&mut out, "store_error");
    out.push_str(if checked.store_error.is_some() {
        "true"
    } else {
        "false"
    });
    field(&mut out, "rules");
    out.push('[');
    for (i, rd) in d.rules.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"rule\":");
        string(&mut out, name_of(rd));
        out.push_str(",\"outcome\":\"");
        out.push_str(rd.outcome.as_str());
        out.push_str("\",\"algorithm\":\"");
        let algorithm = checked
            .rule(rd)
            .and_then(|r| r.limits().get(rd.limit))
            .map_or("", Limit::algorithm_name);
        out.push_str(algorithm);
        out.push('"');
        for (key, v) in [
            ("limit", rd.verdict.limit),
            ("remaining", rd.verdict.remaining),
            ("reset_ms", rd.verdict.reset.as_millis_ceil()),
            ("retry_after_ms", retry_ms(rd)),
        ] {
            out.push_str(",\"");
            out.push_str(key);
            out.push_str("\":");
            out.push_str(num.format(v));
        }
        out.push('}');
    }
    out.push_str("]}");
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    (status, out.into_bytes())
}

fn retry_ms(rd: &spillway_core::RuleDecision) -> u64 {
    if rd.verdict.allowed {
        0
    } else if rd.verdict.retry_after.is_never() {
        u64::MAX / 1_000_000
    } else {
        rd.verdict.retry_after.as_millis_ceil()
    }
}

async fn rules(State(state): State<Arc<AppState>>) -> Response {
    let set = state.limiter.rules();
    let list: Vec<serde_json::Value> = set.rules().iter().map(rule_json).collect();
    axum::Json(json!({ "version": set.version, "rules": list })).into_response()
}

/// A rule as the API and `check-config` show it.
pub fn rule_json(r: &Rule) -> serde_json::Value {
    json!({
        "name": r.name(),
        "api": r.route().map(|x| x.as_str()),
        "by": r.by().to_string(),
        "mode": r.mode().to_string(),
        "limits": r.limits().iter().map(describe_limit).collect::<Vec<_>>(),
    })
}

/// One limit in words, e.g. `sliding_window_log: 5 per 60s`.
pub fn describe_limit(l: &Limit) -> String {
    let secs = |n: spillway_core::Nanos| {
        let ms = n.as_millis_ceil();
        if ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    };
    match l {
        Limit::TokenBucket(a) => format!(
            "token_bucket: capacity {}, refill {} per {}",
            a.capacity(),
            a.refill().count(),
            secs(a.refill().per())
        ),
        Limit::LeakyBucket(a) => format!(
            "leaky_bucket: capacity {}, leak {} per {}",
            a.capacity(),
            a.leak().count(),
            secs(a.leak().per())
        ),
        Limit::Shaper(a) => format!(
            "leaky_bucket (queue): capacity {}, leak {} per {}, max wait {}",
            a.capacity(),
            a.leak().count(),
            secs(a.leak().per()),
            secs(a.max_wait())
        ),
        Limit::FixedWindow(a) => {
            format!("fixed_window: {} per {}", a.limit(), secs(a.window()))
        }
        Limit::SlidingLog(a) => {
            format!("sliding_window_log: {} per {}", a.limit(), secs(a.window()))
        }
        Limit::SlidingCounter(a) => format!(
            "sliding_window_counter: {} per {}",
            a.limit(),
            secs(a.window())
        ),
        Limit::Gcra(a) => format!(
            "gcra: {} per {}, burst {}",
            a.rate().count(),
            secs(a.rate().per()),
            a.burst()
        ),
    }
}

async fn status(State(state): State<Arc<AppState>>) -> Response {
    let set = state.limiter.rules();
    let reload = state.reload.lock().clone();
    axum::Json(json!({
        "version": set.version,
        "rules": set.rules().len(),
        "source": state.source_name,
        "last_reload_error": reload.last_error,
        "last_reload_unix_ms": reload.last_reload_unix_ms,
        "keys": spillway_store::Store::keys(state.limiter.store()),
    }))
    .into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let keys = spillway_store::Store::keys(state.limiter.store());
    let mut resp = state.metrics.render(keys).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// Ready while rules are loaded. A store that is down does not make the
/// service unready: it keeps answering by each rule's failure policy, and
/// says "degraded" (taking every instance out of a load balancer at once
/// would turn a Redis outage into an API outage).
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let set = state.limiter.rules();
    match state.limiter.store().degraded() {
        None => axum::Json(json!({"status": "ready", "rules_version": set.version})),
        Some(why) => {
            axum::Json(json!({"status": "degraded", "reason": why, "rules_version": set.version}))
        }
    }
    .into_response()
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        title: "not found",
        detail: "no such endpoint; see docs/openapi.yaml".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{FixedWindow, KeySpec, ManualClock, Mode, Nanos};
    use spillway_store::{Limiter, MemoryStore, RuleSet};

    #[tokio::test]
    async fn hand_written_decisions_match_the_documented_shape() {
        let fw = |n| {
            vec![Limit::FixedWindow(
                FixedWindow::new(n, Nanos::from_secs(60)).unwrap(),
            )]
        };
        let rule = |name: &str, by: &str, n, mode| {
            Rule::new(name, None, KeySpec::parse(by).unwrap(), fw(n), mode).unwrap()
        };
        let rules = vec![
            rule("plain", "user", 5, Mode::Hard),
            rule("q\"uote\\back\nline\u{1}é", "user", 4, Mode::Hard),
            rule("shadow", "user", 1, Mode::Shadow),
            rule("soft", "user", 2, Mode::Soft { percent: 50 }),
            rule("by-header", "header:x-missing", 5, Mode::Hard),
        ];
        let store = MemoryStore::new(
            ManualClock::new(Nanos::from_secs(1_000)),
            Default::default(),
        );
        let limiter = Limiter::new(store, RuleSet::new(rules.clone()));
        let attrs = SimpleAttributes {
            user: Some("alice"),
            ..Default::default()
        };
        let request = Request {
            method: None,
            path: None,
            attrs: &attrs,
            cost: 1,
        };
        // Allowed, shadow-denied, soft-exceeded, then denied; a skipped
        // rule throughout; then no rule at all.
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(limiter.check(&request).await);
        }
        let none = Limiter::new(
            MemoryStore::new(ManualClock::new(Nanos::from_secs(1)), Default::default()),
            RuleSet::new(Vec::new()),
        );
        seen.push(none.check(&request).await);
        for checked in &seen {
            let (status, hand) = decision_json(checked);
            let (oracle_status, oracle) = serde_decision_json(checked);
            assert_eq!(status, oracle_status);
            let hand: serde_json::Value = serde_json::from_slice(&hand).expect("valid JSON");
            let oracle: serde_json::Value = serde_json::from_slice(&oracle).unwrap();
            assert_eq!(hand, oracle);
        }
        let outcomes: Vec<&str> = seen.iter().map(|c| c.decision.outcome().as_str()).collect();
        assert!(outcomes.contains(&"denied"), "{outcomes:?}");
        assert!(outcomes.contains(&"shadow_denied"), "{outcomes:?}");
        assert!(
            seen.iter().any(|c| c
                .decision
                .rules
                .iter()
                .any(|r| r.outcome == Outcome::SoftExceeded)),
            "no soft excess in {outcomes:?}"
        );
        assert!(!seen[0].skipped.is_empty());
    }

    /// The JSON body of a decision (`Decision` in docs/openapi.yaml).
    #[derive(Debug, serde::Serialize)]
    struct DecisionJson<'a> {
        allowed: bool,
        outcome: &'static str,
        rule: Option<&'a str>,
        limit: Option<u64>,
        remaining: Option<u64>,
        reset_ms: u64,
        retry_after_ms: u64,
        wait_ms: u64,
        shadow_denied: Vec<&'a str>,
        soft_exceeded: Vec<&'a str>,
        skipped: Vec<&'a str>,
        store_error: bool,
        rules: Vec<RuleJson<'a>>,
    }

    /// One rule's part of the answer.
    #[derive(Debug, serde::Serialize)]
    struct RuleJson<'a> {
        rule: &'a str,
        outcome: &'static str,
        algorithm: &'static str,
        limit: u64,
        remaining: u64,
        reset_ms: u64,
        retry_after_ms: u64,
    }

    /// The answer as serde writes it from the documented shape: the oracle.
    fn serde_decision_json(checked: &Checked) -> (StatusCode, Vec<u8>) {
        let d = &checked.decision;
        let name_of = |rd: &spillway_core::RuleDecision| checked.rule(rd).map_or("", Rule::name);
        let algorithm = |rd: &spillway_core::RuleDecision| {
            checked
                .rule(rd)
                .and_then(|r| r.limits().get(rd.limit))
                .map_or("", Limit::algorithm_name)
        };
        let with_outcome = |o: Outcome| -> Vec<&str> {
            d.rules
                .iter()
                .filter(|r| r.outcome == o)
                .map(name_of)
                .collect()
        };
        let deciding = d.deciding.as_ref();
        let body = DecisionJson {
            allowed: d.allowed,
            outcome: d.outcome().as_str(),
            rule: deciding.map(name_of),
            limit: deciding.map(|r| r.verdict.limit),
            remaining: deciding.map(|r| r.verdict.remaining),
            reset_ms: deciding.map_or(0, |r| r.verdict.reset.as_millis_ceil()),
            retry_after_ms: deciding.filter(|_| !d.allowed).map_or(0, retry_ms),
            wait_ms: d.wait.as_millis_ceil(),
            shadow_denied: with_outcome(Outcome::ShadowDenied),
            soft_exceeded: with_outcome(Outcome::SoftExceeded),
            skipped: checked
                .skipped
                .iter()
                .filter_map(|&i| checked.rules.get(i).map(Rule::name))
                .collect(),
            store_error: checked.store_error.is_some(),
            rules: d
                .rules
                .iter()
                .map(|rd| RuleJson {
                    rule: name_of(rd),
                    outcome: rd.outcome.as_str(),
                    algorithm: algorithm(rd),
                    limit: rd.verdict.limit,
                    remaining: rd.verdict.remaining,
                    reset_ms: rd.verdict.reset.as_millis_ceil(),
                    retry_after_ms: retry_ms(rd),
                })
                .collect(),
        };
        let status = if d.allowed {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        // Sized for a typical answer: growing the buffer showed in profiles.
        let mut bytes = Vec::with_capacity(256 + 160 * body.rules.len());
        if serde_json::to_writer(&mut bytes, &body).is_err() {
            bytes.clear();
        }
        (status, bytes)
    }
}
