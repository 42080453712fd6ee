use std::num::NonZeroU64;

use super::{Verdict, Wide, debt_or, window_params};
use crate::error::Error;
use crate::time::Nanos;

/// Sliding window counter: the count of the current window plus the previous
/// window's count weighted by how much of it still overlaps the sliding window.
///
/// `estimate = previous x (W - elapsed) / W + current`, where `elapsed` is
/// the time since the current window began. A request of cost `k` passes if
/// `estimate + k <= limit`.
///
/// **Choose it** for "N per W" that should slide smoothly without the memory
/// of a log, at high key counts.
///
/// **Parameters**: `limit` (at most `u32::MAX`) and `window`.
///
/// **State**: 16 bytes: when the state expires (end of current window + W) and
/// both counts as 32-bit numbers.
///
/// **Weaknesses**: an approximation. It assumes the previous window's requests
/// were spread evenly; if they all came at its end, up to about twice the limit
/// can pass within one window's length in the worst case, and if they came at
/// its start it is stricter than needed. Spread traffic sees errors of a few percent.
/// Counts are exact within a window.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SlidingCounter {
    limit: u64,
    window: Nanos,
    /// The most a charge may leave owing, in ns past what a full window
    /// keeps the key out; `None`: one window.
    max_debt: Option<NonZeroU64>,
}

impl std::fmt::Debug for SlidingCounter {
    /// As derived, without `max_debt` when it is the default (see
    /// [`TokenBucket`](super::TokenBucket)'s).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("SlidingCounter");
        d.field("limit", &self.limit).field("window", &self.window);
        if let Some(m) = self.max_debt {
            d.field("max_debt", &m);
        }
        d.finish()
    }
}

impl SlidingCounter {
    /// `limit` per sliding `window`.
    ///
    /// # Errors
    /// Zero limit or window, or a limit above `u32::MAX`.
    pub fn new(limit: u64, window: Nanos) -> Result<SlidingCounter, Error> {
        window_params(limit, window, "limit", u64::from(u32::MAX))?;
        Ok(SlidingCounter {
            limit,
            window,
            max_debt: None,
        })
    }

    /// Requests per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Window length.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// The most a charge may leave owing: how much longer than a window
    /// counted full a charge may keep the key out (by default one window,
    /// see [`Limit::with_max_debt`](super::Limit::with_max_debt)).
    pub fn max_debt(&self) -> Nanos {
        Nanos(debt_or(self.max_debt, self.window.0))
    }

    pub(crate) fn own_debt(&self) -> Option<NonZeroU64> {
        self.max_debt
    }

    pub(crate) fn with_max_debt(&self, max_debt: Option<NonZeroU64>) -> SlidingCounter {
        SlidingCounter { max_debt, ..*self }
    }

    /// The largest count a charge at `now` leaves in the window ending at
    /// `end`, so that a charge keeps a key out about one period (its
    /// debt, by default a window) from the time of the charge, like the
    /// other algorithms. A count of `x` above the limit keeps a request
    /// of cost `c` out for the rest of this window, `W - e` (`e` the time
    /// elapsed in it), and then until `W - floor((limit - c) W / x)` of
    /// the next has passed: `x <= limit W / (W - d')`, where `d' =
    /// max_debt - (W - e)` is the debt left once this window is over,
    /// keeps the whole within `max(max_debt, W - e) + c W / limit` (and
    /// a nanosecond of rounding). The count is at least `limit + 1`, so
    /// a charge past the limit always leaves the key over it (checks of
    /// cost 0 refused; at `limit` exactly they pass, and a client that
    /// checks, then pays after the fact, would be served without end):
    /// that adds at most one unit's fade, `W / (limit + 1)`. No cap (but
    /// what the state holds, 2^32 - 1) once `d' >= W`. (Capping at
    /// `limit W / (W - max_debt)` whatever `e`, as before, let a charge
    /// early in a window keep a key out for up to two windows.)
    pub fn max_count_at(&self, end: Nanos, now: Nanos) -> u64 {
        let w = self.window.0;
        let cap = u64::from(u32::MAX);
        let left = end.0.saturating_sub(now.0).min(w);
        let d = debt_or(self.max_debt, w).saturating_sub(left);
        if d >= w {
            return cap;
        }
        let x = u128::from(self.limit) * u128::from(w) / u128::from(w - d);
        u64::try_from(x).map_or(cap, |x| x.max(self.limit + 1).min(cap))
    }

    pub(crate) fn with_limit(&self, limit: u64) -> SlidingCounter {
        SlidingCounter {
            limit: limit.min(u64::from(u32::MAX)),
            ..*self
        }
    }

    /// Decides `cost` at `now` against `state` (default when fresh).
    #[inline]
    pub fn decide(&self, state: Wide, now: Nanos, cost: u64) -> (Verdict, Wide) {
        let w = self.window.0;
        let (end, cur, prev) = self.roll(state, now);
        let start = end.saturating_sub(w);
        let elapsed = now.0.max(start) - start;
        let n = u128::from(self.limit);
        let w128 = u128::from(w);
        // Admit iff prev*(W-elapsed) + (cur+cost)*W <= limit*W, in exact
        // integers. Without a previous count (the common case under steady
        // traffic within a window) that is plain counting: skip the 128-bit
        // multiply and divide.
        let (allowed, estimate_ceil) = if prev == 0 {
            (cur.saturating_add(cost) <= self.limit, cur)
        } else {
            let weighted_prev = u128::from(prev) * u128::from(w - elapsed.min(w));
            // A cost above the limit never passes; below it, `used * W`
            // stays under 2^97 (a huge cost times a huge window would wrap).
            let used = u128::from(cur) + u128::from(cost.min(self.limit + 1));
            let allowed = cost <= self.limit && weighted_prev + used * w128 <= n * w128;
            let estimate_ceil = (weighted_prev.div_ceil(w128) + u128::from(cur)) as u64;
            (allowed, estimate_ceil)
        };
        let reset = Nanos(end.saturating_add(w) - now.0.min(end));
        if allowed {
            let new_cur = cur.saturating_add(cost).min(u64::from(u32::MAX));
            let next = Wide {
                a: end.saturating_add(w),
                b: (new_cur << 32) | prev,
            };
            let remaining = self
                .limit
                .saturating_sub(estimate_ceil.saturating_add(cost));
            (Verdict::admit(self.limit, remaining, reset), next)
        } else {
            let retry = self
                .retry_at(start, prev, cur, cost)
                .map_or(Nanos::MAX, |t| Nanos(t.saturating_sub(now.0)));
            let remaining = self.limit.saturating_sub(estimate_ceil);
            (Verdict::deny(self.limit, remaining, reset, retry), state)
        }
    }

    /// Charges `cost` after the fact: always counted in the current
    /// window, even past the limit (up to
    /// [`SlidingCounter::max_count_at`] the charge's time, never lowering
    /// a count already above it), which puts the key in debt: checks are
    /// denied until the estimate is back under the limit, as the count's
    /// weight fades over the next window (the rate at which this
    /// algorithm forgets any count). The verdict is a check of cost 0
    /// after the charge.
    pub fn charge(&self, state: Wide, now: Nanos, cost: u64) -> (Verdict, Wide) {
        let (end, cur, prev) = self.roll(state, now);
        let most = self.max_count_at(Nanos(end), now);
        let cur = cur.saturating_add(cost).min(most.max(cur));
        let next = Wide {
            a: end.saturating_add(self.window.0),
            b: (cur << 32) | prev,
        };
        (self.decide(next, now, 0).0, next)
    }

    /// The stored windows rolled forward to the one `now` falls in: its
    /// end, its count and the previous window's count.
    fn roll(&self, state: Wide, now: Nanos) -> (u64, u64, u64) {
        let w = self.window.0;
        let stored_end = self.stored_end(state.a);
        let (cur0, prev0) = (state.b >> 32, state.b & 0xffff_ffff);
        if state.a == 0 || now.0 >= state.a {
            ((now.0 - now.0 % w).saturating_add(w), 0, 0)
        } else if now.0 >= stored_end {
            (stored_end.saturating_add(w), 0, cur0)
        } else {
            (stored_end, cur0, prev0)
        }
    }

    /// The end of the window a state was stored in, from its `a` (that
    /// end plus W, saturated). A window over about 193,000 days saturates
    /// `a` at `u64::MAX` from the first request (end + W is past 2^64 ns):
    /// taking `a - W` as the end then put the end in the past, and every
    /// request rolled the count over, enforcing nothing. A saturated `a`
    /// comes from the window whose end is the first multiple of W at or
    /// after `u64::MAX - W` (and after zero: a window ends after it
    /// starts), for any `now` before 2^63.
    fn stored_end(&self, a: u64) -> u64 {
        let w = self.window.0;
        if a == u64::MAX {
            (u64::MAX - w).div_ceil(w).max(1) * w
        } else {
            a.saturating_sub(w)
        }
    }

    /// The earliest time a request of `cost` passes, given the window starting at
    /// `start` with counts `prev` and `cur`; `None` if never.
    fn retry_at(&self, start: u64, prev: u64, cur: u64, cost: u64) -> Option<u64> {
        let w64 = self.window.0;
        let w = u128::from(w64);
        // Smallest elapsed e in [0, W) with p*(W-e) <= a*W, i.e. e >= W - floor(a*W/p).
        // In 64 bits when a*W fits (a 128-bit division is a library call,
        // and every denial at a busy key asks this).
        let earliest = |p: u64, a: u64| -> u128 {
            if p == 0 {
                0
            } else if let Some(aw) = a.checked_mul(w64) {
                u128::from(w64.saturating_sub(aw / p))
            } else {
                w.saturating_sub(u128::from(a) * w / u128::from(p))
            }
        };
        if cost > self.limit {
            return None;
        }
        let start = u128::from(start);
        let at = if cur + cost <= self.limit {
            // Later in this window, as the previous window's weight fades.
            start + earliest(prev, self.limit - cur - cost)
        } else {
            // In the next window, where `cur` becomes the previous count.
            start + w + earliest(cur, self.limit - cost)
        };
        Some(u64::try_from(at).unwrap_or(u64::MAX))
    }
}
