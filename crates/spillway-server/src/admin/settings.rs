//! The admin plane's settings (`admin:`) and the plans (`plans:`), as the
//! config layer hands them over.

use std::collections::BTreeMap;
use std::path::PathBuf;

use spillway_core::{Limit, Nanos};

pub use crate::credentials::{Scope, Token};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_the_worst_signal_until_stale() {
        use spillway_core::Health;
        use std::time::Duration;
        let h = HealthSettings {
            latency_target: Some(Duration::from_millis(200)),
            errors_max: Some(0.02),
            ..HealthSettings::default()
        };
        let fresh = Duration::from_secs(1);
        assert_eq!(h.health(Some(0.3), None, None, fresh), Health::Load(0.3));
        assert_eq!(
            h.health(Some(0.3), Some(300.0), None, fresh),
            Health::Load(1.5)
        );
        assert_eq!(
            h.health(None, Some(100.0), Some(0.01), fresh),
            Health::Load(0.5)
        );
        assert_eq!(h.health(None, None, Some(0.04), fresh), Health::Load(2.0));
        assert_eq!(h.health(None, None, None, fresh), Health::Unknown);
        assert_eq!(
            h.health(Some(0.3), None, None, Duration::from_secs(11)),
            Health::Unknown
        );
        // Without a target, a latency says nothing.
        let bare = HealthSettings::default();
        assert_eq!(bare.health(None, Some(900.0), None, fresh), Health::Unknown);
    }
}

/// The most slots a rule's top-keys sketch may have.
pub const MAX_TOP_SLOTS: usize = 65_536;

/// The `admin:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    /// Bearer tokens; none: the admin API answers 401 to every call that
    /// needs one, and metrics, status and rules are open (as before
    /// tokens existed).
    pub tokens: Vec<Token>,
    /// Count top keys at all (their sketches cost every decision a few
    /// hundred instructions; see docs/BENCHMARKS.md).
    pub top_keys: bool,
    /// Top keys as the client sent them; else as their hash.
    pub show_keys: bool,
    /// An admitted request with less than this share of its limit left is
    /// near the limit.
    pub near_limit: f64,
    /// Slots of each rule's top-keys sketch (per kind and minute).
    pub top_slots: usize,
    /// Where the memory store keeps overrides and plan assignments across
    /// restarts (none: in memory only).
    pub state_file: Option<PathBuf>,
    /// Audit entries kept in memory (older ones stay in the log).
    pub audit_entries: usize,
}

impl Default for AdminSettings {
    fn default() -> AdminSettings {
        AdminSettings {
            tokens: Vec::new(),
            top_keys: true,
            show_keys: false,
            near_limit: 0.2,
            top_slots: 256,
            state_file: None,
            audit_entries: 10_000,
        }
    }
}

impl AdminSettings {
    /// The token `given` is, if any.
    pub fn token(&self, given: &[u8]) -> Option<&Token> {
        crate::credentials::find(&self.tokens, given)
    }
}

/// `health:`: what "the service has room" means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthSettings {
    /// Latency at which the service is at capacity (a report's
    /// `latency_ms` over it is a load above 1).
    pub latency_target: Option<std::time::Duration>,
    /// The latency percentile measured (for the proxy's own measurements).
    pub percentile: f64,
    /// The error share at which the service is at capacity.
    pub errors_max: Option<f64>,
    /// After how long without a report health is unknown.
    pub stale_after: std::time::Duration,
    /// The proxy's measurement window over its upstream.
    pub window: std::time::Duration,
}

impl Default for HealthSettings {
    fn default() -> HealthSettings {
        HealthSettings {
            latency_target: None,
            percentile: 99.0,
            errors_max: None,
            stale_after: std::time::Duration::from_secs(10),
            window: std::time::Duration::from_secs(10),
        }
    }
}

impl HealthSettings {
    /// Health as a report says it, `age` after it came: the worst of its
    /// load, its latency over the target and its error rate over the
    /// maximum (signals without a target count as absent); unknown once
    /// the report is stale.
    pub fn health(
        &self,
        load: Option<f64>,
        latency_ms: Option<f64>,
        error_rate: Option<f64>,
        age: std::time::Duration,
    ) -> spillway_core::Health {
        if age > self.stale_after {
            return spillway_core::Health::Unknown;
        }
        let latency = latency_ms.zip(self.latency_target).and_then(|(l, t)| {
            let t = t.as_secs_f64() * 1000.0;
            (t > 0.0).then(|| l / t)
        });
        let errors = error_rate
            .zip(self.errors_max)
            .and_then(|(e, m)| (m > 0.0).then(|| e / m));
        spillway_core::Health::from_signals(load, latency, errors)
    }
}

/// The plans (`plans:`) and which rules use them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanBook {
    /// Each plan's limits in words, by name.
    pub plans: BTreeMap<String, Vec<String>>,
    /// Per rule: its default plan, its queue, and every plan's limits as
    /// that rule enforces them.
    pub rules: BTreeMap<String, RulePlans>,
}

/// What a rule needs to give one key other limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RulePlans {
    /// `plan: { default: NAME }`, if the rule takes its limits from a plan.
    pub default: Option<String>,
    /// The rule's `queue.max_wait` (a leaky bucket under it shapes).
    pub max_wait: Option<Nanos>,
    /// Every plan's limits, built for this rule.
    pub limits: BTreeMap<String, Vec<Limit>>,
}
