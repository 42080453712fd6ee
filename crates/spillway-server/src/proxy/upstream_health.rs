//! What the proxy measures of its upstream: latency quantiles and the share
//! of failed calls over a sliding window.
//!
//! [`UpstreamStats`] keeps the window as [`SLOTS`] time slots, each a
//! log-bucketed latency histogram plus call and error counts. A slot covers
//! a tenth of the window; when `now` moves past a slot's end the oldest slot
//! is emptied and reused, so old samples drop out a slot at a time and the
//! window spans between nine and ten tenths of its nominal length. A running
//! sum of the live slots makes a quantile one pass over the buckets, not
//! over the slots.
//!
//! The histogram has 16 exact buckets below 16 µs, then 16 sub-buckets per
//! power of two up to 2^30 µs (about 18 minutes): a quantile is reported as
//! the upper bound of the bucket holding its rank, at most 1/16 (6.25 %)
//! above the true value, and never above the largest latency the window
//! holds. Longer latencies share the last bucket, reported as that largest
//! latency.
//!
//! Time is a parameter: every method takes the caller's `now`, so tests run
//! on a virtual clock. The first `now` seen anchors the slots; a `now`
//! earlier than one already seen counts in its own slot while that slot is
//! still in the window, and is forgotten otherwise.
//!
//! # Examples
//!
//! ```
//! use std::time::{Duration, Instant};
//! use spillway_server::proxy::upstream_health::UpstreamStats;
//!
//! let stats = UpstreamStats::new(Duration::from_secs(10));
//! let t0 = Instant::now();
//! for ms in 1..=100 {
//!     stats.record(t0, Duration::from_millis(ms), ms > 98);
//! }
//! let p99 = stats.latency_quantile(t0, 0.99).unwrap();
//! assert!(p99 >= Duration::from_millis(99) && p99 <= Duration::from_millis(100));
//! assert_eq!(stats.error_share(t0), Some(0.02));
//! // Eleven seconds later the window has forgotten them.
//! assert_eq!(stats.calls(t0 + Duration::from_secs(11)), 0);
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How many time slots a window is cut into.
pub const SLOTS: usize = 10;

/// The shortest window: a shorter one (zero included) is read as this.
pub const MIN_WINDOW: Duration = Duration::from_millis(10);

/// Sub-buckets per power of two, as a power of two (16).
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Latencies of 2^30 µs and more share the last bucket.
const TOP_OCTAVE: u32 = 30;
const BUCKETS: usize = SUB + (TOP_OCTAVE - SUB_BITS) as usize * SUB;

/// The bucket of a latency in whole microseconds.
fn bucket_of(micros: u64) -> usize {
    if micros < SUB as u64 {
        return micros as usize;
    }
    let octave = 63 - micros.leading_zeros();
    if octave >= TOP_OCTAVE {
        return BUCKETS - 1;
    }
    let shift = octave - SUB_BITS;
    let sub = (micros >> shift) as usize & (SUB - 1);
    SUB + shift as usize * SUB + sub
}

/// The exclusive upper bound of a bucket, in microseconds.
fn upper_bound_micros(bucket: usize) -> u64 {
    if bucket < SUB {
        return bucket as u64 + 1;
    }
    let shift = (bucket - SUB) / SUB;
    let sub = (bucket - SUB) % SUB;
    ((SUB + sub + 1) as u64) << shift
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One tenth of the window.
struct Slot {
    /// Which slot of time (counted from the anchor) this one holds.
    epoch: i64,
    counts: Vec<u64>,
    calls: u64,
    errors: u64,
    /// The largest latency recorded here, in nanoseconds.
    max_nanos: u64,
}

impl Slot {
    fn empty(epoch: i64) -> Slot {
        Slot {
            epoch,
            counts: vec![0; BUCKETS],
            calls: 0,
            errors: 0,
            max_nanos: 0,
        }
    }
}

struct Inner {
    /// The first `now` seen: slot epochs count from it (negative before it).
    anchor: Option<Instant>,
    /// The newest epoch seen; live slots are the `SLOTS` epochs ending here.
    /// Invariant: slot `i` holds the live epoch congruent to `i`.
    head: i64,
    slots: Vec<Slot>,
    /// The sum of the live slots' counts, so a quantile reads one histogram.
    total: Vec<u64>,
    calls: u64,
    errors: u64,
}

/// Epochs are kept far from `i64`'s ends so differences never overflow.
const EPOCH_BOUND: i64 = i64::MAX / 4;

impl Inner {
    fn epoch(&mut self, now: Instant, slot_nanos: u64) -> i64 {
        let anchor = *self.anchor.get_or_insert(now);
        let slot = u128::from(slot_nanos);
        if now >= anchor {
            let n = (now - anchor).as_nanos() / slot;
            i64::try_from(n).unwrap_or(EPOCH_BOUND).min(EPOCH_BOUND)
        } else {
            let n = (anchor - now).as_nanos().div_ceil(slot);
            -i64::try_from(n).unwrap_or(EPOCH_BOUND).min(EPOCH_BOUND)
        }
    }

    fn index(epoch: i64) -> usize {
        epoch.rem_euclid(SLOTS as i64) as usize
    }

    fn live(&self, epoch: i64) -> bool {
        epoch <= self.head && self.head - epoch < SLOTS as i64
    }

    /// Moves the window's end to `now` (never back), emptying the slots
    /// that fall out of it; returns `now`'s epoch.
    fn advance(&mut self, now: Instant, slot_nanos: u64) -> i64 {
        let epoch = self.epoch(now, slot_nanos);
        if epoch > self.head {
            let gap = (epoch - self.head).min(SLOTS as i64);
            for back in 0..gap {
                let e = epoch - back;
                let slot = &mut self.slots[Self::index(e)];
                for (total, count) in self.total.iter_mut().zip(slot.counts.iter_mut()) {
                    *total -= *count;
                    *count = 0;
                }
                self.calls -= slot.calls;
                self.errors -= slot.errors;
                slot.calls = 0;
                slot.errors = 0;
                slot.max_nanos = 0;
                slot.epoch = e;
            }
            self.head = epoch;
        }
        epoch
    }

    fn max_nanos(&self) -> u64 {
        self.slots
            .iter()
            .filter(|s| self.live(s.epoch))
            .map(|s| s.max_nanos)
            .max()
            .unwrap_or(0)
    }
}

/// Latency and error measurements of the upstream over a sliding window.
///
/// `Send + Sync`: share one behind an `Arc` between the proxy's
/// connections. Each method takes one short lock.
pub struct UpstreamStats {
    slot_nanos: u64,
    inner: Mutex<Inner>,
}

impl fmt::Debug for UpstreamStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("UpstreamStats")
            .field(
                "window",
                &(Duration::from_nanos(self.slot_nanos) * SLOTS as u32),
            )
            .field("calls", &inner.calls)
            .field("errors", &inner.errors)
            .finish()
    }
}

impl UpstreamStats {
    /// Measurements over a sliding `window` (e.g. 10 s) cut into [`SLOTS`]
    /// slots; a window shorter than [`MIN_WINDOW`] is read as that.
    pub fn new(window: Duration) -> UpstreamStats {
        let window = window.max(MIN_WINDOW);
        let slot_nanos = u64::try_from(window.as_nanos() / SLOTS as u128).unwrap_or(u64::MAX);
        UpstreamStats {
            slot_nanos,
            inner: Mutex::new(Inner {
                anchor: None,
                head: 0,
                // Slot i holds the epoch congruent to i in (-SLOTS, 0].
                slots: (0..SLOTS as i64)
                    .map(|i| Slot::empty(if i == 0 { 0 } else { i - SLOTS as i64 }))
                    .collect(),
                total: vec![0; BUCKETS],
                calls: 0,
                errors: 0,
            }),
        }
    }

    /// Records one finished upstream call that took `latency`; `error` if
    /// it failed (a 5xx, a connection failure or a timeout). Failed calls
    /// count in the latency quantiles too: a timeout is slow news.
    pub fn record(&self, now: Instant, latency: Duration, error: bool) {
        let mut inner = self.inner.lock();
        let epoch = inner.advance(now, self.slot_nanos);
        if !inner.live(epoch) {
            return; // older than the window
        }
        let bucket = bucket_of(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
        let slot = &mut inner.slots[Inner::index(epoch)];
        debug_assert_eq!(slot.epoch, epoch);
        slot.counts[bucket] += 1;
        slot.calls += 1;
        slot.errors += u64::from(error);
        slot.max_nanos = slot.max_nanos.max(nanos(latency));
        inner.total[bucket] += 1;
        inner.calls += 1;
        inner.errors += u64::from(error);
    }

    /// The latency at quantile `q` (0.5 for the median, 0.99 for p99) over
    /// the window, or `None` if it holds no call. `q` is clamped to
    /// `0.0..=1.0`; NaN is read as 1.0 (the largest latency).
    pub fn latency_quantile(&self, now: Instant, q: f64) -> Option<Duration> {
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let mut inner = self.inner.lock();
        inner.advance(now, self.slot_nanos);
        if inner.calls == 0 {
            return None;
        }
        // The rank of the sample at q, from 1 (the smallest) to calls.
        let rank = ((q * inner.calls as f64).ceil() as u64).clamp(1, inner.calls);
        let max = inner.max_nanos();
        let mut seen = 0;
        for (bucket, count) in inner.total.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let upper = upper_bound_micros(bucket).saturating_mul(1000);
                let nanos = if bucket == BUCKETS - 1 {
                    max
                } else {
                    upper.min(max)
                };
                return Some(Duration::from_nanos(nanos));
            }
        }
        Some(Duration::from_nanos(max))
    }

    /// The share of calls over the window that failed, from 0.0 to 1.0, or
    /// `None` if it holds no call.
    pub fn error_share(&self, now: Instant) -> Option<f64> {
        let mut inner = self.inner.lock();
        inner.advance(now, self.slot_nanos);
        (inner.calls > 0).then(|| inner.errors as f64 / inner.calls as f64)
    }

    /// How many calls the window holds.
    pub fn calls(&self, now: Instant) -> u64 {
        let mut inner = self.inner.lock();
        inner.advance(now, self.slot_nanos);
        inner.calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `got` is `want` or at most one bucket width (1/16) above it.
    fn close(got: Duration, want: Duration) -> bool {
        got >= want && got.as_secs_f64() <= want.as_secs_f64() * (1.0 + 1.0 / 16.0) + 1e-9
    }

    #[test]
    fn buckets_are_ordered_and_contain_their_values() {
        let mut last = 0;
        for b in 0..BUCKETS {
            let upper = upper_bound_micros(b);
            assert!(upper > last, "bucket {b}");
            // The last value below the upper bound lands in this bucket.
            if b < BUCKETS - 1 {
                assert_eq!(bucket_of(upper - 1), b);
                assert_eq!(bucket_of(upper), b + 1);
            }
            last = upper;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(1 << TOP_OCTAVE), BUCKETS - 1);
    }

    #[test]
    fn empty_window_has_no_quantile_and_no_error_share() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(stats.latency_quantile(t0, 0.5), None);
        assert_eq!(stats.error_share(t0), None);
        assert_eq!(stats.calls(t0), 0);
    }

    #[test]
    fn quantiles_of_a_uniform_distribution() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 1..=1000 {
            stats.record(t0, ms(i), false);
        }
        for (q, want) in [(0.5, 500), (0.9, 900), (0.99, 990), (0.001, 1)] {
            let got = stats.latency_quantile(t0, q).unwrap();
            assert!(close(got, ms(want)), "q {q}: {got:?} for {want} ms");
        }
        // The top is capped at the largest latency seen, not its bucket's end.
        assert_eq!(stats.latency_quantile(t0, 1.0), Some(ms(1000)));
    }

    #[test]
    fn quantiles_of_a_bimodal_distribution() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        // 95 fast calls at 2 ms, 5 slow ones at 300 ms.
        for i in 0..100 {
            stats.record(t0, if i % 20 == 0 { ms(300) } else { ms(2) }, false);
        }
        assert!(close(stats.latency_quantile(t0, 0.5).unwrap(), ms(2)));
        assert!(close(stats.latency_quantile(t0, 0.95).unwrap(), ms(2)));
        assert_eq!(stats.latency_quantile(t0, 0.96), Some(ms(300)));
    }

    #[test]
    fn microsecond_latencies_are_exact_and_zero_is_fine() {
        let stats = UpstreamStats::new(Duration::from_secs(1));
        let t0 = Instant::now();
        stats.record(t0, Duration::ZERO, false);
        assert_eq!(stats.latency_quantile(t0, 0.5), Some(Duration::ZERO));
        for _ in 0..3 {
            stats.record(t0, Duration::from_micros(7), false);
        }
        assert_eq!(
            stats.latency_quantile(t0, 0.5),
            Some(Duration::from_micros(7))
        );
        assert_eq!(stats.calls(t0), 4);
    }

    #[test]
    fn huge_latencies_share_the_last_bucket_and_report_the_largest() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        stats.record(t0, Duration::from_secs(5000), true);
        stats.record(t0, Duration::MAX, true);
        assert_eq!(
            stats.latency_quantile(t0, 0.5),
            Some(Duration::from_nanos(u64::MAX))
        );
    }

    #[test]
    fn bad_quantiles_are_clamped() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 1..=10 {
            stats.record(t0, ms(i * 10), false);
        }
        let smallest = stats.latency_quantile(t0, 0.0).unwrap();
        assert!(close(smallest, ms(10)));
        assert_eq!(stats.latency_quantile(t0, -3.0), Some(smallest));
        assert_eq!(
            stats.latency_quantile(t0, f64::NEG_INFINITY),
            Some(smallest)
        );
        assert_eq!(stats.latency_quantile(t0, 7.0), Some(ms(100)));
        assert_eq!(stats.latency_quantile(t0, f64::INFINITY), Some(ms(100)));
        assert_eq!(stats.latency_quantile(t0, f64::NAN), Some(ms(100)));
    }

    #[test]
    fn error_share_counts_failed_calls() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..40 {
            stats.record(t0 + ms(i * 10), ms(5), i % 4 == 0);
        }
        assert_eq!(stats.error_share(t0 + ms(400)), Some(0.25));
        assert_eq!(stats.calls(t0 + ms(400)), 40);
    }

    #[test]
    fn the_window_forgets_old_samples_a_slot_at_a_time() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        // One slow failing call a second for ten seconds...
        for s in 0..10 {
            stats.record(t0 + Duration::from_secs(s), ms(900), true);
        }
        // ...then fast good ones.
        for s in 10..15 {
            stats.record(t0 + Duration::from_secs(s), ms(10), false);
        }
        // At 14.5 s the slots of seconds 5..=14 are live: 5 slow, 5 fast.
        let now = t0 + ms(14_500);
        assert_eq!(stats.calls(now), 10);
        assert_eq!(stats.error_share(now), Some(0.5));
        assert!(close(stats.latency_quantile(now, 0.5).unwrap(), ms(10)));
        assert_eq!(stats.latency_quantile(now, 0.6), Some(ms(900)));
        // At 20 s only seconds 11..=14 remain: all fast.
        let now = t0 + Duration::from_secs(20);
        assert_eq!(stats.calls(now), 4);
        assert_eq!(stats.error_share(now), Some(0.0));
        assert_eq!(stats.latency_quantile(now, 1.0), Some(ms(10)));
        // A long silence empties it.
        let now = t0 + Duration::from_secs(3600);
        assert_eq!(stats.calls(now), 0);
        assert_eq!(stats.latency_quantile(now, 0.5), None);
    }

    #[test]
    fn late_samples_count_in_their_slot_or_not_at_all() {
        let stats = UpstreamStats::new(Duration::from_secs(10));
        let t0 = Instant::now();
        stats.record(t0 + Duration::from_secs(30), ms(1), false);
        // Recorded late but within the window: counted.
        stats.record(t0 + Duration::from_secs(25), ms(1), false);
        // Older than the window: forgotten.
        stats.record(t0 + Duration::from_secs(5), ms(1), false);
        stats.record(t0, ms(1), false);
        assert_eq!(stats.calls(t0 + Duration::from_secs(30)), 2);
        // And the late one leaves before the new one.
        assert_eq!(stats.calls(t0 + Duration::from_secs(35)), 1);
    }

    #[test]
    fn a_zero_window_is_read_as_the_shortest() {
        let stats = UpstreamStats::new(Duration::ZERO);
        let t0 = Instant::now();
        stats.record(t0, ms(1), false);
        assert_eq!(stats.calls(t0 + ms(5)), 1);
        assert_eq!(stats.calls(t0 + ms(20)), 0);
        let stats = UpstreamStats::new(Duration::MAX);
        stats.record(t0, ms(1), false);
        assert_eq!(stats.calls(t0 + Duration::from_secs(1 << 30)), 1);
    }

    proptest! {
        /// The running total always equals a count of the live samples, and
        /// every quantile lies within one bucket of the exact one.
        #[test]
        fn totals_and_quantiles_match_a_naive_window(
            samples in proptest::collection::vec((0u64..30_000, 0u64..2_000_000, any::<bool>()), 1..200),
            q in 0.0f64..=1.0,
        ) {
            let window = Duration::from_secs(10);
            let stats = UpstreamStats::new(window);
            let t0 = Instant::now();
            let mut at = 0;
            let mut kept: Vec<(u64, u64, bool)> = Vec::new();
            for (step, micros, error) in samples {
                at += step;
                stats.record(t0 + ms(at), Duration::from_micros(micros), error);
                kept.push((at, micros, error));
            }
            // Live: the samples in the ten one-second slots ending with
            // `at`'s, slots counted from the first sample.
            let first = kept[0].0;
            let head = (at - first) / 1000;
            let live: Vec<_> = kept
                .iter()
                .filter(|(t, _, _)| head - (t - first) / 1000 < 10)
                .collect();
            let now = t0 + ms(at);
            prop_assert_eq!(stats.calls(now), live.len() as u64);
            let errors = live.iter().filter(|s| s.2).count();
            prop_assert_eq!(stats.error_share(now), Some(errors as f64 / live.len() as f64));
            let mut lat: Vec<u64> = live.iter().map(|s| s.1).collect();
            lat.sort_unstable();
            let rank = ((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len());
            let exact = Duration::from_micros(lat[rank - 1]);
            let got = stats.latency_quantile(now, q).unwrap();
            prop_assert!(got >= exact, "{:?} < {:?}", got, exact);
            prop_assert!(
                got.as_secs_f64() <= (exact.as_secs_f64() * (1.0 + 1.0 / 16.0)).max(exact.as_secs_f64() + 1e-6) + 1e-9,
                "{:?} far above {:?}", got, exact
            );
        }
    }
}
