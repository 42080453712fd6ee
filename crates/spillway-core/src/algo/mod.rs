//! The six algorithms, each a pure state machine.
//!
//! Every algorithm has the same shape: `decide(&self, state, now, cost)`
//! returns a [`Verdict`] and, for the compact ones, the state to store if the
//! request is charged. A denied request returns its input state unchanged, so
//! denials never cost memory or capacity. A cost of 0 is a check: it is
//! admitted unless the key is over its limit, and changes nothing.
//!
//! Costs known only after the answer (tokens an LLM produced, bytes sent)
//! go through `charge(&self, state, now, cost)`: always counted, even past
//! the limit, which puts the key in debt, and later checks are denied until
//! the algorithm has paid it back at its own rate (a bucket's refill or
//! leak, a GCRA's spacing, a window's end, a sliding window's slide). The
//! debt is bounded: a charge keeps a key out at most
//! [`Limit::max_debt`] (by default one period of the limit) longer than
//! its limit itself would, whatever the cost, so one hostile charge
//! cannot lock a key out for years. Stores own the states and apply the
//! transitions atomically; algorithms never read a clock or touch a store.
//!
//! Times are nanoseconds since the epoch, valid up to 2^63 (the year
//! 2262). Within that range no accepted parameters make the arithmetic
//! saturate or overflow: bucket capacities are bounded by [`MAX_SPAN`],
//! sliding logs by [`MAX_LOG_LIMIT`], and a cost above a limit is denied
//! outright.
//!
//! | algorithm | state per key | exact? | choose it when |
//! |---|---|---|---|
//! | [`TokenBucket`] | 8 bytes | yes | you want an average rate with bursts up to a size |
//! | [`LeakyBucket`] | 16 bytes | yes | you think in "queue size and outflow" (meter) |
//! | [`Shaper`] | 8 bytes | yes | excess should wait, not fail (leaky bucket as a shaper) |
//! | [`FixedWindow`] | 16 bytes | per window | quotas per calendar minute/hour/day |
//! | [`SlidingLog`] | 8 bytes per admission in the window, whatever its cost | yes | "N in any W" must hold exactly, N small |
//! | [`SlidingCounter`] | 16 bytes | approximate | "N per W" smoothly, with counter memory |
//! | [`Gcra`] | 8 bytes | yes | a rate with a burst, the least memory and work |

mod fixed_window;
mod gcra;
mod leaky_bucket;
mod ring;
mod sliding_counter;
mod sliding_log;
mod token_bucket;
mod vsched;

pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::{LeakyBucket, Shaper};
pub use sliding_counter::SlidingCounter;
pub use sliding_log::{Log, MAX_LOG_LIMIT, SlidingLog};
pub use token_bucket::TokenBucket;

use std::num::NonZeroU64;

use crate::error::{Error, ErrorKind};
use crate::time::Nanos;

/// What one limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether this limit admits the request.
    pub allowed: bool,
    /// The limit's size in requests (capacity, burst or window limit).
    pub limit: u64,
    /// Requests of cost 1 still admissible right now, after this one if admitted.
    pub remaining: u64,
    /// Time until the limit is back to its fresh, full state (if this request is charged).
    pub reset: Nanos,
    /// When denied: time after which the same request would be admitted;
    /// [`Nanos::MAX`] if never (the cost exceeds the limit). Zero when admitted.
    pub retry_after: Nanos,
    /// When admitted by a [`Shaper`]: how long the request must wait in the queue.
    pub wait: Nanos,
}

impl Verdict {
    pub(crate) fn admit(limit: u64, remaining: u64, reset: Nanos) -> Verdict {
        Verdict {
            allowed: true,
            limit,
            remaining,
            reset,
            retry_after: Nanos::ZERO,
            wait: Nanos::ZERO,
        }
    }

    /// A denial that never clears (`retry_after` is [`Nanos::MAX`]) from a
    /// limit of size `limit` whose state was not read (`remaining` 0): a
    /// cost the limit can never admit, or a store that cannot decide.
    pub fn never(limit: u64) -> Verdict {
        Verdict::deny(limit, 0, Nanos::ZERO, Nanos::MAX)
    }

    pub(crate) fn deny(limit: u64, remaining: u64, reset: Nanos, retry_after: Nanos) -> Verdict {
        Verdict {
            allowed: false,
            limit,
            remaining,
            reset,
            retry_after,
            wait: Nanos::ZERO,
        }
    }
}

/// A rate: `count` units per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    count: u64,
    per: Nanos,
    /// Nanoseconds per unit, rounded up: rounding up makes every algorithm
    /// err on the side of admitting less, by under a nanosecond per unit.
    interval: u64,
}

impl Rate {
    /// `count` units every `per`.
    ///
    /// # Errors
    /// Zero count or period, or more than one unit per nanosecond.
    pub fn new(count: u64, per: Nanos) -> Result<Rate, Error> {
        if count == 0 {
            return Err(ErrorKind::Zero("rate count").into());
        }
        if per.0 == 0 {
            return Err(ErrorKind::ZeroDuration("rate period").into());
        }
        if count > per.0 {
            return Err(ErrorKind::RateTooHigh {
                count,
                per_nanos: per.0,
            }
            .into());
        }
        Ok(Rate {
            count,
            per,
            interval: per.0.div_ceil(count),
        })
    }

    /// Units in the period.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period.
    pub fn per(&self) -> Nanos {
        self.per
    }

    /// Nanoseconds per unit (rounded up).
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// Time to drain or refill `units` units.
    pub(crate) fn span(&self, units: u64) -> u64 {
        units.saturating_mul(self.interval)
    }
}

impl std::str::FromStr for Rate {
    type Err = Error;

    /// Parses `N/s`, `N/m`, `N/h`, `N/d` or `N/<duration>` such as
    /// `100/1m` (any unit [`parse_duration`](crate::parse_duration) takes).
    ///
    /// ```
    /// use spillway_core::{Nanos, Rate};
    /// let r: Rate = "100/1m".parse()?;
    /// assert_eq!((r.count(), r.per()), (100, Nanos::from_secs(60)));
    /// assert_eq!("5/s".parse::<Rate>()?.per(), Nanos::from_secs(1));
    /// # Ok::<(), spillway_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// No `/`, a count that is not a whole number, a bad duration, or a
    /// rate [`Rate::new`] refuses ([`ErrorKind::BadRate`], quoting the input).
    fn from_str(s: &str) -> Result<Rate, Error> {
        let bad = |msg: String| Error::from(ErrorKind::BadRate(msg));
        let (n, per) = s
            .split_once('/')
            .ok_or_else(|| bad(format!("{s:?} is not a rate: write e.g. 5/s, 100/1m")))?;
        let n: u64 = n.trim().parse().map_err(|_| {
            bad(format!(
                "{:?} in rate {s:?} is not a whole number",
                n.trim()
            ))
        })?;
        let per = per.trim();
        let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
            crate::time::parse_duration(per)
        } else {
            crate::time::parse_duration(&format!("1{per}"))
        }
        .map_err(|e| bad(e.to_string()))?;
        Rate::new(n, per).map_err(|e| bad(format!("rate {s:?}: {e}")))
    }
}

/// The longest span a bucket may take to refill or drain from empty to
/// full (`capacity x interval`): 2^62 ns, about 146 years. Bucket states
/// are the time the bucket is full or empty again, `now` plus at most this
/// span: with `now` before 2^63 ns (the year 2262) that never saturates,
/// so a full bucket is always told from a saturated one and every bucket a
/// constructor accepts is enforced.
pub const MAX_SPAN: Nanos = Nanos(1 << 62);

/// The longest [`Limit::max_debt`] a limit accepts: [`MAX_SPAN`], about
/// 146 years, so `now + horizon + debt` stays within a `u64` of
/// nanoseconds.
pub const MAX_DEBT: Nanos = MAX_SPAN;

/// The debt an algorithm allows: its own, or `period` by default.
#[inline]
pub(crate) fn debt_or(max_debt: Option<NonZeroU64>, period: u64) -> u64 {
    max_debt.map_or(period, NonZeroU64::get)
}

/// The largest capacity (or burst) whose drain or refill at `rate` takes
/// at most [`MAX_SPAN`].
pub(crate) fn max_capacity(rate: &Rate) -> u64 {
    MAX_SPAN.0 / rate.interval
}

/// Checks a bucket's capacity: from 1 to what `rate` refills or drains
/// within [`MAX_SPAN`].
pub(crate) fn capacity_param(what: &'static str, capacity: u64, rate: &Rate) -> Result<u64, Error> {
    let max = max_capacity(rate);
    if capacity > max {
        return Err(ErrorKind::LimitTooLarge {
            what,
            value: capacity,
            max,
        }
        .into());
    }
    nonzero(what, capacity)
}

/// Parameter check shared by the constructors.
pub(crate) fn nonzero(what: &'static str, v: u64) -> Result<u64, Error> {
    if v == 0 {
        Err(ErrorKind::Zero(what).into())
    } else {
        Ok(v)
    }
}

/// Checks a window algorithm's parameters: a window longer than zero and a
/// limit from 1 to `max`.
pub(crate) fn window_params(
    limit: u64,
    window: Nanos,
    what: &'static str,
    max: u64,
) -> Result<(), Error> {
    if window.0 == 0 {
        return Err(ErrorKind::ZeroDuration("window").into());
    }
    if limit > max {
        return Err(ErrorKind::LimitTooLarge {
            what,
            value: limit,
            max,
        }
        .into());
    }
    nonzero("limit", limit).map(|_| ())
}

/// Two words of state, for the algorithms that need more than a timestamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wide {
    /// First word; by convention the time after which the state is fresh.
    pub a: u64,
    /// Second word.
    pub b: u64,
}

/// Which kind of state an algorithm keeps, so a store knows where to put it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// One `u64` (a timestamp).
    Narrow,
    /// A [`Wide`].
    Wide,
    /// A [`Log`] of timestamps.
    Log,
}

/// One limit of a rule: an algorithm with its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// See [`Shaper`].
    Shaper(Shaper),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`SlidingCounter`].
    SlidingCounter(SlidingCounter),
    /// See [`Gcra`].
    Gcra(Gcra),
}

impl Limit {
    /// One limit in words, e.g. `sliding_window_log: 5 per 60s`.
    pub fn describe(&self) -> String {
        let secs = |n: Nanos| {
            let ms = n.as_millis_ceil();
            if ms.is_multiple_of(1000) {
                format!("{}s", ms / 1000)
            } else {
                format!("{ms}ms")
            }
        };
        match self {
            Limit::TokenBucket(a) => format!(
                "token_bucket: capacity {}, refill {} per {}",
                a.capacity(),
                a.refill().count(),
                secs(a.refill().per())
            ),
            Limit::LeakyBucket(a) => format!(
                "leaky_bucket: capacity {}, leak {} per {}",
                a.capacity(),
                a.leak().count(),
                secs(a.leak().per())
            ),
            Limit::Shaper(a) => format!(
                "leaky_bucket (queue): capacity {}, leak {} per {}, max wait {}",
                a.capacity(),
                a.leak().count(),
                secs(a.leak().per()),
                secs(a.max_wait())
            ),
            Limit::FixedWindow(a) => {
                format!("fixed_window: {} per {}", a.limit(), secs(a.window()))
            }
            Limit::SlidingLog(a) => {
                format!("sliding_window_log: {} per {}", a.limit(), secs(a.window()))
            }
            Limit::SlidingCounter(a) => format!(
                "sliding_window_counter: {} per {}",
                a.limit(),
                secs(a.window())
            ),
            Limit::Gcra(a) => format!(
                "gcra: {} per {}, burst {}",
                a.rate().count(),
                secs(a.rate().per()),
                a.burst()
            ),
        }
    }

    /// Where this limit's state lives.
    pub fn state_kind(&self) -> StateKind {
        match self {
            Limit::TokenBucket(_) | Limit::Shaper(_) | Limit::Gcra(_) => StateKind::Narrow,
            Limit::LeakyBucket(_) | Limit::FixedWindow(_) | Limit::SlidingCounter(_) => {
                StateKind::Wide
            }
            Limit::SlidingLog(_) => StateKind::Log,
        }
    }

    /// The limit's size in requests.
    pub fn size(&self) -> u64 {
        match self {
            Limit::TokenBucket(a) => a.capacity(),
            Limit::LeakyBucket(a) => a.capacity(),
            Limit::Shaper(a) => a.capacity(),
            Limit::FixedWindow(a) => a.limit(),
            Limit::SlidingLog(a) => a.limit(),
            Limit::SlidingCounter(a) => a.limit(),
            Limit::Gcra(a) => a.burst(),
        }
    }

    /// The window or period the limit is expressed over (for `RateLimit-Policy`).
    pub fn window(&self) -> Nanos {
        match self {
            Limit::TokenBucket(a) => Nanos(a.refill().span(a.capacity())),
            Limit::LeakyBucket(a) => Nanos(a.leak().span(a.capacity())),
            Limit::Shaper(a) => Nanos(a.leak().span(a.capacity())),
            Limit::FixedWindow(a) => a.window(),
            Limit::SlidingLog(a) => a.window(),
            Limit::SlidingCounter(a) => a.window(),
            Limit::Gcra(a) => Nanos(a.rate().span(a.burst())),
        }
    }

    /// The most a charge after the fact may leave this limit owing: how
    /// much longer than its limit itself would, a charge of any cost may
    /// keep a key out. By default one period ([`Limit::window`]: a
    /// window, or the time a bucket or GCRA takes to refill or drain its
    /// whole size). A fixed window's or a sliding log's debt ends with
    /// the window whatever this says: a count past the limit clears when
    /// a full one would, so it never keeps a key out longer.
    pub fn max_debt(&self) -> Nanos {
        match self {
            Limit::TokenBucket(a) => a.max_debt(),
            Limit::LeakyBucket(a) => a.max_debt(),
            Limit::Shaper(a) => a.max_debt(),
            Limit::SlidingCounter(a) => a.max_debt(),
            Limit::Gcra(a) => a.max_debt(),
            Limit::FixedWindow(_) | Limit::SlidingLog(_) => self.window(),
        }
    }

    /// The same limit with its debt bounded by `max_debt` (see
    /// [`Limit::max_debt`]): `max_debt: 10m` in a rules file. A fixed
    /// window or a sliding log keeps no debt past its window, so it is
    /// accepted there and changes nothing.
    ///
    /// ```
    /// use spillway_core::{Gcra, Limit, Nanos, Rate};
    /// let g = Limit::Gcra(Gcra::new(Rate::new(1, Nanos::from_secs(1))?, 10)?);
    /// assert_eq!(g.max_debt(), Nanos::from_secs(10));
    /// let g = g.with_max_debt(Nanos::from_secs(60))?;
    /// // A charge of 2^32 keeps the key out a minute past its burst, not 136 years.
    /// let Limit::Gcra(a) = &g else { unreachable!() };
    /// let (v, _) = a.charge(0, Nanos::from_secs(1000), 1 << 32);
    /// assert_eq!(v.retry_after, Nanos::from_secs(60));
    /// # Ok::<(), spillway_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// `max_debt` is zero ([`ErrorKind::ZeroDuration`]) or longer than
    /// [`MAX_DEBT`] ([`ErrorKind::LimitTooLarge`], in nanoseconds).
    pub fn with_max_debt(&self, max_debt: Nanos) -> Result<Limit, Error> {
        if max_debt > MAX_DEBT {
            return Err(ErrorKind::LimitTooLarge {
                what: "max_debt in nanoseconds",
                value: max_debt.0,
                max: MAX_DEBT.0,
            }
            .into());
        }
        let d = NonZeroU64::new(max_debt.0).ok_or(ErrorKind::ZeroDuration("max_debt"))?;
        Ok(self.with_debt(Some(d)))
    }

    /// The debt this limit was given (`None`: the default).
    fn own_debt(&self) -> Option<NonZeroU64> {
        match self {
            Limit::TokenBucket(a) => a.own_debt(),
            Limit::LeakyBucket(a) => a.own_debt(),
            Limit::Shaper(a) => a.own_debt(),
            Limit::SlidingCounter(a) => a.own_debt(),
            Limit::Gcra(a) => a.own_debt(),
            Limit::FixedWindow(_) | Limit::SlidingLog(_) => None,
        }
    }

    /// The same limit with debt `d` (`None`: the default).
    fn with_debt(&self, d: Option<NonZeroU64>) -> Limit {
        match self {
            Limit::TokenBucket(a) => Limit::TokenBucket(a.with_max_debt(d)),
            Limit::LeakyBucket(a) => Limit::LeakyBucket(a.with_max_debt(d)),
            Limit::Shaper(a) => Limit::Shaper(a.with_max_debt(d)),
            Limit::SlidingCounter(a) => Limit::SlidingCounter(a.with_max_debt(d)),
            Limit::Gcra(a) => Limit::Gcra(a.with_max_debt(d)),
            Limit::FixedWindow(_) | Limit::SlidingLog(_) => self.clone(),
        }
    }

    /// The same limit with its size raised by `percent` (soft mode), rounded down,
    /// never below the original.
    pub fn scaled(&self, percent: u32) -> Limit {
        let up = |n: u64| -> u64 {
            let extra = (u128::from(n) * u128::from(percent) / 100) as u64;
            n.saturating_add(extra)
        };
        match self {
            Limit::TokenBucket(a) => Limit::TokenBucket(a.with_capacity(up(a.capacity()))),
            Limit::LeakyBucket(a) => Limit::LeakyBucket(a.with_capacity(up(a.capacity()))),
            Limit::Shaper(a) => Limit::Shaper(a.with_capacity(up(a.capacity()))),
            Limit::FixedWindow(a) => Limit::FixedWindow(a.with_limit(up(a.limit()))),
            Limit::SlidingLog(a) => Limit::SlidingLog(a.with_limit(up(a.limit()))),
            Limit::SlidingCounter(a) => Limit::SlidingCounter(a.with_limit(up(a.limit()))),
            Limit::Gcra(a) => Limit::Gcra(a.with_burst(up(a.burst()))),
        }
    }

    /// The same limit with its size (capacity, burst or window limit) set
    /// to `size`, its rate and window unchanged: what `spillway simulate`
    /// tries when it looks for the smallest size that limits few enough
    /// clients. A `size` of 0 is taken as 1, and a size above what the
    /// algorithm accepts (a bucket's capacity past what its rate refills
    /// in [`MAX_SPAN`], a log's limit past [`MAX_LOG_LIMIT`]) as that
    /// maximum.
    ///
    /// ```
    /// use spillway_core::{FixedWindow, Limit, Nanos};
    /// let w = Limit::FixedWindow(FixedWindow::new(100, Nanos::from_secs(60))?);
    /// assert_eq!(w.with_size(7).size(), 7);
    /// assert_eq!(w.with_size(7).window(), w.window());
    /// # Ok::<(), spillway_core::Error>(())
    /// ```
    pub fn with_size(&self, size: u64) -> Limit {
        let size = size.max(1);
        match self {
            Limit::TokenBucket(a) => {
                Limit::TokenBucket(a.with_capacity(size.min(max_capacity(&a.refill()))))
            }
            Limit::LeakyBucket(a) => {
                Limit::LeakyBucket(a.with_capacity(size.min(max_capacity(&a.leak()))))
            }
            Limit::Shaper(a) => Limit::Shaper(a.with_capacity(size.min(max_capacity(&a.leak())))),
            Limit::FixedWindow(a) => Limit::FixedWindow(a.with_limit(size)),
            Limit::SlidingLog(a) => Limit::SlidingLog(a.with_limit(size.min(MAX_LOG_LIMIT))),
            Limit::SlidingCounter(a) => Limit::SlidingCounter(a.with_limit(size)),
            Limit::Gcra(a) => Limit::Gcra(a.with_burst(size.min(max_capacity(&a.rate())))),
        }
    }

    /// One instance's share of this limit among `n`: every size (capacity,
    /// burst, window limit) divided by `n`, rounded down but at least 1,
    /// and every rate divided by `n` (the same count over `n` times the
    /// period), so `n` instances each enforcing it admit at most the
    /// whole limit (plus up to one unit each where a size rounds up to
    /// 1). A share that cannot be represented (a period past 2^64 ns)
    /// keeps the rate whole; `n` of 0 or 1 is the limit itself.
    ///
    /// ```
    /// use spillway_core::{FixedWindow, Gcra, Limit, Nanos, Rate};
    /// let w = Limit::FixedWindow(FixedWindow::new(100, Nanos::from_secs(60))?);
    /// assert_eq!(w.shared(4).size(), 25);
    /// let g = Limit::Gcra(Gcra::new(Rate::new(10, Nanos::from_secs(1))?, 8)?);
    /// let Limit::Gcra(s) = g.shared(4) else { unreachable!() };
    /// assert_eq!((s.burst(), s.rate().per()), (2, Nanos::from_secs(4)));
    /// # Ok::<(), spillway_core::Error>(())
    /// ```
    pub fn shared(&self, n: u64) -> Limit {
        if n <= 1 {
            return self.clone();
        }
        let size = |s: u64| (s / n).max(1);
        let rate = |r: Rate| {
            r.per
                .0
                .checked_mul(n)
                .and_then(|per| Rate::new(r.count, Nanos(per)).ok())
                .unwrap_or(r)
        };
        let shared = match self {
            Limit::TokenBucket(a) => {
                TokenBucket::new(size(a.capacity()), rate(a.refill())).map(Limit::TokenBucket)
            }
            Limit::LeakyBucket(a) => {
                LeakyBucket::new(size(a.capacity()), rate(a.leak())).map(Limit::LeakyBucket)
            }
            Limit::Shaper(a) => {
                Shaper::new(size(a.capacity()), rate(a.leak()), a.max_wait()).map(Limit::Shaper)
            }
            Limit::FixedWindow(a) => {
                FixedWindow::new(size(a.limit()), a.window()).map(Limit::FixedWindow)
            }
            Limit::SlidingLog(a) => {
                SlidingLog::new(size(a.limit()), a.window()).map(Limit::SlidingLog)
            }
            Limit::SlidingCounter(a) => {
                SlidingCounter::new(size(a.limit()), a.window()).map(Limit::SlidingCounter)
            }
            Limit::Gcra(a) => Gcra::new(rate(a.rate()), size(a.burst())).map(Limit::Gcra),
        };
        // Smaller sizes and slower rates stay within every bound the
        // original met; should one not, the original is the safe answer.
        // A share owes what the whole would (a debt set, or its own period).
        shared.map_or_else(|_| self.clone(), |l| l.with_debt(self.own_debt()))
    }

    /// Decides for a narrow-state limit; `None` if this limit keeps another kind of state.
    pub fn decide_narrow(&self, state: u64, now: Nanos, cost: u64) -> Option<(Verdict, u64)> {
        Some(match self {
            Limit::TokenBucket(a) => a.decide(state, now, cost),
            Limit::Shaper(a) => a.decide(state, now, cost),
            Limit::Gcra(a) => a.decide(state, now, cost),
            _ => return None,
        })
    }

    /// Decides for a wide-state limit; `None` if this limit keeps another kind of state.
    #[inline]
    pub fn decide_wide(&self, state: Wide, now: Nanos, cost: u64) -> Option<(Verdict, Wide)> {
        Some(match self {
            Limit::LeakyBucket(a) => a.decide(state, now, cost),
            Limit::FixedWindow(a) => a.decide(state, now, cost),
            Limit::SlidingCounter(a) => a.decide(state, now, cost),
            _ => return None,
        })
    }

    /// Charges a narrow-state limit after the fact (see
    /// [`TokenBucket::charge`]); `None` if this limit keeps another kind of
    /// state.
    pub fn charge_narrow(&self, state: u64, now: Nanos, cost: u64) -> Option<(Verdict, u64)> {
        Some(match self {
            Limit::TokenBucket(a) => a.charge(state, now, cost),
            Limit::Shaper(a) => a.charge(state, now, cost),
            Limit::Gcra(a) => a.charge(state, now, cost),
            _ => return None,
        })
    }

    /// Charges a wide-state limit after the fact (see
    /// [`FixedWindow::charge`]); `None` if this limit keeps another kind of
    /// state.
    pub fn charge_wide(&self, state: Wide, now: Nanos, cost: u64) -> Option<(Verdict, Wide)> {
        Some(match self {
            Limit::LeakyBucket(a) => a.charge(state, now, cost),
            Limit::FixedWindow(a) => a.charge(state, now, cost),
            Limit::SlidingCounter(a) => a.charge(state, now, cost),
            _ => return None,
        })
    }

    /// A short name of the algorithm, as written in rules files.
    pub fn algorithm_name(&self) -> &'static str {
        match self {
            Limit::TokenBucket(_) => "token_bucket",
            Limit::LeakyBucket(_) => "leaky_bucket",
            Limit::Shaper(_) => "leaky_bucket_shaper",
            Limit::FixedWindow(_) => "fixed_window",
            Limit::SlidingLog(_) => "sliding_window_log",
            Limit::SlidingCounter(_) => "sliding_window_counter",
            Limit::Gcra(_) => "gcra",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The syntax and messages of the server's `parse_rate`, which this replaces.
    #[test]
    fn rates_parse_as_rules_files_write_them() {
        for (given, count, per) in [
            ("100/1m", 100, Nanos::from_secs(60)),
            ("5/s", 5, Nanos::from_secs(1)),
            (" 7 / h ", 7, Nanos::from_secs(3600)),
            ("1/d", 1, Nanos::from_secs(86_400)),
            ("3/500ms", 3, Nanos::from_millis(500)),
        ] {
            let r: Rate = given.parse().unwrap();
            assert_eq!((r.count(), r.per()), (count, per), "{given}");
        }
        for (given, message) in [
            ("5", r#""5" is not a rate: write e.g. 5/s, 100/1m"#),
            ("x/s", r#""x" in rate "x/s" is not a whole number"#),
            ("-1/s", r#""-1" in rate "-1/s" is not a whole number"#),
            ("5/y", r#"unknown unit "y" in "1y": use ms, s, m, h or d"#),
            ("5/", r#""1" has no unit: write e.g. 500ms, 1s, 1m, 1h, 1d"#),
            ("0/s", r#"rate "0/s": rate count must be at least 1"#),
            (
                "5/0s",
                r#"rate "5/0s": rate period must be longer than zero"#,
            ),
            (
                "2/1ns",
                r#"rate "2/1ns": rate 2 per 1ns is more than one per nanosecond"#,
            ),
        ] {
            let e = given.parse::<Rate>().unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::BadRate(_)), "{given}");
            assert_eq!(e.to_string(), message, "{given}");
        }
    }

    proptest::proptest! {
        /// Any text: a rate or an error, never a panic.
        #[test]
        fn parsing_a_rate_never_panics(s in "\\PC{0,12}", t in "[0-9]{0,21}/[0-9.]{0,22}(ns|ms|s|m|h|d|x|)") {
            let _ = s.parse::<Rate>();
            let _ = t.parse::<Rate>();
        }
    }
}
