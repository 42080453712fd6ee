//! In-process decisions through the Redis store: `CONCURRENCY` tasks share
//! one store (one multiplexed connection, so concurrent decisions pipeline)
//! and decide GCRA limits for random keys over 100,000 users for `SECONDS`.
//! Prints decisions/s, p50/p99 latency, how many script calls Redis saw per
//! decision and how long Redis spent in them per decision (INFO
//! commandstats). Then measures Redis memory per client
//! key at 100,000 and 1,000,000 keys.
//!
//! With a fourth argument `log:N:USERS`, the limit is instead a sliding log
//! of N per minute over USERS users (so logs fill up to N entries), and the
//! memory part is skipped.
//!
//! Usage: `redis_bench REDIS_URL [SECONDS] [CONCURRENCY] [log:N:USERS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spillway_core::{FixedWindow, Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule, SlidingLog};
use spillway_redis::{RedisConfig, RedisStore};
use spillway_store::{Charge, Key, Store};

mod common;
use common::script_stats;

/// A numeric `field:value` line of an INFO section.
fn info_field(url: &str, section: &str, field: &str) -> f64 {
    let client = redis::Client::open(url).expect("url");
    let mut c = client.get_connection().expect("connect");
    let info: String = redis::cmd("INFO").arg(section).query(&mut c).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: redis_bench REDIS_URL [SECONDS] [CONCURRENCY] [log:N:USERS]");
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let conc: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    // `log:N:USERS`: a sliding log of N per minute over USERS users.
    let log: Option<(u64, u64)> = args.next().map(|a| {
        let mut p = a.strip_prefix("log:").expect("log:N:USERS").split(':');
        let mut num = || p.next().and_then(|v| v.parse().ok()).expect("log:N:USERS");
        (num(), num())
    });
    let users = log.map_or(100_000, |(_, u)| u);
    let store = RedisStore::new(RedisConfig {
        url: url.clone(),
        timeout: Duration::from_secs(1),
        ..RedisConfig::default()
    })
    .expect("store");
    assert!(
        store.wait_connected(Duration::from_secs(5)).await,
        "cannot connect"
    );
    let rule = Arc::new(
        Rule::new(
            "bench",
            None,
            KeySpec::parse("user").unwrap(),
            vec![match log {
                Some((n, _)) => {
                    Limit::SlidingLog(SlidingLog::new(n, Nanos::from_secs(60)).unwrap())
                }
                None => Limit::Gcra(
                    Gcra::new(Rate::new(100, Nanos::from_secs(1)).unwrap(), 100).unwrap(),
                ),
            }],
            Mode::Hard,
        )
        .unwrap(),
    );
    let (calls_before, usec_before) = script_stats(&url);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..conc {
        let (store, rule, stop) = (store.clone(), rule.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(100_000);
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let user = format!("u{}", x % users);
                let key = Key::from_parts([user.as_str()]);
                let t0 = Instant::now();
                let d = store
                    .decide(
                        &[Charge {
                            rule: &rule,
                            key: &key,
                        }],
                        1,
                    )
                    .await;
                lat.push(t0.elapsed());
                d.expect("decision");
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    let (calls, usec) = script_stats(&url);
    let n = all.len() as f64;
    println!(
        "in-process {} concurrency={conc} decisions_per_s={:.0} p50={:?} p99={:?} script_calls_per_decision={:.3} script_us_per_decision={:.2}",
        log.map_or("gcra".to_string(), |(n, u)| format!(
            "sliding_log={n}/min users={u}"
        )),
        n / elapsed,
        pct(0.5),
        pct(0.99),
        (calls - calls_before) / n,
        (usec - usec_before) / n
    );

    if log.is_some() {
        return;
    }
    // Memory per key: fresh keys of limits whose state lives an hour (the
    // benchmark's own keys expire within milliseconds), GCRA (one number of
    // state) and fixed window (two), at 100,000 and 1,000,000 keys.
    let hour = Nanos::from_secs(3600);
    for (name, limit) in [
        (
            "gcra",
            Limit::Gcra(Gcra::new(Rate::new(1, hour).unwrap(), 100).unwrap()),
        ),
        (
            "fixed_window",
            Limit::FixedWindow(FixedWindow::new(100, hour).unwrap()),
        ),
    ] {
        let rule = Arc::new(
            Rule::new(
                "memory",
                None,
                KeySpec::parse("user").unwrap(),
                vec![limit],
                Mode::Hard,
            )
            .unwrap(),
        );
        for n in [100_000u32, 1_000_000] {
            memory_per_key(&url, &store, &rule, name, n).await;
        }
    }
}

/// Redis memory per client key after `n` fresh keys of `rule`.
async fn memory_per_key(url: &str, store: &RedisStore, rule: &Arc<Rule>, name: &str, n: u32) {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let before = info_field(url, "memory", "used_memory:");
    let tasks: Vec<_> = (0..50u32)
        .map(|t| {
            let store = store.clone();
            let rule = rule.clone();
            tokio::spawn(async move {
                for i in (t..n).step_by(50) {
                    let user = format!("m{i:08}");
                    let key = Key::from_parts([user.as_str()]);
                    let charge = Charge {
                        rule: &rule,
                        key: &key,
                    };
                    store.decide(&[charge], 1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = info_field(url, "memory", "used_memory:");
    let redis_keys: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    println!(
        "redis_memory_per_key={:.1}B algorithm={name} keys={n} redis_keys={redis_keys}",
        (after - before) / f64::from(n)
    );
}
