//! The decision API: `POST /v1/check`, `GET /v1/limit` and `POST
//! /v1/charge` (body, validation, rendering), on spillway-wire's direct path ([`direct`]) and
//! as axum routes for the rest.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use spillway_store::{Checked, Request, SimpleAttributes};
use spillway_tower::render::insert_rate_limit_headers;
use spillway_tower::render::{PROBLEM_JSON, Problem};

use crate::Shared;
use crate::trace::Span;

pub mod decision;
pub mod direct;
pub mod forward_auth;

pub use decision::decision_json;

/// Largest accepted request body.
pub const MAX_BODY: usize = 64 * 1024;
/// Largest accepted identity value (user, ip, header, descriptor), in bytes.
pub const MAX_VALUE: usize = 1024;
/// Most descriptors or headers in one check.
pub const MAX_ENTRIES: usize = 64;

/// What a request asks of the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Decide a request of its cost (`POST /v1/check`, `GET /v1/limit`):
    /// a denied request is not charged; a cost of 0 only checks.
    Check,
    /// Charge a cost known after the answer (`POST /v1/charge`): always
    /// counted, even past the limit; the answer says whether the key is
    /// now over, and is never a 429.
    Charge,
}

/// The decision endpoints: `POST /v1/check`, `GET /v1/limit` and `POST /v1/charge`.
pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/charge", post(charge))
        .route("/v1/limit", get(limit))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared)
}

/// The 404 of every HTTP way in.
pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such endpoint; see docs/openapi.yaml",
    )
}

/// An API error, rendered as the one problem document every way in uses.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    detail: String,
}

impl ApiError {
    /// An error with `status` and `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            detail: detail.into(),
        }
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, detail)
    }

    /// The problem document.
    pub fn problem(&self) -> Problem<'_> {
        Problem::new(self.status, self.detail.as_str())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, self.problem().to_json()).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        resp
    }
}

/// The body of `POST /v1/check`. Every field is optional; a field given
/// is given as its type says (`"api": null` is refused: leave it out).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    #[serde(default, deserialize_with = "crate::json::present")]
    api: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    user: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    ip: Option<String>,
    #[serde(default)]
    descriptors: BTreeMap<String, String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "whole_number")]
    cost: Option<u64>,
}

/// A whole number from 0 to `u64::MAX`, written as JSON writes it: `1436`
/// or `1436.0` (JSON Schema's `integer` is any number without a
/// fraction, and some encoders write every number with one); `1436.5`,
/// a negative or a larger number is an error.
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error as _;
    let n = serde_json::Number::deserialize(d)?;
    if let Some(u) = n.as_u64() {
        return Ok(Some(u));
    }
    let bad = || {
        D::Error::custom(format!(
            "expected a whole number from 0 to {}, not {n}",
            u64::MAX
        ))
    };
    match n.as_f64() {
        // 2^64 is the first float past u64::MAX; below it every whole
        // float converts exactly.
        Some(f) if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) =>
        {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Ok(Some(f as u64))
        }
        _ => Err(bad()),
    }
}

/// A decision's span on the axum routes, from the request's
/// `traceparent` (`None` with traces off, or not sampled).
pub(crate) struct Traced(Option<Span>);

impl axum::extract::FromRequestParts<Shared> for Traced {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &Shared,
    ) -> Result<Traced, Self::Rejection> {
        Ok(Traced(match &state.tracer {
            None => None,
            Some(t) => t.span(SPAN_CHECK, &parts.headers),
        }))
    }
}

/// The span of `POST /v1/check`.
pub const SPAN_CHECK: &str = "spillway.check";
/// The span of `POST /v1/charge`.
pub const SPAN_CHARGE: &str = "spillway.charge";
/// The span of `GET /v1/limit`.
pub const SPAN_LIMIT: &str = "spillway.limit";

async fn check(
    state: State<Shared>,
    Traced(span): Traced,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(state, body, Ask::Check, span).await
}

async fn charge(
    state: State<Shared>,
    Traced(span): Traced,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    answer(state, body, Ask::Charge, span.map(|s| s.named(SPAN_CHARGE))).await
}

/// `POST /v1/check` and `POST /v1/charge` on the axum routes.
async fn answer(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
    ask: Ask,
    span: Option<Span>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = body.map_err(|e| {
        state.events.bad_request();
        ApiError::new(
            e.status(),
            format!("{} (bodies are capped at {MAX_BODY} bytes)", e.body_text()),
        )
    })?;
    let checked = check_json(&state, &body, started, ask, span).await?;
    Ok(render(&checked, ask))
}

/// Decides a `POST /v1/check` body, or charges a `POST /v1/charge` one
/// (shared with the direct HTTP/1.1 path).
pub(crate) async fn check_json(
    state: &Shared,
    body: &[u8],
    started: Instant,
    ask: Ask,
    span: Option<Span>,
) -> Result<Checked, ApiError> {
    // Any content type is read as JSON: `curl -d` sends form encoding by
    // default, and refusing it would only trip people up.
    let body: CheckBody = if body.is_empty() {
        CheckBody::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            state.events.bad_request();
            ApiError::bad_request(format!("invalid JSON body: {e}"))
        })?
    };
    decide_body(state, body, started, ask, span).await
}

fn pairs(m: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Validates a check, decides it, counts it and renders the answer: the
/// shared tail of `POST /v1/check` and `GET /v1/limit`; with traces on,
/// ends the decision's `span`.
async fn decide_body(
    state: &Shared,
    body: CheckBody,
    started: Instant,
    ask: Ask,
    span: Option<Span>,
) -> Result<Checked, ApiError> {
    validate_body(&body).inspect_err(|_| state.events.bad_request())?;
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
    let asked = span.is_some().then(Instant::now);
    let checked = match ask {
        Ask::Check => {
            let checked = state.limiter.check(&req).await;
            state.events.decided(&checked, started.elapsed());
            checked
        }
        // Not counted as a decision: nothing was admitted or refused.
        Ask::Charge => {
            let checked = state.limiter.charge(&req).await;
            if checked.store_error.is_some() {
                state.events.store_failed();
            }
            state.events.observe_latency(started.elapsed());
            checked
        }
    };
    if let (Some(span), Some(t), Some(asked)) = (span, &state.tracer, asked) {
        t.finish_checked(span, &checked, req.cost, asked.elapsed());
    }
    Ok(checked)
}

fn validate_body(b: &CheckBody) -> Result<(), ApiError> {
    let too_long = |what: &str, v: &str| -> Result<(), ApiError> {
        // Characters, as the description's maxLength counts them (at
        // most four bytes each). Counted only past MAX_VALUE bytes: a
        // value that short has no more characters than bytes, and every
        // decision goes through here.
        let n = if v.len() > MAX_VALUE {
            v.chars().count()
        } else {
            0
        };
        if n > MAX_VALUE {
            Err(ApiError::bad_request(format!(
                "{what} is {n} characters long; at most {MAX_VALUE}"
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
    Ok(())
}

/// Splits `"POST /v1/login"` into method and path; `"/v1/x"` has no method.
fn split_api(api: Option<&str>) -> (Option<&str>, Option<&str>) {
    match api.map(spillway_core::rule::split_api) {
        None => (None, None),
        Some((m, p)) => (m, Some(p)),
    }
}

async fn limit(
    State(state): State<Shared>,
    Traced(span): Traced,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let span = span.map(|s| s.named(SPAN_LIMIT));
    let checked = check_query(&state, q.as_deref().unwrap_or(""), started, span).await?;
    Ok(render(&checked, Ask::Check))
}

/// Decides a `GET /v1/limit` query string (shared with the direct path).
/// Values are decoded strictly: a `%` escape that is not UTF-8 or a field
/// sent twice is a 400, never a lossy or first-wins reading that could put
/// distinct clients on one counter or count another client than meant.
pub(crate) async fn check_query(
    state: &Shared,
    query: &str,
    started: Instant,
    span: Option<Span>,
) -> Result<Checked, ApiError> {
    let mut body = CheckBody::default();
    let bad = |e: String| {
        state.events.bad_request();
        ApiError::bad_request(e)
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode(k).map_err(bad)?;
        let slot = match k.as_str() {
            "key" => &mut body.user,
            "api" => &mut body.api,
            "ip" => &mut body.ip,
            "cost" => {
                let v = decode(v).map_err(bad)?;
                if body.cost.is_some() {
                    return Err(bad("cost is given more than once".into()));
                }
                body.cost = Some(v.parse().map_err(|_| {
                    bad(format!(
                        "cost {v:?} is not a whole number from 0 to {}",
                        u64::MAX
                    ))
                })?);
                continue;
            }
            _ => continue,
        };
        if slot.is_some() {
            return Err(bad(format!("{k} is given more than once")));
        }
        *slot = Some(decode(v).map_err(bad)?);
    }
    decide_body(state, body, started, Ask::Check, span).await
}

/// A query component, `+` and `%XX` decoded, which must be UTF-8.
fn decode(s: &str) -> Result<String, String> {
    String::from_utf8(percent_decode(s)).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit) =>
            {
                let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
                out.push(hex(b[i + 1]) << 4 | hex(b[i + 2]));
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The decision as JSON with its status and headers.
fn render(checked: &Checked, ask: Ask) -> Response {
    let (status, bytes) = decision_json(checked, ask);
    let mut resp = (status, bytes).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    insert_rate_limit_headers(checked, h);
    resp
}

#[cfg(test)]
mod tests {
    use super::CheckBody;

    fn body(json: &str) -> Result<CheckBody, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    /// JSON Schema's integers are numbers without a fraction, however
    /// written: `1436.0` is 1436 (the contract test's find); a fraction,
    /// a negative or a number past u64 is refused with what was expected.
    #[test]
    fn a_cost_is_a_whole_number_however_written() {
        assert_eq!(body(r#"{"cost": 1436}"#).unwrap().cost, Some(1436));
        assert_eq!(body(r#"{"cost": 1436.0}"#).unwrap().cost, Some(1436));
        assert_eq!(body(r#"{"cost": 1.4360e3}"#).unwrap().cost, Some(1436));
        assert_eq!(body(r#"{"cost": 0.0}"#).unwrap().cost, Some(0));
        assert_eq!(
            body(r#"{"cost": 18446744073709551615}"#).unwrap().cost,
            Some(u64::MAX)
        );
        for bad in ["1436.5", "-1", "-1.0", "1e20", "18446744073709551616"] {
            let e = body(&format!(r#"{{"cost": {bad}}}"#)).unwrap_err();
            assert!(e.contains("expected a whole number"), "{bad}: {e}");
        }
        assert!(body(r#"{"cost": "1"}"#).is_err());
        assert!(body(r#"{"cost": null}"#).is_err());
        assert_eq!(body("{}").unwrap().cost, None);
    }

    /// A string field given as `null` is refused, not read as absent.
    #[test]
    fn null_is_not_a_string() {
        for field in ["api", "user", "ip"] {
            let e = body(&format!(r#"{{"{field}": null}}"#)).unwrap_err();
            assert!(e.contains("string"), "{field}: {e}");
        }
        let b = body(r#"{"api": "GET /a", "user": "u", "ip": "10.0.0.1"}"#).unwrap();
        assert_eq!(b.api.as_deref(), Some("GET /a"));
        assert!(body("{}").unwrap().user.is_none());
    }
}
