//! envoyproxy/ratelimit's HTTP endpoints on `spillway serve`'s HTTP
//! listener: `POST /json` (a `ShouldRateLimit` call in protobuf's JSON
//! mapping, for clients that cannot speak gRPC) and `GET /healthcheck`;
//! and the answer's dynamic metadata, a `google.protobuf.Struct` built
//! from JSON.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Map, Value as Json, json};

use crate::grpc::proto::{
    self, Code, DescriptorStatus, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest,
    RateLimitResponse, Struct, UInt64Value, Unit, Value, value::Kind,
};
use crate::grpc::{GrpcState, Node};

/// `/json` and `/healthcheck`, as envoyproxy/ratelimit serves them (any
/// method).
pub fn router(state: Arc<GrpcState>) -> Router {
    Router::new()
        .route("/json", any(json_call))
        .route("/healthcheck", any(healthcheck))
        .with_state(state)
}

/// 200 `OK` while the store is usable (and, with
/// `healthy_needs_domains`, a domain is in force), else 500 with no body.
async fn healthcheck(State(state): State<Arc<GrpcState>>) -> Response {
    let configured = !state.healthy_needs_domains || !state.domains.load().names().is_empty();
    if configured && state.shared.limiter.store().degraded().is_none() {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            "OK",
        )
            .into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// What Go's `http.Error` answers: the status text, in plain text.
fn plain_error(status: StatusCode) -> Response {
    let text = format!("{}\n", status.canonical_reason().unwrap_or(""));
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        text,
    )
        .into_response()
}

/// A `ShouldRateLimit` call in JSON: 200 with the answer when OK, 429 when
/// over the limit, 400 (`Bad Request`) for a body that is not a request or
/// a call the service refuses.
async fn json_call(State(state): State<Arc<GrpcState>>, body: Bytes) -> Response {
    let started = std::time::Instant::now();
    let Ok(req) = serde_json::from_slice::<Json>(&body)
        .map_err(|e| e.to_string())
        .and_then(|j| request(&j))
    else {
        state.shared.events.bad_request();
        return plain_error(StatusCode::BAD_REQUEST);
    };
    let Ok(resp) = super::should_rate_limit(&state, req).await else {
        return plain_error(StatusCode::BAD_REQUEST);
    };
    state.shared.events.observe_latency(started.elapsed());
    let status = if resp.overall_code == Code::OverLimit as i32 {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        response(&resp).to_string(),
    )
        .into_response()
}

/// A field of a JSON message under its JSON name or its proto name (both
/// are accepted, as protobuf's JSON mapping says); `null` is absent.
fn field<'a>(
    obj: &'a Map<String, Json>,
    json_name: &str,
    proto_name: &str,
) -> Result<Option<&'a Json>, String> {
    match (obj.get(json_name), obj.get(proto_name)) {
        (Some(_), Some(_)) if json_name != proto_name => Err(format!("{json_name} is given twice")),
        (Some(v), _) | (None, Some(v)) => Ok(Some(v).filter(|v| !v.is_null())),
        (None, None) => Ok(None),
    }
}

/// Every key of `obj` is one of `known` (JSON or proto names).
fn only(obj: &Map<String, Json>, known: &[&str]) -> Result<(), String> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!("unknown field {k:?}")),
        None => Ok(()),
    }
}

fn object<'a>(v: &'a Json, what: &str) -> Result<&'a Map<String, Json>, String> {
    v.as_object()
        .ok_or_else(|| format!("{what}: expected an object"))
}

fn string(v: Option<&Json>, what: &str) -> Result<String, String> {
    match v {
        None => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("{what}: expected a string")),
    }
}

/// An integer as protobuf's JSON mapping writes one: a number, or a
/// string holding one.
fn integer(v: Option<&Json>, what: &str, max: u64) -> Result<u64, String> {
    let n = match v {
        None => return Ok(0),
        Some(Json::Number(n)) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        }),
        Some(Json::String(s)) => s.parse().ok(),
        Some(_) => None,
    };
    n.filter(|n| *n <= max)
        .ok_or_else(|| format!("{what}: expected a whole number from 0 to {max}"))
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Unknown => "UNKNOWN",
        Unit::Second => "SECOND",
        Unit::Minute => "MINUTE",
        Unit::Hour => "HOUR",
        Unit::Day => "DAY",
        Unit::Month => "MONTH",
        Unit::Year => "YEAR",
        Unit::Week => "WEEK",
    }
}

fn unit(v: Option<&Json>) -> Result<i32, String> {
    match v {
        None => Ok(0),
        Some(Json::String(s)) => [
            Unit::Unknown,
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Month,
            Unit::Year,
            Unit::Week,
        ]
        .into_iter()
        .find(|u| unit_name(*u) == s)
        .map(|u| u as i32)
        .ok_or_else(|| format!("unit {s:?} is not a unit")),
        Some(n) => integer(Some(n), "unit", i32::MAX as u64).map(|n| n as i32),
    }
}

/// A `RateLimitRequest` from protobuf's JSON mapping.
///
/// # Errors
/// What is wrong with it.
pub fn request(j: &Json) -> Result<RateLimitRequest, String> {
    let obj = object(j, "request")?;
    only(obj, &["domain", "descriptors", "hitsAddend", "hits_addend"])?;
    let mut descriptors = Vec::new();
    if let Some(list) = field(obj, "descriptors", "descriptors")? {
        for d in list.as_array().ok_or("descriptors: expected a list")? {
            descriptors.push(descriptor(d)?);
        }
    }
    Ok(RateLimitRequest {
        domain: string(field(obj, "domain", "domain")?, "domain")?,
        descriptors,
        hits_addend: integer(
            field(obj, "hitsAddend", "hits_addend")?,
            "hitsAddend",
            u64::from(u32::MAX),
        )? as u32,
    })
}

fn descriptor(j: &Json) -> Result<RateLimitDescriptor, String> {
    let obj = object(j, "descriptor")?;
    only(obj, &["entries", "limit", "hitsAddend", "hits_addend"])?;
    let mut entries = Vec::new();
    if let Some(list) = field(obj, "entries", "entries")? {
        for e in list.as_array().ok_or("entries: expected a list")? {
            let e = object(e, "entry")?;
            only(e, &["key", "value"])?;
            entries.push(Entry {
                key: string(field(e, "key", "key")?, "key")?,
                value: string(field(e, "value", "value")?, "value")?,
            });
        }
    }
    let limit = match field(obj, "limit", "limit")? {
        None => None,
        Some(l) => {
            let l = object(l, "limit")?;
            only(l, &["requestsPerUnit", "requests_per_unit", "unit"])?;
            Some(RateLimitOverride {
                requests_per_unit: integer(
                    field(l, "requestsPerUnit", "requests_per_unit")?,
                    "requestsPerUnit",
                    u64::from(u32::MAX),
                )? as u32,
                unit: unit(field(l, "unit", "unit")?)?,
            })
        }
    };
    let hits_addend = match field(obj, "hitsAddend", "hits_addend")? {
        None => None,
        Some(v) => Some(UInt64Value {
            value: integer(Some(v), "hitsAddend", u64::MAX)?,
        }),
    };
    Ok(RateLimitDescriptor {
        entries,
        limit,
        hits_addend,
    })
}

fn code_name(c: i32) -> &'static str {
    match Code::try_from(c) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// A `google.protobuf.Duration` in protobuf's JSON mapping (`20s`).
fn duration(d: &proto::Duration) -> String {
    if d.nanos == 0 {
        format!("{}s", d.seconds)
    } else {
        format!("{}.{:09}s", d.seconds, d.nanos.unsigned_abs())
    }
}

fn status(s: &DescriptorStatus) -> Json {
    let mut o = Map::new();
    if s.code != 0 {
        o.insert("code".into(), json!(code_name(s.code)));
    }
    if let Some(l) = &s.current_limit {
        let mut lim = Map::new();
        if !l.name.is_empty() {
            lim.insert("name".into(), json!(l.name));
        }
        if l.requests_per_unit != 0 {
            lim.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
        }
        if l.unit != 0 {
            let name = Unit::try_from(l.unit).map_or("UNKNOWN", unit_name);
            lim.insert("unit".into(), json!(name));
        }
        o.insert("currentLimit".into(), Json::Object(lim));
    }
    if s.limit_remaining != 0 {
        o.insert("limitRemaining".into(), json!(s.limit_remaining));
    }
    if let Some(d) = &s.duration_until_reset {
        o.insert("durationUntilReset".into(), json!(duration(d)));
    }
    Json::Object(o)
}

/// A `RateLimitResponse` in protobuf's JSON mapping, default values left
/// out, as envoyproxy/ratelimit's `/json` writes it.
pub fn response(r: &RateLimitResponse) -> Json {
    let mut o = Map::new();
    if r.overall_code != 0 {
        o.insert("overallCode".into(), json!(code_name(r.overall_code)));
    }
    if !r.statuses.is_empty() {
        o.insert(
            "statuses".into(),
            Json::Array(r.statuses.iter().map(status).collect()),
        );
    }
    for (name, list) in [
        ("responseHeadersToAdd", &r.response_headers_to_add),
        ("requestHeadersToAdd", &r.request_headers_to_add),
    ] {
        if !list.is_empty() {
            let headers = list
                .iter()
                .map(|h| json!({"key": h.key, "value": h.value}))
                .collect();
            o.insert(name.into(), Json::Array(headers));
        }
    }
    if let Some(m) = &r.dynamic_metadata {
        o.insert("dynamicMetadata".into(), struct_json(m));
    }
    Json::Object(o)
}

fn struct_json(s: &Struct) -> Json {
    Json::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &Value) -> Json {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_json).collect()),
    }
}

/// A JSON object as a `google.protobuf.Struct`.
pub fn json_struct(m: &Map<String, Json>) -> Struct {
    Struct {
        fields: m.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
    }
}

fn json_value(v: &Json) -> Value {
    let kind = match v {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(a) => Kind::ListValue(proto::ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        Json::Object(m) => Kind::StructValue(json_struct(m)),
    };
    Value { kind: Some(kind) }
}

/// Merges `src` into `dest` as envoyproxy/ratelimit does: a key `dest`
/// already has keeps its value, except that two structs merge.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            Some(Value {
                kind: Some(Kind::StructValue(d)),
            }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The answer's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`), as
/// envoyproxy/ratelimit builds it: the domain; each descriptor's entries
/// (`key=value`), override and `hitsAddend`; the request's `hitsAddend`;
/// and the `metadata` of the limits the call passed (`passed`, in
/// descriptor order), merged, the first one's value winning.
pub fn metadata(req: &RateLimitRequest, passed: &[&Node]) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_string(), Value::string(req.domain.clone()));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| Value::string(format!("{}={}", e.key, e.value)))
                .collect();
            f.insert("entries".to_string(), Value::list(entries));
            if let Some(l) = &d.limit {
                // The override in protobuf's text format, as Go prints it.
                let mut text = Vec::new();
                if l.requests_per_unit != 0 {
                    text.push(format!("requests_per_unit:{}", l.requests_per_unit));
                }
                if l.unit != 0 {
                    let unit = Unit::try_from(l.unit)
                        .map_or_else(|_| l.unit.to_string(), |u| unit_name(u).to_string());
                    text.push(format!("unit:{unit}"));
                }
                f.insert("limit".to_string(), Value::string(text.join(" ")));
            }
            if let Some(h) = &d.hits_addend {
                f.insert("hitsAddend".to_string(), Value::number(h.value as f64));
            }
            Value::object(Struct { fields: f })
        })
        .collect();
    fields.insert("descriptors".to_string(), Value::list(descriptors));
    if req.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_string(),
            Value::number(f64::from(req.hits_addend)),
        );
    }
    let mut passed_metadata = Struct::default();
    for node in passed {
        if let Some(m) = &node.metadata {
            merge(&mut passed_metadata, &json_struct(m));
        }
    }
    if !passed_metadata.fields.is_empty() {
        fields.insert("metadata".to_string(), Value::object(passed_metadata));
    }
    Struct { fields }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_both_field_names_and_refuse_unknown_ones() {
        let r = request(&json!({
            "domain": "rl",
            "hits_addend": "3",
            "descriptors": [
                {"entries": [{"key": "a", "value": "1"}, {"key": "b"}],
                 "limit": {"requestsPerUnit": 5, "unit": "MINUTE"},
                 "hitsAddend": 0},
                {"entries": [], "limit": {"requests_per_unit": "2", "unit": 3}}
            ]
        }))
        .unwrap();
        assert_eq!((r.domain.as_str(), r.hits_addend), ("rl", 3));
        assert_eq!(r.descriptors[0].entries[1].value, "");
        assert_eq!(
            r.descriptors[0].limit,
            Some(RateLimitOverride {
                requests_per_unit: 5,
                unit: Unit::Minute as i32
            })
        );
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 0 }));
        assert_eq!(
            r.descriptors[1].limit.as_ref().unwrap().unit,
            Unit::Hour as i32
        );
        for bad in [
            json!({"domain": "rl", "nope": 1}),
            json!({"domain": 5}),
            json!({"domain": "rl", "descriptors": [{"entries": [{"key": "a", "val": "x"}]}]}),
            json!({"domain": "rl", "hitsAddend": -1}),
            json!({"domain": "rl", "hitsAddend": 1, "hits_addend": 1}),
            json!({"domain": "rl", "descriptors": [{"limit": {"unit": "FORTNIGHT"}}]}),
            json!([1]),
        ] {
            assert!(request(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn responses_leave_defaults_out() {
        let r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(proto::RateLimit {
                        name: String::new(),
                        requests_per_unit: 2,
                        unit: Unit::Minute as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(proto::Duration {
                        seconds: 20,
                        nanos: 0,
                    }),
                },
                DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: None,
                    limit_remaining: 0,
                    duration_until_reset: None,
                },
            ],
            ..RateLimitResponse::default()
        };
        assert_eq!(
            response(&r),
            json!({
                "overallCode": "OVER_LIMIT",
                "statuses": [
                    {"code": "OVER_LIMIT",
                     "currentLimit": {"requestsPerUnit": 2, "unit": "MINUTE"},
                     "durationUntilReset": "20s"},
                    {"code": "OK"}
                ]
            })
        );
    }

    #[test]
    fn metadata_merges_the_first_value_and_nested_structs() {
        let mut a = json_struct(
            json!({"service_with_quota": {"name": "service_1"}, "x": 1})
                .as_object()
                .unwrap(),
        );
        let b = json_struct(
            json!({"service_with_quota": {"name": "service_2", "zone": "b"}, "x": 2, "y": [true, null]})
                .as_object()
                .unwrap(),
        );
        merge(&mut a, &b);
        assert_eq!(
            struct_json(&a),
            json!({"service_with_quota": {"name": "service_1", "zone": "b"}, "x": 1.0, "y": [true, null]})
        );
    }
}
