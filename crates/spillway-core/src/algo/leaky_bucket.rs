use std::num::NonZeroU64;

use super::{Rate, Verdict, Wide, capacity_param, debt_or, max_capacity, vsched};
use crate::error::Error;
use crate::time::Nanos;

/// Leaky bucket as a meter: a bucket of `capacity` that leaks at a steady rate;
/// a request adds its cost as water and is rejected if the bucket would overflow.
///
/// **Choose it** when you reason in "queue size and outflow rate": a backend
/// that can take `leak` per second and absorb `capacity` in flight.
///
/// **Parameters**: `capacity` (water the bucket holds, in requests) and
/// `leak` (requests drained per period).
///
/// **State**: 16 bytes: the water level (as nanoseconds of draining left) and
/// the time it was measured, kept as `(drains_at, measured_at)` so a store
/// can tell a fresh key (`now >= drains_at`) without the parameters.
///
/// **Weaknesses**: it admits the same sequences as a token bucket of the same
/// capacity and rate and as GCRA with `burst = capacity`: pick whichever
/// vocabulary your users think in. As a meter it rejects; to delay instead,
/// use [`Shaper`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    capacity: u64,
    leak: Rate,
    /// The most a charge may leave owing, in ns of draining past a full
    /// bucket; `None`: the time to drain the whole capacity.
    max_debt: Option<NonZeroU64>,
}

impl std::fmt::Debug for LeakyBucket {
    /// As derived, without `max_debt` when it is the default (see
    /// [`TokenBucket`](super::TokenBucket)'s).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("LeakyBucket");
        d.field("capacity", &self.capacity)
            .field("leak", &self.leak);
        if let Some(m) = self.max_debt {
            d.field("max_debt", &m);
        }
        d.finish()
    }
}

impl LeakyBucket {
    /// A meter of `capacity` leaking at `leak`.
    ///
    /// # Errors
    /// `capacity` is zero, or takes longer than [`MAX_SPAN`](super::MAX_SPAN)
    /// (about 146 years) to drain at `leak`; the error names the largest.
    pub fn new(capacity: u64, leak: Rate) -> Result<LeakyBucket, Error> {
        Ok(LeakyBucket {
            capacity: capacity_param("leaky_bucket capacity", capacity, &leak)?,
            leak,
            max_debt: None,
        })
    }

    /// Capacity in requests.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Leak rate.
    pub fn leak(&self) -> Rate {
        self.leak
    }

    /// The most a charge may leave owing: how long past a full bucket it
    /// may keep the key out (by default the time to drain the whole
    /// capacity, see [`Limit::with_max_debt`](super::Limit::with_max_debt)).
    pub fn max_debt(&self) -> Nanos {
        Nanos(debt_or(self.max_debt, self.leak.span(self.capacity)))
    }

    pub(crate) fn own_debt(&self) -> Option<NonZeroU64> {
        self.max_debt
    }

    pub(crate) fn with_max_debt(&self, max_debt: Option<NonZeroU64>) -> LeakyBucket {
        LeakyBucket { max_debt, ..*self }
    }

    pub(crate) fn with_capacity(&self, capacity: u64) -> LeakyBucket {
        LeakyBucket {
            capacity: capacity.min(max_capacity(&self.leak)),
            ..*self
        }
    }

    /// Decides adding `cost` at `now` to a bucket in `state` (default when empty).
    #[inline]
    pub fn decide(&self, state: Wide, now: Nanos, cost: u64) -> (Verdict, Wide) {
        let (drains_at, measured_at) = (state.a, state.b);
        let level_then = drains_at.saturating_sub(measured_at);
        // Water leaks only forwards in time: a clock that stepped back sees
        // the level as last measured.
        let at = now.0.max(measured_at);
        let level = level_then.saturating_sub(at - measured_at);
        let full = self.leak.span(self.capacity);
        let added = self.leak.span(cost);
        let new_level = level.saturating_add(added);
        let interval = self.leak.interval();
        if new_level <= full {
            let next = Wide {
                a: at.saturating_add(new_level),
                b: at,
            };
            let remaining = ((full - new_level) / interval).min(self.capacity);
            let reset = Nanos(next.a - now.0.min(next.a));
            (Verdict::admit(self.capacity, remaining, reset), next)
        } else {
            let retry = if added > full {
                Nanos::MAX
            } else {
                Nanos((at - now.0) + (new_level - full))
            };
            let remaining = ((full - level.min(full)) / interval).min(self.capacity);
            let reset = Nanos((at - now.0).saturating_add(level));
            (Verdict::deny(self.capacity, remaining, reset, retry), state)
        }
    }
    /// Charges `cost` after the fact: the water is always added, even past
    /// the capacity, which puts the key in debt: checks are denied until
    /// the level has leaked back under the capacity, at exactly the leak
    /// rate. The level stops at [`LeakyBucket::max_debt`] of draining
    /// above the capacity (never lowered, should it be higher already):
    /// whatever the cost, a check is admitted again at most that long
    /// after a full bucket would be. The verdict is a check of cost 0
    /// after the charge.
    pub fn charge(&self, state: Wide, now: Nanos, cost: u64) -> (Verdict, Wide) {
        let (drains_at, measured_at) = (state.a, state.b);
        let at = now.0.max(measured_at);
        let level = drains_at
            .saturating_sub(measured_at)
            .saturating_sub(at - measured_at);
        let full = self.leak.span(self.capacity);
        let cap = full.saturating_add(debt_or(self.max_debt, full));
        let new_level = level
            .saturating_add(self.leak.span(cost))
            .min(cap.max(level));
        let next = Wide {
            a: at.saturating_add(new_level),
            b: at,
        };
        (self.decide(next, now, 0).0, next)
    }
}

/// Leaky bucket as a shaper: excess requests wait in a queue and leave at the
/// leak rate, instead of being rejected; only a full queue (or a wait longer
/// than `max_wait`) rejects.
///
/// **Choose it** in front of a backend that must see a smooth rate (a proxy or
/// middleware sleeps for [`Verdict::wait`] before forwarding), like nginx's
/// `limit_req` with `burst` and without `nodelay`.
///
/// **Parameters**: `capacity` (requests in the bucket at once: the one leaving
/// now and those queued behind it), `leak`, and `max_wait`.
///
/// **State**: 8 bytes: when the last queued request leaves.
///
/// **Weaknesses**: waiting holds a connection open; keep `capacity` and
/// `max_wait` small. The decision only says how long to wait: the caller must
/// actually wait, or the shaping is lost.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Shaper {
    capacity: u64,
    leak: Rate,
    max_wait: Nanos,
    /// The most a charge may leave owing, in ns past a full queue;
    /// `None`: the time to drain the whole capacity.
    max_debt: Option<NonZeroU64>,
}

impl std::fmt::Debug for Shaper {
    /// As derived, without `max_debt` when it is the default (see
    /// [`TokenBucket`](super::TokenBucket)'s).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Shaper");
        d.field("capacity", &self.capacity)
            .field("leak", &self.leak)
            .field("max_wait", &self.max_wait);
        if let Some(m) = self.max_debt {
            d.field("max_debt", &m);
        }
        d.finish()
    }
}

impl Shaper {
    /// A shaper queueing up to `capacity` requests, releasing them at `leak`,
    /// and never asking a request to wait longer than `max_wait`.
    ///
    /// # Errors
    /// `capacity` is zero, or takes longer than [`MAX_SPAN`](super::MAX_SPAN)
    /// (about 146 years) to drain at `leak`; the error names the largest.
    pub fn new(capacity: u64, leak: Rate, max_wait: Nanos) -> Result<Shaper, Error> {
        Ok(Shaper {
            capacity: capacity_param("leaky_bucket capacity", capacity, &leak)?,
            leak,
            max_wait,
            max_debt: None,
        })
    }

    /// Capacity in requests.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Leak rate.
    pub fn leak(&self) -> Rate {
        self.leak
    }

    /// The longest a request may be asked to wait.
    pub fn max_wait(&self) -> Nanos {
        self.max_wait
    }

    /// The most a charge may leave owing: how long past a full queue it
    /// may keep the key out (by default the time to drain the whole
    /// capacity, see [`Limit::with_max_debt`](super::Limit::with_max_debt)).
    pub fn max_debt(&self) -> Nanos {
        Nanos(debt_or(self.max_debt, self.leak.span(self.capacity)))
    }

    pub(crate) fn own_debt(&self) -> Option<NonZeroU64> {
        self.max_debt
    }

    pub(crate) fn with_max_debt(&self, max_debt: Option<NonZeroU64>) -> Shaper {
        Shaper { max_debt, ..*self }
    }

    pub(crate) fn with_capacity(&self, capacity: u64) -> Shaper {
        Shaper {
            capacity: capacity.min(max_capacity(&self.leak)),
            ..*self
        }
    }

    /// Decides queueing `cost` at `now` behind a queue whose last request
    /// leaves at `state` (0 when empty).
    pub fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let horizon = self.leak.span(self.capacity);
        let interval = self.leak.interval();
        let mut s = vsched::step(state, now.0, self.leak.span(cost), horizon);
        let wait = s.start - now.0;
        if s.allowed && wait > self.max_wait.0 {
            // The queue has room but the wait is too long: reject, and say
            // when the wait will have shrunk enough.
            s.allowed = false;
            s.next = state;
            s.retry_at = state.saturating_sub(self.max_wait.0);
        } else if !s.allowed && s.retry_at != u64::MAX {
            s.retry_at = s.retry_at.max(state.saturating_sub(self.max_wait.0));
        }
        let mut v = vsched::verdict(&s, now.0, self.capacity, interval, horizon);
        if s.allowed {
            v.wait = Nanos(wait);
        }
        (v, s.next)
    }
    /// Charges `cost` after the fact: always queued, even past the
    /// capacity, which puts the key in debt until the queue has drained
    /// back, at exactly the leak rate; at most [`Shaper::max_debt`] past
    /// a full queue, whatever the cost. The verdict is a check of cost 0
    /// after the charge.
    pub fn charge(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let horizon = self.leak.span(self.capacity);
        let debt = debt_or(self.max_debt, horizon);
        let next = vsched::charge(state, now.0, self.leak.span(cost), horizon, debt);
        (self.decide(next, now, 0).0, next)
    }
}
