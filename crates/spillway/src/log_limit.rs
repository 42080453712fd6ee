//! Protocol warnings, rate-limited in the log.
//!
//! hyper and h2 warn once per offence (a connection past its reset limit,
//! an illegal header): under an HTTP/2 rapid reset flood that was about
//! 1,200 lines a second, which costs disk and CPU and buries every other
//! line. [`Throttle`] lets the first warning of each kind (each place in
//! their code that warns) through per [`EVERY`], counts the rest, and a
//! thread started at the first one held back says once per interval how
//! many of each kind were held back. The service's own lines are never
//! held back.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{Event, Level, Subscriber, callsite::Identifier};
use tracing_subscriber::layer::{Context, Layer};

/// One line per kind of protocol warning per this interval.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// Targets whose warnings are held back past the first per interval.
fn is_protocol(target: &str) -> bool {
    ["h2", "hyper", "hyper_util", "tonic"]
        .iter()
        .any(|t| target == *t || target.strip_prefix(t).is_some_and(|r| r.starts_with("::")))
}

/// A kind of warning: when its interval started, how many were held back,
/// and where it comes from (for the count's line).
struct Kind {
    since: Instant,
    held: u64,
    target: &'static str,
    place: String,
}

/// The layer that holds protocol warnings back (see the module's doc).
#[derive(Clone, Default)]
pub(crate) struct Throttle {
    kinds: Arc<Mutex<HashMap<Identifier, Kind>>>,
    reporter: Arc<OnceLock<()>>,
}

impl Throttle {
    /// Whether `event` goes to the log now.
    fn admit(&self, event: &Event<'_>, now: Instant) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || !is_protocol(meta.target()) {
            return true;
        }
        let mut kinds = self.kinds.lock();
        match kinds.get_mut(&meta.callsite()) {
            None => {
                kinds.insert(
                    meta.callsite(),
                    Kind {
                        since: now,
                        held: 0,
                        target: meta.target(),
                        place: format!(
                            "{}:{}",
                            meta.file().unwrap_or("?"),
                            meta.line().unwrap_or(0)
                        ),
                    },
                );
                true
            }
            Some(k) if now.duration_since(k.since) >= EVERY && k.held == 0 => {
                k.since = now;
                true
            }
            Some(k) => {
                k.held += 1;
                drop(kinds);
                self.start_reporting();
                false
            }
        }
    }

    /// The lines saying how many warnings of each kind were held back
    /// since the last report, and the kinds' intervals restarted.
    fn report(&self, now: Instant) -> Vec<(u64, &'static str, String)> {
        let mut out = Vec::new();
        for k in self.kinds.lock().values_mut() {
            if k.held > 0 && now.duration_since(k.since) >= EVERY {
                out.push((k.held, k.target, k.place.clone()));
                k.held = 0;
                k.since = now;
            }
        }
        out
    }

    fn start_reporting(&self) {
        self.reporter.get_or_init(|| {
            let me = self.clone();
            let _ = std::thread::Builder::new()
                .name("log-throttle".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(EVERY / 4);
                        for (held, target, place) in me.report(Instant::now()) {
                            tracing::warn!(
                                held,
                                from = target,
                                "{held} more {target} warnings like the last one ({place}) in the last {}s, not logged",
                                EVERY.as_secs()
                            );
                        }
                    }
                });
        });
    }
}

impl<S: Subscriber> Layer<S> for Throttle {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        self.admit(event, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Counts the events that reach it.
    #[derive(Clone, Default)]
    struct Count(Arc<AtomicU64>);

    impl<S: Subscriber> Layer<S> for Count {
        fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_flood_of_one_protocol_warning_logs_one_line_and_the_service_logs_all() {
        let throttle = Throttle::default();
        let seen = Count::default();
        let sub = tracing_subscriber::registry()
            .with(throttle.clone())
            .with(seen.clone());
        tracing::subscriber::with_default(sub, || {
            for _ in 0..1_000 {
                tracing::warn!(target: "h2::proto::streams::recv", "recv_reset; too many");
            }
            for _ in 0..10 {
                tracing::warn!(target: "spillway_server::proxy", "an upstream failed");
            }
            tracing::debug!(target: "h2::codec", "below warnings: never held");
        });
        // The first h2 warning, the ten of the service's own, the debug line.
        assert_eq!(seen.0.load(Ordering::Relaxed), 12);
        let later = Instant::now() + EVERY;
        let lines = throttle.report(later);
        assert_eq!(lines.len(), 1, "{:?}", lines);
        assert_eq!(lines[0].0, 999);
        assert_eq!(lines[0].1, "h2::proto::streams::recv");
        // Reported once: the next report has nothing new to say.
        assert!(throttle.report(later + EVERY).is_empty());
    }

    #[test]
    fn protocol_targets_are_matched_by_crate_not_prefix() {
        assert!(is_protocol("h2"));
        assert!(is_protocol("h2::proto"));
        assert!(is_protocol("hyper_util::server"));
        assert!(!is_protocol("h2x"));
        assert!(!is_protocol("spillway_server::h2"));
    }
}
