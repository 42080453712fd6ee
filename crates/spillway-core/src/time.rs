//! Time as integer nanoseconds, and the clock that supplies it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, ErrorKind};

/// A point in time or a span of time, in nanoseconds.
///
/// Points are measured from the Unix epoch (the server anchors a monotonic
/// clock there once at start-up), so fixed windows line up with wall-clock
/// minutes and hours. A `u64` of nanoseconds lasts until the year 2554 and
/// fits any per-key state in one machine word. All arithmetic saturates:
/// no input can make time wrap around.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Nanos {
    /// Zero: the epoch, or no time at all.
    pub const ZERO: Nanos = Nanos(0);
    /// The largest representable time; used as "never".
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// Nanoseconds in a millisecond.
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// Whole seconds.
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s.saturating_mul(1_000_000_000))
    }

    /// The raw count.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Milliseconds, rounded up, so a client told to wait never retries early.
    pub const fn as_millis_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000)
    }

    /// Whole seconds, rounded up (what `Retry-After` wants).
    pub const fn as_secs_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000_000)
    }

    /// `self + rhs`, stopping at [`Nanos::MAX`].
    pub const fn saturating_add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }

    /// `self - rhs`, stopping at zero.
    pub const fn saturating_sub(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(rhs.0))
    }

    /// True for the "never" sentinel.
    pub const fn is_never(self) -> bool {
        self.0 == u64::MAX
    }
}

impl From<Duration> for Nanos {
    fn from(d: Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Nanos> for Duration {
    fn from(n: Nanos) -> Duration {
        Duration::from_nanos(n.0)
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// Parses a duration as rules files write it: `500ms`, `1s`, `1m`, `1h`,
/// `1d` (also `ns`, `us` or `µs`, `sec`, `min`; a decimal like `1.5s`,
/// with up to 9 decimals), surrounding spaces ignored.
///
/// # Examples
/// ```
/// use spillway_core::{Nanos, parse_duration};
/// assert_eq!(parse_duration("1.5s")?, Nanos::from_millis(1500));
/// assert_eq!(parse_duration(" 1d ")?, Nanos::from_secs(86_400));
/// assert_eq!(
///     parse_duration("1y").unwrap_err().to_string(),
///     r#"unknown unit "y" in "1y": use ms, s, m, h or d"#
/// );
/// # Ok::<(), spillway_core::Error>(())
/// ```
///
/// # Errors
/// No unit, an unknown unit, no number, a number that is not one, more
/// than 9 decimals, or more nanoseconds than a `u64` holds (about 584
/// years); the message quotes the input ([`ErrorKind::BadDuration`]).
pub fn parse_duration(s: &str) -> Result<Nanos, Error> {
    let bad = |msg: String| Error::from(ErrorKind::BadDuration(msg));
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| {
            bad(format!(
                "{s:?} has no unit: write e.g. 500ms, 1s, 1m, 1h, 1d"
            ))
        })?;
    let (num, unit) = s.split_at(split);
    let unit_ns: u128 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        other => {
            return Err(bad(format!(
                "unknown unit {other:?} in {s:?}: use ms, s, m, h or d"
            )));
        }
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(bad(format!("{s:?} has no number")));
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse()
            .map_err(|_| bad(format!("{s:?} is not a number")))?
    };
    let mut total = int.saturating_mul(unit_ns);
    if !frac.is_empty() {
        if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("{s:?}: at most 9 decimals")));
        }
        let f: u128 = frac
            .parse()
            .map_err(|_| bad(format!("{s:?} is not a number")))?;
        // At most 9 digits times a day's nanoseconds: far inside a u128.
        total = total.saturating_add(f * unit_ns / 10u128.pow(frac.len() as u32));
    }
    let ns = u64::try_from(total).map_err(|_| bad(format!("{s:?} is too long")))?;
    Ok(Nanos(ns))
}

/// A source of the current time.
///
/// Everything that decides takes `now` as an argument; only the layer that
/// owns a clock reads it. Tests drive [`ManualClock`] instead of sleeping.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Nanos;
}

/// A clock that moves only when told to; clones share one time.
///
/// # Examples
/// ```
/// use spillway_core::{Clock, ManualClock, Nanos};
/// let clock = ManualClock::new(Nanos::from_secs(10));
/// clock.advance(Nanos::from_millis(1500));
/// assert_eq!(clock.now(), Nanos::from_millis(11_500));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: Nanos) -> ManualClock {
        ManualClock {
            now: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Nanos) {
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by.0))
            });
    }

    /// Sets the clock to `to`, which may be in the past (to test clocks that step back).
    pub fn set(&self, to: Nanos) {
        self.now.store(to.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The syntax and messages of the server's parser, which this replaces.
    #[test]
    fn durations_parse_as_rules_files_write_them() {
        for (given, want) in [
            ("500ms", Nanos::from_millis(500)),
            ("1d", Nanos::from_secs(86_400)),
            ("1.5s", Nanos::from_millis(1500)),
            (" 2 min ", Nanos::from_secs(120)),
            ("1h", Nanos::from_secs(3600)),
            ("3us", Nanos(3_000)),
            ("3µs", Nanos(3_000)),
            ("7ns", Nanos(7)),
            (".5m", Nanos::from_secs(30)),
            ("1.000000001s", Nanos(1_000_000_001)),
            ("0s", Nanos::ZERO),
            ("18446744073709551615ns", Nanos::MAX),
        ] {
            assert_eq!(parse_duration(given), Ok(want), "{given}");
        }
        for (given, message) in [
            ("5", r#""5" has no unit: write e.g. 500ms, 1s, 1m, 1h, 1d"#),
            (
                "-1s",
                r#"unknown unit "-1s" in "-1s": use ms, s, m, h or d"#,
            ),
            ("1y", r#"unknown unit "y" in "1y": use ms, s, m, h or d"#),
            ("s", r#""s" has no number"#),
            (".s", r#"".s" has no number"#),
            ("1.2.3s", r#""1.2.3s": at most 9 decimals"#),
            ("1.0000000001s", r#""1.0000000001s": at most 9 decimals"#),
            (
                "99999999999999999999d",
                r#""99999999999999999999d" is too long"#,
            ),
            (
                "18446744073709551616ns",
                r#""18446744073709551616ns" is too long"#,
            ),
            ("", r#""" has no unit: write e.g. 500ms, 1s, 1m, 1h, 1d"#),
        ] {
            let e = parse_duration(given).unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::BadDuration(_)), "{given}");
            assert_eq!(e.to_string(), message, "{given}");
        }
    }

    proptest::proptest! {
        /// Any text: a duration or an error, never a panic.
        #[test]
        fn parse_duration_never_panics(s in "\\PC{0,12}", t in "[0-9.]{0,25}(ns|us|µs|ms|s|m|h|d|x|)") {
            let _ = parse_duration(&s);
            let _ = parse_duration(&t);
        }

        /// `{n}ms` is `n` milliseconds, or too long when that overflows.
        #[test]
        fn milliseconds_round_trip(n in proptest::prelude::any::<u64>()) {
            let text = format!("{n}ms");
            match n.checked_mul(1_000_000) {
                Some(ns) => proptest::prop_assert_eq!(parse_duration(&text), Ok(Nanos(ns))),
                None => proptest::prop_assert_eq!(
                    parse_duration(&text).unwrap_err().to_string(),
                    format!("{text:?} is too long")
                ),
            }
        }
    }
}
