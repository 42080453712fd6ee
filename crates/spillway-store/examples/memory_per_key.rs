//! Resident memory per key: fills a fresh store with N keys of 16-byte client
//! ids for one algorithm and prints the RSS growth per key, next to governor's
//! keyed limiter on the same keys. One algorithm per process, so figures do
//! not mix: `memory_per_key ALGORITHM [KEYS] [REQUESTS_PER_KEY]`.
//!
//! ALGORITHM: token_bucket | leaky_bucket | fixed_window | sliding_window_log |
//! sliding_window_counter | gcra | governor

use std::num::NonZeroU32;

use spillway_core::{
    FixedWindow, Gcra, LeakyBucket, Limit, ManualClock, Nanos, Rate, SlidingCounter, SlidingLog,
    TokenBucket,
};
use spillway_store::{MemoryConfig, MemoryStore};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let mut args = std::env::args().skip(1);
    let algo = args.next().unwrap_or_else(|| "gcra".to_string());
    let keys: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let per_key: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let ids: Vec<[u8; 16]> = (0..keys)
        .map(|i| {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&i.to_le_bytes());
            id[8..].copy_from_slice(&(i ^ 0x5bd1_e995).to_le_bytes());
            id
        })
        .collect();
    let hour = Nanos::from_secs(3600);
    let rate = Rate::new(1000, hour).unwrap();
    let limit = match algo.as_str() {
        "token_bucket" => Limit::TokenBucket(TokenBucket::new(1000, rate).unwrap()),
        "leaky_bucket" => Limit::LeakyBucket(LeakyBucket::new(1000, rate).unwrap()),
        "fixed_window" => Limit::FixedWindow(FixedWindow::new(1000, hour).unwrap()),
        "sliding_window_log" => Limit::SlidingLog(SlidingLog::new(per_key.max(1), hour).unwrap()),
        "sliding_window_counter" => Limit::SlidingCounter(SlidingCounter::new(1000, hour).unwrap()),
        "gcra" => Limit::Gcra(Gcra::new(rate, 1000).unwrap()),
        "governor" => {
            let before = rss_bytes();
            let quota = governor::Quota::per_hour(NonZeroU32::new(1000).unwrap());
            let gov = governor::RateLimiter::<[u8; 16], _, _>::dashmap(quota);
            for id in &ids {
                let _ = gov.check_key(id);
            }
            let after = rss_bytes();
            println!(
                "governor keys={keys} rss_per_key={:.1}B",
                (after - before) as f64 / keys as f64
            );
            return;
        }
        other => panic!("unknown algorithm {other}"),
    };
    let start = 1_700_000_000_000_000_000u64;
    let before = rss_bytes();
    let store = MemoryStore::new(
        ManualClock::new(Nanos(start)),
        MemoryConfig {
            max_keys: keys as usize * 2,
            shards: 256,
        },
    );
    for r in 0..per_key {
        for id in &ids {
            let v = store.check(id, &limit, 1, Nanos(start + r));
            assert!(v.allowed);
        }
    }
    let after = rss_bytes();
    let usage = store.usage();
    println!(
        "{algo} keys={keys} requests_per_key={per_key} rss_per_key={:.1}B table_bytes_per_key={:.1}B",
        (after - before) as f64 / keys as f64,
        usage.bytes as f64 / keys as f64,
    );
}
