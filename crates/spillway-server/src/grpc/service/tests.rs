use std::sync::Arc;

use super::plan::entries_key;
use super::*;
use proto::{Entry, RateLimitDescriptor, RateLimitOverride, UInt64Value, Unit};

fn desc(entries: Vec<(String, String)>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .into_iter()
            .map(|(key, value)| Entry { key, value })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

/// A service on the memory store over one small domain.
fn state() -> GrpcState {
    use spillway_store::{Limiter, MemoryConfig, MemoryStore, RuleSet, SystemClock};
    let domain = crate::config::parse_envoy(
            "t.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n  - key: b\n    value: x\n    rate_limit: { unit: second, requests_per_unit: 0 }\n  - key: c\n    rate_limit: { unlimited: true }\n",
        )
        .unwrap();
    let set = RuleSet::new(Vec::new());
    let store = crate::ServerStore::Memory(MemoryStore::new(
        SystemClock::new(),
        MemoryConfig::default(),
    ));
    GrpcState {
        shared: crate::Shared {
            events: Arc::new(crate::metrics::Metrics::new(&set)),
            limiter: Arc::new(Limiter::new(store, set)),
            envoy: Arc::default(),
            health: Arc::default(),
            measured: Arc::default(),
            api_tokens: crate::credentials::ApiTokens::default(),
            tracer: None,
        },
        domains: Arc::new(arc_swap::ArcSwap::from_pointee(super::super::Domains::new(
            vec![domain],
        ))),
        response_headers: true,
        healthy_needs_domains: false,
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(64))]
    /// Any request shape: only a call without a domain or without
    /// descriptors is an error; every other call is decided, one
    /// status per descriptor, its size at most limiting it (OVER_LIMIT
    /// whole), never failing it; never a panic.
    #[test]
    fn only_a_call_without_domain_or_descriptors_is_an_error(
        domain in "d|[a-z ]{0,2}",
        base in proptest::collection::vec(
            (
                proptest::collection::vec(("[a-c]{0,1}", "[xy]{0,2}"), 0..3),
                proptest::option::of(0u64..3),
                proptest::option::of((0u32..3, 0i32..9)),
            ),
            0..4,
        ),
        count in 0usize..1100,
        long in proptest::option::of(0usize..1_100_000),
        hits in proptest::num::u32::ANY,
    ) {
        let mut descriptors: Vec<RateLimitDescriptor> = Vec::new();
        if !base.is_empty() {
            for i in 0..count {
                let (entries, h, o) = &base[i % base.len()];
                let mut d = desc(entries.clone());
                d.hits_addend = h.map(|value| UInt64Value { value });
                d.limit = o.map(|(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                });
                descriptors.push(d);
            }
        }
        if let (Some(n), Some(d)) = (long, descriptors.first_mut()) {
            d.entries.push(Entry { key: "a".into(), value: "x".repeat(n) });
        }
        let req = RateLimitRequest { domain, descriptors, hits_addend: hits };
        let bytes: usize = req
            .descriptors
            .iter()
            .map(|d| 1 + d.entries.iter().map(|e| e.key.len() + e.value.len() + 1).sum::<usize>())
            .sum();
        let too_big = req.descriptors.len() > MAX_DESCRIPTORS || bytes > MAX_CALL_BYTES;
        let refused = req.domain.is_empty() || req.descriptors.is_empty();
        proptest::prop_assert_eq!(unusable(&req).is_some(), refused);
        if !refused {
            proptest::prop_assert_eq!(oversized(&req), too_big);
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let n = req.descriptors.len();
        let known = req.domain == "d";
        match rt.block_on(should_rate_limit(&state(), req)) {
            Err(_) => proptest::prop_assert!(refused),
            Ok(r) => {
                proptest::prop_assert!(!refused);
                proptest::prop_assert_eq!(r.statuses.len(), n);
                if known && too_big {
                    proptest::prop_assert_eq!(r.overall_code, Code::OverLimit as i32);
                }
                if !known {
                    proptest::prop_assert_eq!(r.overall_code, Code::Ok as i32);
                }
                for st in &r.statuses {
                    if st.code == Code::OverLimit as i32 {
                        proptest::prop_assert_eq!(st.limit_remaining, 0);
                    }
                }
            }
        }
    }
}

#[test]
fn a_descriptor_hits_addend_of_zero_checks_and_above_zero_charges() {
    let mut d = desc(vec![("k".into(), "v".into())]);
    assert_eq!(ask_of(&d, 0), Ask::Request(1));
    assert_eq!(ask_of(&d, 7), Ask::Request(7));
    d.hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(ask_of(&d, 7), Ask::Check);
    d.hits_addend = Some(UInt64Value { value: 600 });
    assert_eq!(ask_of(&d, 7), Ask::Charge(600));
    assert!(Group::Check < Group::Request(1));
    assert!(Group::Request(u64::MAX) < Group::Quota(0, 1));
    assert!(Group::Quota(9, u64::MAX) < Group::Charge(1));
}

#[test]
fn hits_are_counted_as_envoyproxy_ratelimit_counts_them() {
    let v = |limit, remaining| Verdict {
        allowed: true,
        limit,
        remaining,
        reset: spillway_core::Nanos::ZERO,
        retry_after: spillway_core::Nanos::ZERO,
        wait: spillway_core::Nanos::ZERO,
    };
    // 10 per unit, near past 8: from 7 to 9 used, one hit is near.
    let h = hits_of(2, Outcome::Allowed, &v(10, 1), 0.8);
    assert_eq!((h.total, h.within_limit, h.near_limit), (2, 2, 1));
    // From 8 to 10: both near.
    let h = hits_of(2, Outcome::Allowed, &v(10, 0), 0.8);
    assert_eq!(h.near_limit, 2);
    let h = hits_of(3, Outcome::Denied, &v(10, 0), 0.8);
    assert_eq!((h.total, h.over_limit, h.within_limit), (3, 3, 0));
    let h = hits_of(3, Outcome::ShadowDenied, &v(10, 0), 0.8);
    assert_eq!((h.over_limit, h.shadow_mode), (3, 3));
    assert_eq!(hits_of(0, Outcome::Denied, &v(10, 0), 0.8), Hits::default());
}

#[test]
fn labels_and_keys_of_descriptors() {
    let d = desc(vec![("a".into(), "1".into()), ("b".into(), String::new())]);
    assert_eq!(descriptor_label(&d), "a_1.b");
    assert_eq!(entries_key(&d), "1:a1:11:b0:");
    let mut o = d.clone();
    o.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 9,
    });
    assert_eq!(
        o.limit.as_ref().map(|l| Unit::try_from(l.unit).is_err()),
        Some(true)
    );
}
