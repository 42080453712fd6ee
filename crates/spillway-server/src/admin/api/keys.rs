//! The admin API's writes and reads per key: a key's state and reset,
//! overrides (limits or a block for one key, with a TTL) and plan
//! assignments (/admin/v1/keys, /overrides, /plans).

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn key_get(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    KeyTarget(t): KeyTarget,
) -> Response {
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

pub(super) async fn key_reset(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    KeyTarget(t): KeyTarget,
    method: Method,
    uri: Uri,
) -> Response {
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

/// `after` (a page's `next_after`) and `limit` of the overrides' and
/// plans' lists.
#[derive(Deserialize)]
pub(super) struct IdPageQuery {
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

/// The most entries of a page of overrides or plan assignments.
const ID_PAGE: usize = 1000;

fn id_page(
    q: Result<Query<IdPageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(Option<crate::admin::assign::Id>, usize), Response> {
    let Ok(Query(mut q)) = q else {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            "query: after=CURSOR&limit=N",
        ));
    };
    unset_blanks([&mut q.after, &mut q.limit]);
    let limit = match q.limit.as_deref().map(count) {
        None => ID_PAGE,
        Some(Ok(n)) if (1..=ID_PAGE).contains(&n) => n,
        Some(_) => {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                format!("limit: from 1 to {ID_PAGE}"),
            ));
        }
    };
    let after = match q.after.as_deref() {
        None => None,
        Some(a) => Some(crate::admin::assign::read_cursor(a).ok_or_else(|| {
            problem(
                StatusCode::BAD_REQUEST,
                "after: a next_after this list answered",
            )
        })?),
    };
    Ok((after, limit))
}

pub(super) async fn overrides_list(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    q: Result<Query<IdPageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let (after, limit) = match id_page(q) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let (page, more) = state.assign.overrides_page(now_ms(), after.as_ref(), limit);
    let next = more
        .then(|| {
            page.last()
                .map(|o| crate::admin::assign::cursor(&o.rule, &o.key))
        })
        .flatten();
    let list: Vec<Value> = page.iter().map(|o| override_json(o, &state)).collect();
    axum::Json(json!({ "overrides": list, "next_after": next })).into_response()
}

pub(super) async fn override_get(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    KeyTarget(t): KeyTarget,
) -> Response {
    match state.assign.override_of(t.rule().name(), &t.key, now_ms()) {
        Some(o) => axum::Json(override_json(&o, &state)).into_response(),
        None => problem(StatusCode::NOT_FOUND, "no override for this key"),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OverrideBody {
    #[serde(default, deserialize_with = "crate::json::present")]
    limits: Option<Value>,
    #[serde(default, deserialize_with = "crate::json::present")]
    block: Option<bool>,
    #[serde(default, deserialize_with = "crate::json::present")]
    ttl: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    reason: Option<String>,
}

/// A reason for the audit trail: at most 1,024 characters, one line.
pub(super) fn check_reason(reason: &str) -> Result<(), Response> {
    if reason.chars().count() > 1024 || reason.chars().any(char::is_control) {
        return Err(problem(
            StatusCode::BAD_REQUEST,
            "reason: at most 1024 characters, no control characters (one line)",
        ));
    }
    Ok(())
}

/// A write call's body, read after its token and key (the extractors
/// before it: 401/403 before anything about the body).
pub(super) fn json_body<T: serde::de::DeserializeOwned>(
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, Response> {
    body(&read_body(bytes)?)
}

pub(super) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes).map_err(|e| {
        problem(
            StatusCode::BAD_REQUEST,
            format!("the body is not the JSON this call takes: {e}"),
        )
    })
}

pub(super) async fn override_put(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    KeyTarget(t): KeyTarget,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let b: OverrideBody = match json_body(bytes) {
        Ok(b) => b,
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
pub(super) struct Put<'a> {
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

pub(super) async fn override_delete(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    KeyTarget(t): KeyTarget,
    method: Method,
    uri: Uri,
) -> Response {
    let call = Call {
        who: &who,
        method: &method,
        uri: &uri,
        t: &t,
    };
    delete_assigned(&state, call, Assigned::Override).await
}

/// A write call's caller and target, for its audit entry.
pub(super) struct Call<'a> {
    who: &'a str,
    method: &'a Method,
    uri: &'a Uri,
    t: &'a Target,
}

/// What a DELETE of an assignment takes away.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Assigned {
    Override,
    Plan,
}

/// DELETE of a key's override or plan: 200 with what the key has now,
/// 404 if it had none.
pub(super) async fn delete_assigned(
    state: &AdminState,
    call: Call<'_>,
    what: Assigned,
) -> Response {
    let Call {
        who,
        method,
        uri,
        t,
    } = call;
    let (action, none) = match what {
        Assigned::Override => ("override.delete", "no override for this key"),
        Assigned::Plan => ("plan.delete", "this key has no assigned plan"),
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
    state.record(who, method, uri, action, Some(t), None, status);
    match result {
        Ok(true) => {
            state.recompile_key(t.rule().name(), &t.key);
            match what {
                Assigned::Override => axum::Json(json!({"deleted": true})).into_response(),
                Assigned::Plan => axum::Json(plan_json(state, t)).into_response(),
            }
        }
        Ok(false) => problem(StatusCode::NOT_FOUND, none),
        Err(e) => write_failed(e),
    }
}

pub(super) fn plan_json(state: &AdminState, t: &Target) -> Value {
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

pub(super) async fn plans_list(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    q: Result<Query<IdPageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let (after, limit) = match id_page(q) {
        Ok(p) => p,
        Err(r) => return r,
    };
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
    let (assignments, more) = state.assign.plans_page(after.as_ref(), limit);
    let next = more
        .then(|| {
            assignments
                .last()
                .map(|p| crate::admin::assign::cursor(&p.rule, &p.key))
        })
        .flatten();
    axum::Json(json!({
        "plans": plans,
        "defaults": defaults,
        "assignments": assignments,
        "next_after": next,
    }))
    .into_response()
}

pub(super) async fn plan_get(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    KeyTarget(t): KeyTarget,
) -> Response {
    axum::Json(plan_json(&state, &t)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanBody {
    plan: String,
    #[serde(default, deserialize_with = "crate::json::present")]
    reason: Option<String>,
}

pub(super) async fn plan_put(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    KeyTarget(t): KeyTarget,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let b: PlanBody = match json_body(bytes) {
        Ok(b) => b,
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

pub(super) async fn plan_delete(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    KeyTarget(t): KeyTarget,
    method: Method,
    uri: Uri,
) -> Response {
    let call = Call {
        who: &who,
        method: &method,
        uri: &uri,
        t: &t,
    };
    delete_assigned(&state, call, Assigned::Plan).await
}
