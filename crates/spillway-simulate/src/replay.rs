//! Replaying requests at virtual time through the real engine: the
//! [`Limiter`] and [`MemoryStore`] that `serve` runs, on a [`ManualClock`]
//! the trace moves. A [`Watch`] on the limiter sees every rule's decision
//! with the key the engine built, so the statistics, the algorithm
//! comparison and the suggestions count clients exactly as the engine
//! keys them.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use parking_lot::Mutex;
use spillway_core::{
    FixedWindow, Gcra, LeakyBucket, Limit, Log, ManualClock, Nanos, Outcome, Rate, Rule,
    SlidingCounter, SlidingLog, TokenBucket, Wide,
};
use spillway_store::{Key, Limiter, MemoryConfig, MemoryStore, Request, RuleSet, Watch};

use super::summary::{
    Accuracy, AlgorithmError, Distribution, FileSummary, HistogramBucket, KeyCount, RuleSummary,
    Suggestion, Timeline,
};
use super::trace::Record;
// Keys are the engine's keyed hashes already.
use crate::RulesFile;
use spillway_store::AsIs;

mod sizes;
#[allow(clippy::wildcard_imports)]
use sizes::*;

/// The timeline starts at this bucket width and doubles whenever a trace
/// would need more than [`MAX_BUCKETS`] buckets.
const FIRST_BUCKET_NS: u64 = 1_000_000;
/// Most buckets a timeline keeps (it ends with between half and all of them).
pub(crate) const MAX_BUCKETS: usize = 480;

/// How the replay is run.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Keys listed per rule as the heaviest.
    pub top: usize,
    /// With `Some(share)`: suggest, for every limit, the smallest size that
    /// limits at most `share` (0..1) of the rule's clients. Keeps every
    /// request's time and cost per key until the end (16 bytes each).
    pub target_limited: Option<f64>,
    /// Compare every window-type limit with the exact log (and the other
    /// algorithms of the same limit and window).
    pub accuracy: bool,
}

/// One rules file being replayed.
#[derive(Debug)]
pub struct FileRun {
    /// The file, as the summary names it.
    pub name: String,
    limiter: Limiter<MemoryStore<ManualClock>>,
    recorder: Arc<Recorder>,
    admitted: u64,
    denied: u64,
}

impl FileRun {
    /// A run of `config` on `clock`: the rule set `serve` would build (its
    /// elastic rules without a health source: held to their plain
    /// limits), on a memory store of the file's key cap.
    pub fn new(file: &RulesFile, clock: &ManualClock, opts: &ReplayOptions) -> FileRun {
        let set: RuleSet = file.rules.clone();
        let name = file.name.clone();
        let max_keys = file.max_keys;
        let store = MemoryStore::new(
            clock.clone(),
            MemoryConfig {
                max_keys,
                ..MemoryConfig::default()
            },
        );
        let recorder = Arc::new(Recorder::new(set.rules(), opts));
        let limiter = Limiter::new(store, set);
        limiter.set_watch(recorder.clone());
        FileRun {
            name,
            limiter,
            recorder,
            admitted: 0,
            denied: 0,
        }
    }

    /// Decides `rec` at the clock's time; `now` is that time.
    pub fn decide(&mut self, rec: &Record, now: u64) -> spillway_store::Checked {
        let req = Request {
            method: Some(rec.method.as_str()).filter(|m| !m.is_empty()),
            path: Some(rec.path.as_str()).filter(|p| !p.is_empty()),
            attrs: rec,
            cost: rec.cost,
        };
        self.recorder.at(now, rec.cost);
        let checked = spillway_store::block_on(self.limiter.check(&req));
        // Rules that take their cost from the answer: charged the trace's
        // cost once admitted, as the proxy charges what the answer's
        // header says.
        if checked.decision.allowed && self.limiter.has_response_costs() {
            let _ = spillway_store::block_on(self.limiter.settle(&req, &|_| Some(rec.cost)));
        }
        if checked.decision.allowed {
            self.admitted += 1;
        } else {
            self.denied += 1;
        }
        if !checked.skipped.is_empty() {
            self.recorder.skipped(&checked.skipped);
        }
        checked
    }

    /// The file's results.
    pub fn summary(&self, requests: u64, malformed: u64, top: usize) -> FileSummary {
        FileSummary {
            config: self.name.clone(),
            requests,
            malformed,
            admitted: self.admitted,
            denied: self.denied,
            rules: self.recorder.summaries(top),
        }
    }
}

/// Sees every decision of one file's limiter.
#[derive(Debug)]
struct Recorder {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The time and cost of the request being decided.
    now: u64,
    cost: u64,
    /// The first request's time: the timeline's origin.
    start: Option<u64>,
    /// The timeline's bucket width, ns.
    width: u64,
    /// The current request's bucket.
    bucket: usize,
    keep_requests: bool,
    target: Option<f64>,
    rules: Vec<Track>,
}

/// One rule's counts.
#[derive(Debug)]
struct Track {
    rule: Rule,
    applied: u64,
    admitted: u64,
    denied: u64,
    shadow_denied: u64,
    soft_exceeded: u64,
    skipped: u64,
    keys: HashMap<u64, KeyEntry, BuildHasherDefault<AsIs>>,
    offered: Vec<u64>,
    admitted_at: Vec<u64>,
    /// The distribution's window (ns, at least 1) and size.
    window: u64,
    size: u64,
    /// Window-type limits compared with the exact log.
    accuracy: Vec<Compared>,
    /// How many variant states a key holds (all `accuracy` entries).
    states: usize,
}

/// One window-type limit and the algorithms run beside it.
#[derive(Debug)]
struct Compared {
    limit_index: usize,
    limit: u64,
    window: Nanos,
    /// Where this limit's states start in a key's `states`.
    offset: usize,
    /// `(algorithm, configured, limit, wrongly allowed, wrongly denied)`;
    /// the first is the exact log, the reference.
    variants: Vec<Variant>,
}

#[derive(Debug)]
struct Variant {
    algorithm: &'static str,
    configured: String,
    limit: Limit,
    wrongly_allowed: u64,
    wrongly_denied: u64,
}

/// One key of one rule.
#[derive(Debug)]
struct KeyEntry {
    text: Box<str>,
    requests: u64,
    denied: u64,
    /// The distribution's window the key is in, what it has offered in
    /// it, and its busiest window so far (cost units).
    window: u64,
    in_window: u64,
    busiest: u64,
    /// The compared algorithms' states.
    states: Vec<State>,
    /// With suggestions: every request's time and cost.
    requests_seen: Vec<(u64, u64)>,
}

impl Recorder {
    fn new(rules: &[Rule], opts: &ReplayOptions) -> Recorder {
        let rules = rules.iter().map(|r| Track::new(r, opts.accuracy)).collect();
        Recorder {
            inner: Mutex::new(Inner {
                now: 0,
                cost: 1,
                start: None,
                width: FIRST_BUCKET_NS,
                bucket: 0,
                keep_requests: opts.target_limited.is_some(),
                target: opts.target_limited,
                rules,
            }),
        }
    }

    fn at(&self, now: u64, cost: u64) {
        let mut inner = self.inner.lock();
        inner.now = now;
        inner.cost = cost;
        let start = *inner.start.get_or_insert(now);
        let mut bucket = now.saturating_sub(start) / inner.width;
        while bucket >= MAX_BUCKETS as u64 {
            inner.width = inner.width.saturating_mul(2);
            for t in &mut inner.rules {
                halve(&mut t.offered);
                halve(&mut t.admitted_at);
            }
            bucket = now.saturating_sub(start) / inner.width;
        }
        inner.bucket = bucket as usize;
    }

    fn skipped(&self, rules: &[usize]) {
        let mut inner = self.inner.lock();
        for &i in rules {
            if let Some(t) = inner.rules.get_mut(i) {
                t.skipped += 1;
            }
        }
    }

    fn summaries(&self, top: usize) -> Vec<RuleSummary> {
        let inner = self.inner.lock();
        let start = inner.start.unwrap_or(0);
        inner
            .rules
            .iter()
            .map(|t| t.summary(top, start, inner.width, inner.target))
            .collect()
    }
}

impl Watch for Recorder {
    fn decided(&self, _version: u64, index: usize, _rule: &Rule, key: &Key<'_>, outcome: Outcome) {
        let mut inner = self.inner.lock();
        let Inner {
            now,
            cost,
            bucket,
            keep_requests,
            rules,
            ..
        } = &mut *inner;
        if let Some(t) = rules.get_mut(index) {
            t.decided(index, key, outcome, *now, *cost, *bucket, *keep_requests);
        }
    }
}

/// Merges pairs of buckets: the timeline at twice the width.
fn halve(v: &mut Vec<u64>) {
    let merged: Vec<u64> = v.chunks(2).map(|c| c.iter().sum()).collect();
    *v = merged;
}

impl Track {
    fn new(rule: &Rule, accuracy: bool) -> Track {
        let first = rule.limits().first();
        let window = first.map_or(1, |l| l.window().as_u64().max(1));
        let size = first.map_or(0, Limit::size);
        let mut states = 0;
        let mut compared = Vec::new();
        if accuracy {
            for (i, l) in rule.limits().iter().enumerate() {
                if let Some(variants) = variants(l) {
                    let n = variants.len();
                    compared.push(Compared {
                        limit_index: i,
                        limit: l.size(),
                        window: l.window(),
                        offset: states,
                        variants,
                    });
                    states += n;
                }
            }
        }
        Track {
            rule: rule.clone(),
            applied: 0,
            admitted: 0,
            denied: 0,
            shadow_denied: 0,
            soft_exceeded: 0,
            skipped: 0,
            keys: HashMap::default(),
            offered: Vec::new(),
            admitted_at: Vec::new(),
            window,
            size,
            accuracy: compared,
            states,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn decided(
        &mut self,
        index: usize,
        key: &Key<'_>,
        outcome: Outcome,
        now: u64,
        cost: u64,
        bucket: usize,
        keep: bool,
    ) {
        // A rule that takes its cost from the answer is charged the
        // trace's cost in all (its estimate first, the rest once
        // admitted), or its estimate if that is more.
        let cost = self
            .rule
            .response_cost()
            .map_or(cost, |c| c.estimate.max(cost));
        let denied = matches!(outcome, Outcome::Denied | Outcome::ShadowDenied);
        self.applied += 1;
        if denied {
            self.denied += 1;
        } else {
            self.admitted += 1;
        }
        match outcome {
            Outcome::ShadowDenied => self.shadow_denied += 1,
            Outcome::SoftExceeded => self.soft_exceeded += 1,
            _ => {}
        }
        if self.offered.len() <= bucket {
            self.offered.resize(bucket + 1, 0);
            self.admitted_at.resize(bucket + 1, 0);
        }
        self.offered[bucket] += 1;
        if !denied {
            self.admitted_at[bucket] += 1;
        }
        let hash = key.hash(index as u64 + 1, 0x5EED_5EED);
        let states = &self.accuracy;
        let width = self.states;
        let e = self.keys.entry(hash).or_insert_with(|| KeyEntry {
            text: key.parts().join("+").into_boxed_str(),
            requests: 0,
            denied: 0,
            window: u64::MAX,
            in_window: 0,
            busiest: 0,
            states: {
                let mut v = Vec::with_capacity(width);
                for c in states {
                    v.extend(c.variants.iter().map(|x| State::fresh(&x.limit)));
                }
                v
            },
            requests_seen: Vec::new(),
        });
        e.requests += 1;
        if denied {
            e.denied += 1;
        }
        let w = now / self.window;
        if w != e.window {
            e.window = w;
            e.in_window = 0;
        }
        e.in_window = e.in_window.saturating_add(cost);
        e.busiest = e.busiest.max(e.in_window);
        if keep && !self.rule.limits().is_empty() {
            e.requests_seen.push((now, cost));
        }
        let t = Nanos(now);
        for c in &mut self.accuracy {
            let states = &mut e.states[c.offset..c.offset + c.variants.len()];
            let mut reference = true;
            for (i, (v, s)) in c.variants.iter_mut().zip(states.iter_mut()).enumerate() {
                let allowed = step(&v.limit, s, t, cost);
                if i == 0 {
                    reference = allowed;
                } else if allowed && !reference {
                    v.wrongly_allowed += 1;
                } else if !allowed && reference {
                    v.wrongly_denied += 1;
                }
            }
        }
    }

    fn summary(&self, top: usize, start: u64, width: u64, target: Option<f64>) -> RuleSummary {
        let clients = self.keys.len() as u64;
        let clients_limited = self.keys.values().filter(|e| e.denied > 0).count() as u64;
        let share = |n: u64| {
            if clients == 0 {
                0.0
            } else {
                n as f64 / clients as f64
            }
        };
        let mut heaviest: Vec<&KeyEntry> = self.keys.values().collect();
        let by_weight = |a: &&KeyEntry, b: &&KeyEntry| {
            b.requests
                .cmp(&a.requests)
                .then_with(|| a.text.cmp(&b.text))
        };
        if heaviest.len() > top && top > 0 {
            heaviest.select_nth_unstable_by(top - 1, by_weight);
            heaviest.truncate(top);
        }
        heaviest.sort_unstable_by(by_weight);
        heaviest.truncate(top);
        let pct = |n: u64| {
            if self.applied == 0 {
                0.0
            } else {
                100.0 * n as f64 / self.applied as f64
            }
        };
        let accuracy = self
            .accuracy
            .iter()
            .map(|c| Accuracy {
                limit_index: c.limit_index,
                limit: c.limit,
                window_secs: c.window.as_u64() as f64 / 1e9,
                reference: "sliding_window_log".into(),
                decisions: self.applied,
                algorithms: c
                    .variants
                    .iter()
                    .map(|v| AlgorithmError {
                        algorithm: v.algorithm.into(),
                        configured: v.configured.clone(),
                        wrongly_allowed: v.wrongly_allowed,
                        wrongly_denied: v.wrongly_denied,
                        wrongly_allowed_pct: pct(v.wrongly_allowed),
                        wrongly_denied_pct: pct(v.wrongly_denied),
                        wrong_pct: pct(v.wrongly_allowed + v.wrongly_denied),
                    })
                    .collect(),
            })
            .collect();
        let suggestions = match target {
            Some(target) => self.suggestions(target),
            None => Vec::new(),
        };
        RuleSummary {
            rule: self.rule.name().to_string(),
            mode: self.rule.mode().to_string(),
            limits: self
                .rule
                .limits()
                .iter()
                .map(spillway_core::Limit::describe)
                .collect(),
            applied: self.applied,
            admitted: self.admitted,
            denied: self.denied,
            shadow_denied: self.shadow_denied,
            soft_exceeded: self.soft_exceeded,
            skipped: self.skipped,
            clients,
            clients_limited,
            clients_limited_share: share(clients_limited),
            top_keys: heaviest
                .into_iter()
                .map(|e| KeyCount {
                    key: e.text.to_string(),
                    requests: e.requests,
                    denied: e.denied,
                })
                .collect(),
            timeline: Timeline {
                bucket_secs: width as f64 / 1e9,
                start_ns: start,
                offered: self.offered.clone(),
                admitted: self.admitted_at.clone(),
            },
            distribution: Distribution {
                window_secs: self.window as f64 / 1e9,
                limit: self.size,
                buckets: histogram(self.keys.values().map(|e| e.busiest)),
            },
            accuracy,
            suggestions,
        }
    }

    /// For every limit: the size each key needed (the smallest at which
    /// the limit's algorithm admits every request of the key), and from
    /// them the smallest size that limits at most `target` of the keys.
    fn suggestions(&self, target: f64) -> Vec<Suggestion> {
        let clients = self.keys.len();
        let mut out = Vec::new();
        if clients == 0 {
            return out;
        }
        for (i, limit) in self.rule.limits().iter().enumerate() {
            let mut needs: Vec<u64> = self
                .keys
                .values()
                .map(|e| needed_size(limit, &e.requests_seen))
                .collect();
            needs.sort_unstable_by(|a, b| b.cmp(a));
            let limited_at = |size: u64| needs.iter().take_while(|&&n| n > size).count();
            let share = |n: usize| {
                if clients == 0 {
                    0.0
                } else {
                    n as f64 / clients as f64
                }
            };
            // At most `allowed` keys may need more than the size.
            let allowed = (target * clients as f64 + 1e-9).floor() as usize;
            let suggested = match needs.get(allowed) {
                Some(&n) => n.max(1),
                None => 1,
            };
            let suggested = suggested.min(limit.with_size(u64::MAX).size());
            let current = limit.size();
            let limited = limited_at(suggested);
            out.push(Suggestion {
                limit_index: i,
                algorithm: limit.algorithm_name().into(),
                parameter: match limit {
                    Limit::FixedWindow(_) | Limit::SlidingLog(_) | Limit::SlidingCounter(_) => {
                        "limit"
                    }
                    Limit::Gcra(_) => "burst",
                    _ => "capacity",
                }
                .into(),
                current,
                current_limited_share: share(limited_at(current)),
                suggested,
                suggested_limited_share: share(limited),
                target,
                reaches_target: limited <= allowed,
            });
        }
        out
    }
}

/// A histogram of per-key counts on a 1-2-5 scale.
fn histogram(values: impl Iterator<Item = u64>) -> Vec<HistogramBucket> {
    let mut bounds = vec![1u64];
    let mut counts = vec![0u64];
    for v in values {
        while bounds.last().is_some_and(|&b| b < v) {
            let b = *bounds.last().unwrap_or(&1);
            let next = match leading(b) {
                1 => b.saturating_mul(2),
                2 => b / 2 * 5,
                _ => b.saturating_mul(2),
            };
            if next == b {
                break;
            }
            bounds.push(next);
            counts.push(0);
        }
        let i = bounds.partition_point(|&b| b < v).min(bounds.len() - 1);
        counts[i] += 1;
    }
    bounds
        .into_iter()
        .zip(counts)
        .map(|(upto, keys)| HistogramBucket { upto, keys })
        .collect()
}

/// The leading digit of a 1-2-5 bound.
fn leading(mut b: u64) -> u64 {
    while b >= 10 {
        b /= 10;
    }
    b
}

#[cfg(test)]
mod tests;
