//! The admin API's calls under `/admin/v1/` and `/v1/health`: keys,
//! overrides, plans, top keys, the chart's series, the audit trail and
//! reported health. Every call needs a bearer token (see [`authorize`]).

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
    let json = spillway_tower::Problem::new(status, detail.as_str()).to_json();
    let mut r = (
        status,
        [(header::CONTENT_TYPE, spillway_tower::PROBLEM_JSON)],
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
/// scope; else the 401 (no or unknown token) or 403 (a read token on a
/// write call) to answer.
pub fn authorize(state: &AdminState, headers: &HeaderMap, need: Scope) -> Result<String, Response> {
    let settings = state.settings.load();
    if settings.tokens.is_empty() {
        let mut r = problem(
            StatusCode::UNAUTHORIZED,
            "the admin API needs a token: list admin.tokens in the rules file",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static(crate::credentials::ADMIN_REALM),
        );
        return Err(r);
    }
    let given = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    crate::credentials::check(
        &settings.tokens,
        given,
        need,
        crate::credentials::ADMIN_REALM,
    )
    .map(|t| t.name.clone())
    .map_err(|refused| {
        let mut r = problem(refused.status, refused.detail);
        if let Some(c) = refused.challenge {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static(c),
            );
        }
        r
    })
}

/// For the endpoints that were open before tokens existed (metrics,
/// status, rules): a read token once `admin.tokens` lists any.
pub fn authorize_if_tokens(state: &AdminState, headers: &HeaderMap) -> Result<(), Response> {
    if state.settings.load().tokens.is_empty() {
        return Ok(());
    }
    authorize(state, headers, Scope::Read).map(|_| ())
}

/// A rule and a key named by a path: the rule's name, then one segment
/// per key part, each percent-decoded.
struct Target {
    set: Arc<RuleSet>,
    index: usize,
    key: Vec<String>,
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

async fn key_get(State(state): State<Arc<AdminState>>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let t = match target(&state, &uri, "/admin/v1/keys/") {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (rule, source) = own_rule(&state, &t);
    let parts: Vec<&str> = t.key.iter().map(String::as_str).collect();
    let key = Key::from_parts(parts.iter().copied());
    let charges = [Charge {
        rule: &rule,
        key: &key,
    }];
    let store = state.shared.limiter.store();
    let (now, next) = match (store.peek(&charges, 0).await, store.peek(&charges, 1).await) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return store_failed(e),
    };
    let empty = Vec::new();
    let now = now.first().unwrap_or(&empty);
    let mut next = next.first().unwrap_or(&empty).clone();
    if rule.is_blocked() {
        // Refused whatever the counters say, until the block ends.
        for v in &mut next {
            v.allowed = false;
            v.retry_after = Nanos::MAX;
        }
    }
    let next = &next;
    let limits: Vec<Value> = rule
        .enforced_limits()
        .iter()
        .zip(now.iter().zip(next))
        .map(|(l, (n, x))| {
            json!({
                "limit": l.describe(),
                "algorithm": algorithm(l),
                "size": l.size(),
                "remaining": n.remaining.min(l.size()),
                "reset_ms": ms(n.reset),
                "retry_after_ms": if x.allowed { json!(0) } else { ms(x.retry_after) },
                "allowed": x.allowed,
                "state": state_words(l, n, x),
            })
        })
        .collect();
    let ov = state.assign.override_of(t.rule().name(), &t.key, now_ms());
    axum::Json(json!({
        "rule": t.rule().name(),
        "key": t.key,
        "source": source,
        "blocked": rule.is_blocked(),
        "plan": plan_name(&state, &t),
        "override": ov.as_ref().map(|o| override_json(o, &state)),
        "limits": limits,
    }))
    .into_response()
}

async fn key_reset(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
) -> Response {
    let who = match authorize(&state, &headers, Scope::Write) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let t = match target(&state, &uri, "/admin/v1/keys/") {
        Ok(t) => t,
        Err(r) => return r,
    };
    // Every counter the key may have under this rule: the rule's own,
    // each plan's and its override's.
    let mut rules = vec![t.rule().clone()];
    if let Some(rp) = state.plans.load().rules.get(t.rule().name()) {
        for limits in rp.limits.values() {
            if let Ok(r) = t.rule().with_limits(limits.clone()) {
                rules.push(r);
            }
        }
    }
    rules.push(own_rule(&state, &t).0);
    let mut seen = std::collections::HashSet::new();
    rules.retain(|r| seen.insert(r.fingerprint()));
    let parts: Vec<&str> = t.key.iter().map(String::as_str).collect();
    let key = Key::from_parts(parts.iter().copied());
    let charges: Vec<Charge<'_>> = rules
        .iter()
        .map(|rule| Charge { rule, key: &key })
        .collect();
    let mut result = state.shared.limiter.store().reset(&charges).await;
    if result.is_ok()
        && let Some(r) = state.redis()
        && let Err(e) = state.assign.announce_reset(r).await
    {
        result = Err(spillway_store::StoreError::new(true, e));
    }
    let status = if result.is_ok() { 200 } else { 503 };
    state.record(&who, &method, &uri, "key.reset", Some(&t), None, status);
    match result {
        Ok(()) => axum::Json(json!({"rule": t.rule().name(), "key": t.key, "reset": true}))
            .into_response(),
        Err(e) => store_failed(e),
    }
}

async fn overrides_list(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let list: Vec<Value> = state
        .assign
        .overrides(now_ms())
        .iter()
        .map(|o| override_json(o, &state))
        .collect();
    axum::Json(json!({ "overrides": list })).into_response()
}

async fn override_get(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let t = match target(&state, &uri, "/admin/v1/overrides/") {
        Ok(t) => t,
        Err(r) => return r,
    };
    match state.assign.override_of(t.rule().name(), &t.key, now_ms()) {
        Some(o) => axum::Json(override_json(&o, &state)).into_response(),
        None => problem(StatusCode::NOT_FOUND, "no override for this key"),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideBody {
    #[serde(default)]
    limits: Option<Value>,
    #[serde(default)]
    block: Option<bool>,
    #[serde(default)]
    ttl: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// A reason for the audit trail: at most 1,024 bytes, one line.
fn check_reason(reason: &str) -> Result<(), Response> {
    if reason.len() > 1024 || reason.chars().any(char::is_control) {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            "reason: at most 1024 bytes, no control characters (one line)",
        ));
    }
    Ok(())
}

/// A write call's token, key and body, in that order of checks (401/403
/// before anything about the body).
fn write_call<T: serde::de::DeserializeOwned>(
    state: &AdminState,
    headers: &HeaderMap,
    uri: &Uri,
    prefix: &str,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(String, Target, T), Response> {
    let who = authorize(state, headers, Scope::Write)?;
    let t = target(state, uri, prefix)?;
    let b = body(&read_body(bytes)?)?;
    Ok((who, t, b))
}

fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes).map_err(|e| {
        problem(
            StatusCode::BAD_REQUEST,
            format!("the body is not the JSON this call takes: {e}"),
        )
    })
}

async fn override_put(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let (who, t, b) =
        match write_call::<OverrideBody>(&state, &headers, &uri, "/admin/v1/overrides/", bytes) {
            Ok(x) => x,
            Err(r) => return r,
        };
    let block = b.block.unwrap_or(false);
    let Some(ttl) = b.ttl.as_deref() else {
        return problem(
            StatusCode::BAD_REQUEST,
            "ttl: say how long the override lasts, like \"1h\" (overrides end by themselves)",
        );
    };
    let ttl = match spillway_core::parse_duration(ttl) {
        Ok(d) if d.as_u64() > 0 && d <= MAX_TTL => d,
        Ok(_) => {
            return problem(StatusCode::BAD_REQUEST, "ttl: from 1ms to 366d");
        }
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("ttl: {e}")),
    };
    let reason = b.reason.unwrap_or_default();
    if let Err(r) = check_reason(&reason) {
        return r;
    }
    match (&b.limits, block) {
        (Some(_), true) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "give limits or \"block\": true, not both",
            );
        }
        (None, false) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "give limits (a list like a rule's limits:) or \"block\": true",
            );
        }
        (Some(l), false) => {
            let max_wait = state
                .plans
                .load()
                .rules
                .get(t.rule().name())
                .and_then(|rp| rp.max_wait);
            let limits = match (state.parse_limits)(l, max_wait) {
                Ok(x) => x,
                Err(e) => return problem(StatusCode::BAD_REQUEST, e),
            };
            if let Err(e) = t.rule().with_limits(limits) {
                return problem(StatusCode::BAD_REQUEST, e.to_string());
            }
        }
        (None, true) => {}
    }
    let now = now_ms();
    let o = Override {
        rule: t.rule().name().to_string(),
        key: t.key.clone(),
        limits: b.limits,
        block,
        expires_unix_ms: now.saturating_add(ttl.as_millis_ceil()),
        created_unix_ms: now,
        reason: reason.clone(),
        by: who.clone(),
    };
    let result = state.assign.put_override(state.redis(), o.clone()).await;
    let put = Put {
        who: &who,
        method: &method,
        uri: &uri,
        action: "override.put",
        t: &t,
        reason: Some(reason),
    };
    put.answer(&state, result, || override_json(&o, &state))
}

/// A PUT of an assignment, for its audit entry and answer.
struct Put<'a> {
    who: &'a str,
    method: &'a Method,
    uri: &'a Uri,
    action: &'a str,
    t: &'a Target,
    reason: Option<String>,
}

impl Put<'_> {
    /// Records the call with the status it gets, and answers: on success
    /// the per-key rules are compiled again and `ok` is the body.
    fn answer(
        self,
        state: &AdminState,
        result: Result<(), WriteError>,
        ok: impl FnOnce() -> Value,
    ) -> Response {
        let answer = match result {
            Ok(()) => {
                // This key alone: O(one key), not O(every override).
                state.recompile_key(self.t.rule().name(), &self.t.key);
                axum::Json(ok()).into_response()
            }
            Err(e) => write_failed(e),
        };
        let status = answer.status().as_u16();
        state.record(
            self.who,
            self.method,
            self.uri,
            self.action,
            Some(self.t),
            self.reason,
            status,
        );
        answer
    }
}

async fn override_delete(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
) -> Response {
    delete_assigned(&state, &headers, &method, &uri, Assigned::Override).await
}

/// What a DELETE of an assignment takes away.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Assigned {
    Override,
    Plan,
}

/// DELETE of a key's override or plan: 200 with what the key has now,
/// 404 if it had none.
async fn delete_assigned(
    state: &AdminState,
    headers: &HeaderMap,
    method: &Method,
    uri: &Uri,
    what: Assigned,
) -> Response {
    let who = match authorize(state, headers, Scope::Write) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let (prefix, action, none) = match what {
        Assigned::Override => (
            "/admin/v1/overrides/",
            "override.delete",
            "no override for this key",
        ),
        Assigned::Plan => (
            "/admin/v1/plans/",
            "plan.delete",
            "this key has no assigned plan",
        ),
    };
    let t = match target(state, uri, prefix) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (rule, redis) = (t.rule().name(), state.redis());
    let result = match what {
        Assigned::Override => {
            // One that ended but is not swept yet is gone already.
            let in_force = state.assign.override_of(rule, &t.key, now_ms()).is_some();
            state
                .assign
                .delete_override(redis, rule, &t.key)
                .await
                .map(|had| had && in_force)
        }
        Assigned::Plan => state.assign.delete_plan(redis, rule, &t.key).await,
    };
    let status = match &result {
        Ok(true) => 200,
        Ok(false) => 404,
        Err(_) => 503,
    };
    state.record(&who, method, uri, action, Some(&t), None, status);
    match result {
        Ok(true) => {
            state.recompile_key(t.rule().name(), &t.key);
            match what {
                Assigned::Override => axum::Json(json!({"deleted": true})).into_response(),
                Assigned::Plan => axum::Json(plan_json(state, &t)).into_response(),
            }
        }
        Ok(false) => problem(StatusCode::NOT_FOUND, none),
        Err(e) => write_failed(e),
    }
}

fn plan_json(state: &AdminState, t: &Target) -> Value {
    match state.assign.plan_of(t.rule().name(), &t.key) {
        Some(p) => json!({
            "rule": p.rule, "key": p.key, "plan": p.plan, "assigned": true,
            "by": p.by, "since_unix_ms": p.since_unix_ms,
        }),
        None => json!({
            "rule": t.rule().name(), "key": t.key, "assigned": false,
            "plan": state.plans.load().rules.get(t.rule().name()).and_then(|rp| rp.default.clone()),
        }),
    }
}

async fn plans_list(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let book = state.plans.load();
    let plans: serde_json::Map<String, Value> = book
        .plans
        .iter()
        .map(|(n, l)| (n.clone(), json!({ "limits": l })))
        .collect();
    let defaults: serde_json::Map<String, Value> = book
        .rules
        .iter()
        .filter_map(|(r, rp)| rp.default.as_ref().map(|d| (r.clone(), json!(d))))
        .collect();
    let assignments: Vec<PlanAssignment> = state.assign.plans();
    axum::Json(json!({
        "plans": plans,
        "defaults": defaults,
        "assignments": assignments,
    }))
    .into_response()
}

async fn plan_get(State(state): State<Arc<AdminState>>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    match target(&state, &uri, "/admin/v1/plans/") {
        Ok(t) => axum::Json(plan_json(&state, &t)).into_response(),
        Err(r) => r,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanBody {
    plan: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn plan_put(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let (who, t, b) =
        match write_call::<PlanBody>(&state, &headers, &uri, "/admin/v1/plans/", bytes) {
            Ok(x) => x,
            Err(r) => return r,
        };
    if let Err(r) = check_reason(b.reason.as_deref().unwrap_or("")) {
        return r;
    }
    let usable = state
        .plans
        .load()
        .rules
        .get(t.rule().name())
        .is_some_and(|rp| rp.limits.contains_key(&b.plan));
    if !usable {
        let book = state.plans.load();
        let known: Vec<&str> = book.plans.keys().map(String::as_str).collect();
        return problem(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown plan {:?} (plans: {})",
                b.plan,
                if known.is_empty() {
                    "none; list them under plans: in the rules file".to_string()
                } else {
                    known.join(", ")
                }
            ),
        );
    }
    let p = PlanAssignment {
        rule: t.rule().name().to_string(),
        key: t.key.clone(),
        plan: b.plan,
        by: who.clone(),
        since_unix_ms: now_ms(),
    };
    let result = state.assign.put_plan(state.redis(), p).await;
    let put = Put {
        who: &who,
        method: &method,
        uri: &uri,
        action: "plan.put",
        t: &t,
        reason: b.reason,
    };
    put.answer(&state, result, || plan_json(&state, &t))
}

async fn plan_delete(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
) -> Response {
    delete_assigned(&state, &headers, &method, &uri, Assigned::Plan).await
}

/// Query parameters given empty (`rule=`) are as good as absent.
fn unset_blanks<const N: usize>(params: [&mut Option<String>; N]) {
    for v in params {
        if v.as_deref().is_some_and(str::is_empty) {
            *v = None;
        }
    }
}

/// Unknown parameters (a cache buster) are ignored; an empty one is as
/// good as none.
#[derive(Deserialize)]
struct TopQuery {
    #[serde(default)]
    rule: Option<String>,
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    window: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

async fn top(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    q: Result<Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let Ok(Query(mut q)) = q else {
        return problem(
            StatusCode::BAD_REQUEST,
            "query: rule=NAME&by=denied|decided&window=5m&limit=20",
        );
    };
    unset_blanks([&mut q.rule, &mut q.by, &mut q.window, &mut q.limit]);
    if !state.top.enabled() {
        return problem(
            StatusCode::CONFLICT,
            "top keys are not counted here (admin.top_keys: false)",
        );
    }
    let by = match q.by.as_deref().unwrap_or("decided") {
        "decided" => By::Decided,
        "denied" => By::Denied,
        other => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("by={other:?}: expected denied or decided"),
            );
        }
    };
    let window = match spillway_core::parse_duration(q.window.as_deref().unwrap_or("5m")) {
        Ok(d)
            if d >= Nanos::from_secs(1)
                && d <= Nanos::from_secs(super::top::MINUTES as u64 * 60) =>
        {
            d
        }
        Ok(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("window: from 1s to {}m", super::top::MINUTES),
            );
        }
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("window: {e}")),
    };
    let minutes = usize::try_from(window.as_millis_ceil().div_ceil(60_000)).unwrap_or(1);
    let limit = match q.limit.as_deref().map(str::parse::<usize>) {
        None => 20,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "limit: from 1 to 1000"),
    };
    let top = &state.top;
    let one = |rule: &str| -> Option<Value> {
        let t = top.top(rule, by, minutes, limit)?;
        Some(json!({
            "rule": t.rule,
            "by": if by == By::Denied { "denied" } else { "decided" },
            "window_s": t.minutes * 60,
            "slots": top.slots(),
            "total": t.total,
            "max_error": t.max_error,
            "error": format!(
                "Space-Saving sketches of {} slots per minute: each count is an upper bound, at most its error above the true count (true count >= count - error); no error exceeds max_error, and every key with more than total/{} of a minute's requests is listed",
                top.slots(), top.slots()
            ),
            "keys": t.keys.iter().map(|h| json!({
                "key": h.key,
                // What an action names: the whole key, never the cut
                // form shown (null when not kept, or longer than
                // MAX_KEPT bytes).
                "parts": h.parts,
                "cut": h.key.is_some() && h.parts.as_ref().map(|p| p.join("+")) != h.key,
                "hash": format!("{:016x}", h.hash),
                "count": h.count,
                "error": h.error,
            })).collect::<Vec<_>>(),
        }))
    };
    match q.rule {
        Some(rule) => match one(&rule) {
            Some(v) => axum::Json(v).into_response(),
            None => problem(StatusCode::NOT_FOUND, format!("no rule named {rule:?}")),
        },
        None => {
            let list: Vec<Value> = top.rule_names().iter().filter_map(|r| one(r)).collect();
            axum::Json(json!({ "rules": list })).into_response()
        }
    }
}

async fn series(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let names: Vec<String> = state
        .shared
        .limiter
        .rules()
        .rules()
        .iter()
        .map(|r| r.name().to_string())
        .collect();
    let (end, list) = state.series.snapshot(&names);
    let rules: Vec<Value> = list
        .iter()
        .map(|(name, points)| {
            let mut o = serde_json::Map::new();
            o.insert("rule".into(), json!(name));
            for (i, f) in super::series::FIELDS.iter().enumerate() {
                o.insert(
                    (*f).into(),
                    json!(points.iter().map(|p| p[i]).collect::<Vec<_>>()),
                );
            }
            Value::Object(o)
        })
        .collect();
    axum::Json(json!({
        "step_s": super::series::STEP.as_secs(),
        "end_unix_ms": end,
        "rules": rules,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct AuditQuery {
    #[serde(default)]
    since: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

async fn audit(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    let Ok(Query(mut q)) = q else {
        return problem(StatusCode::BAD_REQUEST, "query: since=TIME&limit=N");
    };
    unset_blanks([&mut q.since, &mut q.limit]);
    let since = match q.since.as_deref().map(super::audit::parse_since) {
        None => 0,
        Some(Ok(v)) => v,
        Some(Err(e)) => return problem(StatusCode::BAD_REQUEST, e),
    };
    let limit = match q.limit.as_deref().map(str::parse::<usize>) {
        None => 1000,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "limit: a number from 1"),
    };
    axum::Json(json!({ "entries": state.audit.since(since, limit) })).into_response()
}

/// What the service (or its monitor) says of its health.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// 0 = idle, 1 = at capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// The service's latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// The service's share of failed requests, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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

async fn health_get(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers, Scope::Read) {
        return r;
    }
    axum::Json(health_json(&state)).into_response()
}

async fn health_put(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let bytes = match read_body(bytes) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let who = match authorize(&state, &headers, Scope::Write) {
        Ok(w) => w,
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
        let at = now_ms();
        self.audit.record(Entry {
            at_unix_ms: at,
            at: rfc3339(at),
            token: who.to_string(),
            method: method.to_string(),
            path: uri.path().to_string(),
            action: action.to_string(),
            rule: t.map(|t| t.rule().name().to_string()),
            key: t.map(|t| t.key.clone()),
            reason: reason.filter(|r| !r.is_empty()),
            status,
            refused: (status >= 400).then(|| format!("answered {status}")),
        });
    }
}

#[cfg(test)]
mod tests;
