//! The Envoy gRPC way in's counters: decisions and hits by domain and
//! limit, and per descriptor for a `detailed_metric` limit (bounded).

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use spillway_core::Outcome;

use super::{Counter, Hits, Metrics, OUTCOMES, RuleCounters, escape, slot};

/// One kind of hit of each, as the exposition names them.
const HIT_KINDS: [(&str, &str); 5] = [
    ("total_hits", "Hits on the limit (each call's hits_addend)."),
    (
        "over_limit",
        "Hits over the limit, shadow limits' included.",
    ),
    (
        "near_limit",
        "Hits within the limit past its near-limit ratio.",
    ),
    ("within_limit", "Hits within the limit."),
    ("shadow_mode", "Hits over a shadow limit, answered OK."),
];

/// Hit counters of one limit (or one of its descriptors).
#[derive(Debug, Default)]
struct HitCounters([Counter; 5]);

impl HitCounters {
    fn add(&self, h: &Hits) {
        for (c, n) in self.0.iter().zip([
            h.total,
            h.over_limit,
            h.near_limit,
            h.within_limit,
            h.shadow_mode,
        ]) {
            if n > 0 {
                c.add(n);
            }
        }
    }
}

/// The label value summing a `detailed_metric` limit's descriptors past
/// the cap.
pub const OTHER_DESCRIPTORS: &str = "_other";
/// Longest descriptor label value, in bytes; longer ones are cut (at a
/// character boundary) and end in `...`.
pub const MAX_DESCRIPTOR_LABEL: usize = 256;

/// The counters of one Envoy limit in one domain.
#[derive(Debug, Default)]
pub struct GrpcRule {
    decisions: RuleCounters,
    hits: HitCounters,
    /// `detailed_metric`: hits per descriptor, at most the cap given, then
    /// [`OTHER_DESCRIPTORS`].
    by_descriptor: parking_lot::RwLock<HashMap<String, Arc<HitCounters>>>,
}

impl GrpcRule {
    /// Counts a decision's outcome.
    pub fn decided(&self, outcome: Outcome) {
        self.decisions.by_outcome[slot(outcome)].add(1);
    }

    /// Counts `h`; with `detail`, also under that descriptor's own series
    /// (`detailed_metric`), of which the limit has at most `max` (others
    /// are counted under [`OTHER_DESCRIPTORS`]).
    pub fn hits(&self, h: &Hits, detail: Option<(&str, usize)>) {
        self.hits.add(h);
        let Some((descriptor, max)) = detail else {
            return;
        };
        let label = if descriptor.len() > MAX_DESCRIPTOR_LABEL {
            let mut cut = MAX_DESCRIPTOR_LABEL;
            while !descriptor.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}...", &descriptor[..cut])
        } else {
            descriptor.to_string()
        };
        if let Some(c) = self.by_descriptor.read().get(&label) {
            c.add(h);
            return;
        }
        let mut map = self.by_descriptor.write();
        let key = if map.contains_key(&label) || map.len() < max {
            label
        } else {
            OTHER_DESCRIPTORS.to_string()
        };
        map.entry(key).or_default().add(h);
    }
}

impl Metrics {
    pub(super) fn render_grpc(&self, out: &mut String) {
        let mut grpc: Vec<(String, String, Arc<GrpcRule>)> = self
            .grpc
            .read()
            .iter()
            .flat_map(|(d, rules)| rules.iter().map(|(r, c)| (d.clone(), r.clone(), c.clone())))
            .collect();
        grpc.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        let _ = writeln!(
            out,
            "# HELP spillway_grpc_decisions_total Envoy gRPC decisions by domain, rule and outcome."
        );
        let _ = writeln!(out, "# TYPE spillway_grpc_decisions_total counter");
        for (domain, rule, c) in &grpc {
            for o in OUTCOMES {
                let _ = writeln!(
                    out,
                    "spillway_grpc_decisions_total{{domain=\"{}\",rule=\"{}\",outcome=\"{}\"}} {}",
                    escape(domain),
                    escape(rule),
                    o.as_str(),
                    c.decisions.by_outcome[slot(o)].get()
                );
            }
        }
        for (k, (kind, help)) in HIT_KINDS.iter().enumerate() {
            let name = format!("spillway_grpc_{kind}_total");
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (domain, rule, c) in &grpc {
                let (domain, rule) = (escape(domain), escape(rule));
                let _ = writeln!(
                    out,
                    "{name}{{domain=\"{domain}\",rule=\"{rule}\"}} {}",
                    c.hits.0[k].get()
                );
                let mut detailed: Vec<(String, Arc<HitCounters>)> = c
                    .by_descriptor
                    .read()
                    .iter()
                    .map(|(d, h)| (d.clone(), h.clone()))
                    .collect();
                detailed.sort_by(|a, b| a.0.cmp(&b.0));
                for (d, h) in detailed {
                    let _ = writeln!(
                        out,
                        "{name}{{domain=\"{domain}\",rule=\"{rule}\",descriptor=\"{}\"}} {}",
                        escape(&d),
                        h.0[k].get()
                    );
                }
            }
        }
        for (name, help, c) in [
            (
                "spillway_grpc_domain_not_found_total",
                "Envoy gRPC calls for a domain no configuration has (answered OK).",
                &self.grpc_domain_not_found,
            ),
            (
                "spillway_grpc_oversized_total",
                "Envoy gRPC calls past the descriptor or size caps (answered OVER_LIMIT).",
                &self.grpc_oversized,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", c.get());
        }
    }
}
