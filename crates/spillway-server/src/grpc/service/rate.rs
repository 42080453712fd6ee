//! A limit as Envoy's `current_limit` reports it: a whole number of
//! requests per unit of time.

use spillway_core::{Limit, Nanos};

use crate::grpc::proto::Unit;

/// Envoy's units, shortest first (a month is 30 days and a year 365, as
/// envoyproxy/ratelimit counts them).
const UNITS: [Unit; 7] = [
    Unit::Second,
    Unit::Minute,
    Unit::Hour,
    Unit::Day,
    Unit::Week,
    Unit::Month,
    Unit::Year,
];

/// The rate a limit sustains, as `count` per `per`: a window's limit per
/// window; a bucket's refill or leak rate; GCRA's rate. (A bucket's
/// capacity or GCRA's burst is how much may come at once, which Envoy's
/// format has no field for.)
pub fn sustained(limit: &Limit) -> (u64, Nanos) {
    match limit {
        Limit::FixedWindow(a) => (a.limit(), a.window()),
        Limit::SlidingLog(a) => (a.limit(), a.window()),
        Limit::SlidingCounter(a) => (a.limit(), a.window()),
        Limit::TokenBucket(a) => (a.refill().count(), a.refill().per()),
        Limit::LeakyBucket(a) => (a.leak().count(), a.leak().per()),
        Limit::Shaper(a) => (a.leak().count(), a.leak().per()),
        Limit::Gcra(a) => (a.rate().count(), a.rate().per()),
    }
}

/// `limit` as requests per unit: in the unit of its own period (the
/// longest unit not longer than the window, or the rate's period; a
/// second for shorter ones) if the rate is a whole number there, else in
/// the first longer unit where it is, so the figure is exact: `gcra: {
/// rate: 100/1m }` is 100 per minute, a window of 10 per 2 minutes is 5 per
/// minute, 1 per 100ms is 10 per second. A rate exact in no unit (3 per
/// 7 s is 259,200 per week, exact; 1 per 90 days is in none) is rounded
/// to the nearest whole number in its own unit, and at least 1.
pub fn envoy_rate(limit: &Limit) -> (u32, Unit) {
    let (count, per) = sustained(limit);
    let per = u128::from(per.as_u64().max(1));
    let ns = |u: Unit| u128::from(u.seconds()) * 1_000_000_000;
    let start = UNITS.iter().rposition(|u| ns(*u) <= per).unwrap_or(0);
    for &unit in &UNITS[start..] {
        let scaled = u128::from(count) * ns(unit);
        if scaled % per == 0
            && let Ok(n) = u32::try_from(scaled / per)
        {
            return (n, unit);
        }
    }
    let unit = UNITS[start];
    let n = (u128::from(count) * ns(unit) + per / 2) / per;
    (u32::try_from(n.max(1)).unwrap_or(u32::MAX), unit)
}

/// `duration_until_reset` in whole seconds, as envoyproxy/ratelimit gives
/// it: the time left rounded up (its fixed windows end on whole seconds,
/// and it reports the unit's length minus the seconds elapsed in it).
pub fn reset_seconds(reset: Nanos) -> i64 {
    i64::try_from(reset.as_u64().div_ceil(1_000_000_000)).unwrap_or(i64::MAX)
}

/// The time left in the current `unit` of the epoch at `now_secs`, as
/// envoyproxy/ratelimit computes it for a limit it reports in `unit`.
pub fn unit_reset(unit: Unit, now_secs: u64) -> i64 {
    let len = unit.seconds().max(1);
    i64::try_from(len - now_secs % len).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{FixedWindow, Gcra, Rate, SlidingLog, TokenBucket};

    fn rate(count: u64, per_ms: u64) -> Rate {
        Rate::new(count, Nanos::from_millis(per_ms)).unwrap()
    }

    #[test]
    fn each_algorithm_is_reported_in_the_unit_its_rate_is_exact_in() {
        let fw = |n, s| Limit::FixedWindow(FixedWindow::new(n, Nanos::from_secs(s)).unwrap());
        assert_eq!(envoy_rate(&fw(10, 60)), (10, Unit::Minute));
        assert_eq!(envoy_rate(&fw(120, 60)), (120, Unit::Minute));
        assert_eq!(envoy_rate(&fw(10, 3600)), (10, Unit::Hour));
        assert_eq!(envoy_rate(&fw(10, 120)), (5, Unit::Minute));
        assert_eq!(envoy_rate(&fw(10, 5)), (2, Unit::Second));
        assert_eq!(envoy_rate(&fw(3, 7)), (259_200, Unit::Week));
        assert_eq!(envoy_rate(&fw(5, 86_400 * 30)), (5, Unit::Month));
        // 1 per 90 days: exact in no unit; a month's share, rounded, at least 1.
        assert_eq!(envoy_rate(&fw(1, 86_400 * 90)), (1, Unit::Month));
        let gcra = |r, burst| Limit::Gcra(Gcra::new(r, burst).unwrap());
        assert_eq!(
            envoy_rate(&gcra(rate(100, 60_000), 20)),
            (100, Unit::Minute)
        );
        assert_eq!(envoy_rate(&gcra(rate(1, 100), 5)), (10, Unit::Second));
        assert_eq!(envoy_rate(&gcra(rate(90, 60_000), 5)), (90, Unit::Minute));
        let tb = Limit::TokenBucket(TokenBucket::new(50, rate(600, 3_600_000)).unwrap());
        assert_eq!(envoy_rate(&tb), (600, Unit::Hour));
        let log = Limit::SlidingLog(SlidingLog::new(2, Nanos::from_secs(60)).unwrap());
        assert_eq!(envoy_rate(&log), (2, Unit::Minute));
    }

    #[test]
    fn resets_round_up_to_whole_seconds() {
        assert_eq!(reset_seconds(Nanos::from_millis(19_700)), 20);
        assert_eq!(reset_seconds(Nanos::from_secs(60)), 60);
        assert_eq!(reset_seconds(Nanos::ZERO), 0);
        assert_eq!(unit_reset(Unit::Minute, 100), 20);
        assert_eq!(unit_reset(Unit::Minute, 120), 60);
        assert_eq!(unit_reset(Unit::Second, 7), 1);
    }
}
