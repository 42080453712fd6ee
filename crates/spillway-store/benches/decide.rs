//! Time per decision, per algorithm, against governor's keyed limiter on the
//! same workload: one hot key, 1,000 keys, 1,000,000 keys in random order;
//! one thread and two.
//!
//! Spillway takes injected time (each thread's own counter, one nanosecond
//! per call); governor reads its default clock (quanta, a few ns from the
//! TSC): a shared fake clock would make both sides contend on one atomic and
//! measure that instead. Limits are generous so most decisions admit and
//! write (the common case).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use spillway_core::{
    FixedWindow, Gcra, LeakyBucket, Limit, ManualClock, Nanos, Rate, SlidingCounter, SlidingLog,
    TokenBucket,
};
use spillway_store::{MemoryConfig, MemoryStore};

/// The limits, sized so every workload is in a steady state: decisions
/// mostly admit and keys keep their state (none expires between two visits).
/// A key is revisited every `nkeys` calls, one nanosecond apart; the sliding
/// log's window spans four visits, so it holds about four entries.
fn limits(nkeys: u64) -> Vec<Limit> {
    let rate = Rate::new(1_000_000, Nanos::from_secs(1)).unwrap();
    let w = Nanos::from_secs(1);
    vec![
        Limit::TokenBucket(TokenBucket::new(1000, rate).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(1000, rate).unwrap()),
        Limit::FixedWindow(FixedWindow::new(1_000_000, w).unwrap()),
        Limit::SlidingLog(SlidingLog::new(8, Nanos(4 * nkeys)).unwrap()),
        Limit::SlidingCounter(SlidingCounter::new(1_000_000, w).unwrap()),
        Limit::Gcra(Gcra::new(rate, 1000).unwrap()),
    ]
}

/// A random permutation-ish sequence of `n` keys (xorshift), fixed seed.
fn key_order(n: u64, len: usize) -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        })
        .collect()
}

const T0: u64 = 1_700_000_000_000_000_000;
/// Keys per call of the batch entry point.
const BATCH: usize = 16;

fn bench(c: &mut Criterion) {
    for (label, nkeys) in [("hot", 1u64), ("1k", 1_000), ("1M", 1_000_000)] {
        let order = key_order(nkeys, 1 << 20);
        let mut g = c.benchmark_group(format!("decide/{label}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for limit in limits(nkeys) {
            for threads in [1usize, 2] {
                let store = seeded(&limit, nkeys);
                let id = BenchmarkId::new(limit.algorithm_name(), format!("{threads}t"));
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        run_threads(threads, iters, |t, i| {
                            let k = order[(i as usize * threads + t) & (order.len() - 1)];
                            let now = Nanos(T0 + i);
                            black_box(store.check(&k.to_le_bytes(), &limit, 1, now));
                        })
                    })
                });
            }
            // The batch entry point, measured separately: one thread, 16
            // keys per call, their slots prefetched before deciding.
            let store = seeded(&limit, nkeys);
            let id = BenchmarkId::new(limit.algorithm_name(), "batch16");
            g.bench_function(id, |b| {
                let mut out = Vec::with_capacity(BATCH);
                b.iter_custom(|iters| {
                    let calls = iters.div_ceil(BATCH as u64);
                    let start = Instant::now();
                    for c in 0..calls {
                        let at = (c as usize * BATCH) & (order.len() - 1);
                        let keys: [[u8; 8]; BATCH] =
                            std::array::from_fn(|j| order[at + j].to_le_bytes());
                        let items: [(&[u8], &Limit, u64); BATCH] =
                            std::array::from_fn(|j| (&keys[j][..], &limit, 1));
                        out.clear();
                        store.check_many(&items, Nanos(T0 + c), &mut out);
                        black_box(&out);
                    }
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (calls * BATCH as u64) as f64)
                })
            });
        }
        for threads in [1usize, 2] {
            let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap())
                .allow_burst(NonZeroU32::new(1000).unwrap());
            let gov = RateLimiter::keyed(quota);
            for k in 0..nkeys {
                let _ = gov.check_key(&k);
            }
            let id = BenchmarkId::new("governor_keyed", format!("{threads}t"));
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, |t, i| {
                        let k = order[(i as usize * threads + t) & (order.len() - 1)];
                        let _ = black_box(gov.check_key(&k));
                    })
                })
            });
        }
        g.finish();
    }
}

/// A store holding every key of the workload, so its tables are at their
/// final size. 256 shards, or `SPILLWAY_BENCH_SHARDS` (for experiments
/// such as one large table with transparent huge pages).
fn seeded(limit: &Limit, nkeys: u64) -> MemoryStore<ManualClock> {
    let shards = std::env::var("SPILLWAY_BENCH_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let store = MemoryStore::new(
        ManualClock::new(Nanos(T0)),
        MemoryConfig {
            max_keys: 4_000_000,
            shards,
        },
    );
    for k in 0..nkeys {
        store.check(&k.to_le_bytes(), limit, 1, Nanos(T0));
    }
    store
}

/// Runs `iters` decisions split over `threads` threads and returns the wall
/// time divided so the figure is time per decision of the combined throughput.
fn run_threads<F: Fn(usize, u64) + Sync>(threads: usize, iters: u64, f: F) -> Duration {
    let per = iters.div_ceil(threads as u64);
    let start = Instant::now();
    if threads == 1 {
        for i in 0..iters {
            f(0, i);
        }
    } else {
        std::thread::scope(|s| {
            for t in 0..threads {
                let f = &f;
                s.spawn(move || {
                    for i in 0..per {
                        f(t, i);
                    }
                });
            }
        });
    }
    start
        .elapsed()
        .mul_f64(iters as f64 / (per * threads as u64) as f64)
}

/// What this machine's memory and cores cost during the run, to read the
/// decision figures against: the VM shares its caches with other guests,
/// and its two CPUs may or may not share an L3, so the same code measures
/// differently from one run to the next.
///
/// - `chase_16MB`, `chase_256MB`: one dependent load from a random cache
///   line of a 16 MiB and a 256 MiB block (a random cycle through every
///   line, so each load waits for the one before): an L3 hit and a DRAM
///   miss (with its TLB miss), the floors under the 1,000,000-key figures.
/// - `core_round_trip`: one cache line handed from one thread to the other
///   and back. Around 100 ns when the two CPUs share an L3; several hundred
///   when they do not, and then a table that fits one L3 is written from
///   two, and two threads cannot scale on it.
fn reference(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide/reference");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (label, mib) in [("chase_16MB", 16usize), ("chase_256MB", 256)] {
        let chain = random_cycle(mib << 20);
        g.bench_function(label, |b| {
            b.iter_custom(|iters| {
                let mut at = 0usize;
                let start = Instant::now();
                for _ in 0..iters {
                    at = chain[at] as usize;
                }
                black_box(at);
                start.elapsed()
            })
        });
    }
    g.bench_function("core_round_trip", |b| {
        b.iter_custom(|iters| {
            use std::sync::atomic::{AtomicU64, Ordering};
            #[repr(align(64))]
            struct Line(AtomicU64);
            let line = Line(AtomicU64::new(0));
            let start = Instant::now();
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..iters {
                        while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                            std::hint::spin_loop();
                        }
                        line.0.store(2 * i + 2, Ordering::Release);
                    }
                });
                for i in 0..iters {
                    line.0.store(2 * i + 1, Ordering::Release);
                    while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                        std::hint::spin_loop();
                    }
                }
            });
            start.elapsed()
        })
    });
    g.finish();
}

/// A block of `bytes` whose 64-byte lines are linked into one cycle in a
/// random order (fixed seed): the first `u32` of each line holds the index,
/// in the block, of the next line's first `u32`.
fn random_cycle(bytes: usize) -> Vec<u32> {
    const STRIDE: usize = 64 / std::mem::size_of::<u32>();
    let lines = bytes / 64;
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % i as u64) as usize);
    }
    let mut chain = vec![0u32; lines * STRIDE];
    for w in 0..lines {
        let (from, to) = (order[w] as usize, order[(w + 1) % lines] as usize);
        chain[from * STRIDE] = (to * STRIDE) as u32;
    }
    chain
}

criterion_group!(benches, reference, bench);
criterion_main!(benches);
