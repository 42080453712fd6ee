use std::num::NonZeroU64;

use super::{Rate, Verdict, capacity_param, debt_or, max_capacity, vsched};
use crate::error::Error;
use crate::time::Nanos;

/// Token bucket: a bucket of `capacity` tokens refilled at a steady rate.
///
/// **Choose it** when clients should be able to save up for a burst (up to
/// `capacity`) and otherwise get an average rate: upload quotas, API plans
/// ("5 per second, bursts of 20"). Costs map naturally to tokens (bytes,
/// LLM tokens).
///
/// **Parameters**: `capacity` (tokens when full, the largest burst) and
/// `refill` (tokens added per period).
///
/// **State**: 8 bytes. Instead of a token count and a last-refill time, it
/// stores the moment the bucket will be full again; the token count is
/// `capacity - (full_at - now) / interval`. That is the same information in
/// one word, refilled lazily without a timer.
///
/// **Weaknesses**: a full bucket lets `capacity` requests through at once,
/// so `capacity + refill x elapsed` is the bound over any interval, not
/// `refill x elapsed`. For a limit over a calendar window use a window algorithm.
///
/// # Examples
/// ```
/// use spillway_core::{Nanos, Rate, TokenBucket};
/// let tb = TokenBucket::new(3, Rate::new(1, Nanos::from_secs(1))?)?;
/// let mut s = 0;
/// for _ in 0..3 {
///     let (v, next) = tb.decide(s, Nanos::from_secs(100), 1);
///     assert!(v.allowed);
///     s = next;
/// }
/// assert!(!tb.decide(s, Nanos::from_secs(100), 1).0.allowed);
/// assert!(tb.decide(s, Nanos::from_secs(101), 1).0.allowed);
/// # Ok::<(), spillway_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u64,
    refill: Rate,
    /// The most a charge may leave owing, in ns past an empty bucket;
    /// `None`: the time to refill the whole capacity.
    max_debt: Option<NonZeroU64>,
}

impl std::fmt::Debug for TokenBucket {
    /// As derived, without `max_debt` when it is the default: a rule's
    /// fingerprint (which names its counters) is its limits' debug text,
    /// and a limit's counters must not change when nothing of it did.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TokenBucket");
        d.field("capacity", &self.capacity)
            .field("refill", &self.refill);
        if let Some(m) = self.max_debt {
            d.field("max_debt", &m);
        }
        d.finish()
    }
}

impl TokenBucket {
    /// A bucket of `capacity` tokens refilled at `refill`.
    ///
    /// # Errors
    /// `capacity` is zero, or takes longer than [`MAX_SPAN`](super::MAX_SPAN)
    /// (about 146 years) to refill at `refill`; the error names the largest.
    pub fn new(capacity: u64, refill: Rate) -> Result<TokenBucket, Error> {
        Ok(TokenBucket {
            capacity: capacity_param("token_bucket capacity", capacity, &refill)?,
            refill,
            max_debt: None,
        })
    }

    /// Tokens when full.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Refill rate.
    pub fn refill(&self) -> Rate {
        self.refill
    }

    /// The most a charge may leave owing: how long past an empty bucket
    /// it may keep the key out (by default the time to refill the whole
    /// capacity, see [`Limit::with_max_debt`](super::Limit::with_max_debt)).
    pub fn max_debt(&self) -> Nanos {
        Nanos(debt_or(self.max_debt, self.refill.span(self.capacity)))
    }

    pub(crate) fn own_debt(&self) -> Option<NonZeroU64> {
        self.max_debt
    }

    pub(crate) fn with_max_debt(&self, max_debt: Option<NonZeroU64>) -> TokenBucket {
        TokenBucket { max_debt, ..*self }
    }

    pub(crate) fn with_capacity(&self, capacity: u64) -> TokenBucket {
        TokenBucket {
            capacity: capacity.min(max_capacity(&self.refill)),
            ..*self
        }
    }

    /// Tokens in a bucket whose state is `state` at `now`, rounded down.
    pub fn tokens(&self, state: u64, now: Nanos) -> u64 {
        let missing = state.saturating_sub(now.0).div_ceil(self.refill.interval());
        self.capacity.saturating_sub(missing)
    }

    /// Decides taking `cost` tokens at `now` from a bucket whose state is `state` (0 when full).
    pub fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let horizon = self.refill.span(self.capacity);
        let s = vsched::step(state, now.0, self.refill.span(cost), horizon);
        let v = vsched::verdict(&s, now.0, self.capacity, self.refill.interval(), horizon);
        (v, s.next)
    }

    /// Charges `cost` after the fact (a cost known only once the request
    /// was served): always counted, even past the capacity, which puts the
    /// key in debt: the state moves `cost` intervals further and checks are
    /// denied until it has drained back, at exactly the refill rate. The
    /// debt stops at [`TokenBucket::max_debt`]: whatever the cost, a check
    /// is admitted again at most that long after the bucket would be
    /// empty. The verdict is a check of cost 0 on the state after the
    /// charge: denied if the key is now over.
    pub fn charge(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let horizon = self.refill.span(self.capacity);
        let debt = debt_or(self.max_debt, horizon);
        let next = vsched::charge(state, now.0, self.refill.span(cost), horizon, debt);
        (self.decide(next, now, 0).0, next)
    }
}
