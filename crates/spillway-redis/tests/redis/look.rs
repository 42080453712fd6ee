//! An operator's look at a key (a dry run that charges nothing) and its
//! reset, on a real redis-server and a real cluster, over every
//! algorithm and mode.

use super::*;
use spillway_core::Verdict;

/// The rules of [`rules`] on an hour's scale: rates of 4 an hour, windows
/// of two hours. Their TTLs are hours, so no key expires in Redis while a
/// test runs on its virtual clock, however slow the machine.
fn slow_rules() -> Vec<Rule> {
    let r = Rate::new(4, Nanos::from_secs(3600)).unwrap();
    let w = Nanos::from_secs(7200);
    let l = [
        Limit::TokenBucket(TokenBucket::new(5, r).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(5, r).unwrap()),
        Limit::Shaper(Shaper::new(5, r, Nanos::from_secs(2400)).unwrap()),
        Limit::FixedWindow(FixedWindow::new(5, w).unwrap()),
        Limit::SlidingLog(SlidingLog::new(5, w).unwrap()),
        Limit::SlidingCounter(SlidingCounter::new(5, w).unwrap()),
        Limit::Gcra(Gcra::new(r, 3).unwrap()),
    ];
    let mut out: Vec<Rule> = l
        .iter()
        .map(|l| user_rule(l.algorithm_name(), vec![l.clone()], Mode::Hard))
        .collect();
    out.push(user_rule(
        "multi",
        vec![l[4].clone(), l[6].clone()],
        Mode::Hard,
    ));
    out.push(user_rule(
        "soft",
        vec![l[3].clone(), l[5].clone()],
        Mode::Soft { percent: 40 },
    ));
    out.push(user_rule("shadow", vec![l[0].clone()], Mode::Shadow));
    out
}

/// One charge per rule for `key`.
fn under_all<'a>(rules: &'a [Rule], key: &'a Key<'a>) -> Vec<Charge<'a>> {
    rules.iter().map(|rule| Charge { rule, key }).collect()
}

/// A store on `cluster` under its own prefix.
fn on_cluster(rt: &tokio::runtime::Runtime, cluster: &RedisCluster, prefix: &str) -> RedisStore {
    rt.block_on(async {
        let s = RedisStore::new(RedisConfig {
            cluster: cluster.urls(),
            timeout: TIMEOUT,
            prefix: prefix.to_string(),
            ..RedisConfig::default()
        })
        .unwrap();
        assert!(s.wait_connected(Duration::from_secs(10)).await);
        s
    })
}

/// Redis's verdicts with their times as the memory store's where they
/// differ by a few microseconds: Redis rounds retry times up to whole
/// microseconds, and the memory store keeps a sliding log of hours in
/// steps of 2,048 ns.
fn rounded(memory: &[Vec<Verdict>], redis: &[Vec<Verdict>]) -> Vec<Vec<Verdict>> {
    let near = |a: Nanos, b: Nanos| a.as_u64().abs_diff(b.as_u64()) < 5_000;
    let mut out = redis.to_vec();
    for (m, r) in memory.iter().zip(out.iter_mut()) {
        for (vm, vr) in m.iter().zip(r.iter_mut()) {
            if near(vm.retry_after, vr.retry_after) {
                vr.retry_after = vm.retry_after;
            }
            if near(vm.reset, vr.reset) {
                vr.reset = vm.reset;
            }
        }
    }
    out
}

/// Requests at a virtual clock, a look before each: the look sees on
/// each limit what the memory store sees, looking twice changes nothing
/// (`dump`, if given, reads every key and TTL of the server), and the
/// request then finds what the look found.
fn looks_see_what_requests_find(
    rt: &tokio::runtime::Runtime,
    redis: &RedisStore,
    dump: Option<&dyn Fn() -> String>,
) {
    let memory = MemoryStore::new(ManualClock::new(Nanos::ZERO), MemoryConfig::default());
    let rules = slow_rules();
    let (key, other) = (Key::from_parts(["looked"]), Key::from_parts(["other"]));
    let mut now = T0_US;
    for step in 0..24 {
        // Bursts, then pauses that refill buckets and turn windows (odd
        // microseconds: no entry ends exactly at a step, where the memory
        // store's log of hours, in steps of 2,048 ns, may keep it a
        // moment longer than Redis).
        now += if step % 6 == 5 {
            2_999_000_123
        } else {
            97_000_321
        };
        let at = Nanos(now * 1000);
        for (r, rule) in rules.iter().enumerate() {
            let c = [Charge { rule, key: &key }];
            let before = dump.map(|d| d());
            let seen = rt.block_on(redis.peek_at(&c, 1, now)).unwrap();
            let again = rt.block_on(redis.peek_at(&c, 1, now)).unwrap();
            assert_eq!(again, seen, "{} step {step}", rule.name());
            if let (Some(d), Some(before)) = (dump, before) {
                assert_eq!(d(), before, "{} step {step}: a look wrote", rule.name());
            }
            let m = memory.peek_at(&c, 1, at);
            assert_eq!(rounded(&m, &seen), m, "{} step {step}", rule.name());
            assert_eq!(seen[0].len(), rule.enforced_limits().len());
            // Two keys in one look: each as alone (on a cluster, most
            // likely in two slots).
            let two = [
                Charge { rule, key: &key },
                Charge {
                    rule: &rules[(r + 3) % rules.len()],
                    key: &other,
                },
            ];
            let both = rt.block_on(redis.peek_at(&two, 1, now)).unwrap();
            let alone = rt.block_on(redis.peek_at(&two[1..], 1, now)).unwrap();
            assert_eq!(both, vec![seen[0].clone(), alone[0].clone()]);
            // The request finds what the look found.
            let d = rt.block_on(redis.decide_at(&c, 1, now)).unwrap();
            memory.decide_at(&c, 1, at);
            if rule.mode() != Mode::Shadow {
                let all = seen[0].iter().all(|v| v.allowed);
                assert_eq!(all, d.allowed, "{} step {step}", rule.name());
            }
            if rule.limits().len() == 1 && rule.mode() == Mode::Hard {
                assert_eq!(
                    d.rules[0].verdict.remaining,
                    seen[0][0].remaining,
                    "{} step {step}",
                    rule.name()
                );
            }
            // Now and then the other key is used too.
            if step % 3 == 0 {
                rt.block_on(redis.decide_at(&two[1..], 2, now)).unwrap();
                memory.decide_at(&two[1..], 2, at);
            }
        }
    }
}

/// Keys worn down on every rule (requests past their limits, a charge
/// after the fact on top): a reset makes one as fresh as a key never
/// seen, and leaves the other as it was.
fn a_reset_makes_a_key_fresh(rt: &tokio::runtime::Runtime, redis: &RedisStore) {
    let rules = slow_rules();
    let (gone, kept, fresh) = (
        Key::from_parts(["gone"]),
        Key::from_parts(["kept"]),
        Key::from_parts(["fresh"]),
    );
    let now = T0_US;
    for rule in &rules {
        for key in [&gone, &kept] {
            let c = [Charge { rule, key }];
            for _ in 0..12 {
                rt.block_on(redis.decide_at(&c, 1, now)).unwrap();
            }
            rt.block_on(redis.charge_at(&c, 3, now)).unwrap();
        }
    }
    let of = |key| under_all(&rules, key);
    let kept_before = rt.block_on(redis.peek_at(&of(&kept), 1, now)).unwrap();
    let n = rt.block_on(redis.reset_keys(&of(&gone))).unwrap();
    let states: usize = rules.iter().map(|r| r.limits().len()).sum();
    assert_eq!(n, states as u64, "every limit of every rule had a state");
    assert_eq!(rt.block_on(redis.reset_keys(&of(&gone))).unwrap(), 0);
    assert_eq!(
        rt.block_on(redis.peek_at(&of(&gone), 1, now)).unwrap(),
        rt.block_on(redis.peek_at(&of(&fresh), 1, now)).unwrap(),
    );
    assert_eq!(
        rt.block_on(redis.peek_at(&of(&kept), 1, now)).unwrap(),
        kept_before
    );
    for rule in &rules {
        let g = [Charge { rule, key: &gone }];
        let f = [Charge { rule, key: &fresh }];
        let d = rt.block_on(redis.decide_at(&g, 1, now)).unwrap();
        assert!(d.allowed, "{}", rule.name());
        assert_eq!(d, rt.block_on(redis.decide_at(&f, 1, now)).unwrap());
    }
    // Through the trait, as the admin API calls it.
    rt.block_on(Store::reset(redis, &of(&gone))).unwrap();
    let seen = rt.block_on(Store::peek(redis, &of(&gone), 1)).unwrap();
    assert_eq!(seen.len(), rules.len());
}

#[test]
fn a_look_sees_what_a_request_would_and_writes_nothing() {
    let server = RedisServer::start();
    let rt = rt();
    // One bucket: every state shares it, and a write would sweep it.
    let redis = rt.block_on(async {
        let s = RedisStore::new(RedisConfig {
            buckets: 1,
            ..config(server.url())
        })
        .unwrap();
        assert!(s.wait_connected(Duration::from_secs(5)).await);
        s
    });
    looks_see_what_requests_find(&rt, &redis, Some(&|| dump(&server)));
}

#[test]
fn a_reset_makes_a_key_fresh_on_every_rule() {
    let server = RedisServer::start();
    let rt = rt();
    let redis = rt.block_on(connected(server.url()));
    a_reset_makes_a_key_fresh(&rt, &redis);
}

/// The same on a cluster: looks at keys in several slots are a dry run
/// in each, resets a call per key.
#[test]
fn a_cluster_looks_and_resets() {
    let cluster = RedisCluster::start();
    let rt = rt();
    looks_see_what_requests_find(&rt, &on_cluster(&rt, &cluster, "look:"), None);
    a_reset_makes_a_key_fresh(&rt, &on_cluster(&rt, &cluster, "reset:"));
}

/// A look goes to Redis even for a key the over-limit cache refuses; a
/// reset forgets what the cache knew, so the next request goes to Redis
/// and is admitted.
#[test]
fn a_reset_key_is_no_longer_refused_from_the_over_limit_cache() {
    let server = RedisServer::start();
    let rt = rt();
    let redis = cached(&rt, &server, spillway_redis::DEFAULT_OVER_LIMIT_CACHE);
    let rule = user_rule("two", vec![fixed_window(2, 3600)], Mode::Hard);
    let key = Key::from_parts(["a"]);
    let c = [Charge {
        rule: &rule,
        key: &key,
    }];
    for _ in 0..2 {
        assert!(rt.block_on(redis.decide(&c, 1)).unwrap().allowed);
    }
    assert!(!rt.block_on(redis.decide(&c, 1)).unwrap().allowed);
    assert!(!rt.block_on(redis.decide(&c, 1)).unwrap().allowed);
    let hits = redis.over_limit_cache_hits();
    assert_eq!(hits, 1, "the refusal was learned");
    let calls = script_calls(&server);
    let seen = rt.block_on(redis.peek(&c, 1)).unwrap();
    assert!(!seen[0][0].allowed);
    assert_eq!(seen[0][0].remaining, 0);
    assert_eq!(script_calls(&server), calls + 1, "the look went to redis");
    rt.block_on(redis.reset(&c)).unwrap();
    let seen = rt.block_on(redis.peek(&c, 1)).unwrap();
    assert_eq!((seen[0][0].allowed, seen[0][0].remaining), (true, 1));
    assert!(rt.block_on(redis.decide(&c, 1)).unwrap().allowed);
    assert_eq!(redis.over_limit_cache_hits(), hits);
}

/// Bad answers never panic: a look at no charges is empty, and a look
/// or reset while Redis is gone is a transient error.
#[test]
fn looks_and_resets_without_redis_are_transient_errors() {
    let mut server = RedisServer::start();
    let rt = rt();
    let redis = rt.block_on(connected_with(server.url(), Duration::from_millis(500)));
    let rule = user_rule("w", vec![fixed_window(2, 60)], Mode::Hard);
    let key = Key::from_parts(["a"]);
    let c = [Charge {
        rule: &rule,
        key: &key,
    }];
    assert!(rt.block_on(redis.peek(&[], 1)).unwrap().is_empty());
    server.kill();
    let e = rt.block_on(redis.peek(&c, 1)).unwrap_err();
    assert!(e.transient(), "{e}");
    let e = rt.block_on(redis.reset(&c)).unwrap_err();
    assert!(e.transient(), "{e}");
}
