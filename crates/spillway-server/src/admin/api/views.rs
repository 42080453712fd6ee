//! The admin API's views of recent traffic: top keys, the decision series
//! and the audit trail (GET /admin/v1/top, /series, /audit).

#[allow(clippy::wildcard_imports)]
use super::*;

/// A count as docs/openapi.yaml spells one: decimal digits only (Rust's
/// parser would also take `+5`, which the description does not offer).
pub(super) fn count(s: &str) -> Result<usize, ()> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(());
    }
    s.parse().map_err(|_| ())
}

/// Query parameters given empty (`rule=`) are as good as absent.
pub(super) fn unset_blanks<const N: usize>(params: [&mut Option<String>; N]) {
    for v in params {
        if v.as_deref().is_some_and(str::is_empty) {
            *v = None;
        }
    }
}

/// Unknown parameters (a cache buster) are ignored; an empty one is as
/// good as none.
#[derive(Deserialize)]
pub(super) struct TopQuery {
    #[serde(default)]
    rule: Option<String>,
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    window: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

pub(super) async fn top(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    q: Result<Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
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
                && d <= Nanos::from_secs(crate::admin::top::MINUTES as u64 * 60) =>
        {
            d
        }
        Ok(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("window: from 1s to {}m", crate::admin::top::MINUTES),
            );
        }
        Err(e) => return problem(StatusCode::BAD_REQUEST, format!("window: {e}")),
    };
    let minutes = usize::try_from(window.as_millis_ceil().div_ceil(60_000)).unwrap_or(1);
    let limit = match q.limit.as_deref().map(count) {
        None => 20,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "limit: from 1 to 1000"),
    };
    let top = &state.top;
    let set = state.shared.limiter.rules();
    let one = |rule: &str| -> Option<Value> {
        let t = match top.top(rule, by, minutes, limit) {
            Some(t) => t,
            // In force, no decision yet: nothing counted.
            None if set.rules().iter().any(|r| r.name() == rule) => {
                crate::admin::top::TopKeys::empty(rule, minutes)
            }
            None => return None,
        };
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

#[derive(Deserialize)]
pub(super) struct SeriesQuery {
    #[serde(default)]
    limit: Option<String>,
}

/// The most rules the chart's series lists unless asked.
const SERIES_RULES: usize = 50;

pub(super) async fn series(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    q: Result<Query<SeriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(mut q)) = q else {
        return problem(StatusCode::BAD_REQUEST, "query: limit=N");
    };
    unset_blanks([&mut q.limit]);
    let limit = match q.limit.as_deref().map(count) {
        None => SERIES_RULES,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "limit: from 1 to 1000"),
    };
    let set = state.shared.limiter.rules();
    let all: Vec<&str> = set.rules().iter().map(Rule::name).collect();
    // The busiest rules, not all: a chart of a million lines says nothing.
    let busiest = state.series.busiest(&all, limit);
    let names: Vec<String> = busiest.iter().map(|(n, _)| n.clone()).collect();
    let wanted: std::collections::HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let mut info = vec![Value::Null; names.len()];
    for r in set.rules() {
        if let Some(i) = wanted.get(r.name()) {
            info[*i] = crate::admin::rule_json(r);
        }
    }
    let (end, list) = state.series.snapshot(&names);
    let rules: Vec<Value> = list
        .iter()
        .zip(busiest.iter().zip(info))
        .map(|((name, points), ((_, decided), rule))| {
            let mut o = serde_json::Map::new();
            o.insert("rule".into(), json!(name));
            for (i, f) in crate::admin::series::FIELDS.iter().enumerate() {
                o.insert(
                    (*f).into(),
                    json!(points.iter().map(|p| p[i]).collect::<Vec<_>>()),
                );
            }
            o.insert("decided".into(), json!(decided));
            o.insert("info".into(), rule);
            Value::Object(o)
        })
        .collect();
    axum::Json(json!({
        "step_s": crate::admin::series::STEP.as_secs(),
        "end_unix_ms": end,
        "rules": rules,
        "rules_total": all.len(),
    }))
    .into_response()
}

#[derive(Deserialize)]
pub(super) struct AuditQuery {
    #[serde(default)]
    since: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

pub(super) async fn audit(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(mut q)) = q else {
        return problem(StatusCode::BAD_REQUEST, "query: since=TIME&limit=N");
    };
    unset_blanks([&mut q.since, &mut q.limit]);
    let since = match q.since.as_deref().map(crate::admin::audit::parse_since) {
        None => 0,
        Some(Ok(v)) => v,
        Some(Err(e)) => return problem(StatusCode::BAD_REQUEST, e),
    };
    let limit = match q.limit.as_deref().map(count) {
        None => 1000,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => return problem(StatusCode::BAD_REQUEST, "limit: a number from 1"),
    };
    axum::Json(json!({ "entries": state.audit.since(since, limit) })).into_response()
}
