use super::{Verdict, Wide, window_params};
use crate::error::Error;
use crate::time::Nanos;

/// Fixed window counter: at most `limit` per window, windows aligned to the epoch
/// (a 1-minute window runs from :00 to :59 of each wall-clock minute).
///
/// **Choose it** for quotas users read off a calendar ("1000 per day, reset
/// at midnight UTC") and when the counter itself should be easy to explain.
///
/// **Parameters**: `limit` and `window`.
///
/// **State**: 16 bytes: the end of the counted window and the count in it.
///
/// **Weaknesses**: boundary bursts: a client can send `limit` at the end of
/// one window and `limit` again at the start of the next, so up to
/// `2 x limit` pass within one window's length. Use a sliding algorithm when
/// that matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: Nanos,
}

impl FixedWindow {
    /// `limit` per `window`.
    ///
    /// # Errors
    /// Zero limit or window.
    pub fn new(limit: u64, window: Nanos) -> Result<FixedWindow, Error> {
        window_params(limit, window, "limit", u64::MAX)?;
        Ok(FixedWindow { limit, window })
    }

    /// Requests per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Window length.
    pub fn window(&self) -> Nanos {
        self.window
    }

    pub(crate) fn with_limit(&self, limit: u64) -> FixedWindow {
        FixedWindow { limit, ..*self }
    }

    /// Decides `cost` at `now` against `state` = `(window_end, count)` (default when fresh).
    #[inline]
    pub fn decide(&self, state: Wide, now: Nanos, cost: u64) -> (Verdict, Wide) {
        let (end, count) = self.current(state, now);
        let reset = Nanos(end - now.0);
        // Checked, not saturating: with a limit of u64::MAX a saturated
        // total would pass forever.
        if let Some(total) = count.checked_add(cost).filter(|t| *t <= self.limit) {
            let next = Wide { a: end, b: total };
            (Verdict::admit(self.limit, self.limit - total, reset), next)
        } else {
            let retry = if cost > self.limit { Nanos::MAX } else { reset };
            let remaining = self.limit.saturating_sub(count);
            (Verdict::deny(self.limit, remaining, reset, retry), state)
        }
    }

    /// Charges `cost` after the fact: always counted, even past the limit,
    /// which leaves the window's count above its limit (the key is in
    /// debt) and denies checks until the window ends, as every count of a
    /// fixed window clears at its end. The verdict is a check of cost 0
    /// after the charge.
    pub fn charge(&self, state: Wide, now: Nanos, cost: u64) -> (Verdict, Wide) {
        let (end, count) = self.current(state, now);
        let next = Wide {
            a: end,
            b: count.saturating_add(cost),
        };
        (self.decide(next, now, 0).0, next)
    }

    /// The window `now` is counted in and its count so far.
    fn current(&self, state: Wide, now: Nanos) -> (u64, u64) {
        // A stored window that has not ended (or lies ahead, if the clock
        // stepped back) is still the one that counts.
        if now.0 < state.a {
            (state.a, state.b)
        } else {
            let w = self.window.0;
            ((now.0 - now.0 % w).saturating_add(w), 0)
        }
    }
}
