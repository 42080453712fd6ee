use std::num::NonZeroU64;

use super::{Rate, Verdict, capacity_param, debt_or, max_capacity, vsched};
use crate::error::Error;
use crate::time::Nanos;

/// GCRA, the generic cell rate algorithm: a rate with a burst, in one timestamp.
///
/// **Choose it** for "about R per period, allowing B at once from idle" with
/// the smallest state and the least work per decision; it is the default for
/// high-cardinality keys (per IP, per API key).
///
/// **Parameters**: `rate` (requests per period, the steady spacing is
/// `period / count`) and `burst` (how many requests an idle key may send at
/// once, at least 1).
///
/// **State**: 8 bytes, the theoretical arrival time (TAT) of the next
/// request; the key is fresh again once `now >= TAT`.
///
/// **Weaknesses**: it only knows a rate: "at most 100 in any hour" needs a
/// window algorithm. Its `remaining` is derived (how many more would pass now),
/// not a count a user can look up in a log. Admits exactly what a leaky bucket
/// meter with capacity `burst` and the same leak rate admits.
///
/// # Examples
/// ```
/// use spillway_core::{Gcra, Nanos, Rate};
/// let g = Gcra::new(Rate::new(10, Nanos::from_secs(1))?, 2)?;
/// let (v1, s) = g.decide(0, Nanos::from_secs(5), 1);
/// let (v2, s) = g.decide(s, Nanos::from_secs(5), 1);
/// let (v3, _) = g.decide(s, Nanos::from_secs(5), 1);
/// assert!(v1.allowed && v2.allowed && !v3.allowed);
/// assert_eq!(v3.retry_after, Nanos::from_millis(100));
/// # Ok::<(), spillway_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    rate: Rate,
    burst: u64,
    /// The most a charge may leave owing, in ns past a spent burst;
    /// `None`: the time the whole burst takes at the rate.
    max_debt: Option<NonZeroU64>,
}

impl std::fmt::Debug for Gcra {
    /// As derived, without `max_debt` when it is the default (see
    /// [`TokenBucket`](super::TokenBucket)'s).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Gcra");
        d.field("rate", &self.rate).field("burst", &self.burst);
        if let Some(m) = self.max_debt {
            d.field("max_debt", &m);
        }
        d.finish()
    }
}

impl Gcra {
    /// A GCRA of `rate` with `burst` requests allowed at once.
    ///
    /// # Errors
    /// `burst` is zero, or its requests take longer than
    /// [`MAX_SPAN`](super::MAX_SPAN) (about 146 years) at `rate`; the error
    /// names the largest.
    pub fn new(rate: Rate, burst: u64) -> Result<Gcra, Error> {
        Ok(Gcra {
            rate,
            burst: capacity_param("gcra burst", burst, &rate)?,
            max_debt: None,
        })
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The most a charge may leave owing: how long past a spent burst it
    /// may keep the key out (by default the time the whole burst takes at
    /// the rate, see [`Limit::with_max_debt`](super::Limit::with_max_debt)).
    pub fn max_debt(&self) -> Nanos {
        Nanos(debt_or(self.max_debt, self.rate.span(self.burst)))
    }

    pub(crate) fn own_debt(&self) -> Option<NonZeroU64> {
        self.max_debt
    }

    pub(crate) fn with_max_debt(&self, max_debt: Option<NonZeroU64>) -> Gcra {
        Gcra { max_debt, ..*self }
    }

    pub(crate) fn with_burst(&self, burst: u64) -> Gcra {
        Gcra {
            burst: burst.min(max_capacity(&self.rate)),
            ..*self
        }
    }

    /// Decides a request of `cost` at `now` against TAT `state` (0 when fresh).
    pub fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let horizon = self.rate.span(self.burst);
        let s = vsched::step(state, now.0, self.rate.span(cost), horizon);
        let v = vsched::verdict(&s, now.0, self.burst, self.rate.interval(), horizon);
        (v, s.next)
    }

    /// Charges `cost` after the fact (a cost known only once the request
    /// was served): always counted, even past the burst, which puts the
    /// key in debt: the state moves `cost` intervals further and checks are
    /// denied until it has drained back, at exactly the rate. The debt
    /// stops at [`Gcra::max_debt`]: whatever the cost, a check is admitted
    /// again at most that long after the burst would be spent. The
    /// verdict is a check of cost 0 on the state after the charge: denied
    /// if the key is now over.
    pub fn charge(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let horizon = self.rate.span(self.burst);
        let debt = debt_or(self.max_debt, horizon);
        let next = vsched::charge(state, now.0, self.rate.span(cost), horizon, debt);
        (self.decide(next, now, 0).0, next)
    }
}
