//! What the over-limit cache saves: `CONCURRENCY` tasks decide for
//! `SECONDS` over 1,000 users, 90 % of the calls for the 900 users already
//! over their limit (1 an hour, spent before the run), 10 % for 100 users
//! with room (a million an hour). Run once with the cache off and once on,
//! in one process against one redis-server; prints decisions/s, script
//! calls per decision (INFO commandstats) and the share of decisions the
//! cache answered.
//!
//! Usage: `over_limit_bench REDIS_URL [SECONDS] [CONCURRENCY]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos, Rule};
use spillway_redis::{DEFAULT_OVER_LIMIT_CACHE, RedisConfig, RedisStore};
use spillway_store::{Charge, Key, Store};

/// Script calls so far (INFO commandstats).
fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).expect("url");
    let mut c = client.get_connection().expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("cmdstat_evalsha:")
                .or_else(|| l.strip_prefix("cmdstat_eval:"))
        })
        .filter_map(|rest| rest.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .sum()
}

fn rule(name: &str, limit: u64) -> Rule {
    Rule::new(
        name,
        None,
        KeySpec::parse("user").expect("key"),
        vec![Limit::FixedWindow(
            FixedWindow::new(limit, Nanos::from_secs(3600)).expect("limit"),
        )],
        Mode::Hard,
    )
    .expect("rule")
}

async fn run(url: &str, entries: usize, secs: u64, conc: usize) {
    let store = Arc::new(
        RedisStore::new(RedisConfig {
            url: url.to_string(),
            timeout: Duration::from_secs(1),
            prefix: format!("ol{entries}:"),
            over_limit_cache: entries,
            ..RedisConfig::default()
        })
        .expect("store"),
    );
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    let hot = Arc::new(rule("hot", 1));
    let cold = Arc::new(rule("cold", 1_000_000));
    // Spend the hot users' limits first.
    for u in 0..900 {
        let name = format!("h{u}");
        let key = Key::from_parts([name.as_str()]);
        let c = [Charge {
            rule: &hot,
            key: &key,
        }];
        let _ = store.decide(&c, 1).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let calls_before = script_calls(url);
    let hits_before = store.over_limit_cache_hits();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..conc {
        let (store, hot, cold) = (store.clone(), hot.clone(), cold.clone());
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut x: u64 = 0x9e37_79b9 ^ t as u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (rule, name) = if x.is_multiple_of(10) {
                    (&cold, format!("c{}", x % 100))
                } else {
                    (&hot, format!("h{}", x % 900))
                };
                let key = Key::from_parts([name.as_str()]);
                let c = [Charge { rule, key: &key }];
                let _ = store.decide(&c, 1).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let took = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let calls = script_calls(url) - calls_before;
    let hits = store.over_limit_cache_hits() - hits_before;
    println!(
        "cache {:>6} slots: {:>9.0} decisions/s, {:.3} script calls per decision, {:.1} % answered by the cache",
        entries,
        n as f64 / took,
        calls as f64 / n.max(1) as f64,
        100.0 * hits as f64 / n.max(1) as f64,
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: over_limit_bench REDIS_URL [SECONDS] [CONCURRENCY]");
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let conc: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    for entries in [0, DEFAULT_OVER_LIMIT_CACHE] {
        run(&url, entries, secs, conc).await;
    }
}
