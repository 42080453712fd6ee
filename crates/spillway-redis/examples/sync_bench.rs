//! What a sync exchange costs Redis per item: exchanges of `ITEMS` items
//! ([`RedisStore::exchange`], as a sync instance sends every interval)
//! over 10,000 tags of one rule, for a GCRA rule and a fixed-window rule:
//! charges after the fact (`SyncOp::Charge(n)`, n from 1 to 4) and
//! checks (`SyncOp::Charge(0)`); then, for comparison, plain decisions of
//! the same rule (`Store::decide`, 50 concurrent tasks, so calls carry
//! many decisions). Prints the microseconds Redis spent in the script per
//! item (INFO commandstats).
//!
//! Starts its own redis-server on a free port unless given a URL.
//!
//! Usage: `sync_bench [REDIS_URL] [ROUNDS] [ITEMS] [PAUSE_MS]` (PAUSE_MS
//! between exchanges, 5 unless given).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use spillway_core::{FixedWindow, Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule};
use spillway_redis::{RedisConfig, RedisStore, SyncItem, SyncOp};
use spillway_store::{Charge, Key, Store};

mod common;
use common::script_stats;

const TAGS: u64 = 10_000;

/// The push's sequence number, as a sync instance counts its exchanges.
static SEQ: AtomicU64 = AtomicU64::new(1);

fn rule(name: &str, limit: Limit) -> Rule {
    Rule::new(
        name,
        None,
        KeySpec::parse("user").expect("key"),
        vec![limit],
        Mode::Hard,
    )
    .expect("rule")
}

/// A xorshift step: the benchmark's keys, the same on every run.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Microseconds Redis spent per item over `rounds` exchanges of `items`
/// items each, every item `op(i)` on a random tag.
async fn exchanges(
    url: &str,
    store: &RedisStore,
    rule: &Rule,
    rounds: usize,
    items: usize,
    pause: Duration,
    op: impl Fn(u64) -> SyncOp,
) -> f64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (_, before) = script_stats(url);
    for _ in 0..rounds {
        let batch: Vec<SyncItem<'_>> = (0..items)
            .map(|_| {
                let r = next(&mut x);
                SyncItem {
                    rule,
                    tag: r % TAGS,
                    op: op(r >> 32),
                }
            })
            .collect();
        store
            .exchange(&batch, Some(("bench", SEQ.fetch_add(1, Ordering::Relaxed))))
            .await
            .expect("exchange");
        // Ticks of a sync instance: time moves between exchanges.
        tokio::time::sleep(pause).await;
    }
    let (_, after) = script_stats(url);
    (after - before) / (rounds * items) as f64
}

/// Microseconds Redis spent per decision over `n` plain decisions (cost 1)
/// from 50 concurrent tasks.
async fn decisions(url: &str, store: &RedisStore, rule: &Arc<Rule>, n: u64) -> f64 {
    let (calls0, before) = script_stats(url);
    let tasks: Vec<_> = (0..50u64)
        .map(|t| {
            let (store, rule) = (store.clone(), rule.clone());
            tokio::spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                for _ in (t..n).step_by(50) {
                    let user = format!("u{}", next(&mut x) % TAGS);
                    let key = Key::from_parts([user.as_str()]);
                    let charge = Charge {
                        rule: &rule,
                        key: &key,
                    };
                    store.decide(&[charge], 1).await.expect("decision");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let (calls, after) = script_stats(url);
    println!(
        "  (plain: {:.1} decisions per script call)",
        n as f64 / (calls - calls0)
    );
    (after - before) / n as f64
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let given = args.next().filter(|a| a.starts_with("redis"));
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let items: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let pause = Duration::from_millis(args.next().and_then(|a| a.parse().ok()).unwrap_or(5));
    let server = given.is_none().then(spillway_testkit::RedisServer::start);
    let url = given.unwrap_or_else(|| server.as_ref().expect("server").url());
    let store = RedisStore::new(RedisConfig {
        url: url.clone(),
        timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    })
    .expect("store");
    assert!(
        store.wait_connected(Duration::from_secs(5)).await,
        "cannot connect"
    );
    let rules = [
        rule(
            "gcra",
            Limit::Gcra(Gcra::new(Rate::new(100, Nanos::from_secs(1)).unwrap(), 100).unwrap()),
        ),
        rule(
            "fixed_window",
            Limit::FixedWindow(FixedWindow::new(1_000, Nanos::from_secs(10)).unwrap()),
        ),
    ];
    for r in rules {
        let name = r.name().to_string();
        let r = Arc::new(r);
        // Warm up: every tag has a state.
        exchanges(&url, &store, &r, 10, items, pause, |_| SyncOp::Charge(1)).await;
        let charge = exchanges(&url, &store, &r, rounds, items, pause, |x| {
            SyncOp::Charge(1 + x % 4)
        })
        .await;
        let check = exchanges(&url, &store, &r, rounds, items, pause, |_| {
            SyncOp::Charge(0)
        })
        .await;
        let plain = decisions(&url, &store, &r, (rounds * items) as u64).await;
        println!(
            "{name}: items={items} rounds={rounds} charge_us_per_item={charge:.2} \
             check_us_per_item={check:.2} plain_us_per_decision={plain:.2}"
        );
    }
}
