//! The tonic service for `envoy.service.ratelimit.v3.RateLimitService`,
//! written by hand over tonic's server helpers (no protoc, no codegen).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use spillway_core::{Mode, Outcome, Rule};
use spillway_store::{Charge, Key};
use tonic::Status;
use tonic::server::NamedService;

use super::GrpcState;
use super::proto::{
    self, Code, DescriptorStatus, HeaderValue, RateLimit, RateLimitRequest, RateLimitResponse, Unit,
};
use super::{Action, envoy_rate, envoy_rule, find};

/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;
/// Longest key or value, in bytes.
pub const MAX_VALUE: usize = 1024;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The gRPC service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RateLimitService {
    state: Arc<GrpcState>,
}

impl RateLimitService {
    /// A service deciding with `state`'s limiter and domains.
    pub fn new(state: Arc<GrpcState>) -> RateLimitService {
        RateLimitService { state }
    }
}

impl NamedService for RateLimitService {
    const NAME: &'static str = proto::SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for RateLimitService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != proto::SHOULD_RATE_LIMIT {
            let path = req.uri().path().to_string();
            return Box::pin(async move {
                Ok(Status::unimplemented(format!("no method {path}")).into_http())
            });
        }
        let method = ShouldRateLimit(self.state.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(method, req).await)
        })
    }
}

struct ShouldRateLimit(Arc<GrpcState>);

impl tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<tonic::Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let started = std::time::Instant::now();
            let resp = should_rate_limit(&state, request.into_inner()).await?;
            state.shared.events.observe_latency(started.elapsed());
            Ok(tonic::Response::new(resp))
        })
    }
}

fn validate(req: &RateLimitRequest) -> Result<(), Status> {
    if req.domain.trim().is_empty() {
        return Err(Status::invalid_argument("domain must not be empty"));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "at least one descriptor is needed",
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        )));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has no entries"
            )));
        }
        if d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has {} entries; at most {MAX_ENTRIES}",
                d.entries.len()
            )));
        }
        for e in &d.entries {
            if e.key.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i} has an entry with an empty key"
                )));
            }
            if e.key.len() > MAX_VALUE || e.value.len() > MAX_VALUE {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i}: keys and values are at most {MAX_VALUE} bytes"
                )));
            }
        }
    }
    Ok(())
}

/// One descriptor that matched a limit.
struct Pending<'a> {
    index: usize,
    rule: Cow<'a, Rule>,
    key: String,
    cost: u64,
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: None,
        limit_remaining: 0,
        duration_until_reset: None,
    }
}

/// Decides one `ShouldRateLimit` call.
///
/// # Errors
/// `INVALID_ARGUMENT` for malformed requests.
pub async fn should_rate_limit(
    state: &GrpcState,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    validate(&req)?;
    let domains = state.domains.load();
    let mut statuses: Vec<DescriptorStatus> = req.descriptors.iter().map(|_| ok_status()).collect();
    let Some(domain) = domains.get(&req.domain) else {
        // An unknown domain limits nothing, as in envoyproxy/ratelimit.
        return Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        });
    };
    let default_cost = u64::from(req.hits_addend.max(1));
    let mut matched = Vec::new();
    for (i, d) in req.descriptors.iter().enumerate() {
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        if let Some(m) = find(&domain.nodes, &entries) {
            matched.push((i, d, m));
        }
    }
    // A limit named in another matched limit's `replaces` does not apply.
    let replaced: HashSet<&str> = matched
        .iter()
        .flat_map(|(_, _, m)| m.node.replaces.iter().map(String::as_str))
        .collect();
    let mut pending: Vec<Pending<'_>> = Vec::new();
    for (i, d, m) in matched {
        let rule = match &m.node.action {
            Action::Limit(rule) if !replaced.contains(rule.name()) => rule,
            Action::Unlimited => {
                statuses[i].limit_remaining = u32::MAX;
                continue;
            }
            Action::Ban { name, unit, shadow } if !replaced.contains(name.as_str()) => {
                state.shared.events.count_grpc(
                    &req.domain,
                    name,
                    if *shadow {
                        Outcome::ShadowDenied
                    } else {
                        Outcome::Denied
                    },
                );
                statuses[i] = DescriptorStatus {
                    code: if *shadow { Code::Ok } else { Code::OverLimit } as i32,
                    current_limit: Some(RateLimit {
                        name: name.clone(),
                        requests_per_unit: 0,
                        unit: *unit as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(proto::Duration {
                        seconds: i64::try_from(unit.seconds()).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                };
                continue;
            }
            _ => continue,
        };
        let rule: Cow<'_, Rule> = match d.limit.as_ref().and_then(|o| {
            let unit = Unit::try_from(o.unit).ok()?;
            (o.requests_per_unit > 0 && unit != Unit::Unknown)
                .then_some((o.requests_per_unit, unit))
        }) {
            // A per-request override: its own fixed window, its own counters.
            Some((rpu, unit)) => Cow::Owned(
                envoy_rule(
                    rule.name(),
                    u64::from(rpu),
                    unit,
                    rule.mode() == Mode::Shadow,
                )
                .map_err(Status::invalid_argument)?,
            ),
            None => Cow::Borrowed(rule.as_ref()),
        };
        let key = m.key;
        let cost = d
            .hits_addend
            .as_ref()
            .map(|h| h.value)
            .filter(|v| *v > 0)
            .unwrap_or(default_cost);
        pending.push(Pending {
            index: i,
            rule,
            key,
            cost,
        });
    }
    // One atomic store call per distinct cost (usually one for the request).
    let mut by_cost: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (j, p) in pending.iter().enumerate() {
        by_cost.entry(p.cost).or_default().push(j);
    }
    let mut closest: Option<(usize, spillway_core::Verdict, &Rule)> = None;
    for (cost, group) in by_cost {
        let keys: Vec<Key<'_>> = group
            .iter()
            .map(|&j| Key::from_parts([pending[j].key.as_str()]))
            .collect();
        let charges: Vec<Charge<'_>> = group
            .iter()
            .zip(&keys)
            .map(|(&j, key)| Charge {
                rule: pending[j].rule.as_ref(),
                key,
            })
            .collect();
        let (decision, store_error) = state.shared.limiter.decide(&charges, cost).await;
        if store_error.is_some() {
            state.shared.events.store_failed();
        }
        for rd in &decision.rules {
            let p = &pending[group[rd.rule]];
            let rule = p.rule.as_ref();
            state
                .shared
                .events
                .count_grpc(&req.domain, rule.name(), rd.outcome);
            let limit = rule.limits().get(rd.limit).unwrap_or(&rule.limits()[0]);
            let (rpu, unit) = envoy_rate(limit);
            let v = rd.verdict;
            statuses[p.index] = DescriptorStatus {
                code: if rd.outcome == Outcome::Denied {
                    Code::OverLimit as i32
                } else {
                    Code::Ok as i32
                },
                current_limit: Some(RateLimit {
                    name: rule.name().to_string(),
                    requests_per_unit: rpu,
                    unit: unit as i32,
                }),
                limit_remaining: u32::try_from(v.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(proto::Duration {
                    seconds: i64::try_from(v.reset.as_u64() / 1_000_000_000).unwrap_or(i64::MAX),
                    nanos: (v.reset.as_u64() % 1_000_000_000) as i32,
                }),
            };
            let worse = match &closest {
                None => true,
                Some((_, c, _)) => (v.allowed, v.remaining) < (c.allowed, c.remaining),
            };
            if worse && rd.outcome != Outcome::ShadowDenied {
                closest = Some((p.index, v, rule));
            }
        }
    }
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    let mut response_headers_to_add = Vec::new();
    if state.response_headers
        && let Some((_, v, rule)) = closest
    {
        let window = rule
            .limits()
            .first()
            .map_or(0, |l| l.window().as_secs_ceil());
        let reset = v.reset.as_secs_ceil();
        let mut add = |k: &str, val: String| {
            response_headers_to_add.push(HeaderValue {
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
            let retry = spillway_tower::retry_after_secs(v.retry_after).to_string();
            add("Retry-After", retry.clone());
            add("X-RateLimit-Retry-After", retry);
        }
    }
    Ok(RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add,
        request_headers_to_add: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{Entry, RateLimitDescriptor};

    proptest::proptest! {
        /// Any request shape: refused with a reason, or within the bounds
        /// the service promises; never a panic.
        #[test]
        fn any_rls_request_is_refused_or_within_bounds(
            domain in "[a-z ]{0,4}",
            descriptors in proptest::collection::vec(
                proptest::collection::vec(("[a-z]{0,3}", "[a-z]{0,3}|x{1020,1030}"), 0..4),
                0..70,
            ),
            hits in proptest::num::u32::ANY,
        ) {
            let req = RateLimitRequest {
                domain,
                descriptors: descriptors
                    .into_iter()
                    .map(|entries| RateLimitDescriptor {
                        entries: entries
                            .into_iter()
                            .map(|(key, value)| Entry { key, value })
                            .collect(),
                        limit: None,
                        hits_addend: None,
                    })
                    .collect(),
                hits_addend: hits,
            };
            if validate(&req).is_ok() {
                proptest::prop_assert!(!req.domain.trim().is_empty());
                proptest::prop_assert!(!req.descriptors.is_empty());
                proptest::prop_assert!(req.descriptors.len() <= MAX_DESCRIPTORS);
                for d in &req.descriptors {
                    proptest::prop_assert!(!d.entries.is_empty() && d.entries.len() <= MAX_ENTRIES);
                    for e in &d.entries {
                        proptest::prop_assert!(!e.key.is_empty());
                    }
                }
            }
        }
    }
}
