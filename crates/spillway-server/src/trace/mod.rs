//! OpenTelemetry traces of decisions: a span per decision on every way in
//! (`spillway.check`, `spillway.forward_auth`, `spillway.proxy`,
//! `envoy.ShouldRateLimit`, ...), a child of the caller's span when its
//! W3C `traceparent` can be read, exported over OTLP (gRPC or HTTP with
//! protobuf) in batches off the request path.
//!
//! Not a way in: ways in import it (as they import `events`); it imports
//! none of them. Off by default, and then free: `Shared::tracer` is
//! `None` and a way in pays one check of it per decision, no clock read
//! and no allocation.
//!
//! A span holds what the metrics and the decision's answer already show:
//! rule names, the decision, cost, limit and remaining, the store and its
//! latency; never a key's value (user, address, header, descriptor
//! value) or a credential.

pub mod context;
mod export;
pub mod proto;
pub mod settings;

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_core::Outcome;
use spillway_store::Checked;
use spillway_wire::Headers;

pub use context::{Parent, parse_traceparent, traceparent};
pub use settings::{Protocol, Sampler, TraceSettings, TraceTls};

use proto::{KeyValue, SpanKind, StatusCode};

/// Starts spans, decides which are recorded, and hands finished ones to
/// the exporter's bounded queue.
#[derive(Debug)]
pub struct Tracer {
    sampler: Sampler,
    /// `ratio` as a bound on the trace id's low 63 bits.
    threshold: u64,
    store: &'static str,
    queue: tokio::sync::mpsc::Sender<proto::Span>,
    counts: Arc<Counts>,
    exporter: parking_lot::Mutex<Option<export::Handle>>,
}

/// What the exporter counts, for the metrics.
#[derive(Debug, Default)]
pub struct Counts {
    /// Spans handed to the collector.
    pub exported: AtomicU64,
    /// Spans dropped: the queue was full, or their export failed.
    pub dropped: AtomicU64,
    /// Exports that failed (refused, timed out, or no collector).
    pub failed_exports: AtomicU64,
}

/// A recorded span under way: one pointer, so the `Option<Span>` every
/// decision's future carries costs 8 bytes to move while traces are off.
#[derive(Debug)]
pub struct Span(Box<Open>);

/// What a [`Span`] holds.
#[derive(Debug)]
struct Open {
    name: &'static str,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    trace_state: String,
    start_unix_ns: u64,
    started: Instant,
}

/// What the proxy sends upstream instead of the client's trace context
/// (one pointer, as [`Span`]).
#[derive(Debug, Clone)]
pub struct Forward(Box<(String, bool)>);

impl Forward {
    /// The `traceparent` naming spillway's span.
    pub fn traceparent(&self) -> &str {
        &self.0.0
    }

    /// The client's `traceparent` could not be read: its `tracestate`
    /// belongs to no trace and is not passed on.
    pub fn drops_tracestate(&self) -> bool {
        self.0.1
    }
}

impl Span {
    /// This span, named `name` instead.
    #[must_use]
    pub fn named(mut self, name: &'static str) -> Span {
        self.0.name = name;
        self
    }

    /// What the proxy sends upstream to make the upstream's span a child
    /// of this one.
    pub fn forward(&self) -> Forward {
        let s = &self.0;
        Forward(Box::new((
            traceparent(&s.trace_id, &s.span_id),
            s.parent.is_none(),
        )))
    }
}

impl Tracer {
    /// A tracer for `settings` deciding with a `store` (its name in
    /// spans), its exporter started on the current Tokio runtime.
    pub fn start(settings: &TraceSettings, store: &'static str) -> Tracer {
        let (queue, rx) = tokio::sync::mpsc::channel(settings.max_queue.max(1));
        let counts = Arc::new(Counts::default());
        let exporter = export::spawn(settings, rx, counts.clone());
        Tracer {
            sampler: settings.sampler,
            threshold: threshold(settings.sampler.ratio),
            store,
            queue,
            counts,
            exporter: parking_lot::Mutex::new(Some(exporter)),
        }
    }

    /// The exporter's counts.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// A span named `name` for a request with `headers`, a child of the
    /// caller's span when its `traceparent` is readable; `None` when the
    /// sampler does not record it.
    #[inline(never)]
    pub fn span<H: Headers + ?Sized>(&self, name: &'static str, headers: &H) -> Option<Span> {
        // Sent twice, even alike, or unreadable: a new trace.
        let parent = match headers.sole("traceparent") {
            spillway_wire::Sole::One(v) => parse_traceparent(v),
            _ => None,
        };
        let trace_id = parent.map_or_else(new_trace_id, |p| p.trace_id);
        let sampled = match parent {
            Some(p) if self.sampler.parent_based => p.sampled,
            _ => ratio_sampled(&trace_id, self.threshold),
        };
        if !sampled {
            return None;
        }
        let trace_state = match parent {
            None => String::new(),
            Some(_) => {
                let all = headers.all("tracestate");
                let joined = all.join(",");
                if joined.len() <= context::MAX_TRACESTATE {
                    joined
                } else {
                    String::new()
                }
            }
        };
        Some(Span(Box::new(Open {
            name,
            trace_id,
            span_id: new_span_id(),
            parent: parent.map(|p| p.span_id),
            trace_state,
            start_unix_ns: crate::os::unix_ns(),
            started: Instant::now(),
        })))
    }

    /// Ends `span` now with `attributes`, an error status with `error`'s
    /// message if given, and queues it for export; a full queue drops it
    /// (counted), never waits.
    pub fn finish(&self, span: Span, mut attributes: Vec<KeyValue>, error: Option<&str>) {
        let span = *span.0;
        let took = u64::try_from(span.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        attributes.push(KeyValue::string("spillway.store", self.store));
        let remote = if span.parent.is_some() {
            proto::FLAG_HAS_IS_REMOTE | proto::FLAG_IS_REMOTE
        } else {
            proto::FLAG_HAS_IS_REMOTE
        };
        let s = proto::Span {
            trace_id: span.trace_id.to_vec(),
            span_id: span.span_id.to_vec(),
            trace_state: span.trace_state,
            parent_span_id: span.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: span.name.to_string(),
            kind: SpanKind::Server as i32,
            start_time_unix_nano: span.start_unix_ns,
            end_time_unix_nano: span.start_unix_ns.saturating_add(took),
            attributes,
            status: Some(proto::Status {
                message: error.unwrap_or_default().to_string(),
                code: if error.is_some() {
                    StatusCode::Error
                } else {
                    StatusCode::Unset
                } as i32,
            }),
            flags: 1 | remote,
        };
        if self.queue.try_send(s).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends `span` for a decision of the limiter (`checked`) at `cost`,
    /// the store having taken `store_took`.
    #[inline(never)]
    pub fn finish_checked(&self, span: Span, checked: &Checked, cost: u64, store_took: Duration) {
        let (attributes, error) = decision_attributes(checked, cost, store_took);
        self.finish(span, attributes, error);
    }

    /// Sends what is queued and stops the exporter, within its timeout.
    pub async fn shutdown(&self) {
        let handle = self.exporter.lock().take();
        if let Some(h) = handle {
            h.stop().await;
        }
    }

    /// The exporter's counters, Prometheus text.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = &self.counts;
        for (name, help, n) in [
            (
                "spillway_trace_spans_exported_total",
                "Spans the OTLP collector accepted.",
                &c.exported,
            ),
            (
                "spillway_trace_spans_dropped_total",
                "Spans dropped: the export queue was full, or their export failed.",
                &c.dropped,
            ),
            (
                "spillway_trace_export_failures_total",
                "OTLP exports that failed (refused, timed out, or no collector).",
                &c.failed_exports,
            ),
        ] {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                n.load(Ordering::Relaxed)
            );
        }
    }
}

/// The span attributes of a limiter decision, and an error message when
/// the store failed (the failure policy decided).
pub fn decision_attributes(
    checked: &Checked,
    cost: u64,
    store_took: Duration,
) -> (Vec<KeyValue>, Option<&'static str>) {
    let d = &checked.decision;
    let names = d
        .rules
        .iter()
        .filter_map(|rd| checked.rule(rd))
        .map(|r| r.name());
    let mut a = Vec::with_capacity(9);
    a.push(KeyValue::strings("spillway.rules", names));
    a.push(KeyValue::string("spillway.decision", decision_of(d)));
    a.push(KeyValue::string("spillway.outcome", d.outcome().as_str()));
    a.push(KeyValue::int("spillway.cost", clamp(cost)));
    if let Some(rd) = d.deciding.as_ref() {
        if let Some(rule) = checked.rule(rd) {
            a.push(KeyValue::string("spillway.rule", rule.name()));
        }
        a.push(KeyValue::int("spillway.limit", clamp(rd.verdict.limit)));
        a.push(KeyValue::int(
            "spillway.remaining",
            clamp(rd.verdict.remaining),
        ));
    }
    a.push(latency(store_took));
    let error = checked
        .store_error
        .as_ref()
        .map(|_| "the store failed; the rules' on_store_error policy decided");
    if error.is_some() {
        a.push(KeyValue::bool("spillway.store_error", true));
    }
    (a, error)
}

/// `allowed`, `denied`, or `shadow` (allowed, a shadow rule over its limit).
fn decision_of(d: &spillway_core::Decision) -> &'static str {
    if !d.allowed {
        "denied"
    } else if d.rules.iter().any(|r| r.outcome == Outcome::ShadowDenied) {
        "shadow"
    } else {
        "allowed"
    }
}

/// `spillway.store.latency_us`: how long the store took.
pub fn latency(took: Duration) -> KeyValue {
    KeyValue::int(
        "spillway.store.latency_us",
        i64::try_from(took.as_micros()).unwrap_or(i64::MAX),
    )
}

/// A count as OTLP's signed integer.
pub fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The bound `ratio` sets on a trace id's low 63 bits (as the
/// specification's `TraceIdRatioBased` samplers compare them).
fn threshold(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else if ratio <= 0.0 {
        0
    } else {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let t = (ratio * (1u64 << 63) as f64) as u64;
        t
    }
}

fn ratio_sampled(trace_id: &[u8; 16], threshold: u64) -> bool {
    if threshold == u64::MAX {
        return true;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < threshold
}

thread_local! {
    /// Each thread's id generator (splitmix64), seeded from the
    /// standard library's random hasher keys.
    static IDS: Cell<u64> = Cell::new({
        use std::hash::BuildHasher as _;
        std::collections::hash_map::RandomState::new().hash_one(std::thread::current().id())
    });
}

fn next_u64() -> u64 {
    IDS.with(|s| {
        let z = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(z);
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// A random trace id, never all zero.
fn new_trace_id() -> [u8; 16] {
    loop {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&next_u64().to_be_bytes());
        id[8..].copy_from_slice(&next_u64().to_be_bytes());
        if id != [0; 16] {
            return id;
        }
    }
}

/// A random span id, never all zero.
fn new_span_id() -> [u8; 8] {
    loop {
        let id = next_u64().to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// A random instance id in UUID form (as envoyproxy/ratelimit makes one
/// when `TRACING_SERVICE_INSTANCE_ID` is empty).
pub fn random_instance_id() -> String {
    let mut b = new_trace_id();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut hex = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            hex.push('-');
        }
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_sampling_follows_the_trace_ids_low_bits() {
        let id = |low: u64| {
            let mut t = [1u8; 16];
            t[8..].copy_from_slice(&low.to_be_bytes());
            t
        };
        assert!(ratio_sampled(&id(u64::MAX), threshold(1.0)));
        assert!(!ratio_sampled(&id(0), threshold(0.0)));
        let half = threshold(0.5);
        assert!(ratio_sampled(&id(0), half));
        assert!(ratio_sampled(&id(u64::MAX / 2 - 2), half));
        assert!(!ratio_sampled(&id(u64::MAX), half));
        // About the share asked for, over random ids.
        let n = 20_000;
        let kept = (0..n)
            .filter(|_| ratio_sampled(&new_trace_id(), threshold(0.25)))
            .count();
        assert!((4_000..6_000).contains(&kept), "{kept}");
    }

    #[test]
    fn ids_are_never_zero_and_differ() {
        let a = new_span_id();
        let b = new_span_id();
        assert_ne!(a, b);
        assert_ne!(new_trace_id(), new_trace_id());
        let u = random_instance_id();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
