//! `envoy.service.ratelimit.v3.RateLimitService`'s one method, decided as
//! envoyproxy/ratelimit decides it (see docs/ENVOY.md); the listener
//! (`grpc/listener.rs`) reads and frames the calls.
//!
//! One call: each descriptor is matched to the limit that decides it (or to
//! a request's `limit` override); the limits are asked of the store in
//! groups of the same kind of cost (a check, a request's cost, a cost
//! charged after the fact); each descriptor gets its status, the call its
//! overall code, headers and metadata.

pub mod json;
mod plan;
pub mod rate;
pub mod settings;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::task::{Context, Poll};

use spillway_core::{Outcome, Rule, Verdict};
use spillway_store::{Charge, Key};
use tonic::Status;
use tonic::server::NamedService;

use self::settings::EnvoySettings;
use super::GrpcState;
use super::Node;
use super::proto::{
    self, Code, DescriptorStatus, HeaderValue, RateLimit, RateLimitRequest, RateLimitResponse,
};
use crate::events::Hits;
use plan::{Ask, Group, Plan, ask_of, descriptor_label, plan};

/// Most descriptors in one call. Envoy sends one per matching
/// `rate_limits` entry, a handful; past this many the whole call is
/// answered OVER_LIMIT (never an error: Envoy's default
/// `failure_mode_deny: false` would admit an errored call past every limit).
pub const MAX_DESCRIPTORS: usize = 1024;
/// Most bytes in one call's descriptors: every key and value, plus one per
/// entry and per descriptor. Past it the whole call is answered OVER_LIMIT.
/// A long value alone is no problem: counters are keyed by a hash.
pub const MAX_CALL_BYTES: usize = 1 << 20;
/// The largest gRPC message read (tonic's default is 4 MiB). A larger one
/// is refused with RESOURCE_EXHAUSTED, an error: this is set far above
/// what [`MAX_CALL_BYTES`] already answers OVER_LIMIT, and above what
/// Envoy's header limits (60 KiB by default) let a client put in a call.
pub const MAX_MESSAGE: usize = 16 << 20;

/// The metrics label and counter name of a request `limit` override on a
/// descriptor no configured limit decides (after the domain's name).
const OVERRIDE: &str = "(override)";

/// The service's name among tonic's routes, for the methods it does not
/// have (`ShouldRateLimit` is served before the routes are asked).
#[derive(Clone, Copy, Debug, Default)]
pub struct RateLimitService;

impl NamedService for RateLimitService {
    const NAME: &'static str = proto::SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for RateLimitService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    /// The service's other methods: `ShouldRateLimit` itself is answered
    /// by the listener's lean path before tonic's routes are asked.
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path();
        std::future::ready(Ok(
            Status::unimplemented(format!("no method {path}")).into_http()
        ))
    }
}

/// The span of a `ShouldRateLimit` call.
pub const SPAN: &str = "envoy.ShouldRateLimit";

/// A call's span attributes: the domain (not the descriptors' values),
/// the limits that decided (their names as the answer gives them), the
/// overall code, the least remaining; an error for a refused call.
pub(super) fn trace_attributes(
    domain: &str,
    descriptors: usize,
    cost: u32,
    resp: &Result<RateLimitResponse, Status>,
    store_took: std::time::Duration,
) -> (Vec<crate::trace::proto::KeyValue>, Option<String>) {
    use crate::trace::proto::KeyValue;
    let mut a = vec![
        KeyValue::string("rpc.system", "grpc"),
        KeyValue::string("rpc.service", proto::SERVICE),
        KeyValue::string("rpc.method", "ShouldRateLimit"),
        KeyValue::string("envoy.domain", domain),
        KeyValue::int(
            "envoy.descriptors",
            i64::try_from(descriptors).unwrap_or(i64::MAX),
        ),
        KeyValue::int("spillway.cost", i64::from(cost)),
    ];
    let resp = match resp {
        Ok(r) => r,
        Err(status) => {
            a.push(KeyValue::int("rpc.grpc.status_code", status.code() as i64));
            return (a, Some(status.message().to_string()));
        }
    };
    let over = resp.overall_code == Code::OverLimit as i32;
    let names = resp
        .statuses
        .iter()
        .filter_map(|s| s.current_limit.as_ref())
        .map(|l| l.name.as_str());
    a.push(KeyValue::strings("spillway.rules", names));
    let shadow = !over
        && resp
            .statuses
            .iter()
            .any(|s| s.code == Code::OverLimit as i32);
    let decision = match (over, shadow) {
        (true, _) => "denied",
        (false, true) => "shadow",
        (false, false) => "allowed",
    };
    a.push(KeyValue::string("spillway.decision", decision));
    a.push(KeyValue::string(
        "envoy.overall_code",
        if over { "OVER_LIMIT" } else { "OK" },
    ));
    if let Some(least) = resp
        .statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .map(|s| s.limit_remaining)
        .min()
    {
        a.push(KeyValue::int("spillway.remaining", i64::from(least)));
    }
    a.push(crate::trace::latency(store_took));
    (a, None)
}

/// The only calls answered with an error, as envoyproxy/ratelimit answers
/// them: no domain, or no descriptor. Envoy never sends either (its filter
/// requires a domain, and calls only when a descriptor was produced).
fn unusable(req: &RateLimitRequest) -> Option<Status> {
    if req.domain.is_empty() {
        return Some(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Some(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    None
}

/// Whether a call is past the caps ([`MAX_DESCRIPTORS`],
/// [`MAX_CALL_BYTES`]), and so answered OVER_LIMIT whole.
fn oversized(req: &RateLimitRequest) -> bool {
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return true;
    }
    let mut bytes = 0usize;
    for d in &req.descriptors {
        bytes += 1;
        for e in &d.entries {
            bytes += e.key.len() + e.value.len() + 1;
        }
        if bytes > MAX_CALL_BYTES {
            return true;
        }
    }
    false
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: None,
    }
}

fn seconds(s: i64) -> Option<proto::Duration> {
    Some(proto::Duration {
        seconds: s,
        nanos: 0,
    })
}

/// Seconds since the epoch, for the reset of a ban.
fn now_secs() -> u64 {
    crate::os::unix_secs()
}

/// What one decided descriptor left for the headers and statistics.
#[derive(Clone, Copy)]
struct Decided<'a> {
    verdict: Verdict,
    outcome: Outcome,
    rule: &'a Rule,
}

/// The hit counters a descriptor adds to, as envoyproxy/ratelimit counts
/// them: every hit in `total`; an answer over the limit puts them all in
/// `over_limit` (and `shadow_mode` for a shadow limit); one within it in
/// `within_limit`, and those past the near-limit share of the limit in
/// `near_limit` too.
fn hits_of(hits: u64, outcome: Outcome, v: &Verdict, ratio: f32) -> Hits {
    let mut h = Hits {
        total: hits,
        ..Hits::default()
    };
    match outcome {
        Outcome::Denied => h.over_limit = hits,
        Outcome::ShadowDenied => {
            h.over_limit = hits;
            h.shadow_mode = hits;
        }
        Outcome::Allowed | Outcome::SoftExceeded | Outcome::ElasticAdmitted => {
            h.within_limit = hits;
            // As envoyproxy/ratelimit: floor(float32(limit) * ratio).
            let near = (v.limit as f32 * ratio).floor() as u64;
            let used = v.limit.saturating_sub(v.remaining);
            if used > near {
                h.near_limit = hits.min(used - near);
            }
        }
    }
    h
}

/// Decides one `ShouldRateLimit` call.
///
/// # Errors
/// `INVALID_ARGUMENT` for a call without a domain or without descriptors;
/// nothing else is an error.
pub async fn should_rate_limit(
    state: &GrpcState,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    decide_call(state, req, None).await
}

/// [`should_rate_limit`], adding the time the store took to `store_took`
/// when given (a traced call).
pub(super) async fn decide_call(
    state: &GrpcState,
    req: RateLimitRequest,
    mut store_took: Option<&mut std::time::Duration>,
) -> Result<RateLimitResponse, Status> {
    if let Some(e) = unusable(&req) {
        return Err(e);
    }
    let settings: &EnvoySettings = &state.shared.envoy;
    let events = &state.shared.events;
    let domains = state.domains.load();
    let n = req.descriptors.len();
    let mut statuses: Vec<DescriptorStatus> = req.descriptors.iter().map(|_| ok_status()).collect();
    let Some(domain) = domains.get(&req.domain) else {
        // An unknown domain limits nothing, as in envoyproxy/ratelimit.
        events.grpc_domain_not_found();
        return Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        });
    };
    if oversized(&req) {
        // Too big to decide descriptor by descriptor, and an error would
        // be admitted: the whole call is over the limit.
        events.grpc_oversized();
        for s in &mut statuses {
            s.code = Code::OverLimit as i32;
        }
        return Ok(RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses,
            ..RateLimitResponse::default()
        });
    }
    let mut plans: Vec<Plan<'_>> = Vec::with_capacity(n);
    // Names of the limits matched nodes replace (rarely any).
    let mut replaced: Vec<&str> = Vec::new();
    for d in &req.descriptors {
        let (p, replaces) = plan(domain, d);
        plans.push(p);
        replaced.extend(replaces.iter().map(String::as_str));
    }
    for p in &mut plans {
        let gone = match p {
            Plan::Limit {
                rule,
                node: Some(_),
                ..
            } => replaced.contains(&rule.get().name()),
            Plan::Ban {
                label,
                node: Some(_),
                ..
            } => replaced.contains(&label.as_ref()),
            _ => false,
        };
        if gone {
            *p = Plan::Free;
        }
    }
    let asks: Vec<Ask> = req
        .descriptors
        .iter()
        .map(|d| ask_of(d, req.hits_addend))
        .collect();
    let mut decided: Vec<Option<Decided<'_>>> = vec![None; n];
    // Unlimited and banned descriptors: no store needed.
    for (i, p) in plans.iter().enumerate() {
        if matches!(p, Plan::Unlimited) {
            statuses[i].limit_remaining = u32::MAX;
        }
        if let Plan::Ban {
            label,
            shown,
            unit,
            shadow,
            ..
        } = p
        {
            let outcome = if *shadow {
                Outcome::ShadowDenied
            } else {
                Outcome::Denied
            };
            let rule = events.grpc_rule(&req.domain, label);
            rule.decided(outcome);
            let hits = asks[i].hits();
            let h = Hits {
                total: hits,
                over_limit: hits,
                shadow_mode: if *shadow { hits } else { 0 },
                ..Hits::default()
            };
            let detail = p.detailed().then(|| descriptor_label(&req.descriptors[i]));
            rule.hits(
                &h,
                detail
                    .as_deref()
                    .map(|l| (l, settings.detailed_metric_max_values)),
            );
            statuses[i] = DescriptorStatus {
                code: if *shadow { Code::Ok } else { Code::OverLimit } as i32,
                current_limit: Some(RateLimit {
                    name: (*shown).to_string(),
                    requests_per_unit: 0,
                    unit: *unit as i32,
                }),
                limit_remaining: 0,
                duration_until_reset: seconds(rate::unit_reset(*unit, now_secs())),
            };
        }
    }
    // The store, in groups (see `Group`).
    let mut groups: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
    for (i, p) in plans.iter().enumerate() {
        if matches!(p, Plan::Limit { .. }) {
            let g = match asks[i] {
                Ask::Check => Group::Check,
                Ask::Request(c) if settings.quota_mode || p.quota() => Group::Quota(i, c),
                Ask::Request(c) => Group::Request(c),
                Ask::Charge(c) => Group::Charge(c),
            };
            groups.entry(g).or_default().push(i);
        }
    }
    let quota = |i: usize| settings.quota_mode || plans[i].quota();
    // Whether the call is already refused (by a ban, a check, or the
    // request group): then the request's cost is counted nowhere, its
    // groups only checked.
    let mut refused = plans
        .iter()
        .enumerate()
        .any(|(i, p)| matches!(p, Plan::Ban { shadow: false, .. }) && !quota(i));
    for (g, group) in groups {
        let keys: Vec<Key<'_>> = group
            .iter()
            .map(|&i| match &plans[i] {
                Plan::Limit { key, .. } => Key::from_parts([key.as_str()]),
                _ => Key::default(),
            })
            .collect();
        let charges: Vec<Charge<'_>> = group
            .iter()
            .zip(&keys)
            .filter_map(|(&i, key)| match &plans[i] {
                Plan::Limit { rule, .. } => Some(Charge {
                    rule: rule.get(),
                    key,
                }),
                _ => None,
            })
            .collect();
        let limiter = &state.shared.limiter;
        let asked = store_took.is_some().then(std::time::Instant::now);
        let (decision, store_error) = match g {
            Group::Check => {
                let d = limiter.decide(&charges, 0).await;
                refused |=
                    d.0.rules
                        .iter()
                        .any(|rd| rd.outcome == Outcome::Denied && !quota(group[rd.rule]));
                d
            }
            Group::Request(cost) => {
                let d = limiter
                    .decide(&charges, if refused { 0 } else { cost })
                    .await;
                refused |= !d.0.allowed;
                d
            }
            Group::Quota(_, cost) => {
                limiter
                    .decide(&charges, if refused { 0 } else { cost })
                    .await
            }
            Group::Charge(cost) => limiter.charge_charges(&charges, cost).await,
        };
        if let (Some(total), Some(asked)) = (store_took.as_deref_mut(), asked) {
            *total += asked.elapsed();
        }
        if store_error.is_some() {
            events.store_failed();
        }
        for rd in &decision.rules {
            let i = group[rd.rule];
            let Plan::Limit { rule, shown, .. } = &plans[i] else {
                continue;
            };
            let rule: &Rule = rule.get();
            let limit = rule.limits().get(rd.limit).unwrap_or(&rule.limits()[0]);
            let (rpu, unit) = rate::envoy_rate(limit);
            let v = rd.verdict;
            let over = rd.outcome == Outcome::Denied;
            let past = over || rd.outcome == Outcome::ShadowDenied;
            statuses[i] = DescriptorStatus {
                code: if over { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: Some(RateLimit {
                    name: (*shown).to_string(),
                    requests_per_unit: rpu,
                    unit: unit as i32,
                }),
                limit_remaining: if past {
                    0
                } else {
                    u32::try_from(v.remaining).unwrap_or(u32::MAX)
                },
                duration_until_reset: seconds(rate::reset_seconds(v.reset)),
            };
            decided[i] = Some(Decided {
                verdict: v,
                outcome: rd.outcome,
                rule,
            });
            let counters = events.grpc_rule(&req.domain, rule.name());
            counters.decided(rd.outcome);
            let h = hits_of(asks[i].hits(), rd.outcome, &v, settings.near_limit_ratio);
            let label = plans[i]
                .detailed()
                .then(|| descriptor_label(&req.descriptors[i]));
            counters.hits(
                &h,
                label
                    .as_deref()
                    .map(|l| (l, settings.detailed_metric_max_values)),
            );
        }
    }
    // The overall code, as envoyproxy/ratelimit gives it: over the limit
    // if a descriptor not in quota mode is, or if every descriptor in
    // quota mode is; never with the global shadow mode.
    let unlimited = |i: usize| matches!(plans[i], Plan::Unlimited);
    let over = |i: usize| statuses[i].code == Code::OverLimit as i32;
    let limiting = (0..n).filter(|&i| !unlimited(i));
    let failed = limiting.clone().filter(|&i| over(i) && !quota(i)).count();
    let quotas = limiting.clone().filter(|&i| quota(i)).count();
    let quotas_failed = limiting.clone().filter(|&i| over(i) && quota(i)).count();
    let mut overall_over = failed > 0 || (quotas > 0 && quotas == quotas_failed);
    if overall_over && settings.shadow_mode {
        overall_over = false;
    }
    let mut response_headers_to_add = Vec::new();
    if let Some(names) = &settings.limit_headers
        && let Some(i) = ratelimit_headers_descriptor(&statuses, &unlimited, &quota)
        && let Some(limit) = &statuses[i].current_limit
    {
        let s = &statuses[i];
        let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
        for (k, v) in [
            (&names.limit, limit.requests_per_unit.to_string()),
            (&names.remaining, s.limit_remaining.to_string()),
            (&names.reset, reset.to_string()),
        ] {
            response_headers_to_add.push(HeaderValue {
                key: k.clone(),
                value: v,
            });
        }
    }
    if state.response_headers {
        ietf_headers(&decided, overall_over, &mut response_headers_to_add);
    }
    let dynamic_metadata = settings.response_dynamic_metadata.then(|| {
        let passed: Vec<&Node> = (0..n)
            .filter(|&i| !unlimited(i) && !over(i))
            .filter_map(|i| match &plans[i] {
                Plan::Limit { node, .. } | Plan::Ban { node, .. } => *node,
                _ => None,
            })
            .collect();
        json::metadata(&req, &passed)
    });
    Ok(RateLimitResponse {
        overall_code: if overall_over {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        response_headers_to_add,
        request_headers_to_add: Vec::new(),
        dynamic_metadata,
    })
}

/// The descriptor envoyproxy/ratelimit's `RateLimit-*` headers describe:
/// the last one over its limit (not in quota mode), else the first with
/// the least `limit_remaining` among those with a limit.
fn ratelimit_headers_descriptor(
    statuses: &[DescriptorStatus],
    unlimited: &dyn Fn(usize) -> bool,
    quota: &dyn Fn(usize) -> bool,
) -> Option<usize> {
    let mut least = u32::MAX;
    let mut chosen = None;
    for (i, s) in statuses.iter().enumerate() {
        if s.current_limit.is_some() && s.limit_remaining < least {
            chosen = Some(i);
            least = s.limit_remaining;
        }
        if !unlimited(i) && s.code == Code::OverLimit as i32 && !quota(i) {
            chosen = Some(i);
            least = 0;
        }
    }
    chosen
}

/// spillway's own headers (`grpc_response_headers`): the IETF draft's
/// `RateLimit-Policy` and `RateLimit`, the common `X-RateLimit-*`, and
/// `Retry-After` when over, for the limit closest to refusing (shadow
/// refusals aside).
fn ietf_headers(decided: &[Option<Decided<'_>>], over: bool, out: &mut Vec<HeaderValue>) {
    let mut closest: Option<&Decided<'_>> = None;
    for d in decided.iter().flatten() {
        if d.outcome == Outcome::ShadowDenied {
            continue;
        }
        let v = &d.verdict;
        if closest
            .is_none_or(|c| (v.allowed, v.remaining) < (c.verdict.allowed, c.verdict.remaining))
        {
            closest = Some(d);
        }
    }
    let Some(Decided {
        verdict: v, rule, ..
    }) = closest
    else {
        return;
    };
    let window = rule
        .limits()
        .first()
        .map_or(0, |l| l.window().as_secs_ceil());
    let reset = v.reset.as_secs_ceil();
    let mut add = |k: &str, val: String| {
        out.push(HeaderValue {
            key: k.to_string(),
            value: val,
        });
    };
    let name = rule.name().replace(['"', '\\'], "_");
    add(
        "RateLimit-Policy",
        format!("\"{name}\";q={};w={window}", v.limit),
    );
    add(
        "RateLimit",
        format!("\"{name}\";r={};t={reset}", v.remaining),
    );
    add("X-RateLimit-Limit", v.limit.to_string());
    add("X-RateLimit-Remaining", v.remaining.to_string());
    add("X-RateLimit-Reset", reset.to_string());
    if over {
        let retry = spillway_tower::render::retry_after_secs(v.retry_after).to_string();
        add("Retry-After", retry.clone());
        add("X-RateLimit-Retry-After", retry);
    }
}

#[cfg(test)]
mod tests;
