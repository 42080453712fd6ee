//! Local-first sync: exchanges (charges, refunds, leases, idempotent
//! pushes) and heartbeats against a real redis-server.
//!
//! Refunds and leases run on Redis's clock, so every limit here is one no
//! test can outrun: rates of one unit an hour, and windows whose edges are
//! at least ten minutes from Redis's time when the test starts.

use super::*;
use spillway_core::Decision;
use spillway_redis::{SyncItem, SyncOp, SyncReply};

const HOUR: u64 = 3600;
const MINUTE_US: u64 = 60 * SEC_US;

/// Redis's TIME in microseconds, as an exchange answers it.
async fn redis_now(redis: &RedisStore) -> u64 {
    redis.exchange(&[], None).await.unwrap().now_us
}

/// A window of a whole number of minutes whose current one, at `now_us`,
/// neither began nor ends within ten minutes: a test of a few round trips
/// stays inside it.
fn window_around(now_us: u64) -> Nanos {
    let minutes = (60..=600)
        .find(|m| {
            let w = m * MINUTE_US;
            let into = now_us % w;
            into >= 10 * MINUTE_US && w - into >= 10 * MINUTE_US
        })
        .expect("a window clear of its edges");
    Nanos::from_secs(minutes * 60)
}

/// One limit of 10 for each algorithm: rates of one unit an hour,
/// windows of `window`, a shaper that may wait a day (a lease's units
/// wait their turn there).
fn limits_of_ten(window: Nanos) -> Vec<Limit> {
    let hourly = Rate::new(1, Nanos::from_secs(HOUR)).unwrap();
    vec![
        Limit::TokenBucket(TokenBucket::new(10, hourly).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(10, hourly).unwrap()),
        Limit::Shaper(Shaper::new(10, hourly, Nanos::from_secs(24 * HOUR)).unwrap()),
        Limit::FixedWindow(FixedWindow::new(10, window).unwrap()),
        Limit::SlidingLog(SlidingLog::new(10, Nanos::from_secs(HOUR)).unwrap()),
        Limit::SlidingCounter(SlidingCounter::new(10, window).unwrap()),
        Limit::Gcra(Gcra::new(hourly, 10).unwrap()),
    ]
}

fn item<'a>(rule: &'a Rule, key: &'a Key<'a>, op: SyncOp) -> SyncItem<'a> {
    SyncItem {
        rule,
        tag: spillway_redis::tag(&Charge { rule, key }),
        op,
    }
}

/// The remaining of a one-rule decision.
fn remaining(d: &Decision) -> u64 {
    d.rules[0].verdict.remaining
}

/// One exchange of one item, applied without a push.
async fn one(redis: &RedisStore, rule: &Rule, key: &Key<'_>, op: SyncOp) -> SyncReply {
    let reply = redis.exchange(&[item(rule, key, op)], None).await.unwrap();
    assert!(reply.applied);
    assert_eq!(reply.items.len(), 1);
    reply
}

#[test]
fn every_algorithm_leases_gives_back_and_is_charged() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let window = window_around(redis_now(&redis).await);
        for limit in limits_of_ten(window) {
            let name = limit.algorithm_name();
            let rule = user_rule(name, vec![limit], Mode::Hard);
            let key = Key::from_parts(["leaser"]);
            let lease = |want| SyncOp::Lease { want };

            let first = one(&redis, &rule, &key, lease(5)).await;
            let taken = &first.items[0];
            assert_eq!(taken.granted, 5, "{name}");
            assert!(taken.decision.allowed, "{name}");
            assert_eq!(remaining(&taken.decision), 5, "{name}");

            let second = &one(&redis, &rule, &key, lease(10)).await.items[0];
            assert_eq!(second.granted, 5, "{name}: the rest");
            assert_eq!(remaining(&second.decision), 0, "{name}");

            let third = &one(&redis, &rule, &key, lease(10)).await.items[0];
            assert_eq!(third.granted, 0, "{name}: nothing left");
            assert_eq!(remaining(&third.decision), 0, "{name}");

            let refund = SyncOp::Refund {
                units: 3,
                since_us: first.now_us,
            };
            let back = &one(&redis, &rule, &key, refund).await.items[0];
            assert_eq!(back.granted, 0, "{name}");
            assert_eq!(
                remaining(&back.decision),
                3,
                "{name}: a check after the refund"
            );

            let again = &one(&redis, &rule, &key, lease(10)).await.items[0];
            assert_eq!(again.granted, 3, "{name}: the units given back");

            let charged = Key::from_parts(["charged"]);
            let c = &one(&redis, &rule, &charged, SyncOp::Charge(4)).await.items[0];
            assert_eq!((c.granted, remaining(&c.decision)), (0, 6), "{name}");
            let check = &one(&redis, &rule, &charged, SyncOp::Charge(0)).await.items[0];
            assert!(check.decision.allowed, "{name}");
            assert_eq!(remaining(&check.decision), 6, "{name}: a check of cost 0");
        }
        assert!(redis.is_healthy());
    });
}

#[test]
fn a_replayed_push_changes_nothing_and_a_new_one_applies() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let hourly = Rate::new(1, Nanos::from_secs(HOUR)).unwrap();
        let rule = user_rule(
            "gcra",
            vec![Limit::Gcra(Gcra::new(hourly, 10).unwrap())],
            Mode::Hard,
        );
        let (a, b) = (Key::from_parts(["a"]), Key::from_parts(["b"]));
        let first = redis
            .exchange(
                &[
                    item(&rule, &a, SyncOp::Charge(4)),
                    item(&rule, &b, SyncOp::Lease { want: 6 }),
                ],
                Some(("instance-1", 7)),
            )
            .await
            .unwrap();
        assert!(first.applied);
        assert_eq!(remaining(&first.items[0].decision), 6);
        assert_eq!(first.items[1].granted, 6);

        // The same push again (its reply was lost, say), then an older one:
        // every op answered as a check, none applied.
        let ops = |since_us| {
            [
                item(&rule, &a, SyncOp::Charge(4)),
                item(&rule, &b, SyncOp::Lease { want: 2 }),
                item(&rule, &b, SyncOp::Refund { units: 6, since_us }),
            ]
        };
        let before = dump(&server);
        for seq in [7, 6, 0] {
            let again = redis
                .exchange(&ops(first.now_us), Some(("instance-1", seq)))
                .await
                .unwrap();
            assert!(!again.applied, "seq {seq}");
            assert!(again.now_us >= first.now_us);
            assert_eq!(again.items.len(), 3);
            assert_eq!(remaining(&again.items[0].decision), 6, "seq {seq}");
            assert_eq!(again.items[1].granted, 0, "seq {seq}");
            assert_eq!(remaining(&again.items[1].decision), 4, "seq {seq}");
            assert_eq!(remaining(&again.items[2].decision), 4, "seq {seq}");
            assert_eq!(dump(&server), before, "seq {seq} wrote nothing");
        }

        // A newer push applies; another instance has its own numbers.
        let next = redis
            .exchange(&ops(first.now_us), Some(("instance-1", 8)))
            .await
            .unwrap();
        assert!(next.applied);
        assert_eq!(remaining(&next.items[0].decision), 2);
        assert_eq!(next.items[1].granted, 2);
        assert_eq!(
            remaining(&next.items[2].decision),
            8,
            "6 of the 8 taken given back"
        );
        let other = redis
            .exchange(
                &[item(&rule, &a, SyncOp::Charge(1))],
                Some(("instance-2", 1)),
            )
            .await
            .unwrap();
        assert!(other.applied);
        assert_eq!(remaining(&other.items[0].decision), 1);

        // Without a push, every call applies.
        let c = Key::from_parts(["c"]);
        for left in [9, 8] {
            let d = one(&redis, &rule, &c, SyncOp::Charge(1)).await;
            assert_eq!(remaining(&d.items[0].decision), left);
        }
        // The numbers live in one hash, with a TTL.
        assert_eq!(server.cli(&["HLEN", "spillway:sync:seq"]).trim(), "2");
        let ttl: i64 = server
            .cli(&["PTTL", "spillway:sync:seq"])
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{ttl}");
    });
}

/// Units go back to the window that counted them: a refund of units
/// taken in the window before the current one gives nothing back (a fixed
/// window forgot them; a sliding counter's previous window holds none).
#[test]
fn a_window_refund_from_before_its_window_gives_nothing_back() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let window = window_around(redis_now(&redis).await);
        let windows = [
            Limit::FixedWindow(FixedWindow::new(10, window).unwrap()),
            Limit::SlidingCounter(SlidingCounter::new(10, window).unwrap()),
        ];
        for limit in windows {
            let name = limit.algorithm_name();
            let rule = user_rule(name, vec![limit], Mode::Hard);
            let key = Key::from_parts(["u"]);
            let taken = one(&redis, &rule, &key, SyncOp::Lease { want: 10 }).await;
            assert_eq!(taken.items[0].granted, 10, "{name}");
            let earlier = taken.now_us - window.as_u64() / 1000;
            let stale = SyncOp::Refund {
                units: 3,
                since_us: earlier,
            };
            let d = one(&redis, &rule, &key, stale).await;
            assert_eq!(
                remaining(&d.items[0].decision),
                0,
                "{name}: the last window's"
            );
            let lease = one(&redis, &rule, &key, SyncOp::Lease { want: 10 }).await;
            assert_eq!(lease.items[0].granted, 0, "{name}");
            // The same units taken in this window do come back.
            let fresh = SyncOp::Refund {
                units: 3,
                since_us: taken.now_us,
            };
            let d = one(&redis, &rule, &key, fresh).await;
            assert_eq!(remaining(&d.items[0].decision), 3, "{name}");
        }
    });
}

/// A sliding log gives back only entries from the lease's time on: older
/// ones were not the lease's.
#[test]
fn a_sliding_log_refund_keeps_entries_older_than_its_lease() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let log = Limit::SlidingLog(SlidingLog::new(10, Nanos::from_secs(HOUR)).unwrap());
        let rule = user_rule("log", vec![log], Mode::Hard);
        let key = Key::from_parts(["u"]);
        let older = one(&redis, &rule, &key, SyncOp::Charge(4)).await;
        let lease = one(&redis, &rule, &key, SyncOp::Lease { want: 10 }).await;
        assert!(lease.now_us > older.now_us);
        assert_eq!(lease.items[0].granted, 6);
        let back = SyncOp::Refund {
            units: 10,
            since_us: lease.now_us,
        };
        let d = one(&redis, &rule, &key, back).await;
        assert_eq!(
            remaining(&d.items[0].decision),
            6,
            "the 4 charged before stay"
        );
    });
}

/// Two instances' leases of one sliding log, given back in either order,
/// each dated at its own grant: every unit comes back (a refund drops the
/// oldest entries from its date on, so the earlier lease's refund cannot
/// take the entries the later lease's units made), and entries charged
/// before both stay.
#[test]
fn sliding_log_refunds_of_two_leases_give_back_every_unit_in_either_order() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        for (n, first_back) in [(0, false), (1, true)] {
            let log = Limit::SlidingLog(SlidingLog::new(20, Nanos::from_secs(HOUR)).unwrap());
            let rule = user_rule("log", vec![log], Mode::Hard);
            let name = format!("u{n}");
            let key = Key::from_parts([name.as_str()]);
            one(&redis, &rule, &key, SyncOp::Charge(2)).await;
            let a = one(&redis, &rule, &key, SyncOp::Lease { want: 8 }).await;
            let b = one(&redis, &rule, &key, SyncOp::Lease { want: 10 }).await;
            assert_eq!((a.items[0].granted, b.items[0].granted), (8, 10));
            assert!(b.now_us > a.now_us);
            // `a` spent 3 of its 8, `b` none of its 10.
            let back_a = SyncOp::Refund {
                units: 5,
                since_us: a.now_us,
            };
            let back_b = SyncOp::Refund {
                units: 10,
                since_us: b.now_us,
            };
            let order = if first_back {
                [back_a, back_b]
            } else {
                [back_b, back_a]
            };
            let mut last = None;
            for op in order {
                last = Some(one(&redis, &rule, &key, op).await);
            }
            assert_eq!(
                remaining(&last.unwrap().items[0].decision),
                15,
                "order {n}: 2 charged and 3 spent stay, 15 come back"
            );
        }
        // Rewritten logs keep a TTL.
        for k in server.cli(&["KEYS", "*"]).lines().filter(|k| !k.is_empty()) {
            let ttl: i64 = server.cli(&["PTTL", k]).trim().parse().unwrap();
            assert!(ttl > 0, "{k}: PTTL {ttl}");
        }
    });
}

/// The hash of sequence numbers does not keep instances that stopped
/// pushing: a push to a hash of more than 8 sweeps a sample of 16 for
/// numbers a day old (here: written at time 0).
#[test]
fn pushes_sweep_the_numbers_of_instances_gone_a_day() {
    let server = RedisServer::start();
    let rt = rt();
    let stale =
        "for i = 1, 20 do redis.call('HSET', KEYS[1], 'gone' .. i, struct.pack('>dd', 5, 0)) end";
    server.cli(&["EVAL", stale, "1", "spillway:sync:seq"]);
    assert_eq!(server.cli(&["HLEN", "spillway:sync:seq"]).trim(), "20");
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let reply = redis.exchange(&[], Some(("alive", 1))).await.unwrap();
        assert!(reply.applied);
    });
    let left: u64 = server
        .cli(&["HLEN", "spillway:sync:seq"])
        .trim()
        .parse()
        .unwrap();
    assert!(
        left <= 6,
        "{left} of 21 left: 15 of the 16 sampled were gone"
    );
    let alive = server.cli(&["HEXISTS", "spillway:sync:seq", "alive"]);
    assert_eq!(alive.trim(), "1");
}

/// Units given back make a key less over its limit, which the over-limit
/// cache assumes only time does: an applied refund drops what it knew of
/// the key, and the next request goes to Redis (which admits it).
#[test]
fn a_refund_clears_what_the_over_limit_cache_knew_of_its_key() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let window = window_around(redis_now(&redis).await);
        let rule = user_rule(
            "window",
            vec![Limit::FixedWindow(FixedWindow::new(1, window).unwrap())],
            Mode::Hard,
        );
        let key = Key::from_parts(["u"]);
        let charges = [Charge {
            rule: &rule,
            key: &key,
        }];
        let first = redis.decide(&charges, 1).await.unwrap();
        assert!(first.allowed);
        assert!(!redis.decide(&charges, 1).await.unwrap().allowed);
        assert!(!redis.decide(&charges, 1).await.unwrap().allowed);
        assert_eq!(redis.over_limit_cache_hits(), 1, "the refusal was learned");
        let now_us = redis_now(&redis).await;
        let back = SyncOp::Refund {
            units: 1,
            since_us: now_us,
        };
        let d = one(&redis, &rule, &key, back).await;
        assert_eq!(remaining(&d.items[0].decision), 1);
        assert!(redis.decide(&charges, 1).await.unwrap().allowed);
        assert_eq!(redis.over_limit_cache_hits(), 1);
    });
}

#[test]
fn a_lease_takes_what_every_limit_admits_all_or_none() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let hourly = Rate::new(1, Nanos::from_secs(HOUR)).unwrap();
        let log = |n| Limit::SlidingLog(SlidingLog::new(n, Nanos::from_secs(HOUR)).unwrap());
        // 10 an hour (a log, whose entries show what was taken) and 3.
        let both = user_rule(
            "both",
            vec![log(10), Limit::Gcra(Gcra::new(hourly, 3).unwrap())],
            Mode::Hard,
        );
        let key = Key::from_parts(["u"]);
        let entries = || {
            let keys = server.cli(&["--scan", "--pattern", "spillway:*.0"]);
            let list = keys.lines().find(|l| !l.is_empty()).expect("the log");
            // Units, not elements: a run holds a count (see RUN in decide.lua).
            let sum = "local s = 0 for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do \
                       local _, _, n = struct.unpack('>BdI4I4', e) s = s + n end return s";
            server.cli(&["EVAL", sum, "1", list]).trim().to_string()
        };
        let d = one(&redis, &both, &key, SyncOp::Lease { want: 10 }).await;
        assert_eq!(d.items[0].granted, 3);
        assert_eq!(entries(), "3", "the 10 an hour charged 3 too");
        // Each limit's verdict, where the decision names the closest one.
        let limits: Vec<(u64, u64)> = d.items[0]
            .limits
            .iter()
            .map(|v| (v.limit, v.remaining))
            .collect();
        assert_eq!(limits, [(10, 7), (3, 0)]);
        assert_eq!(d.items[0].decision.rules[0].limit, 1);
        let d = one(&redis, &both, &key, SyncOp::Lease { want: 10 }).await;
        assert_eq!(d.items[0].granted, 0);
        assert_eq!(entries(), "3", "and nothing when nothing was taken");

        // A soft rule leases up to its raised size; a shadow rule neither
        // limits a lease nor is charged past its size.
        let soft = user_rule("soft", vec![log(10)], Mode::Soft { percent: 50 });
        let d = one(&redis, &soft, &key, SyncOp::Lease { want: 20 }).await;
        assert_eq!(d.items[0].granted, 15);
        let v = d.items[0].limits[0];
        assert_eq!((v.limit, v.remaining), (15, 0), "under the raised size");
        let shadow = user_rule("shadow", vec![log(3)], Mode::Shadow);
        let d = one(&redis, &shadow, &key, SyncOp::Lease { want: 10 }).await;
        assert_eq!(d.items[0].granted, 10);
        assert!(d.items[0].decision.allowed);
    });
}

#[test]
fn thousands_of_items_are_one_script_call() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let rules: Vec<Rule> = limits_of_ten(Nanos::from_secs(HOUR))
            .into_iter()
            .map(|l| user_rule(l.algorithm_name(), vec![l], Mode::Hard))
            .collect();
        let names: Vec<String> = (0..500).map(|i| format!("user{i}")).collect();
        let keys: Vec<Key<'_>> = names
            .iter()
            .map(|n| Key::from_parts([n.as_str()]))
            .collect();
        // Each key of the sliding log, the fixed window and GCRA: a lease
        // of 4 and a charge of 1 (3,000 items over three rules).
        let mut items = Vec::new();
        for key in &keys {
            for rule in [&rules[3], &rules[4], &rules[6]] {
                items.push(item(rule, key, SyncOp::Lease { want: 4 }));
                items.push(item(rule, key, SyncOp::Charge(1)));
            }
        }
        // (The first call loads the script: a second round trip.)
        redis_now(&redis).await;
        let calls = redis.script_calls();
        let reply = redis.exchange(&items, Some(("big", 1))).await.unwrap();
        assert_eq!(redis.script_calls(), calls + 1);
        assert!(reply.applied);
        assert_eq!(reply.items.len(), items.len());
        for pair in reply.items.chunks(2) {
            assert_eq!(pair[0].granted, 4);
            assert_eq!(remaining(&pair[1].decision), 5);
        }
    });
}

#[test]
fn heartbeats_count_live_instances_and_drop_stale_ones() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let ttl = Duration::from_secs(HOUR);
        let (t1, n1) = redis.heartbeat("a", ttl).await.unwrap();
        assert_eq!(n1, 1);
        let (t2, n2) = redis.heartbeat("b", ttl).await.unwrap();
        assert_eq!(n2, 2);
        assert!(t2 >= t1);
        assert_eq!(redis.heartbeat("a", ttl).await.unwrap().1, 2, "a again");

        // An instance last heard of two hours ago is gone at the next beat.
        let stale = (t2 - 2 * HOUR * SEC_US).to_string();
        server.cli(&["ZADD", "spillway:sync:live", &stale, "gone"]);
        // a, b, gone, and a's pushed-before time (a has beaten twice).
        assert_eq!(server.cli(&["ZCARD", "spillway:sync:live"]).trim(), "4");
        assert_eq!(redis.heartbeat("b", ttl).await.unwrap().1, 2);
        assert_eq!(
            server.cli(&["ZSCORE", "spillway:sync:live", "gone"]).trim(),
            ""
        );
        let pttl: u64 = server
            .cli(&["PTTL", "spillway:sync:live"])
            .trim()
            .parse()
            .unwrap();
        assert!(pttl > 0 && pttl <= HOUR * 1000, "{pttl}");
    });
}

/// The horizon: the earliest, over the live instances that said all
/// their pushes were applied, of their previous heartbeat's time (what
/// they admitted before it is in the store). An instance that has not
/// said so is left out; one whose pushes wait keeps its old time.
#[test]
fn heartbeats_tell_the_horizon_every_instance_has_pushed_to() {
    let server = RedisServer::start();
    let rt = rt();
    rt.block_on(async {
        let redis = connected(server.url()).await;
        let ttl = Duration::from_secs(HOUR);
        let a1 = redis.beat("a", ttl, true).await.unwrap();
        assert_eq!((a1.live, a1.horizon_us), (1, 0), "no previous beat yet");
        let b1 = redis.beat("b", ttl, true).await.unwrap();
        assert_eq!((b1.live, b1.horizon_us), (2, 0));
        let a2 = redis.beat("a", ttl, true).await.unwrap();
        assert_eq!(a2.horizon_us, a1.now_us, "b has not said yet: a's alone");
        let b2 = redis.beat("b", ttl, false).await.unwrap();
        assert_eq!(b2.horizon_us, a1.now_us, "b's pushes wait: left out");
        let b3 = redis.beat("b", ttl, true).await.unwrap();
        assert_eq!(b3.horizon_us, a1.now_us.min(b2.now_us));
        let a3 = redis.beat("a", ttl, true).await.unwrap();
        assert_eq!(a3.horizon_us, a2.now_us.min(b2.now_us));
        assert_eq!(a3.live, 2);
    });
}

/// A heartbeat is one key: it works on a cluster (a script call routed
/// by its key, loaded on the node that answers NOSCRIPT).
#[test]
fn heartbeats_work_on_a_cluster() {
    let cluster = RedisCluster::start();
    let rt = rt();
    rt.block_on(async {
        let redis = RedisStore::new(RedisConfig {
            cluster: cluster.urls(),
            timeout: TIMEOUT,
            ..RedisConfig::default()
        })
        .unwrap();
        assert!(redis.wait_connected(Duration::from_secs(10)).await);
        let ttl = Duration::from_secs(HOUR);
        assert_eq!(redis.heartbeat("a", ttl).await.unwrap().1, 1);
        assert_eq!(redis.heartbeat("b", ttl).await.unwrap().1, 2);
        assert!(redis.is_healthy());
    });
}

/// On a cluster an exchange is one call per slot, each numbered in its
/// own slot: forty keys spread over the slots are charged once, a replay
/// changes nothing, the next number applies, and every answer comes back
/// in the order asked.
#[test]
fn an_exchange_on_a_cluster_counts_each_slot_once() {
    let cluster = RedisCluster::start();
    let rt = rt();
    rt.block_on(async {
        let redis = RedisStore::new(RedisConfig {
            cluster: cluster.urls(),
            timeout: TIMEOUT,
            ..RedisConfig::default()
        })
        .unwrap();
        assert!(redis.wait_connected(Duration::from_secs(10)).await);
        let window = window_around(redis_now_cluster(&redis).await);
        let rule = user_rule(
            "window",
            vec![Limit::FixedWindow(FixedWindow::new(10, window).unwrap())],
            Mode::Hard,
        );
        let names: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
        let keys: Vec<Key<'_>> = names
            .iter()
            .map(|n| Key::from_parts([n.as_str()]))
            .collect();
        let ops = |n: u64| -> Vec<SyncItem<'_>> {
            keys.iter()
                .enumerate()
                .map(|(i, k)| item(&rule, k, SyncOp::Charge(n + (i % 3) as u64)))
                .collect()
        };
        let first = redis.exchange(&ops(1), Some(("inst", 1))).await.unwrap();
        assert!(first.applied);
        for (i, r) in first.items.iter().enumerate() {
            assert_eq!(remaining(&r.decision), 10 - 1 - (i % 3) as u64, "key {i}");
        }
        let again = redis.exchange(&ops(1), Some(("inst", 1))).await.unwrap();
        assert!(!again.applied);
        for (i, r) in again.items.iter().enumerate() {
            assert_eq!(
                remaining(&r.decision),
                10 - 1 - (i % 3) as u64,
                "key {i}: replayed"
            );
        }
        let next = redis.exchange(&ops(2), Some(("inst", 2))).await.unwrap();
        assert!(next.applied);
        for (i, r) in next.items.iter().enumerate() {
            let used = 1 + 2 + 2 * (i % 3) as u64;
            assert_eq!(remaining(&r.decision), 10 - used, "key {i}");
        }
    });
}

/// Redis's clock on a cluster, in microseconds (a heartbeat answers it).
async fn redis_now_cluster(redis: &RedisStore) -> u64 {
    redis
        .heartbeat("clock", Duration::from_secs(1))
        .await
        .unwrap()
        .0
}
