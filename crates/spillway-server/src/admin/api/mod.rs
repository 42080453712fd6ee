//! The admin API's calls under `/admin/v1/` and `/v1/health`: keys,
//! overrides, plans, top keys, the chart's series, the audit trail and
//! reported health. Every call needs a bearer token: a handler names the
//! scope in its signature ([`Authorized<Read>`](Authorized) or
//! [`Authorized<Write>`](Authorized)), and the rule and key it acts on
//! as a [`KeyTarget`], instead of repeating that prologue.

// An error here is the answer itself, returned once per call: boxing
// each would only add noise.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use spillway_core::{KeyPart, Limit, Nanos, Rule, Verdict};
use spillway_store::{Charge, Key, RuleSet, Store};

use super::AdminState;
use super::assign::{Override, PlanAssignment, WriteError};
use super::audit::{Entry, rfc3339};
use super::settings::Scope;
use super::top::By;

mod views;
#[allow(clippy::wildcard_imports)]
use views::*;

mod keys;
#[allow(clippy::wildcard_imports)]
use keys::*;

mod rules;
pub(crate) use rules::PageQuery;

mod extract;
pub use extract::{Authorized, KeyTarget, Need, Read, ReadIfTokens, Write};

/// The largest body a write call takes.
const MAX_BODY: usize = 64 * 1024;

/// The longest `ttl` of an override.
const MAX_TTL: Nanos = Nanos::from_secs(366 * 86_400);

/// The admin calls.
pub fn routes() -> Router<Arc<AdminState>> {
    Router::new()
        .route("/admin/v1/keys/{*rest}", get(key_get).delete(key_reset))
        .route("/admin/v1/overrides", get(overrides_list))
        .route(
            "/admin/v1/overrides/{*rest}",
            get(override_get).put(override_put).delete(override_delete),
        )
        .route("/admin/v1/plans", get(plans_list))
        .route(
            "/admin/v1/plans/{*rest}",
            get(plan_get).put(plan_put).delete(plan_delete),
        )
        .route("/admin/v1/rules", get(rules::rules_list))
        .route(
            "/admin/v1/rules/{*rest}",
            get(rules::rule_get)
                .put(rules::rule_put)
                .delete(rules::rule_delete),
        )
        .route("/admin/v1/top", get(top))
        .route("/admin/v1/series", get(series))
        .route("/admin/v1/audit", get(audit))
        .route("/v1/health", get(health_get).put(health_put))
        .method_not_allowed_fallback(not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

async fn not_allowed(method: Method) -> Response {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not a method of this path"),
    )
}

/// A write call's body, or the problem to answer (too large, unread).
fn read_body(
    b: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Bytes, Response> {
    b.map_err(|e| {
        let status = e.status();
        let detail = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the body is over {MAX_BODY} bytes")
        } else {
            "the body could not be read".to_string()
        };
        problem(status, detail)
    })
}

/// A problem answer's detail, kept beside it for the audit trail of a
/// refused write.
#[derive(Debug, Clone)]
struct Detail(String);

/// An RFC 9457 problem answer.
pub fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    let detail = detail.into();
    let json = spillway_tower::render::Problem::new(status, detail.as_str()).to_json();
    let mut r = (
        status,
        [(header::CONTENT_TYPE, spillway_tower::render::PROBLEM_JSON)],
        json,
    )
        .into_response();
    r.extensions_mut().insert(Detail(detail));
    r
}

/// The layer of the admin calls: a write call (any method but GET, HEAD
/// and OPTIONS) refused before its handler recorded it (no token, a read
/// token, a bad body, no such rule, a method the path lacks) is recorded
/// here, with the token's name if it is one and the reason.
pub async fn audit_refusals(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = req.method().clone();
    if matches!(method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let uri = req.uri().clone();
    let who = {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        crate::credentials::bearer(given)
            .and_then(|g| state.settings.load().token(g).map(|t| t.name.clone()))
            .unwrap_or_else(|| "-".to_string())
    };
    let (answer, recorded) = super::audit::watch(next.run(req)).await;
    let status = answer.status();
    if !recorded && (status.is_client_error() || status.is_server_error()) {
        let path = uri.path();
        let action = match (&method, path) {
            (&Method::DELETE, p) if p.starts_with("/admin/v1/keys/") => "key.reset",
            (&Method::PUT, p) if p.starts_with("/admin/v1/overrides/") => "override.put",
            (&Method::DELETE, p) if p.starts_with("/admin/v1/overrides/") => "override.delete",
            (&Method::PUT, p) if p.starts_with("/admin/v1/plans/") => "plan.put",
            (&Method::DELETE, p) if p.starts_with("/admin/v1/plans/") => "plan.delete",
            (&Method::PUT, "/v1/health") => "health.put",
            (&Method::PUT, p) if p.starts_with("/admin/v1/rules/") => "rule.put",
            (&Method::DELETE, p) if p.starts_with("/admin/v1/rules/") => "rule.delete",
            _ => "write",
        };
        let why = answer
            .extensions()
            .get::<Detail>()
            .map_or_else(|| status.to_string(), |d| d.0.clone());
        let at = now_ms();
        state.audit.record(Entry {
            at_unix_ms: at,
            at: rfc3339(at),
            token: who,
            method: method.to_string(),
            path: path.to_string(),
            action: action.to_string(),
            rule: None,
            key: None,
            reason: None,
            status: status.as_u16(),
            refused: Some(super::audit::refusal_reason(&why)),
        });
    }
    answer
}

/// The token's name if the request carries a token of at least `need`'s
/// scope; else the 401 (no or unknown token, or none configured) or 403
/// (a read token on a write call) to answer, as
/// [`crate::credentials::refusal_answer`] writes it. Handlers take
/// [`Authorized`] instead; the decision routes' layer asks this.
pub fn authorize(state: &AdminState, headers: &HeaderMap, need: Scope) -> Result<String, Response> {
    let settings = state.settings.load();
    let refused = if settings.tokens.is_empty() {
        crate::credentials::Refusal {
            status: StatusCode::UNAUTHORIZED,
            detail: "the admin API needs a token: list admin.tokens in the rules file".into(),
            challenge: Some(crate::credentials::ADMIN_REALM),
        }
    } else {
        let given = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
        match crate::credentials::check(
            &settings.tokens,
            given,
            need,
            crate::credentials::ADMIN_REALM,
        ) {
            Ok(t) => return Ok(t.name.clone()),
            Err(refused) => refused,
        }
    };
    let detail = Detail(refused.detail.clone());
    let mut r = refused.into_response();
    r.extensions_mut().insert(detail);
    Err(r)
}

/// A rule and a key named by a path: the rule's name, then one segment
/// per key part, each percent-decoded.
pub struct Target {
    set: Arc<RuleSet>,
    index: usize,
    key: Vec<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("rule", &self.rule().name())
            .field("key", &self.key)
            .finish()
    }
}

impl Target {
    fn rule(&self) -> &Rule {
        &self.set.rules()[self.index]
    }
}

fn target(state: &AdminState, uri: &Uri, prefix: &str) -> Result<Target, Response> {
    let rest = uri.path().strip_prefix(prefix).unwrap_or("");
    let mut segments = Vec::new();
    for s in rest.split('/') {
        segments.push(decode(s).ok_or_else(|| {
            problem(
                StatusCode::BAD_REQUEST,
                format!("{s:?}: bad percent-encoding or not UTF-8"),
            )
        })?);
    }
    let Some((name, parts)) = segments.split_first() else {
        return Err(problem(StatusCode::BAD_REQUEST, "name a rule"));
    };
    let set = state.shared.limiter.rules();
    let Some(index) = set.rules().iter().position(|r| r.name() == name) else {
        return Err(problem(
            StatusCode::NOT_FOUND,
            format!("no rule named {name:?}"),
        ));
    };
    let rule = &set.rules()[index];
    let want = rule.by().parts();
    if parts.len() != want.len() || (want.is_empty() && parts.len() == 1 && parts[0].is_empty()) {
        let spelled: Vec<String> = want.iter().map(ToString::to_string).collect();
        return Err(problem(
            StatusCode::BAD_REQUEST,
            format!(
                "rule {name:?} is keyed by {} ({} part{}): give one path segment per part, percent-encoded",
                if spelled.is_empty() {
                    "nothing".to_string()
                } else {
                    spelled.join("+")
                },
                want.len(),
                if want.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    let mut key = Vec::with_capacity(parts.len());
    for (p, kind) in parts.iter().zip(want) {
        if p.is_empty() {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "an empty key part: an empty value is never limited",
            ));
        }
        if p.len() > 4096 {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "a key part over 4096 bytes",
            ));
        }
        if p.chars().any(char::is_control) {
            // No request is keyed so (header values and the decision
            // API's fields carry none), and logs must not get one.
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "a key part with a control character: no request is keyed so",
            ));
        }
        key.push(match kind {
            KeyPart::Ip => spillway_core::canonical_ip(p).into_owned(),
            _ => p.clone(),
        });
    }
    Ok(Target { set, index, key })
}

/// Percent-decodes one path segment.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn now_ms() -> u64 {
    crate::unix_ms()
}

fn ms(n: Nanos) -> Value {
    if n == Nanos::MAX {
        Value::Null
    } else {
        json!(n.as_millis_ceil())
    }
}

fn words(n: Nanos) -> String {
    if n == Nanos::MAX {
        return "never".into();
    }
    let ms = n.as_millis_ceil();
    match ms {
        0 => "now".into(),
        m if m < 1000 => format!("{m}ms"),
        m if m < 120_000 => format!("{:.1}s", m as f64 / 1000.0),
        m if m < 7_200_000 => format!("{:.1}m", m as f64 / 60_000.0),
        m => format!("{:.1}h", m as f64 / 3_600_000.0),
    }
}

/// An algorithm's name as the rules file spells it.
pub fn algorithm(l: &Limit) -> &'static str {
    match l {
        Limit::TokenBucket(_) => "token_bucket",
        Limit::LeakyBucket(_) | Limit::Shaper(_) => "leaky_bucket",
        Limit::FixedWindow(_) => "fixed_window",
        Limit::SlidingLog(_) => "sliding_window_log",
        Limit::SlidingCounter(_) => "sliding_window_counter",
        Limit::Gcra(_) => "gcra",
    }
}

/// A limit's state in words, from a check (`now`: cost 0) and the verdict
/// of a request of cost 1 (`next`).
fn state_words(l: &Limit, now: &Verdict, next: &Verdict) -> String {
    let size = l.size();
    let left = now.remaining.min(size);
    let used = size - left;
    let fresh = match now.reset.as_u64() {
        0 => "now".to_string(),
        _ => format!("in {}", words(now.reset)),
    };
    let base = match l {
        Limit::TokenBucket(_) => format!("{left} of {size} tokens left; full again {fresh}"),
        Limit::LeakyBucket(_) | Limit::Shaper(_) => {
            format!("{used} of {size} in the bucket; empty {fresh}")
        }
        Limit::FixedWindow(_) | Limit::SlidingLog(_) | Limit::SlidingCounter(_) => {
            format!("{used} of {size} used in the window, {left} left; fresh again {fresh}")
        }
        Limit::Gcra(_) => format!("{left} of {size} burst left; fresh again {fresh}"),
    };
    if next.allowed {
        base
    } else {
        format!(
            "refused now: the next request passes {}; {base}",
            match next.retry_after {
                Nanos::MAX => "never (blocked, or a cost above the limit)".to_string(),
                r => format!("in {}", words(r)),
            }
        )
    }
}

fn store_failed(e: impl std::fmt::Display) -> Response {
    tracing::warn!("admin call: store failed: {e}");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the store did not answer; nothing was changed (see the log)",
    )
}

fn write_failed(e: WriteError) -> Response {
    match e {
        WriteError::Full(m) => problem(StatusCode::CONFLICT, m),
        WriteError::Store(m) => store_failed(m),
    }
}

/// The rule the key decides under now: its override's or plan's, else
/// the rule's own.
fn own_rule(state: &AdminState, t: &Target) -> (Rule, &'static str) {
    let parts: Vec<&str> = t.key.iter().map(String::as_str).collect();
    let key = Key::from_parts(parts.iter().copied());
    match state.shared.limiter.rule_for(t.rule(), &key) {
        None => (t.rule().clone(), "rule"),
        Some(r) => {
            let source = if state
                .assign
                .override_of(t.rule().name(), &t.key, now_ms())
                .is_some()
            {
                "override"
            } else {
                "plan"
            };
            (Rule::clone(&r), source)
        }
    }
}

fn plan_name(state: &AdminState, t: &Target) -> Option<String> {
    state
        .assign
        .plan_of(t.rule().name(), &t.key)
        .map(|p| p.plan)
        .or_else(|| {
            state
                .plans
                .load()
                .rules
                .get(t.rule().name())
                .and_then(|rp| rp.default.clone())
        })
}

fn override_json(o: &Override, state: &AdminState) -> Value {
    let max_wait = state
        .plans
        .load()
        .rules
        .get(&o.rule)
        .and_then(|rp| rp.max_wait);
    let limits: Vec<String> = o
        .limits
        .as_ref()
        .and_then(|l| (state.parse_limits)(l, max_wait).ok())
        .map(|l| l.iter().map(spillway_core::Limit::describe).collect())
        .unwrap_or_default();
    json!({
        "rule": o.rule,
        "key": o.key,
        "limits": limits,
        "limits_given": o.limits,
        "block": o.block,
        "expires_unix_ms": o.expires_unix_ms,
        "expires": rfc3339(o.expires_unix_ms),
        "created_unix_ms": o.created_unix_ms,
        "reason": o.reason,
        "by": o.by,
    })
}

/// What the service (or its monitor) says of its health.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// 0 = idle, 1 = at capacity.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json::present"
    )]
    pub load: Option<f64>,
    /// The service's latency.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json::present"
    )]
    pub latency_ms: Option<f64>,
    /// The service's share of failed requests, 0 to 1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json::present"
    )]
    pub error_rate: Option<f64>,
}

/// A health report and when it came.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reported {
    /// What was said.
    pub health: Health,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// Health as seen now, as `/v1/health` and `/v1/status` show it.
pub fn seen_json(state: &AdminState) -> Value {
    let settings = state.health_settings.load();
    let (known, load) = match state.health_now() {
        spillway_core::Health::Unknown => (false, None),
        spillway_core::Health::Load(l) => (true, Some(l)),
    };
    json!({
        "known": known,
        "load": load,
        "stale_after_s": settings.stale_after.as_secs_f64(),
        "latency_target_ms": settings.latency_target.map(|d| d.as_secs_f64() * 1000.0),
        "errors_max": settings.errors_max,
    })
}

fn health_json(state: &AdminState) -> Value {
    let r = *state.health.lock();
    let mut v = match r {
        None => json!({ "reported": false }),
        Some(r) => json!({
            "reported": true,
            "load": r.health.load,
            "latency_ms": r.health.latency_ms,
            "error_rate": r.health.error_rate,
            "received_unix_ms": r.at_unix_ms,
            "age_ms": now_ms().saturating_sub(r.at_unix_ms),
        }),
    };
    v["as_seen"] = seen_json(state);
    v
}

async fn health_get(State(state): State<Arc<AdminState>>, _: Authorized<Read>) -> Response {
    axum::Json(health_json(&state)).into_response()
}

async fn health_put(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let bytes = match read_body(bytes) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let h: Health = match body(&bytes) {
        Ok(h) => h,
        Err(r) => return r,
    };
    let ok = |v: Option<f64>, max: f64| v.is_none_or(|x| x.is_finite() && (0.0..=max).contains(&x));
    if h.load.is_none() && h.latency_ms.is_none() && h.error_rate.is_none() {
        return problem(
            StatusCode::BAD_REQUEST,
            "send at least one of load (0 idle .. 1 at capacity), latency_ms, error_rate",
        );
    }
    if !ok(h.load, 1000.0) || !ok(h.latency_ms, 3.6e6) || !ok(h.error_rate, 1.0) {
        return problem(
            StatusCode::BAD_REQUEST,
            "load: 0 to 1000 (1 = at capacity); latency_ms: 0 to 3600000; error_rate: 0 to 1",
        );
    }
    let r = Reported {
        health: h,
        at_unix_ms: now_ms(),
    };
    *state.health.lock() = Some(r);
    state.record(&who, &method, &uri, "health.put", None, None, 200);
    axum::Json(health_json(&state)).into_response()
}

impl AdminState {
    /// Records a write call in the audit trail.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        who: &str,
        method: &Method,
        uri: &Uri,
        action: &str,
        t: Option<&Target>,
        reason: Option<String>,
        status: u16,
    ) {
        self.audit_write(
            who,
            (method, uri),
            action,
            (
                t.map(|t| t.rule().name().to_string()),
                t.map(|t| t.key.clone()),
            ),
            reason,
            status,
            (status >= 400).then(|| format!("answered {status}")),
        );
    }

    /// One entry of the audit trail, as every write call records it: who
    /// called what, about which rule and key, and how it was answered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn audit_write(
        &self,
        who: &str,
        (method, uri): (&Method, &Uri),
        action: &str,
        (rule, key): (Option<String>, Option<Vec<String>>),
        reason: Option<String>,
        status: u16,
        refused: Option<String>,
    ) {
        let at = now_ms();
        self.audit.record(Entry {
            at_unix_ms: at,
            at: rfc3339(at),
            token: who.to_string(),
            method: method.to_string(),
            path: uri.path().to_string(),
            action: action.to_string(),
            rule,
            key,
            reason: reason.filter(|r| !r.is_empty()),
            status,
            refused,
        });
    }
}

#[cfg(test)]
mod tests;
