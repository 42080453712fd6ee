//! Elastic allowances: how far a rule may admit past its limit while the
//! service behind it has room (the groundwork of `mode: elastic N%`).
//!
//! Health is one number, the service's **load**: 0 idle, 1 at capacity,
//! more past it. It comes from what the service reports (`load`, or a
//! latency or error share measured against its target, whichever is
//! worst: see [`Health::from_signals`]) or is **unknown** (never
//! reported, or stale). An elastic rule of `percent` admits up to
//! `percent / 100` times its limit at low load and shrinks smoothly to
//! its plain limit as the load rises from [`KNEE`] to 1: a smoothstep, so
//! neither the allowance nor its slope jumps (no cliff that would turn a
//! small rise in load into a wave of denials). Unknown health is the
//! plain limit: elasticity is only ever granted on evidence.

/// The load up to which an elastic rule admits its whole allowance.
pub const KNEE: f64 = 0.5;

/// What is known of the service's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Health {
    /// Nothing (never reported, or the last report is stale).
    Unknown,
    /// Its load: 0 idle, 1 at capacity, above 1 past it.
    Load(f64),
}

impl Health {
    /// Health from the signals a service or a proxy sees, each as a share
    /// of its own limit (1 = at it): the reported load, the latency over
    /// its target, the error rate over its maximum. The worst one counts;
    /// signals that are absent or not finite count as absent, and none at
    /// all is [`Health::Unknown`].
    pub fn from_signals(load: Option<f64>, latency: Option<f64>, errors: Option<f64>) -> Health {
        let worst = [load, latency, errors]
            .into_iter()
            .flatten()
            .filter(|v| v.is_finite())
            .map(|v| v.max(0.0))
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        worst.map_or(Health::Unknown, Health::Load)
    }

    /// The worse of two views of the service (one unknown: the other).
    pub fn worst(self, other: Health) -> Health {
        match (self, other) {
            (Health::Unknown, h) | (h, Health::Unknown) => h,
            (Health::Load(a), Health::Load(b)) => Health::from_signals(Some(a), Some(b), None),
        }
    }

    /// The share of the extra allowance in force: 1 at or below
    /// [`KNEE`], 0 at or above a load of 1 and when unknown, smooth and
    /// never increasing in between.
    pub fn room(self) -> f64 {
        match self {
            Health::Unknown => 0.0,
            Health::Load(l) if l.is_nan() => 0.0,
            Health::Load(l) => {
                let t = ((l - KNEE) / (1.0 - KNEE)).clamp(0.0, 1.0);
                1.0 - t * t * (3.0 - 2.0 * t)
            }
        }
    }
}

/// An elastic rule's reach: up to `percent` % of the limit while healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elastic {
    percent: u32,
}

/// The most an elastic rule may reach: 100 times its limit.
pub const MAX_PERCENT: u32 = 10_000;

impl Elastic {
    /// An elastic reach of `percent` % (100 to [`MAX_PERCENT`]; 100 is the
    /// plain limit). `None` outside that range.
    pub fn new(percent: u32) -> Option<Elastic> {
        (100..=MAX_PERCENT)
            .contains(&percent)
            .then_some(Elastic { percent })
    }

    /// The reach, in percent of the limit.
    pub fn percent(self) -> u32 {
        self.percent
    }

    /// The size a limit of `size` admits up to at `health`: from `size`
    /// (unknown health, load 1 or more) to `size * percent / 100` (load
    /// at or below [`KNEE`]), rounded down, never below `size`.
    pub fn allowance(self, size: u64, health: Health) -> u64 {
        let extra = size as f64 * f64::from(self.percent - 100) / 100.0;
        let grant = (extra * health.room()).floor();
        // Saturating: a huge limit and reach cannot wrap.
        size.saturating_add(grant as u64)
    }
}

/// How many steps an elastic rule's allowance takes between its plain
/// limit and its whole reach: the rule keeps its limits scaled for each
/// step, and a decision reads the step in force (one atomic load).
pub const LEVELS: usize = 32;

impl Elastic {
    /// The percent above the limit a rule admits at `level` (0 to
    /// [`LEVELS`]): 0 at level 0, `percent - 100` at [`LEVELS`], in
    /// between in proportion, rounded down.
    pub fn extra_percent_at(self, level: usize) -> u32 {
        let level = level.min(LEVELS) as u64;
        let extra = u64::from(self.percent - 100) * level / LEVELS as u64;
        u32::try_from(extra).unwrap_or(u32::MAX)
    }
}

/// The service's health as the elastic rules of one limiter read it: set
/// by whatever watches the service (the proxy's measurements, reports
/// through the admin API), read by every decision of an elastic rule as
/// one atomic load. Shared behind an `Arc`; two gauges are equal only if
/// they are the same one.
#[derive(Debug, Default)]
pub struct HealthGauge {
    /// The room in force, in steps of 1 / [`LEVELS`], rounded down.
    level: std::sync::atomic::AtomicUsize,
    /// The load last set, as `f64` bits; `u64::MAX` when unknown.
    load: std::sync::atomic::AtomicU64,
}

impl HealthGauge {
    /// A gauge that knows nothing yet (elastic rules at their plain limit).
    pub fn new() -> HealthGauge {
        HealthGauge {
            level: std::sync::atomic::AtomicUsize::new(0),
            load: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }

    /// Sets the health in force.
    pub fn set(&self, health: Health) {
        use std::sync::atomic::Ordering::Relaxed;
        // Rounded down: the allowance in force never exceeds the one the
        // health gives.
        let level = (health.room() * LEVELS as f64).floor();
        let level = if level.is_finite() {
            (level.max(0.0) as usize).min(LEVELS)
        } else {
            0
        };
        self.level.store(level, Relaxed);
        let bits = match health {
            Health::Load(l) if !l.is_nan() => l.to_bits(),
            _ => u64::MAX,
        };
        self.load.store(bits, Relaxed);
    }

    /// The step in force, 0 (plain limits) to [`LEVELS`] (the whole reach).
    pub fn level(&self) -> usize {
        self.level.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The health last set.
    pub fn health(&self) -> Health {
        match self.load.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => Health::Unknown,
            bits => Health::Load(f64::from_bits(bits)),
        }
    }
}

impl PartialEq for HealthGauge {
    fn eq(&self, other: &HealthGauge) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for HealthGauge {}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn loads() -> impl Strategy<Value = f64> {
        prop_oneof![
            -1.0f64..3.0,
            Just(0.0),
            Just(KNEE),
            Just(1.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
        ]
    }

    proptest! {
        /// Between the plain limit and `percent` % of it.
        #[test]
        fn the_allowance_is_between_the_limit_and_its_reach(
            size in 1u64..1_000_000_000,
            percent in 100u32..=MAX_PERCENT,
            load in loads(),
        ) {
            let e = Elastic::new(percent).unwrap();
            let a = e.allowance(size, Health::Load(load));
            prop_assert!(a >= size);
            prop_assert!(u128::from(a) * 100 <= u128::from(size) * u128::from(percent));
        }

        /// More load never means more allowance.
        #[test]
        fn the_allowance_never_grows_with_load(
            size in 1u64..1_000_000_000,
            percent in 100u32..=MAX_PERCENT,
            a in -1.0f64..3.0,
            b in -1.0f64..3.0,
        ) {
            let e = Elastic::new(percent).unwrap();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(e.allowance(size, Health::Load(lo)) >= e.allowance(size, Health::Load(hi)));
        }

        /// Unknown health, or a load at capacity or past it: the plain
        /// limit exactly. At or below the knee: the whole reach.
        #[test]
        fn unknown_health_is_the_plain_limit(
            size in 1u64..1_000_000_000,
            percent in 100u32..=MAX_PERCENT,
            past in 1.0f64..100.0,
            idle in 0.0f64..=KNEE,
        ) {
            let e = Elastic::new(percent).unwrap();
            prop_assert_eq!(e.allowance(size, Health::Unknown), size);
            prop_assert_eq!(e.allowance(size, Health::Load(past)), size);
            prop_assert_eq!(e.allowance(size, Health::Load(f64::NAN)), size);
            let full = (size as f64 * f64::from(percent - 100) / 100.0).floor() as u64 + size;
            prop_assert_eq!(e.allowance(size, Health::Load(idle)), full);
        }

        /// The worst signal counts; none is unknown.
        #[test]
        fn the_worst_signal_counts(
            l in proptest::option::of(0.0f64..2.0),
            t in proptest::option::of(0.0f64..2.0),
            r in proptest::option::of(0.0f64..2.0),
        ) {
            let h = Health::from_signals(l, t, r);
            match [l, t, r].into_iter().flatten().reduce(f64::max) {
                None => prop_assert_eq!(h, Health::Unknown),
                Some(w) => prop_assert_eq!(h, Health::Load(w)),
            }
        }
    }

    proptest! {
        /// The step a gauge puts in force gives an allowance between the
        /// plain limit and the reach, never above what the health gives,
        /// never growing with load, and the plain limit when unknown.
        #[test]
        fn a_gauge_step_is_within_the_allowance(
            size in 1u64..1_000_000_000,
            percent in 100u32..=MAX_PERCENT,
            a in loads(),
            b in loads(),
        ) {
            let e = Elastic::new(percent).unwrap();
            let g = HealthGauge::new();
            prop_assert_eq!(g.level(), 0);
            let at = |load: f64| {
                g.set(Health::Load(load));
                let extra = u128::from(size) * u128::from(e.extra_percent_at(g.level())) / 100;
                u128::from(size) + extra
            };
            let (x, y) = (at(a), at(b));
            prop_assert!(x >= u128::from(size));
            prop_assert!(x * 100 <= u128::from(size) * u128::from(percent));
            prop_assert!(x <= u128::from(e.allowance(size, Health::Load(a))) + 1);
            if a <= b { prop_assert!(x >= y); }
            g.set(Health::Unknown);
            prop_assert_eq!(g.level(), 0);
            prop_assert_eq!(g.health(), Health::Unknown);
        }
    }

    #[test]
    fn smooth_not_a_cliff() {
        let e = Elastic::new(300).unwrap();
        // Halfway between the knee and capacity: halfway in the reach.
        assert_eq!(e.allowance(100, Health::Load(0.75)), 200);
        // Small steps in load, small steps in allowance.
        let mut last = e.allowance(1000, Health::Load(KNEE));
        for i in 1..=100 {
            let now = e.allowance(
                1000,
                Health::Load(KNEE + (1.0 - KNEE) * f64::from(i) / 100.0),
            );
            assert!(last - now <= 31, "a step of {} at {i}", last - now);
            last = now;
        }
        assert_eq!(last, 1000);
        assert!(Elastic::new(99).is_none() && Elastic::new(MAX_PERCENT + 1).is_none());
        assert_eq!(
            Health::from_signals(Some(f64::NAN), None, None),
            Health::Unknown
        );
    }
}
