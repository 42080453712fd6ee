//! A circuit breaker: after `threshold` consecutive failures, stop calling
//! Redis (a hung server would make every decision wait for the timeout, a
//! failing one would be asked in vain) and let one probe through every
//! `probe` interval until one succeeds.
//!
//! It also keeps the outage's story for operators: the opening and the
//! closing are logged once each (exactly one thread sees each transition),
//! with the kind of failure that opened it, and the last failure is kept
//! for the readiness check.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fault::Fault;

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
    /// The kind of the last failure (a [`Fault`] discriminant): what the
    /// open breaker's fast answers say and whether they are transient.
    fault: AtomicU8,
    /// The last failure's message, until a success: why the store is not
    /// healthy, for the readiness check. Written only by calls that reached
    /// (or tried to reach) Redis, never by the open breaker's fast answers.
    last: Mutex<Option<String>>,
    /// How many times the breaker has opened: one warning each.
    outages: AtomicU64,
    /// When the current outage began (milliseconds since `start`), for the
    /// line that says it ended.
    opened_at: AtomicU64,
    /// Whether the connection was lost (a call went out and the
    /// connection failed, dropped or was refused) and no call has
    /// succeeded since: a call that then times out waited for the
    /// reconnection, not for a server that holds it (see
    /// [`Breaker::link_down`]).
    link_down: AtomicBool,
    /// How many times the connection was found lost while it was
    /// believed up (see [`Breaker::losses`]).
    losses: AtomicU64,
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
            fault: AtomicU8::new(Fault::NotConnected as u8),
            last: Mutex::new(None),
            outages: AtomicU64::new(0),
            opened_at: AtomicU64::new(0),
            link_down: AtomicBool::new(false),
            losses: AtomicU64::new(0),
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
        if self.failures.load(Ordering::Relaxed) != 0 {
            let failures = self.failures.swap(0, Ordering::AcqRel);
            if failures != 0 {
                let last = self.lock().take();
                if failures >= self.threshold {
                    let opened = self.opened_at.load(Ordering::Acquire);
                    let lasted = Duration::from_millis(self.now_ms().saturating_sub(opened));
                    tracing::info!(
                        "redis answers again: circuit breaker closed after {lasted:?} ({failures} failed calls; the last: {})",
                        last.as_deref().unwrap_or("?")
                    );
                }
            }
        }
        if self.probing.load(Ordering::Relaxed) {
            self.probing.store(false, Ordering::Release);
        }
        if self.link_down.load(Ordering::Relaxed) {
            self.link_down.store(false, Ordering::Release);
        }
    }

    /// A call went out and its connection failed, dropped or was refused.
    /// Returns whether it was believed up until now (a loss counted).
    pub(crate) fn link_lost(&self) -> bool {
        let was_up = !self.link_down.swap(true, Ordering::AcqRel);
        if was_up {
            self.losses.fetch_add(1, Ordering::AcqRel);
        }
        was_up
    }

    /// How many times the connection was found lost while it was believed
    /// up: a call that timed out on a connection lost afterwards (this
    /// count moved on since) may never have reached a server that runs
    /// it, whereas one followed by an answer on the same connection (the
    /// count unchanged) was run before that answer (one connection's
    /// calls run in order).
    pub(crate) fn losses(&self) -> u64 {
        self.losses.load(Ordering::Acquire)
    }

    /// Whether the connection has been lost since the last success. A
    /// call that times out meanwhile waited for the connection manager's
    /// reconnection (its retries take up to a few hundred ms): it was
    /// never written to a live server, so nothing will run it, whereas
    /// one that timed out on a live connection (a stopped server) may
    /// still be run. A killed Redis's calls timed out this way 30 times
    /// in 38 (issue 35).
    pub(crate) fn link_down(&self) -> bool {
        self.link_down.load(Ordering::Acquire)
    }

    /// A call failed with `fault`; `message` says how (as the store error
    /// does).
    pub(crate) fn failure(&self, fault: Fault, message: &str) {
        self.fault.store(fault as u8, Ordering::Release);
        {
            let mut last = self.lock();
            if last.as_deref() != Some(message) {
                *last = Some(message.to_string());
            }
        }
        let f = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if f == self.threshold {
            self.opened_at.store(self.now_ms(), Ordering::Release);
            self.outages.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                "redis failing ({}: {message}): circuit breaker open after {f} failed calls in a row; decisions follow on_store_error at once, and one probes redis every {:?}",
                fault.name(),
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

    /// The kind of the last failure.
    pub(crate) fn fault(&self) -> Fault {
        Fault::from_u8(self.fault.load(Ordering::Acquire))
    }

    /// The last failure's message, if no call succeeded since.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.lock().clone()
    }

    /// How many times the breaker has opened.
    pub(crate) fn outages(&self) -> u64 {
        self.outages.load(Ordering::Acquire)
    }

    /// The message lock; a thread that panicked holding it left a message
    /// or none, either of which is fine to read.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Losses count the times the link went down, not the failed calls
    /// while it stays down.
    #[test]
    fn a_loss_is_counted_once_until_a_success() {
        let b = Breaker::new(3, Duration::ZERO);
        assert_eq!((b.losses(), b.link_down()), (0, false));
        b.link_lost();
        b.link_lost();
        assert_eq!((b.losses(), b.link_down()), (1, true));
        b.success();
        assert_eq!((b.losses(), b.link_down()), (1, false));
        b.link_lost();
        assert_eq!(b.losses(), 2);
    }

    #[test]
    fn opens_after_threshold_and_lets_one_probe_through() {
        let b = Breaker::new(3, Duration::ZERO);
        for _ in 0..2 {
            b.failure(Fault::Timeout, "late");
            assert!(b.allow());
        }
        b.failure(Fault::Timeout, "late");
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow(), "probe interval elapsed: one probe");
        assert!(!b.allow(), "only one probe at a time");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow());
    }

    #[test]
    fn an_outage_is_counted_once_and_remembers_its_last_failure() {
        let b = Breaker::new(2, Duration::ZERO);
        b.failure(Fault::OutOfMemory, "OOM one");
        assert_eq!(b.outages(), 0);
        assert_eq!(b.last_error().as_deref(), Some("OOM one"));
        for _ in 0..10 {
            b.failure(Fault::OutOfMemory, "OOM two");
        }
        assert_eq!(b.outages(), 1, "one outage, however many failures");
        assert_eq!(b.fault(), Fault::OutOfMemory);
        assert_eq!(b.last_error().as_deref(), Some("OOM two"));
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.last_error(), None);
        b.success();
        assert_eq!(b.outages(), 1);
        b.failure(Fault::Script, "ERR");
        b.failure(Fault::Script, "ERR");
        assert_eq!(b.outages(), 2, "a new outage after a success");
    }

    #[test]
    fn stays_open_until_the_probe_interval() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        b.failure(Fault::Timeout, "late");
        assert!(!b.allow());
        assert_eq!(b.state(), BreakerState::Open);
    }
}
