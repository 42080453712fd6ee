//! What each limit would need: the smallest size that limits at most a
//! target share of a rule's clients, and every algorithm replayed beside
//! the exact log, each as configured.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The smallest size at which `limit` (its rate and window unchanged)
/// admits every one of `requests`; `u64::MAX` if no size the algorithm
/// accepts does. Admitting is monotone in the size, so a binary search
/// over sizes finds it, each step a replay through the real algorithm.
pub(crate) fn needed_size(limit: &Limit, requests: &[(u64, u64)]) -> u64 {
    let admits_all = |size: u64| {
        let l = limit.with_size(size);
        let mut s = State::fresh(&l);
        requests.iter().all(|&(t, c)| step(&l, &mut s, Nanos(t), c))
    };
    let total = requests
        .iter()
        .fold(0u64, |a, &(_, c)| a.saturating_add(c))
        .max(1);
    let max = limit.with_size(u64::MAX).size();
    let mut hi = total.min(max);
    if !admits_all(hi) {
        if hi == max {
            return u64::MAX;
        }
        // A bucket whose rate is slower than the window suggests: search
        // up to the largest size.
        hi = max;
        if !admits_all(hi) {
            return u64::MAX;
        }
    }
    let mut lo = 1;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if admits_all(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// An algorithm's state for one key, held outside any store.
#[derive(Debug, Clone)]
pub(super) enum State {
    Narrow(u64),
    Wide(Wide),
    Log(Log),
}

impl State {
    pub(super) fn fresh(limit: &Limit) -> State {
        match limit.state_kind() {
            spillway_core::StateKind::Narrow => State::Narrow(0),
            spillway_core::StateKind::Wide => State::Wide(Wide::default()),
            spillway_core::StateKind::Log => State::Log(Log::new()),
        }
    }
}

/// Decides `cost` at `now` and keeps the next state if admitted, as the
/// memory store does.
pub(super) fn step(limit: &Limit, state: &mut State, now: Nanos, cost: u64) -> bool {
    match state {
        State::Narrow(s) => match limit.decide_narrow(*s, now, cost) {
            Some((v, next)) => {
                if v.allowed {
                    *s = next;
                }
                v.allowed
            }
            None => false,
        },
        State::Wide(s) => match limit.decide_wide(*s, now, cost) {
            Some((v, next)) => {
                if v.allowed {
                    *s = next;
                }
                v.allowed
            }
            None => false,
        },
        State::Log(log) => match limit {
            Limit::SlidingLog(a) => {
                let v = a.decide(log, now, cost);
                if v.allowed {
                    a.commit(log, now, cost);
                }
                v.allowed
            }
            _ => false,
        },
    }
}

/// For a window-type limit (`limit` per `window`): the exact sliding log
/// of the same limit and window first, then every other algorithm set to
/// the same limit and window (buckets: `limit` at once, refilled at
/// `limit` per `window`). `None` for other limits, or a limit past what
/// the exact log holds.
pub(super) fn variants(l: &Limit) -> Option<Vec<Variant>> {
    let (limit, window) = match l {
        Limit::FixedWindow(a) => (a.limit(), a.window()),
        Limit::SlidingLog(a) => (a.limit(), a.window()),
        Limit::SlidingCounter(a) => (a.limit(), a.window()),
        _ => return None,
    };
    let reference = SlidingLog::new(limit, window).ok()?;
    let rate = Rate::new(limit, window).ok();
    let mut out = vec![Limit::SlidingLog(reference)];
    if let Ok(a) = FixedWindow::new(limit, window) {
        out.push(Limit::FixedWindow(a));
    }
    if let Ok(a) = SlidingCounter::new(limit, window) {
        out.push(Limit::SlidingCounter(a));
    }
    if let Some(rate) = rate {
        if let Ok(a) = TokenBucket::new(limit, rate) {
            out.push(Limit::TokenBucket(a));
        }
        if let Ok(a) = Gcra::new(rate, limit) {
            out.push(Limit::Gcra(a));
        }
        if let Ok(a) = LeakyBucket::new(limit, rate) {
            out.push(Limit::LeakyBucket(a));
        }
    }
    Some(
        out.into_iter()
            .map(|limit| Variant {
                algorithm: limit.algorithm_name(),
                configured: limit.describe(),
                limit,
                wrongly_allowed: 0,
                wrongly_denied: 0,
            })
            .collect(),
    )
}
