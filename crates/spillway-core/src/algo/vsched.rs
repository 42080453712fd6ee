//! Virtual scheduling: the arithmetic under GCRA, the token bucket and the shaper.
//!
//! State is one timestamp `tat`: the moment the limit would be back to fresh
//! if nothing else arrived. A request of `inc` nanoseconds of work is admitted
//! if, after adding it, the backlog `tat - now` stays within `horizon`.

use super::Verdict;
use crate::time::Nanos;

/// Outcome of one virtual-scheduling step.
pub(super) struct Step {
    pub allowed: bool,
    /// `max(tat, now)`: where the request's work starts.
    pub start: u64,
    /// The state to store if charged (`tat` itself when denied).
    pub next: u64,
    /// When denied: the earliest admitting time; `u64::MAX` if none.
    pub retry_at: u64,
}

pub(super) fn step(tat: u64, now: u64, inc: u64, horizon: u64) -> Step {
    // A clock that stepped back reads as `tat`'s own time: stored backlog is
    // never forgiven, so a backwards step cannot create capacity.
    let start = tat.max(now);
    let end = start.saturating_add(inc);
    if end - now <= horizon {
        Step {
            allowed: true,
            start,
            next: end,
            retry_at: now,
        }
    } else {
        let retry_at = if inc > horizon {
            u64::MAX
        } else {
            // Backlog at time t is tat - t (t <= tat); admit when tat + inc - t <= horizon.
            tat.saturating_add(inc) - horizon
        };
        Step {
            allowed: false,
            start,
            next: tat,
            retry_at,
        }
    }
}

/// Charges `inc` nanoseconds of work after the fact: counted past the
/// horizon if need be (the limit is then in debt, and checks are denied
/// until the backlog has drained back within the horizon), but never
/// further than `debt` past it: a backlog of at most `horizon + debt`
/// after `now`. Without that bound one charge of 2^32 at one request per
/// second kept the key out for 136 years. The bound never lowers a
/// backlog already stored (a clock that stepped back): a charge never
/// gives capacity back.
pub(super) fn charge(tat: u64, now: u64, inc: u64, horizon: u64, debt: u64) -> u64 {
    let start = tat.max(now);
    let cap = now.saturating_add(horizon).saturating_add(debt);
    start.saturating_add(inc).min(cap.max(start))
}

/// Renders a step as a verdict for a limit of `size` units of `interval` ns each.
pub(super) fn verdict(s: &Step, now: u64, size: u64, interval: u64, horizon: u64) -> Verdict {
    let backlog = s.next.max(now) - now;
    let remaining = (horizon - backlog.min(horizon)) / interval;
    let remaining = remaining.min(size);
    if s.allowed {
        Verdict::admit(size, remaining, Nanos(backlog))
    } else {
        let retry = if s.retry_at == u64::MAX {
            Nanos::MAX
        } else {
            Nanos(s.retry_at.saturating_sub(now))
        };
        Verdict::deny(size, remaining, Nanos(backlog), retry)
    }
}
