//! Adaptive client-side throttling (Google's SRE book, "Handling
//! Overload"): when a backend refuses much of what it is sent, the client
//! refuses requests itself, before they cost the backend anything, with
//! probability `max(0, (requests - K * accepts) / (requests + 1))` over a
//! sliding window. `requests` counts what the application asked for
//! (refused locally or not); `accepts`, what the backend accepted.
//!
//! With `K = 2` the client sends up to about twice what the backend
//! accepts: enough to notice at once when it recovers, and an overloaded
//! backend no longer spends its capacity refusing retries.
//!
//! Time and randomness come in as arguments, so the controller is a pure
//! state machine tests drive on a virtual clock.

use std::time::Duration;

/// Buckets the window is kept in.
const BUCKETS: usize = 20;

/// The throttle's counters over a sliding window.
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    k: f64,
    /// Width of one bucket, ns.
    width: u64,
    /// Per bucket: its index (time / width), requests, accepts.
    buckets: [(u64, u64, u64); BUCKETS],
}

impl AdaptiveThrottle {
    /// A throttle with multiplier `k` (at least 1; 2 is the book's
    /// choice) over `window` (the book uses 2 minutes).
    pub fn new(k: f64, window: Duration) -> AdaptiveThrottle {
        let k = if k.is_finite() { k.max(1.0) } else { 2.0 };
        let width = (window.as_nanos() / BUCKETS as u128).clamp(1, u128::from(u64::MAX)) as u64;
        AdaptiveThrottle {
            k,
            width,
            buckets: [(u64::MAX, 0, 0); BUCKETS],
        }
    }

    /// Requests and accepts in the window ending at `now` (ns on any
    /// monotonic scale).
    pub fn counts(&self, now: u64) -> (u64, u64) {
        let current = now / self.width;
        self.buckets
            .iter()
            .filter(|(i, ..)| *i != u64::MAX && *i + (BUCKETS as u64) > current && *i <= current)
            .fold((0, 0), |(r, a), (_, br, ba)| (r + br, a + ba))
    }

    /// The probability of refusing a request now.
    pub fn reject_probability(&self, now: u64) -> f64 {
        let (requests, accepts) = self.counts(now);
        let requests = requests as f64;
        ((requests - self.k * accepts as f64) / (requests + 1.0)).max(0.0)
    }

    /// Whether to refuse a request now, given a uniform draw in `[0, 1)`.
    /// Counts the request either way.
    pub fn admit(&mut self, now: u64, uniform: f64) -> bool {
        let refuse = uniform < self.reject_probability(now);
        self.bucket(now).1 += 1;
        !refuse
    }

    /// Records the backend's answer to a request that was sent.
    pub fn answered(&mut self, now: u64, accepted: bool) {
        if accepted {
            self.bucket(now).2 += 1;
        }
    }

    fn bucket(&mut self, now: u64) -> &mut (u64, u64, u64) {
        let i = now / self.width;
        let b = &mut self.buckets[(i % BUCKETS as u64) as usize];
        if b.0 != i {
            *b = (i, 0, 0);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that accepts at most `capacity` requests per second.
    /// Offered 100 per second, it accepts 10 % of them; the client's sent
    /// rate falls to about `K` times what is accepted.
    #[test]
    fn the_sent_rate_falls_to_about_k_times_the_accepts() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(120));
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut uniform = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let capacity = 10;
        let (mut sent_late, mut accepted_late) = (0u64, 0u64);
        for second in 0..600u64 {
            let mut accepted_this_second = 0;
            for i in 0..100u64 {
                let now = second * 1_000_000_000 + i * 10_000_000;
                if t.admit(now, uniform()) {
                    let ok = accepted_this_second < capacity;
                    accepted_this_second += u64::from(ok);
                    t.answered(now, ok);
                    if second >= 300 {
                        sent_late += 1;
                        accepted_late += u64::from(ok);
                    }
                }
            }
        }
        let ratio = sent_late as f64 / accepted_late as f64;
        assert!(
            (1.7..=2.3).contains(&ratio),
            "sent {sent_late}, accepted {accepted_late}"
        );
        // The backend still gets all it can take.
        assert!(accepted_late as f64 >= 0.95 * 300.0 * capacity as f64);
    }

    #[test]
    fn a_healthy_backend_is_never_throttled() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(60));
        for i in 0..10_000u64 {
            assert!(t.admit(i * 1_000_000, 0.0));
            t.answered(i * 1_000_000, true);
        }
        assert_eq!(t.reject_probability(10_000_000_000), 0.0);
    }

    #[test]
    fn old_answers_leave_the_window() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(20));
        for i in 0..100 {
            t.admit(i, 0.99);
            t.answered(i, false);
        }
        assert!(t.reject_probability(100) > 0.9);
        assert_eq!(t.counts(30_000_000_000), (0, 0));
        assert_eq!(t.reject_probability(30_000_000_000), 0.0);
    }
}
