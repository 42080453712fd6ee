//! What the over-limit cache saves: `CONCURRENCY` tasks decide for
//! `SECONDS` over 1,000 users, 90 % of the calls for the 900 users already
//! over their limit, 10 % for 100 users with room (a million an hour).
//! Two workloads, each run once with the cache off and once on, in one
//! process against one redis-server:
//!
//! - `requests`: requests of cost 1; the hot users spent their limit (1
//!   an hour) before the run.
//! - `checks`: issue 16's checks (cost 0) before serving; the hot users
//!   were charged 2 tokens after the fact against a limit of 1 an hour,
//!   so they owe (are in debt) for the whole run.
//!
//! Prints decisions/s, round trips per decision (the store's own count
//! of script calls, and Redis's, INFO commandstats) and the share of
//! decisions the cache answered.
//!
//! Usage: `over_limit_bench REDIS_URL [SECONDS] [CONCURRENCY] [requests|checks|both]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos, Rule};
use spillway_redis::{DEFAULT_OVER_LIMIT_CACHE, RedisConfig, RedisStore};
use spillway_store::{Charge, Key, Store};

mod common;

/// Script calls so far, as Redis counts them (INFO commandstats).
fn script_calls(url: &str) -> u64 {
    common::script_stats(url).0 as u64
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

/// Which calls the run makes (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Requests,
    Checks,
}

async fn run(url: &str, entries: usize, secs: u64, conc: usize, work: Workload) {
    let store = Arc::new(
        RedisStore::new(RedisConfig {
            url: url.to_string(),
            timeout: Duration::from_secs(1),
            prefix: format!("ol{entries}{work:?}:"),
            over_limit_cache: entries,
            ..RedisConfig::default()
        })
        .expect("store"),
    );
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    let hot = Arc::new(rule("hot", 1));
    let cold = Arc::new(rule("cold", 1_000_000));
    // Spend the hot users' limits first (or put them in debt).
    for u in 0..900 {
        let name = format!("h{u}");
        let key = Key::from_parts([name.as_str()]);
        let c = [Charge {
            rule: &hot,
            key: &key,
        }];
        match work {
            Workload::Requests => drop(store.decide(&c, 1).await),
            Workload::Checks => drop(store.charge(&c, 2).await),
        }
    }
    let cost = match work {
        Workload::Requests => 1,
        Workload::Checks => 0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let calls_before = script_calls(url);
    let own_before = store.script_calls();
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
                let _ = store.decide(&c, cost).await;
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
    let own = store.script_calls() - own_before;
    let hits = store.over_limit_cache_hits() - hits_before;
    let per = |x: u64| x as f64 / n.max(1) as f64;
    println!(
        "{:<8} cache {:>6} slots: {:>9.0} decisions/s, {:.3} round trips per decision (redis counted {:.3}), {:.1} % answered by the cache",
        format!("{work:?}").to_lowercase(),
        entries,
        n as f64 / took,
        per(own),
        per(calls),
        100.0 * per(hits),
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: over_limit_bench REDIS_URL [SECONDS] [CONCURRENCY] [requests|checks|both]");
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let conc: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let works = match args.next().as_deref() {
        Some("requests") => vec![Workload::Requests],
        Some("checks") => vec![Workload::Checks],
        _ => vec![Workload::Requests, Workload::Checks],
    };
    for work in works {
        for entries in [0, DEFAULT_OVER_LIMIT_CACHE] {
            run(&url, entries, secs, conc, work).await;
        }
    }
}
