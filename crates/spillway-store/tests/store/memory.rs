//! The in-memory store: all-or-none charging, exactness under threads, bounds and expiry.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use spillway_core::{
    FixedWindow, Gcra, KeySpec, Limit, ManualClock, Mode, Nanos, Rate, Rule, SlidingLog,
    TokenBucket,
};
use spillway_store::{Charge, Key, MemoryConfig, MemoryStore};

const T0: u64 = 1_700_000_000_000_000_000;

fn clock() -> ManualClock {
    ManualClock::new(Nanos(T0))
}

fn rule(name: &str, limits: Vec<Limit>, mode: Mode) -> Rule {
    Rule::new(name, None, KeySpec::parse("user").unwrap(), limits, mode).unwrap()
}

fn fw(n: u64, secs: u64) -> Limit {
    Limit::FixedWindow(FixedWindow::new(n, Nanos::from_secs(secs)).unwrap())
}

fn log(n: u64, secs: u64) -> Limit {
    Limit::SlidingLog(SlidingLog::new(n, Nanos::from_secs(secs)).unwrap())
}

#[test]
fn ten_per_minute_and_fifteen_per_hour_are_charged_together() {
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig::default());
    let r = rule("multi", vec![log(10, 60), log(15, 3600)], Mode::Hard);
    let key = Key::from_parts(["alice"]);
    let charges = [Charge {
        rule: &r,
        key: &key,
    }];
    let mut admitted = 0;
    for minute in 0..5 {
        for _ in 0..20 {
            if store.decide_now(&charges, 1).allowed {
                admitted += 1;
            }
        }
        assert!(admitted <= 15, "minute {minute}: {admitted}");
        c.advance(Nanos::from_secs(61));
    }
    // 10 in the first minute, 5 in the second, none after: the hour limit
    // was not charged by the requests the minute limit denied.
    assert_eq!(admitted, 15);
}

#[test]
fn a_denied_request_is_charged_to_no_rule() {
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig::default());
    let wide = rule("wide", vec![fw(100, 60)], Mode::Hard);
    let narrow = rule("narrow", vec![fw(1, 60)], Mode::Hard);
    let key = Key::from_parts(["bob"]);
    let both = [
        Charge {
            rule: &wide,
            key: &key,
        },
        Charge {
            rule: &narrow,
            key: &key,
        },
    ];
    assert!(store.decide_now(&both, 1).allowed);
    for _ in 0..50 {
        let d = store.decide_now(&both, 1);
        assert!(!d.allowed);
        assert_eq!(d.deciding.unwrap().rule, 1);
    }
    let alone = [Charge {
        rule: &wide,
        key: &key,
    }];
    let d = store.decide_now(&alone, 1);
    assert_eq!(d.deciding.unwrap().verdict.remaining, 98);
}

#[test]
fn charging_is_all_or_none_across_more_than_64_rules() {
    // 70 rules on one client: rules 0-68 allow 3, rule 69 (past the
    // 64-rule bit set, kept in a list) allows 2.
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig::default());
    let rules: Vec<Rule> = (0..70)
        .map(|i| {
            rule(
                &format!("r{i}"),
                vec![fw(if i == 69 { 2 } else { 3 }, 60)],
                Mode::Hard,
            )
        })
        .collect();
    let key = Key::from_parts(["carol"]);
    let charges: Vec<Charge<'_>> = rules
        .iter()
        .map(|r| Charge { rule: r, key: &key })
        .collect();
    assert!(store.decide_now(&charges, 1).allowed);
    assert!(store.decide_now(&charges, 1).allowed);
    let d = store.decide_now(&charges, 1);
    assert!(!d.allowed);
    assert_eq!(d.rules.len(), 70);
    assert_eq!(d.deciding.unwrap().rule, 69);
    // Rules 0 and 68 were charged twice, not three times.
    for i in [0, 63, 64, 68] {
        let alone = [charges[i]];
        let d = store.decide_now(&alone, 1);
        assert!(d.allowed, "rule {i}");
        assert_eq!(d.deciding.unwrap().verdict.remaining, 0, "rule {i}");
    }
}

#[test]
fn shadow_never_denies_and_soft_admits_ten_percent_more() {
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig::default());
    let shadow = rule("s", vec![fw(5, 60)], Mode::Shadow);
    let soft = rule("t", vec![fw(10, 60)], Mode::Soft { percent: 10 });
    let key = Key::from_parts(["carol"]);
    let mut shadow_denied = 0;
    for _ in 0..8 {
        let d = store.decide_now(
            &[Charge {
                rule: &shadow,
                key: &key,
            }],
            1,
        );
        assert!(d.allowed);
        if d.outcome() == spillway_core::Outcome::ShadowDenied {
            shadow_denied += 1;
        }
    }
    assert_eq!(shadow_denied, 3);
    let mut outcomes = Vec::new();
    for _ in 0..13 {
        outcomes.push(
            store
                .decide_now(
                    &[Charge {
                        rule: &soft,
                        key: &key,
                    }],
                    1,
                )
                .outcome(),
        );
    }
    use spillway_core::Outcome::*;
    assert_eq!(&outcomes[..10], &[Allowed; 10]);
    assert_eq!(outcomes[10], SoftExceeded);
    assert_eq!(&outcomes[11..], &[Denied, Denied]);
}

#[test]
fn many_threads_on_one_key_admit_exactly_the_limit() {
    for limit in [
        fw(1000, 3600),
        log(1000, 3600),
        Limit::Gcra(Gcra::new(Rate::new(1, Nanos::from_secs(3600)).unwrap(), 1000).unwrap()),
        Limit::TokenBucket(
            TokenBucket::new(1000, Rate::new(1, Nanos::from_secs(3600)).unwrap()).unwrap(),
        ),
    ] {
        let store = Arc::new(MemoryStore::new(clock(), MemoryConfig::default()));
        let r = Arc::new(rule("hot", vec![limit.clone()], Mode::Hard));
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (store, r, admitted) = (store.clone(), r.clone(), admitted.clone());
                std::thread::spawn(move || {
                    let key = Key::from_parts(["same"]);
                    for _ in 0..500 {
                        if store
                            .decide_now(
                                &[Charge {
                                    rule: &r,
                                    key: &key,
                                }],
                                1,
                            )
                            .allowed
                        {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            1000,
            "{}",
            limit.algorithm_name()
        );
    }
}

#[test]
fn the_key_cap_holds_under_a_flood_and_idle_keys_expire() {
    let c = clock();
    let store = MemoryStore::new(
        c.clone(),
        MemoryConfig {
            max_keys: 10_000,
            shards: 16,
        },
    );
    let r = rule("flood", vec![fw(5, 1)], Mode::Hard);
    for i in 0..200_000u32 {
        let id = i.to_string();
        let key = Key::from_parts([id.as_str()]);
        assert!(
            store
                .decide_now(
                    &[Charge {
                        rule: &r,
                        key: &key
                    }],
                    1
                )
                .allowed
        );
    }
    let u = store.usage();
    assert!(u.keys <= 10_000, "{u:?}");
    assert!(u.keys >= 9_000, "{u:?}");
    c.advance(Nanos::from_secs(2));
    assert_eq!(store.purge(), u.keys);
    assert_eq!(store.usage().keys, 0);
}

#[test]
fn sweep_returns_memory_of_idle_keys() {
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig::default());
    let r = rule("idle", vec![fw(5, 1)], Mode::Hard);
    // 40 keys per shard on average, swept 8 slots at a time.
    for i in 0..10_000u32 {
        let id = i.to_string();
        let key = Key::from_parts([id.as_str()]);
        store.decide_now(
            &[Charge {
                rule: &r,
                key: &key,
            }],
            1,
        );
    }
    assert_eq!(store.usage().keys, 10_000);
    c.advance(Nanos::from_secs(1));
    let mut dropped = 0;
    for _ in 0..100 {
        dropped += store.sweep(8);
    }
    assert_eq!(dropped, 10_000);
    assert_eq!(store.usage().keys, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The store decides exactly what the pure algorithm decides, per key.
    #[test]
    fn store_matches_the_pure_algorithm(
        ops in prop::collection::vec((0u8..4, 0u64..200_000_000, 1u64..3), 1..300)
    ) {
        let c = clock();
        let store = MemoryStore::new(c.clone(), MemoryConfig { max_keys: 1 << 20, shards: 4 });
        let limit = Limit::Gcra(Gcra::new(Rate::new(5, Nanos::from_secs(1)).unwrap(), 3).unwrap());
        let r = rule("p", vec![limit.clone()], Mode::Hard);
        let mut states = [0u64; 4];
        for (user, gap, cost) in ops {
            c.advance(Nanos(gap));
            let name = user.to_string();
            let key = Key::from_parts([name.as_str()]);
            let got = store.decide_now(&[Charge { rule: &r, key: &key }], cost);
            let (want, next) = limit.decide_narrow(states[user as usize], c.now_value(), cost).unwrap();
            if want.allowed { states[user as usize] = next; }
            prop_assert_eq!(got.allowed, want.allowed);
            prop_assert_eq!(got.deciding.unwrap().verdict, want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `check_many` decides what `check` on each item in turn decides,
    /// for every kind of state (repeated keys within a batch included).
    #[test]
    fn check_many_matches_check_one_by_one(
        batches in prop::collection::vec(
            (prop::collection::vec((0u8..6, 0usize..3, 1u64..3), 0..20), 0u64..300_000_000),
            1..20,
        )
    ) {
        let limits = [
            Limit::Gcra(Gcra::new(Rate::new(5, Nanos::from_secs(1)).unwrap(), 3).unwrap()),
            fw(4, 1),
            log(3, 1),
        ];
        let cfg = || MemoryConfig { max_keys: 1 << 20, shards: 4 };
        let (many, one) = (MemoryStore::new(clock(), cfg()), MemoryStore::new(clock(), cfg()));
        let mut now = T0;
        for (items, gap) in batches {
            now += gap;
            let keys: Vec<[u8; 1]> = items.iter().map(|&(k, _, _)| [k]).collect();
            let batch: Vec<(&[u8], &Limit, u64)> = items
                .iter()
                .zip(&keys)
                .map(|(&(_, l, cost), key)| (&key[..], &limits[l], cost))
                .collect();
            let mut got = Vec::new();
            many.check_many(&batch, Nanos(now), &mut got);
            let want: Vec<_> = batch
                .iter()
                .map(|&(key, limit, cost)| one.check(key, limit, cost, Nanos(now)))
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}

trait NowValue {
    fn now_value(&self) -> Nanos;
}

impl NowValue for ManualClock {
    fn now_value(&self) -> Nanos {
        spillway_core::Clock::now(self)
    }
}

/// A store that fails every decision, as Redis does for a cost past 2^32:
/// the limiter must answer what no state could admit without asking it.
struct FailingStore;

impl spillway_store::Store for FailingStore {
    fn decide(
        &self,
        _: &[Charge<'_>],
        _: u64,
    ) -> impl std::future::Future<
        Output = Result<spillway_core::Decision, spillway_store::StoreError>,
    > + Send {
        std::future::ready(Err(spillway_store::StoreError::new(
            true,
            "cost does not fit",
        )))
    }

    fn charge(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl std::future::Future<
        Output = Result<spillway_core::Decision, spillway_store::StoreError>,
    > + Send {
        self.decide(charges, cost)
    }
}

fn check_cost<S: spillway_store::Store>(
    limiter: &spillway_store::Limiter<S>,
    cost: u64,
) -> spillway_store::Checked {
    let attrs = spillway_store::SimpleAttributes {
        user: Some("alice"),
        ..Default::default()
    };
    let req = spillway_store::Request {
        method: None,
        path: None,
        attrs: &attrs,
        cost,
    };
    spillway_store::block_on(limiter.check(&req))
}

/// Regression: `cost: 4294967297` against `limit: 10` became a Redis
/// store error, and the default fail-open policy admitted it (200).
#[test]
fn a_cost_past_every_limit_is_denied_by_any_store() {
    use spillway_core::Outcome;
    use spillway_store::{Limiter, RuleSet};
    let rules = || RuleSet::new(vec![rule("ten", vec![fw(10, 60)], Mode::Hard)]);
    let memory = Limiter::new(MemoryStore::new(clock(), MemoryConfig::default()), rules());
    let failing = Limiter::new(FailingStore, rules());
    for cost in [11, 4_294_967_297, u64::MAX] {
        for checked in [check_cost(&memory, cost), check_cost(&failing, cost)] {
            assert!(!checked.decision.allowed, "cost {cost}");
            assert!(checked.store_error.is_none(), "cost {cost}");
            let d = checked.decision.deciding.unwrap();
            assert_eq!(checked.rule(&d).unwrap().name(), "ten");
            assert_eq!(d.outcome, Outcome::Denied);
            assert_eq!(d.verdict.retry_after, Nanos::MAX);
            assert_eq!(d.verdict.limit, 10);
        }
    }
    // Nothing was charged: the whole limit is still there.
    assert_eq!(memory.store().usage().keys, 0);
    let at_capacity = check_cost(&memory, 10);
    assert!(at_capacity.decision.allowed);
    assert!(!check_cost(&memory, 1).decision.allowed);
    // The failing store is asked for what a state could admit.
    let asked = check_cost(&failing, 10);
    assert!(asked.store_error.is_some());
}

/// The same through `Limiter::decide` (the Envoy way in), and for every
/// algorithm: a cost at the limit's size passes a fresh key, one more never.
#[test]
fn a_cost_at_capacity_is_admitted_and_one_more_is_not() {
    use spillway_store::{Limiter, RuleSet};
    let rate = Rate::new(1, Nanos::from_secs(1)).unwrap();
    let limits = [
        Limit::TokenBucket(TokenBucket::new(7, rate).unwrap()),
        Limit::Gcra(Gcra::new(rate, 7).unwrap()),
        fw(7, 60),
        log(7, 60),
        Limit::SlidingCounter(spillway_core::SlidingCounter::new(7, Nanos::from_secs(60)).unwrap()),
    ];
    for limit in limits {
        let r = rule("r", vec![limit.clone()], Mode::Hard);
        let limiter = Limiter::new(
            MemoryStore::new(clock(), MemoryConfig::default()),
            RuleSet::new(vec![r.clone()]),
        );
        let key = Key::from_parts(["k"]);
        let charges = [Charge {
            rule: &r,
            key: &key,
        }];
        let (over, err) = spillway_store::block_on(limiter.decide(&charges, 8));
        assert!(!over.allowed && err.is_none(), "{}", limit.algorithm_name());
        let (at, err) = spillway_store::block_on(limiter.decide(&charges, 7));
        assert!(at.allowed && err.is_none(), "{}", limit.algorithm_name());
    }
}

/// A shadow rule reports a cost it could never admit and lets the request
/// through; a soft rule admits up to its raised limit and no further.
#[test]
fn a_shadow_rule_reports_a_huge_cost_without_denying() {
    use spillway_core::Outcome;
    use spillway_store::{Limiter, RuleSet};
    let limiter = Limiter::new(
        MemoryStore::new(clock(), MemoryConfig::default()),
        RuleSet::new(vec![
            rule("big", vec![fw(u64::MAX, 60)], Mode::Hard),
            rule("watch", vec![fw(10, 60)], Mode::Shadow),
        ]),
    );
    let checked = check_cost(&limiter, 4_294_967_297);
    assert!(checked.decision.allowed);
    assert!(checked.store_error.is_none());
    assert_eq!(checked.decision.outcome(), Outcome::ShadowDenied);
    let outcomes: Vec<_> = checked
        .decision
        .rules
        .iter()
        .map(|d| (d.rule, d.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [(0, Outcome::Allowed), (1, Outcome::ShadowDenied)]
    );
    // The hard rule was charged; the shadow rule was not.
    let d = checked.decision.rules[0];
    assert_eq!(d.verdict.remaining, u64::MAX - 4_294_967_297);
    assert_eq!(
        check_cost(&limiter, 10).decision.outcome(),
        Outcome::Allowed
    );

    // Alone, the shadow rule speaks for the request.
    let alone = Limiter::new(
        MemoryStore::new(clock(), MemoryConfig::default()),
        RuleSet::new(vec![rule("watch", vec![fw(10, 60)], Mode::Shadow)]),
    );
    let checked = check_cost(&alone, u64::MAX);
    assert!(checked.decision.allowed);
    let d = checked.decision.deciding.unwrap();
    assert_eq!(d.outcome, Outcome::ShadowDenied);
    assert_eq!(d.verdict.retry_after, Nanos::MAX);

    let soft = Limiter::new(
        MemoryStore::new(clock(), MemoryConfig::default()),
        RuleSet::new(vec![rule(
            "soft",
            vec![fw(10, 60)],
            Mode::Soft { percent: 50 },
        )]),
    );
    assert!(!check_cost(&soft, 16).decision.allowed);
    assert_eq!(
        check_cost(&soft, 15).decision.outcome(),
        Outcome::SoftExceeded
    );
}

/// One key's state held alone, decided by the pure algorithm: what the
/// store must answer for a key it keeps.
#[derive(Default)]
struct Alone {
    narrow: u64,
    wide: spillway_core::Wide,
    log: spillway_core::Log,
}

impl Alone {
    /// Decides and, if admitted, charges.
    fn decide(&mut self, limit: &Limit, now: Nanos, cost: u64) -> spillway_core::Verdict {
        if let Limit::SlidingLog(sl) = limit {
            let v = sl.decide(&self.log, now, cost);
            if v.allowed {
                sl.commit(&mut self.log, now, cost);
            }
            return v;
        }
        if let Some((v, next)) = limit.decide_narrow(self.narrow, now, cost) {
            if v.allowed {
                self.narrow = next;
            }
            return v;
        }
        let (v, next) = limit.decide_wide(self.wide, now, cost).unwrap();
        if v.allowed {
            self.wide = next;
        }
        v
    }
}

/// What a flood does between two requests of the limited client.
#[derive(Debug, Clone)]
enum Flood {
    /// Time passes.
    Wait(u64),
    /// `keys` fresh keys send `each` requests of cost 1 (more than the
    /// limit: each key ends limited, and the table fills with them).
    Keys { keys: u32, each: u32 },
    /// The limited client asks again.
    Client,
}

/// Runs a flood against a store of `max_keys` over `shards`, with one
/// client that has spent its limit; checks that while the client is
/// limited (its last answer denied it, or left less than its cost) the
/// store answers it exactly as an unbounded store of that key alone would.
/// Returns the store's overflow count.
fn flood_against_a_limited_client(
    limit: &Limit,
    max_keys: usize,
    shards: usize,
    cost: u64,
    ops: &[Flood],
) -> Result<u64, TestCaseError> {
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig { max_keys, shards });
    let r = rule("flooded", vec![limit.clone()], Mode::Hard);
    let victim = Key::from_parts(["victim"]);
    let mut alone = Alone::default();
    // Whether the client is still limited (and so still held).
    let ask = |alone: &mut Alone| -> Result<bool, TestCaseError> {
        let now = c.now_value();
        let before = store.overflowed();
        let charge = Charge {
            rule: &r,
            key: &victim,
        };
        let got = store.decide_now(&[charge], cost);
        let want = alone.decide(limit, now, cost);
        let at = now.as_u64() - T0;
        prop_assert!(!got.allowed || want.allowed, "re-admitted at {}", at);
        if got.allowed != want.allowed {
            // Its state came to rest and was dropped, and now it is a new
            // key in a full table: it shares the overflow state, stricter.
            prop_assert!(store.overflowed() > before, "denied at {}", at);
            return Ok(false);
        }
        Ok(!want.allowed || want.remaining < cost)
    };
    // The client spends its limit.
    while !ask(&mut alone)? {}
    let mut fresh = 0u32;
    for op in ops {
        match *op {
            Flood::Wait(ns) => c.advance(Nanos(ns)),
            Flood::Keys { keys, each } => {
                for _ in 0..keys {
                    fresh += 1;
                    let name = format!("f{fresh}");
                    let key = Key::from_parts([name.as_str()]);
                    for _ in 0..each {
                        store.decide_now(
                            &[Charge {
                                rule: &r,
                                key: &key,
                            }],
                            1,
                        );
                    }
                }
                prop_assert!(store.usage().keys <= max_keys);
            }
            Flood::Client => {
                if !ask(&mut alone)? {
                    // Its own state lets it in with room to spare: it
                    // is an ordinary client again, which the store may
                    // forget.
                    break;
                }
            }
        }
    }
    Ok(store.overflowed())
}

fn limits_under_test() -> Vec<Limit> {
    let per = Nanos::from_secs(60);
    vec![
        Limit::SlidingCounter(spillway_core::SlidingCounter::new(5, per).unwrap()),
        log(5, 60),
        Limit::TokenBucket(TokenBucket::new(5, Rate::new(5, per).unwrap()).unwrap()),
        Limit::Gcra(Gcra::new(Rate::new(5, per).unwrap(), 5).unwrap()),
        fw(5, 60),
    ]
}

/// Regression for "No way past a limit": with the table full, eviction
/// took the entry expiring soonest, the very client being denied, and a
/// flood of fresh keys (1.7M in 30 s against `max_keys: 100000`)
/// re-admitted a limited user 159 times. Here 3,000 keys in 30 s against
/// `max_keys: 100`, half of them used once, half until limited.
#[test]
fn a_key_flood_does_not_readmit_a_limited_client() {
    for limit in limits_under_test() {
        let mut ops = Vec::new();
        for i in 0..300 {
            ops.push(Flood::Keys {
                keys: 10,
                each: if i % 2 == 0 { 1 } else { 6 },
            });
            ops.push(Flood::Client);
            ops.push(Flood::Wait(100_000_000));
        }
        let overflowed = flood_against_a_limited_client(&limit, 100, 4, 1, &ops)
            .unwrap_or_else(|e| panic!("{}: {e}", limit.algorithm_name()));
        // Keys limited by the flood filled the table: later ones shared
        // the overflow state, and the store says so.
        assert!(overflowed > 0, "{}", limit.algorithm_name());
    }
}

/// Overflowed keys share one state per rule and limit: a flood of fresh
/// keys that finds no room is limited as one client would be.
#[test]
fn keys_that_find_no_room_share_one_limit() {
    let c = clock();
    let store = MemoryStore::new(
        c.clone(),
        MemoryConfig {
            max_keys: 10,
            shards: 1,
        },
    );
    let r = rule("one", vec![fw(3, 60)], Mode::Hard);
    let ask = |name: &str| {
        let key = Key::from_parts([name]);
        store
            .decide_now(
                &[Charge {
                    rule: &r,
                    key: &key,
                }],
                1,
            )
            .allowed
    };
    // Ten clients, each limited.
    for i in 0..10 {
        let name = format!("held{i}");
        while ask(&name) {}
    }
    assert_eq!(store.overflowed(), 0);
    let admitted = (0..1000).filter(|i| ask(&format!("new{i}"))).count();
    assert_eq!(admitted, 3);
    assert_eq!(store.overflowed(), 1000);
    assert_eq!(store.usage().overflowed, 1000);
    assert_eq!(store.usage().keys, 10);
    // Once the held clients are at rest, new keys are stored again.
    c.advance(Nanos::from_secs(60));
    assert!(ask("later"));
    assert_eq!(store.overflowed(), 1000);
    // The bare-key path overflows alike.
    let limit = fw(2, 60);
    for i in 0..10u8 {
        while store.check(&[i], &limit, 1, c.now_value()).allowed {}
    }
    let before = store.overflowed();
    let admitted = (100..200u8)
        .filter(|&i| store.check(&[i], &limit, 1, c.now_value()).allowed)
        .count();
    assert_eq!(admitted, 2);
    assert_eq!(store.overflowed(), before + 100);
}

/// A sliding log's memory is bounded by its configuration, not by what
/// clients send: a cost above the limit is denied before anything is
/// stored (by the limiter, and by the store itself on its bare path), and
/// a cost at the largest limit core accepts stays within 4 bytes a unit.
#[test]
fn a_sliding_log_holds_no_more_than_its_limit_whatever_the_cost() {
    use spillway_core::algo::MAX_LOG_LIMIT;
    let c = clock();
    let store = MemoryStore::new(c.clone(), MemoryConfig::default());
    let empty = store.usage().bytes;
    let limit = log(MAX_LOG_LIMIT, 60);
    for cost in [MAX_LOG_LIMIT + 1, 1 << 24, u64::MAX] {
        assert!(!store.check(b"k", &limit, cost, c.now_value()).allowed);
    }
    assert_eq!(store.usage().keys, 0);
    assert_eq!(store.usage().bytes, empty, "a denied cost allocated");
    assert!(
        store
            .check(b"k", &limit, MAX_LOG_LIMIT, c.now_value())
            .allowed
    );
    let grown = store.usage().bytes - empty;
    assert!(grown <= 4 * MAX_LOG_LIMIT as usize + 4096, "{grown} bytes");
    assert!(!store.check(b"k", &limit, 1, c.now_value()).allowed);
    assert_eq!(store.usage().bytes - empty, grown);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// For any flood of fresh keys against a small `max_keys`, a client
    /// that was denied stays denied until its own state says otherwise.
    #[test]
    fn a_flood_never_readmits_a_limited_client_early(
        which in 0usize..5,
        max_keys in 1usize..24,
        shards in 1usize..5,
        cost in 1u64..3,
        ops in prop::collection::vec(
            prop_oneof![
                (0u64..20_000_000_000).prop_map(Flood::Wait),
                (1u32..40, 1u32..8).prop_map(|(keys, each)| Flood::Keys { keys, each }),
                Just(Flood::Client),
            ],
            1..40,
        ),
    ) {
        let limit = &limits_under_test()[which];
        flood_against_a_limited_client(limit, max_keys, shards, cost, &ops)?;
    }
}

/// Charges after the fact through the memory store and the limiter.
mod after_the_fact {
    use super::*;
    use spillway_core::{Outcome, ResponseCost};
    use spillway_store::{Limiter, Request, RuleSet, SimpleAttributes, block_on};

    fn request<'a>(attrs: &'a SimpleAttributes<'a>, cost: u64) -> Request<'a> {
        Request {
            method: None,
            path: None,
            attrs,
            cost,
        }
    }

    /// A charge counts on every rule, shadow ones too, even past the
    /// limit, and says the keys are now over; checks are then refused
    /// and charge nothing; a key with no room (a full table) is charged
    /// on its shared overflow state, never skipped.
    #[test]
    fn a_charge_counts_everywhere_and_a_check_charges_nothing() {
        let store = MemoryStore::new(clock(), MemoryConfig::default());
        let limiter = Limiter::new(
            store,
            RuleSet::new(vec![
                rule("hard", vec![fw(10, 60)], Mode::Hard),
                rule("watch", vec![fw(5, 60)], Mode::Shadow),
            ]),
        );
        let attrs = SimpleAttributes {
            user: Some("u"),
            ..Default::default()
        };
        for _ in 0..3 {
            let d = block_on(limiter.check(&request(&attrs, 0))).decision;
            assert!(d.allowed);
            assert_eq!(d.rules[0].verdict.remaining, 10, "a check charged: {d:?}");
        }
        assert_eq!(limiter.store().usage().keys, 0, "a check stored a key");
        let d = block_on(limiter.charge(&request(&attrs, 7))).decision;
        assert!(d.allowed, "7 of 10 is not over: {d:?}");
        assert_eq!(d.rules[1].outcome, Outcome::ShadowDenied, "{d:?}");
        let d = block_on(limiter.charge(&request(&attrs, 7))).decision;
        assert!(!d.allowed, "14 of 10 is over: {d:?}");
        assert_eq!(d.rules[0].verdict.remaining, 0);
        let d = block_on(limiter.check(&request(&attrs, 0))).decision;
        assert!(!d.allowed, "a key that owes passed a check: {d:?}");
        assert!(
            !block_on(limiter.check(&request(&attrs, 1)))
                .decision
                .allowed
        );
    }

    /// A full table: a new key's charge lands on the shared overflow
    /// state, so it still counts.
    #[test]
    fn a_charge_without_room_is_counted_on_the_overflow_state() {
        let store = MemoryStore::new(
            clock(),
            MemoryConfig {
                max_keys: 1,
                shards: 1,
            },
        );
        let r = rule("hard", vec![fw(10, 60)], Mode::Hard);
        let (a, b) = (Key::from_parts(["a"]), Key::from_parts(["b"]));
        // `a` fills the table and is being limited, so it is not evicted.
        let ca = [Charge { rule: &r, key: &a }];
        assert!(!store.charge_now(&ca, 20).allowed);
        let cb = [Charge { rule: &r, key: &b }];
        assert!(!store.charge_now(&cb, 11).allowed, "the charge was skipped");
        assert!(!store.decide_now(&cb, 0).allowed);
        assert!(store.overflowed() > 0);
    }

    /// A rule that reads its cost from the answer is checked with its
    /// estimate, before the request's other rules: a refusal there charges
    /// the others nothing; `settle` then charges what the answer said
    /// beyond the estimate, to that rule only.
    #[test]
    fn a_response_cost_rule_is_checked_first_and_settled_after() {
        let tokens =
            rule("tokens", vec![fw(1000, 3600)], Mode::Hard).with_response_cost(ResponseCost {
                header: "x-tokens".into(),
                estimate: 100,
            });
        let requests = rule("requests", vec![fw(50, 3600)], Mode::Hard);
        let limiter = Limiter::new(
            MemoryStore::new(clock(), MemoryConfig::default()),
            RuleSet::new(vec![tokens, requests]),
        );
        let attrs = SimpleAttributes {
            user: Some("u"),
            ..Default::default()
        };
        let mut served = 0;
        for _ in 0..10 {
            let req = request(&attrs, 1);
            let c = block_on(limiter.check(&req));
            if !c.decision.allowed {
                assert_eq!(c.decision.deciding.unwrap().rule, 0, "{c:?}");
                continue;
            }
            served += 1;
            let settled =
                block_on(limiter.settle(&req, &|r| (r.name() == "tokens").then_some(600)));
            assert!(settled.is_some());
        }
        // 100 before and 500 after each: after two the key owes 200, and
        // the third is refused by `tokens` before `requests` is asked.
        assert_eq!(served, 2);
        let set = limiter.rules();
        let key = Key::from_parts(["u"]);
        let requests = [Charge {
            rule: &set.rules()[1],
            key: &key,
        }];
        let d = limiter.store().decide_now(&requests, 0);
        assert_eq!(d.rules[0].verdict.remaining, 48, "{d:?}");
        // Nothing to settle when the answer says nothing.
        assert!(block_on(limiter.settle(&request(&attrs, 1), &|_| None)).is_none());
    }
}

/// Every algorithm as a limit of 10 that does not refill within a test.
fn every_algorithm_of_ten() -> Vec<Limit> {
    use spillway_core::{LeakyBucket, SlidingCounter};
    let hour = Nanos::from_secs(3600);
    let slow = Rate::new(1, hour).unwrap();
    vec![
        Limit::TokenBucket(TokenBucket::new(10, slow).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(10, slow).unwrap()),
        fw(10, 3600),
        log(10, 3600),
        Limit::SlidingCounter(SlidingCounter::new(10, hour).unwrap()),
        Limit::Gcra(Gcra::new(slow, 10).unwrap()),
    ]
}

/// `mode: elastic 300%`, every algorithm: the plain limit while health
/// is unknown; up to 3x it at low load, the requests above the plain
/// limit reported as elastic admissions; the plain limit again once the
/// load reaches capacity (no new admissions past what was used).
#[test]
fn elastic_rules_follow_the_health_on_every_algorithm() {
    use spillway_core::{Elastic, Health, HealthGauge, Outcome};
    for limit in every_algorithm_of_ten() {
        let name = limit.algorithm_name();
        let c = clock();
        let store = MemoryStore::new(c.clone(), MemoryConfig::default());
        let gauge = Arc::new(HealthGauge::new());
        let elastic = rule(name, vec![limit], Mode::Elastic(Elastic::new(300).unwrap()))
            .with_health(gauge.clone());
        let run = |user: &str, n: usize| -> Vec<Outcome> {
            let key = Key::from_parts([user]);
            (0..n)
                .map(|_| {
                    store
                        .decide_now(
                            &[Charge {
                                rule: &elastic,
                                key: &key,
                            }],
                            1,
                        )
                        .outcome()
                })
                .collect()
        };
        let count = |o: &[Outcome], x: Outcome| o.iter().filter(|&&y| y == x).count();
        // Unknown: the plain limit, nothing elastic.
        let o = run("unknown", 40);
        assert_eq!(count(&o, Outcome::Allowed), 10, "{name}: {o:?}");
        assert_eq!(count(&o, Outcome::ElasticAdmitted), 0, "{name}");
        // Healthy: up to 30, the 20 above the plain limit said so.
        gauge.set(Health::Load(0.1));
        let o = run("healthy", 40);
        assert_eq!(count(&o, Outcome::Allowed), 10, "{name}: {o:?}");
        assert_eq!(count(&o, Outcome::ElasticAdmitted), 20, "{name}: {o:?}");
        assert_eq!(count(&o, Outcome::Denied), 10, "{name}");
        // Half way between the knee and capacity: half the reach.
        gauge.set(Health::Load(0.75));
        let o = run("busy", 40);
        assert_eq!(count(&o, Outcome::Allowed), 10, "{name}");
        assert_eq!(count(&o, Outcome::ElasticAdmitted), 10, "{name}: {o:?}");
        // At capacity: the healthy key is held to its plain limit (it
        // used 30 of it); a fresh key gets exactly the plain limit.
        gauge.set(Health::Load(1.0));
        assert_eq!(count(&run("healthy", 5), Outcome::Denied), 5, "{name}");
        let o = run("late", 40);
        assert_eq!(count(&o, Outcome::Allowed), 10, "{name}");
        assert_eq!(count(&o, Outcome::ElasticAdmitted), 0, "{name}");
        // Gone stale: the same.
        gauge.set(Health::Unknown);
        assert_eq!(count(&run("late", 5), Outcome::Denied), 5, "{name}");
    }
}

/// Every algorithm (a shaper too), with its default max_debt (one
/// period) and with one of its own, shorter than a period.
fn every_algorithm_with_debts() -> Vec<Limit> {
    use spillway_core::{LeakyBucket, Shaper, SlidingCounter};
    let r = Rate::new(4, Nanos::from_secs(1)).unwrap();
    let w = Nanos::from_secs(2);
    let plain = vec![
        Limit::TokenBucket(TokenBucket::new(5, r).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(5, r).unwrap()),
        Limit::Shaper(Shaper::new(5, r, Nanos::from_millis(600)).unwrap()),
        Limit::FixedWindow(FixedWindow::new(5, w).unwrap()),
        log(5, 2),
        Limit::SlidingCounter(SlidingCounter::new(5, w).unwrap()),
        Limit::Gcra(Gcra::new(r, 3).unwrap()),
    ];
    let own: Vec<Limit> = plain
        .iter()
        .map(|l| l.with_max_debt(Nanos::from_millis(300)).unwrap())
        .collect();
    plain.into_iter().chain(own).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Costs never lock out in the memory store: after any requests and
    /// charges after the fact of any cost (up to `u64::MAX`), a check of
    /// any algorithm is refused for at most its max_debt longer than its
    /// limit itself could refuse a check (nothing for a bucket or GCRA,
    /// a shaper's queue, a window; a nanosecond of rounding more for the
    /// sliding counter), and passes at its `retry_after`.
    #[test]
    fn a_charge_never_locks_a_key_out_past_max_debt(
        which in 0usize..14,
        ops in prop::collection::vec(
            (
                prop_oneof![3 => Just(0u64), 3 => 0u64..300_000_000, 1 => 0u64..3_000_000_000],
                prop_oneof![
                    3 => 0u64..10,
                    1 => Just(u64::MAX),
                    1 => Just(1u64 << 32),
                    1 => 10u64..=u64::MAX,
                ],
                any::<bool>(),
            ),
            1..60,
        ),
    ) {
        let limit = every_algorithm_with_debts().swap_remove(which);
        let bound = match &limit {
            Limit::TokenBucket(_) | Limit::LeakyBucket(_) | Limit::Gcra(_) => {
                limit.max_debt().as_u64()
            }
            // One period from the charge and a count just over the limit
            // fading, as the core bounds it (issue 35: it was two periods).
            Limit::SlidingCounter(a) => {
                let w = a.window().as_u64();
                limit.max_debt().as_u64().max(w) + w.div_ceil(a.limit() + 1) + 1
            }
            _ => limit.window().as_u64() + limit.max_debt().as_u64(),
        };
        let r = rule("r", vec![limit], Mode::Hard);
        let c = clock();
        let store = MemoryStore::new(c.clone(), MemoryConfig::default());
        let key = Key::from_parts(["victim"]);
        let charges = [Charge { rule: &r, key: &key }];
        for (gap, cost, after) in ops {
            c.advance(Nanos(gap));
            if after {
                store.charge_now(&charges, cost);
            } else {
                store.decide_now(&charges, cost);
            }
            let d = store.decide_now(&charges, 0);
            let v = d.rules[0].verdict;
            if !v.allowed {
                prop_assert!(
                    v.retry_after.as_u64() <= bound,
                    "{:?}: retry after {:?}, bound {}ns", r.limits()[0], v.retry_after, bound
                );
                let at = c.now_value().as_u64() + v.retry_after.as_u64();
                prop_assert!(store.decide_at(&charges, 0, Nanos(at)).allowed);
            }
        }
    }
}
