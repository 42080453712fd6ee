//! A circuit breaker: after `threshold` consecutive failures, stop calling
//! Redis (a hung server would make every decision wait for the timeout) and
//! let one probe through every `probe` interval until one succeeds.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail at once.
    Open,
    /// One probe call is under way.
    HalfOpen,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    failures: AtomicU32,
    threshold: u32,
    /// Milliseconds since `start` after which a probe may go.
    open_until: AtomicU64,
    probing: AtomicBool,
    start: Instant,
    probe: Duration,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, probe: Duration) -> Breaker {
        Breaker {
            failures: AtomicU32::new(0),
            threshold: threshold.max(1),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            start: Instant::now(),
            probe,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// May a call go now?
    pub(crate) fn allow(&self) -> bool {
        if self.failures.load(Ordering::Acquire) < self.threshold {
            return true;
        }
        self.now_ms() >= self.open_until.load(Ordering::Acquire)
            && !self.probing.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn success(&self) {
        // Every decision reports; a store only when something changes keeps
        // the threads deciding from writing one shared cache line in turn.
        // (A swap, so exactly one thread sees the breaker close and says so.)
        if self.failures.load(Ordering::Relaxed) != 0
            && self.failures.swap(0, Ordering::AcqRel) >= self.threshold
        {
            tracing::info!("redis answers again: circuit breaker closed");
        }
        if self.probing.load(Ordering::Relaxed) {
            self.probing.store(false, Ordering::Release);
        }
    }

    pub(crate) fn failure(&self) {
        let f = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if f == self.threshold {
            tracing::warn!(
                "redis failed {f} times in a row: circuit breaker open; decisions follow on_store_error at once, and one probes redis every {:?}",
                self.probe
            );
        }
        if f >= self.threshold {
            let until = self.now_ms() + u64::try_from(self.probe.as_millis()).unwrap_or(u64::MAX);
            self.open_until.store(until, Ordering::Release);
            self.probing.store(false, Ordering::Release);
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        if self.failures.load(Ordering::Acquire) < self.threshold {
            BreakerState::Closed
        } else if self.probing.load(Ordering::Acquire) {
            BreakerState::HalfOpen
        } else {
            BreakerState::Open
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_lets_one_probe_through() {
        let b = Breaker::new(3, Duration::ZERO);
        for _ in 0..2 {
            b.failure();
            assert!(b.allow());
        }
        b.failure();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow(), "probe interval elapsed: one probe");
        assert!(!b.allow(), "only one probe at a time");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow());
    }

    #[test]
    fn stays_open_until_the_probe_interval() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        b.failure();
        assert!(!b.allow());
        assert_eq!(b.state(), BreakerState::Open);
    }
}
