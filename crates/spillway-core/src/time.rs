//! Time as integer nanoseconds, and the clock that supplies it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
