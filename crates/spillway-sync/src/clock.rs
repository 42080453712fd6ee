//! The store's clock, kept locally.
//!
//! Windows and buckets decided in memory must agree across instances on
//! which window a charge belongs to, so local decisions read the store's
//! time rather than the host's: a monotonic clock plus an offset learned
//! at every exchange (the store's `TIME`, taken as read at the midpoint of
//! the round trip). Two instances whose host clocks disagree by minutes
//! agree with the store, and so with each other, to within half a round
//! trip. Until the first exchange the host's wall clock stands in.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
}

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
        let mid = sent + (received - sent) / 2;
        let store = i128::from(store_us) * 1000;
        let offset = (store - i128::from(mid)).clamp(0, i128::from(i64::MAX)) as i64;
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
        let read = clock.at(sent + 1_000_000).as_u64();
        assert_eq!(read, store_us * 1000);
        assert!(clock.synced());
        assert!(clock.last_step() < -3_500_000_000_000);
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
