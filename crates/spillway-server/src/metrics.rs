//! Prometheus metrics, written by hand: a few atomics, no registry.
//!
//! Labels are rule names and outcomes only, never client keys. A rule has
//! series only once it has decided a request, and at most
//! [`DEFAULT_MAX_RULE_SERIES`] rules have their own (see
//! [`Metrics::set_max_rule_series`]); the decisions of rules past that
//! count in one aggregate series, `rule="(other rules)"`. So a million
//! rules cost no memory here until they are requested, and `/metrics`
//! stays bounded whatever the number of rules. The one exception, an
//! Envoy limit marked `detailed_metric`, has a bounded number of
//! descriptor series of its own (see [`GrpcRule::hits`]).

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use spillway_core::Outcome;
use spillway_store::RuleSet;

pub use crate::events::Hits;

mod process;

pub use process::{Usage, build_info, process_metrics, usage};

mod store;
pub use store::{redis_gauges, sync_metrics};

mod grpc;
pub use grpc::{GrpcRule, OTHER_DESCRIPTORS};

const OUTCOMES: [Outcome; 5] = [
    Outcome::Allowed,
    Outcome::Denied,
    Outcome::ShadowDenied,
    Outcome::SoftExceeded,
    Outcome::ElasticAdmitted,
];

fn slot(o: Outcome) -> usize {
    match o {
        Outcome::Allowed => 0,
        Outcome::Denied => 1,
        Outcome::ShadowDenied => 2,
        Outcome::SoftExceeded => 3,
        Outcome::ElasticAdmitted => 4,
    }
}

/// A counter striped over cache lines: every request bumps several
/// counters, and two cores bumping one shared atomic would pass its cache
/// line back and forth on each request. Each thread adds to its own stripe;
/// reading sums them.
#[derive(Debug, Default)]
pub struct Counter {
    stripes: [Stripe; STRIPES],
}

const STRIPES: usize = 8;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Stripe(AtomicU64);

thread_local! {
    static STRIPE: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
    };
}

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        let i = STRIPE.with(|s| *s);
        self.stripes[i].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The total.
    pub fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// Decisions of one rule by outcome.
#[derive(Debug, Default)]
pub struct RuleCounters {
    by_outcome: [Counter; OUTCOMES.len()],
    /// Admitted with less than the near-limit share of the limit left.
    near_limit: Counter,
}

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.1,
];

/// How many rules have series of their own by default: enough for the
/// rules that carry traffic in most deployments, few enough for a scrape
/// (each is 7 lines).
pub const DEFAULT_MAX_RULE_SERIES: usize = 2_000;

/// The label of the series that aggregates rules past the cap.
pub const OTHER_RULES: &str = "(other rules)";

/// Where each rule of one rule set version counts, in rule order: empty
/// until the rule's first decision (16 bytes a rule, not the 3 KB of its
/// striped counters).
#[derive(Debug, Default)]
struct RuleTable {
    version: u64,
    slots: Box<[std::sync::OnceLock<Arc<RuleCounters>>]>,
}

/// The counters of every rule that has decided a request, by name, in
/// the order of their first decisions; kept when the rule goes away
/// (Prometheus counters must not vanish mid-process).
#[derive(Debug, Default)]
struct Seen {
    list: Vec<(String, Arc<RuleCounters>)>,
    by_name: HashMap<String, usize>,
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct Metrics {
    /// Counters per rule, indexed like the rule set they were built for.
    rules: ArcSwap<RuleTable>,
    /// Rules that have decided a request (their own series).
    seen: parking_lot::Mutex<Seen>,
    /// The decisions of rules past `max_rule_series`.
    other: Arc<RuleCounters>,
    /// How many rules have series of their own.
    max_rule_series: AtomicUsize,
    /// Requests no rule applied to.
    unlimited: Counter,
    latency_buckets: [Counter; BUCKETS.len()],
    latency_count: Counter,
    latency_sum_ns: Counter,
    /// gRPC decisions and hits by domain, then rule.
    grpc: parking_lot::RwLock<HashMap<String, HashMap<String, Arc<GrpcRule>>>>,
    /// gRPC calls for a domain no configuration has.
    grpc_domain_not_found: Counter,
    /// gRPC calls past the size caps, answered OVER_LIMIT whole.
    grpc_oversized: Counter,
    reloads: Counter,
    reload_errors: Counter,
    store_errors: Counter,
    bad_requests: Counter,
    /// Admitted requests that were told to wait (queues), and the waits.
    delayed: Counter,
    delay_ns: Counter,
    /// `near_limit`'s share as f64 bits.
    near_ratio: AtomicU64,
    /// Proxy answers 502 (upstream failed) and 504 (upstream too slow).
    upstream_502: Counter,
    upstream_504: Counter,
    /// Proxied requests shed for the in-flight limit, by priority
    /// (least important first, as [`spillway_core::Priority::ALL`]).
    shed: [Counter; 3],
    /// Gauges a way in renders itself (the proxy's in-flight limit).
    gauges: Gauges,
}

/// Renders gauges that live with a way in, appending to the exposition.
pub type RenderGauges = Box<dyn Fn(&mut String) + Send + Sync>;

/// Renderers of gauges that live with a way in.
#[derive(Default)]
struct Gauges(parking_lot::Mutex<Vec<RenderGauges>>);

impl std::fmt::Debug for Gauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gauges({})", self.0.lock().len())
    }
}

impl Metrics {
    /// Metrics for the rules in `set`.
    pub fn new(set: &RuleSet) -> Metrics {
        let m = Metrics {
            rules: ArcSwap::from_pointee(RuleTable::default()),
            seen: parking_lot::Mutex::new(Seen::default()),
            other: Arc::default(),
            max_rule_series: AtomicUsize::new(DEFAULT_MAX_RULE_SERIES),
            unlimited: Counter::default(),
            latency_buckets: Default::default(),
            latency_count: Counter::default(),
            latency_sum_ns: Counter::default(),
            grpc: parking_lot::RwLock::new(HashMap::new()),
            grpc_domain_not_found: Counter::default(),
            grpc_oversized: Counter::default(),
            reloads: Counter::default(),
            reload_errors: Counter::default(),
            store_errors: Counter::default(),
            bad_requests: Counter::default(),
            delayed: Counter::default(),
            delay_ns: Counter::default(),
            upstream_502: Counter::default(),
            upstream_504: Counter::default(),
            shed: Default::default(),
            gauges: Gauges::default(),
            near_ratio: AtomicU64::new(0.2f64.to_bits()),
        };
        m.rules_changed(set);
        m
    }

    /// Re-indexes counters for a new rule set, keeping the counts of rules
    /// whose names stay. Linear in the rules, and free of allocation per
    /// rule beyond its empty slot.
    pub fn rules_changed(&self, set: &RuleSet) {
        let seen = self.seen.lock();
        let slots: Box<[std::sync::OnceLock<Arc<RuleCounters>>]> =
            (0..set.rules().len()).map(|_| Default::default()).collect();
        if !seen.list.is_empty() {
            for (slot, r) in slots.iter().zip(set.rules()) {
                if let Some(&i) = seen.by_name.get(r.name()) {
                    let _ = slot.set(seen.list[i].1.clone());
                }
            }
        }
        self.rules.store(Arc::new(RuleTable {
            version: set.version,
            slots,
        }));
    }

    /// Sets how many rules have series of their own (at least 1): the
    /// first to decide a request get them; the others count in the
    /// aggregate series `rule="(other rules)"`. Rules that have their own
    /// already keep them.
    pub fn set_max_rule_series(&self, n: usize) {
        self.max_rule_series.store(n.max(1), Ordering::Relaxed);
    }

    /// The counters of the rule named `name`: its own (made now if it has
    /// none and the cap allows), else the aggregate.
    fn counters_for(&self, name: &str) -> Arc<RuleCounters> {
        let mut seen = self.seen.lock();
        if let Some(&i) = seen.by_name.get(name) {
            return seen.list[i].1.clone();
        }
        if seen.list.len() >= self.max_rule_series.load(Ordering::Relaxed) {
            return self.other.clone();
        }
        let c = Arc::<RuleCounters>::default();
        let i = seen.list.len();
        seen.list.push((name.to_string(), c.clone()));
        seen.by_name.insert(name.to_string(), i);
        c
    }

    /// Counts one rule's outcome. `index` is the rule's index in the set of `version`.
    pub fn count(&self, version: u64, index: usize, name: &str, outcome: Outcome) {
        self.with_counters(version, index, name, |c| c.by_outcome[slot(outcome)].add(1));
    }

    /// Runs `f` on the counters of the rule at `index` of the set
    /// numbered `version` (by name if the set changed since), made on
    /// the rule's first decision.
    fn with_counters(&self, version: u64, index: usize, name: &str, f: impl FnOnce(&RuleCounters)) {
        let rules = self.rules.load();
        if rules.version == version
            && let Some(slot) = rules.slots.get(index)
        {
            f(slot.get_or_init(|| self.counters_for(name)));
            return;
        }
        f(&self.counters_for(name));
    }

    /// Sets the share of a limit below which an admitted request counts
    /// as near the limit (`admin.near_limit`, default 0.2).
    pub fn set_near_limit(&self, ratio: f64) {
        self.near_ratio
            .store(ratio.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    /// The near-limit share in force.
    pub fn near_limit_ratio(&self) -> f64 {
        f64::from_bits(self.near_ratio.load(Ordering::Relaxed))
    }

    /// The series to show: every rule that has decided a request, in the
    /// order of their first decisions, then the aggregate of the rules
    /// past the cap if it counted any.
    fn rule_series(&self) -> Vec<(String, Arc<RuleCounters>)> {
        let mut list = self.seen.lock().list.clone();
        if self.other.by_outcome.iter().any(|c| c.get() > 0) {
            list.push((OTHER_RULES.to_string(), self.other.clone()));
        }
        list
    }

    /// Every requested rule's totals so far (and the aggregate of those
    /// past the cap): decisions by outcome (allowed, denied, shadow
    /// denied, soft exceeded), then near-limit admissions.
    pub fn rule_totals(&self) -> Vec<(String, [u64; 5])> {
        self.rule_series()
            .iter()
            .map(|(n, c)| {
                let mut t = [0; 5];
                for (i, o) in c.by_outcome.iter().enumerate() {
                    t[i] = o.get();
                }
                t[4] = c.near_limit.get();
                (n.clone(), t)
            })
            .collect()
    }

    /// The counters of the Envoy limit `rule` in `domain` (made on first use).
    pub fn grpc_rule(&self, domain: &str, rule: &str) -> Arc<GrpcRule> {
        if let Some(c) = self.grpc.read().get(domain).and_then(|d| d.get(rule)) {
            return c.clone();
        }
        self.grpc
            .write()
            .entry(domain.to_string())
            .or_default()
            .entry(rule.to_string())
            .or_default()
            .clone()
    }

    /// Counts one gRPC rule's outcome in `domain`.
    pub fn count_grpc(&self, domain: &str, rule: &str, outcome: Outcome) {
        self.grpc_rule(domain, rule).decided(outcome);
    }

    /// Counts a gRPC call for a domain no configuration has.
    pub fn grpc_domain_not_found(&self) {
        self.grpc_domain_not_found.add(1);
    }

    /// Counts a gRPC call past the size caps.
    pub fn grpc_oversized(&self) {
        self.grpc_oversized.add(1);
    }

    /// Counts a decision, which took `took`.
    pub fn decided(&self, checked: &spillway_store::Checked, took: Duration) {
        let version = checked.rules.version;
        if checked.decision.rules.is_empty() {
            self.count_unlimited();
        }
        let ratio = self.near_limit_ratio();
        for rd in &checked.decision.rules {
            let name = checked.rule(rd).map_or("", |r| r.name());
            let v = &rd.verdict;
            let near =
                rd.outcome == Outcome::Allowed && (v.remaining as f64) < ratio * v.limit as f64;
            // One lookup of the rule's counters for both.
            self.with_counters(version, rd.rule, name, |c| {
                c.by_outcome[slot(rd.outcome)].add(1);
                if near {
                    c.near_limit.add(1);
                }
            });
        }
        if checked.store_error.is_some() {
            self.store_failed();
        }
        if checked.decision.allowed && checked.decision.wait.as_u64() > 0 {
            self.delayed(checked.decision.wait.into());
        }
        self.observe_latency(took);
    }

    /// Counts a request no rule applied to.
    pub fn count_unlimited(&self) {
        self.unlimited.add(1);
    }

    /// Records how long a decision took.
    pub fn observe_latency(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.latency_buckets[i].add(1);
        }
        self.latency_count.add(1);
        self.latency_sum_ns
            .add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Counts a successful reload.
    pub fn reloaded(&self) {
        self.reloads.add(1);
    }

    /// Counts a rejected reload.
    pub fn reload_failed(&self) {
        self.reload_errors.add(1);
    }

    /// Counts a decision made without the store.
    pub fn store_failed(&self) {
        self.store_errors.add(1);
    }

    /// Counts a request rejected as malformed.
    pub fn bad_request(&self) {
        self.bad_requests.add(1);
    }

    /// Counts an admission that waits `wait` first (a queue).
    pub fn delayed(&self, wait: Duration) {
        self.delayed.add(1);
        self.delay_ns
            .add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Counts a proxied request answered 502 (`timed_out` false: the
    /// upstream failed) or 504 (it did not answer in time).
    pub fn upstream_failed(&self, timed_out: bool) {
        if timed_out {
            self.upstream_504.add(1);
        } else {
            self.upstream_502.add(1);
        }
    }

    /// Counts a proxied request shed for the in-flight limit.
    pub fn shed(&self, priority: spillway_core::Priority) {
        if let Some(i) = spillway_core::Priority::ALL
            .iter()
            .position(|p| *p == priority)
        {
            self.shed[i].add(1);
        }
    }

    /// Adds gauges a way in renders itself, appended to every exposition.
    pub fn add_gauges(&self, render: RenderGauges) {
        self.gauges.0.lock().push(render);
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, keys: Option<usize>) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP spillway_decisions_total Decisions by rule and outcome."
        );
        let _ = writeln!(out, "# TYPE spillway_decisions_total counter");
        let rules = self.rule_series();
        for (name, c) in &rules {
            for o in OUTCOMES {
                let _ = writeln!(
                    out,
                    "spillway_decisions_total{{rule=\"{}\",outcome=\"{}\"}} {}",
                    escape(name),
                    o.as_str(),
                    c.by_outcome[slot(o)].get()
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP spillway_near_limit_total Requests admitted with less than the near-limit share (admin.near_limit, now {}) of the limit left, by rule.",
            self.near_limit_ratio()
        );
        let _ = writeln!(out, "# TYPE spillway_near_limit_total counter");
        for (name, c) in &rules {
            let _ = writeln!(
                out,
                "spillway_near_limit_total{{rule=\"{}\"}} {}",
                escape(name),
                c.near_limit.get()
            );
        }
        self.render_grpc(&mut out);
        let _ = writeln!(
            out,
            "# HELP spillway_unlimited_total Requests no rule applied to (allowed)."
        );
        let _ = writeln!(out, "# TYPE spillway_unlimited_total counter");
        let _ = writeln!(out, "spillway_unlimited_total {}", self.unlimited.get());
        let _ = writeln!(
            out,
            "# HELP spillway_decision_duration_seconds Time to decide, from parsed request to decision."
        );
        let _ = writeln!(out, "# TYPE spillway_decision_duration_seconds histogram");
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.latency_buckets[i].get();
            let _ = writeln!(
                out,
                "spillway_decision_duration_seconds_bucket{{le=\"{b}\"}} {cumulative}"
            );
        }
        let count = self.latency_count.get();
        let _ = writeln!(
            out,
            "spillway_decision_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "spillway_decision_duration_seconds_sum {}",
            self.latency_sum_ns.get() as f64 / 1e9
        );
        let _ = writeln!(out, "spillway_decision_duration_seconds_count {count}");
        // No made-up 0 for a store that cannot count: the series is left
        // out, and its HELP says when.
        let _ = writeln!(
            out,
            "# HELP spillway_keys Keys held by this instance: the memory store's, or those a sync store tracks. Absent with a per-decision Redis store, whose keys live in Redis for every instance (see Redis's INFO keyspace).\n# TYPE spillway_keys gauge"
        );
        if let Some(k) = keys {
            let _ = writeln!(out, "spillway_keys {k}");
        }
        let simple = [
            (
                "spillway_rules_reloads_total",
                "counter",
                "Rules files loaded by reload.",
                self.reloads.get(),
            ),
            (
                "spillway_rules_reload_errors_total",
                "counter",
                "Reloads rejected because the file was invalid.",
                self.reload_errors.get(),
            ),
            (
                "spillway_store_errors_total",
                "counter",
                "Decisions made by failure policy because the store failed.",
                self.store_errors.get(),
            ),
            (
                "spillway_bad_requests_total",
                "counter",
                "Requests rejected as malformed.",
                self.bad_requests.get(),
            ),
            (
                "spillway_delayed_total",
                "counter",
                "Admitted requests that waited in a queue first.",
                self.delayed.get(),
            ),
        ];
        for (name, kind, help, v) in simple {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP spillway_delay_seconds_total Time those requests were told to wait, in all."
        );
        let _ = writeln!(out, "# TYPE spillway_delay_seconds_total counter");
        let _ = writeln!(
            out,
            "spillway_delay_seconds_total {}",
            self.delay_ns.get() as f64 / 1e9
        );
        let _ = writeln!(
            out,
            "# HELP spillway_upstream_errors_total Proxied requests answered 502 (upstream failed) or 504 (no answer in time)."
        );
        let _ = writeln!(out, "# TYPE spillway_upstream_errors_total counter");
        for (status, c) in [("502", &self.upstream_502), ("504", &self.upstream_504)] {
            let _ = writeln!(
                out,
                "spillway_upstream_errors_total{{status=\"{status}\"}} {}",
                c.get()
            );
        }
        let _ = writeln!(
            out,
            "# HELP spillway_shed_total Proxied requests refused with 503 for the in-flight limit (queue full or wait over), by priority."
        );
        let _ = writeln!(out, "# TYPE spillway_shed_total counter");
        for (p, c) in spillway_core::Priority::ALL.iter().zip(&self.shed) {
            let _ = writeln!(
                out,
                "spillway_shed_total{{priority=\"{}\"}} {}",
                p.as_str(),
                c.get()
            );
        }
        let _ = writeln!(
            out,
            "# HELP spillway_elastic_admitted_total Requests an elastic rule admitted above its plain limit, by rule (also in spillway_decisions_total as elastic_admitted)."
        );
        let _ = writeln!(out, "# TYPE spillway_elastic_admitted_total counter");
        for (name, c) in &rules {
            let _ = writeln!(
                out,
                "spillway_elastic_admitted_total{{rule=\"{}\"}} {}",
                escape(name),
                c.by_outcome[slot(Outcome::ElasticAdmitted)].get()
            );
        }
        for render in self.gauges.0.lock().iter() {
            render(&mut out);
        }
        build_info(&mut out);
        process_metrics(&mut out);
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule};

    fn set(names: &[&str], version: u64) -> RuleSet {
        let rules = names
            .iter()
            .map(|n| {
                let rate = Rate::new(1, Nanos::from_secs(1)).unwrap();
                let limit = Limit::Gcra(Gcra::new(rate, 1).unwrap());
                let by = KeySpec::from_parts(Vec::new());
                Rule::new(*n, None, by, vec![limit], Mode::Hard).unwrap()
            })
            .collect();
        let mut s = RuleSet::new(rules);
        s.version = version;
        s
    }

    /// Issue 36: a million rules had a million series (and 3 KB of
    /// counters each) before any request.
    #[test]
    fn only_requested_rules_have_series_and_past_the_cap_they_aggregate() {
        let m = Metrics::new(&set(&["a", "b", "c", "d"], 1));
        assert!(!m.render(None).contains("spillway_decisions_total{rule="));
        m.set_max_rule_series(2);
        m.count(1, 1, "b", Outcome::Allowed);
        m.count(1, 1, "b", Outcome::Denied);
        m.count(1, 3, "d", Outcome::Allowed);
        m.count(1, 0, "a", Outcome::Allowed);
        m.count(1, 2, "c", Outcome::Allowed);
        let shown = m.render(None);
        assert!(shown.contains("spillway_decisions_total{rule=\"b\",outcome=\"denied\"} 1"));
        assert!(shown.contains("spillway_decisions_total{rule=\"d\",outcome=\"allowed\"} 1"));
        assert!(!shown.contains("rule=\"a\""), "{shown}");
        assert!(
            shown
                .contains("spillway_decisions_total{rule=\"(other rules)\",outcome=\"allowed\"} 2"),
            "{shown}"
        );
        // A reload keeps the counts of a rule by name, at its new index,
        // and a removed rule's series stays.
        m.rules_changed(&set(&["x", "d"], 2));
        m.count(2, 1, "d", Outcome::Allowed);
        let shown = m.render(None);
        assert!(shown.contains("spillway_decisions_total{rule=\"d\",outcome=\"allowed\"} 2"));
        assert!(shown.contains("spillway_decisions_total{rule=\"b\",outcome=\"denied\"} 1"));
        // A decision made under the old version finds its rule by name.
        m.count(1, 3, "d", Outcome::Allowed);
        assert!(
            m.render(None)
                .contains("spillway_decisions_total{rule=\"d\",outcome=\"allowed\"} 3")
        );
    }
}
