//! `health:`: what "the service has room" means, one type read by the
//! admin plane (reports against targets) and handed to the proxy (its
//! measurements of the upstream and the in-flight limit's latency target).
//!
//! Not a way in: admin and proxy both import it; it imports neither.

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
