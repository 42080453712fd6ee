use super::{Rate, Verdict, capacity_param, max_capacity, vsched};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u64,
    refill: Rate,
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
    /// verdict is a check of cost 0 on the state after the charge: denied
    /// if the key is now over.
    pub fn charge(&self, state: u64, now: Nanos, cost: u64) -> (Verdict, u64) {
        let next = vsched::charge(state, now.0, self.refill.span(cost));
        (self.decide(next, now, 0).0, next)
    }
}
