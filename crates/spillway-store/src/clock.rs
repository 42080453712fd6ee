use std::time::{Instant, SystemTime, UNIX_EPOCH};

use spillway_core::{Clock, Nanos};

/// The real clock: monotonic, anchored once to the Unix epoch.
///
/// It reads the wall clock once, at creation, and from then on adds the
/// monotonic time elapsed, so it never steps back when NTP adjusts the wall
/// clock, and fixed windows still line up with wall-clock boundaries.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    start: Instant,
    epoch_at_start: u64,
}

impl SystemClock {
    /// Anchors a new clock now.
    pub fn new() -> SystemClock {
        let epoch_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| Nanos::from(d).as_u64())
            .unwrap_or(0);
        SystemClock {
            start: Instant::now(),
            epoch_at_start,
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        Nanos(self.epoch_at_start).saturating_add(Nanos::from(self.start.elapsed()))
    }
}
