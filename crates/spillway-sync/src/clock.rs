//! The store's clock, kept locally.
//!
//! Windows and buckets decided in memory must agree across instances on
//! which window a charge belongs to, so local decisions read the store's
//! time rather than the host's: a monotonic clock plus an offset learned
//! at every exchange. Two instances whose host clocks disagree by minutes
//! agree with the store, and so with each other, to within a round trip.
//! Until the first exchange the host's wall clock stands in.
//!
//! The estimate never runs ahead of the store. Each answer's `TIME` was
//! read somewhere between sending and receiving, so taking it as read on
//! receipt gives a time the store's has reached; the largest such over
//! the last [`MEMORY`] of answers (the one with the shortest round trip
//! counts most) is the offset. Why not the midpoint of the round trip: on
//! a busy machine that was up to half a long round trip ahead, so an
//! instance began a fixed window before the store did, pushed its first
//! admissions of the new window into the old one, where the store dropped
//! them at its own window start, and the other instances admitted them
//! again: 3 eventual instances hammering a limit of 100 admitted 139 in
//! one window beside two CPU hogs (issue 35). Behind, an instance's last
//! admissions of a window count in the store's next one: refused later,
//! never admitted twice.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use spillway_core::{Clock, Nanos};

/// Monotonic time plus the offset to the store's clock. Cheap to clone;
/// clones share the offset.
#[derive(Debug, Clone)]
pub struct StoreClock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    start: Instant,
    /// Store time (Unix nanoseconds) at `start`, as last learned.
    offset: AtomicI64,
    /// How far the last correction moved the clock, in nanoseconds (for
    /// the status page: the host's skew from the store is about this at
    /// the first exchange).
    last_step: AtomicI64,
    /// Exchanges that set the offset.
    syncs: AtomicU64,
    /// The offsets the answers of the last [`MEMORY`] allow (the store's
    /// time taken as read on receipt), by when they were received.
    bounds: Mutex<VecDeque<(u64, i64)>>,
}

/// How long an answer's bound on the offset is kept: long enough that
/// a quick round trip outweighs the slow ones around it, short enough
/// that the two clocks' drift (tens of parts per million) stays far
/// below a millisecond.
pub const MEMORY: std::time::Duration = std::time::Duration::from_secs(30);

impl StoreClock {
    /// Anchored to the host's wall clock until the first [`learn`](Self::learn).
    pub fn new() -> StoreClock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        StoreClock {
            inner: Arc::new(Inner {
                start: Instant::now(),
                offset: AtomicI64::new(wall),
                last_step: AtomicI64::new(0),
                syncs: AtomicU64::new(0),
                bounds: Mutex::new(VecDeque::new()),
            }),
        }
    }

    /// Nanoseconds since this clock started.
    pub fn elapsed(&self) -> u64 {
        u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Learns the store's time: `store_us` (microseconds since the epoch)
    /// was read between `sent` and `received` (this clock's
    /// [`elapsed`](Self::elapsed)).
    pub fn learn(&self, store_us: u64, sent: u64, received: u64) {
        if store_us == 0 || received < sent {
            return;
        }
        let store = i128::from(store_us) * 1000;
        let bound = (store - i128::from(received)).clamp(0, i128::from(i64::MAX)) as i64;
        let memory = u64::try_from(MEMORY.as_nanos()).unwrap_or(u64::MAX);
        let offset = {
            let mut bounds = self.inner.bounds.lock();
            while bounds
                .front()
                .is_some_and(|&(at, _)| at.saturating_add(memory) < received)
            {
                bounds.pop_front();
            }
            bounds.push_back((received, bound));
            bounds.iter().map(|&(_, b)| b).max().unwrap_or(bound)
        };
        let before = self.inner.offset.swap(offset, Ordering::Relaxed);
        self.inner
            .last_step
            .store(offset.saturating_sub(before), Ordering::Relaxed);
        self.inner.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the store's time has been learned at least once.
    pub fn synced(&self) -> bool {
        self.inner.syncs.load(Ordering::Relaxed) > 0
    }

    /// The last correction, in nanoseconds (positive: the clock moved on).
    pub fn last_step(&self) -> i64 {
        self.inner.last_step.load(Ordering::Relaxed)
    }

    /// The store's time as a [`Nanos`] for `elapsed` nanoseconds since start.
    pub fn at(&self, elapsed: u64) -> Nanos {
        let offset = self.inner.offset.load(Ordering::Relaxed).max(0) as u64;
        Nanos(offset.saturating_add(elapsed))
    }
}

impl Default for StoreClock {
    fn default() -> StoreClock {
        StoreClock::new()
    }
}

impl Clock for StoreClock {
    fn now(&self) -> Nanos {
        self.at(self.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host an hour fast reads the store's time once it has learned it,
    /// to within the round trip.
    #[test]
    fn learning_the_store_time_replaces_the_host_time() {
        let clock = StoreClock::new();
        let host = clock.now().as_u64();
        let store_us = host / 1000 - 3_600_000_000;
        let sent = clock.elapsed();
        let received = sent + 2_000_000;
        clock.learn(store_us, sent, received);
        let read = clock.at(received).as_u64();
        assert_eq!(read, store_us * 1000);
        assert!(clock.synced());
        assert!(clock.last_step() < -3_500_000_000_000);
    }

    /// Whatever the round trips, the estimate is never ahead of the
    /// store's time, and it is as close as the quickest answer of the
    /// last [`MEMORY`] allows.
    #[test]
    fn the_estimate_never_runs_ahead_of_the_store() {
        let clock = StoreClock::new();
        // The store's time is the elapsed time plus 10 s, read at a
        // random point of each round trip.
        let store_at = |elapsed: u64| (elapsed + 10_000_000_000) / 1000;
        let mut t = 1_000_000_000u64;
        let mut rng = 7u64;
        let mut quickest = u64::MAX;
        for _ in 0..200 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let rtt = 1_000 + (rng >> 33) % 400_000_000;
            let read = t + (rng >> 13) % rtt;
            clock.learn(store_at(read), t, t + rtt);
            quickest = quickest.min(rtt);
            let now = t + rtt;
            let truth = store_at(now) * 1000;
            let est = clock.at(now).as_u64();
            assert!(
                est <= truth + 1000,
                "ahead by {} ns (rtt {rtt})",
                est - truth
            );
            assert!(
                truth - est <= quickest + 1000,
                "behind by {} ns, quickest rtt {quickest}",
                truth - est
            );
            t += 100_000_000;
        }
        // Answers older than the memory are forgotten.
        let later = t + u64::try_from(MEMORY.as_nanos()).unwrap() * 2;
        clock.learn(store_at(later), later, later + 300_000_000);
        let est = clock.at(later + 300_000_000).as_u64();
        let truth = store_at(later + 300_000_000) * 1000;
        assert!(truth - est >= 299_000_000, "an old quick answer was kept");
    }

    /// A reply whose times make no sense changes nothing.
    #[test]
    fn nonsense_is_ignored() {
        let clock = StoreClock::new();
        let before = clock.at(0);
        clock.learn(0, 1, 2);
        clock.learn(5, 10, 2);
        assert_eq!(clock.at(0), before);
        assert!(!clock.synced());
    }
}
