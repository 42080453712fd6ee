//! Rules: key, route, mode, limits.

use serde_saphyr::Spanned;
use spillway_core::{
    FailPolicy, FixedWindow, Gcra, KeySpec, LeakyBucket, Limit, Mode, Nanos, Rate, Route, Rule,
    Shaper, SlidingCounter, SlidingLog, TokenBucket,
};

use super::errors::Errors;
use super::raw::{RawLimit, RawRule};

pub const DEFAULT_MAX_KEYS: usize = 10_000_000;

pub(super) fn policy(errs: &mut Errors<'_>, p: &Spanned<String>) -> FailPolicy {
    match p.value.as_str() {
        "allow" => FailPolicy::Allow,
        "deny" => FailPolicy::Deny,
        other => {
            errs.at(
                p,
                format!("on_store_error {other:?}: expected allow or deny"),
            );
            FailPolicy::Allow
        }
    }
}

pub(super) fn rule(errs: &mut Errors<'_>, r: &Spanned<RawRule>) -> Option<Rule> {
    let raw = &r.value;
    let before = errs.list.len();
    let name = raw.name.value.trim();
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        errs.at(&raw.name, "rule name must be 1 to 128 printable characters");
    }
    let route = raw.api.as_ref().and_then(|a| match Route::parse(&a.value) {
        Ok(route) => Some(route),
        Err(e) => {
            errs.at(a, format!("api: {e}"));
            None
        }
    });
    let by = match &raw.by {
        None => KeySpec::from_parts(Vec::new()),
        Some(b) => match KeySpec::parse(&b.value) {
            Ok(k) if k.parts().len() > spillway_store::MAX_KEY_PARTS => {
                errs.at(
                    b,
                    format!("by: at most {} parts", spillway_store::MAX_KEY_PARTS),
                );
                k
            }
            Ok(k) => k,
            Err(e) => {
                errs.at(b, format!("by: {e}"));
                KeySpec::from_parts(Vec::new())
            }
        },
    };
    let mode = raw.mode.as_ref().map_or(Mode::Hard, |m| mode(errs, m));
    let max_wait = raw.queue.as_ref().and_then(|q| {
        let mw = &q.value.max_wait;
        duration(errs, mw, "queue.max_wait", true)
    });
    if raw.limits.is_empty() {
        errs.at(r, format!("rule {name:?} needs at least one limit"));
    }
    let mut limits = Vec::new();
    for l in &raw.limits {
        if let Some(limit) = limit(errs, l, max_wait) {
            limits.push(limit);
        }
    }
    if let (Some(q), Some(_)) = (&raw.queue, max_wait)
        && !limits.iter().any(|l| matches!(l, Limit::Shaper(_)))
    {
        errs.at(
            q,
            "queue needs a leaky_bucket limit in the same rule to shape with",
        );
    }
    let policy = raw.on_store_error.as_ref().map(|p| policy(errs, p));
    if errs.list.len() != before {
        return None;
    }
    match Rule::new(name, route, by, limits, mode) {
        Ok(rule) => Some(match policy {
            Some(p) => rule.with_fail_policy(p),
            None => rule,
        }),
        Err(e) => {
            errs.at(r, e.to_string());
            None
        }
    }
}

pub(super) fn mode(errs: &mut Errors<'_>, m: &Spanned<String>) -> Mode {
    let v = m.value.trim();
    match v {
        "hard" => Mode::Hard,
        "shadow" => Mode::Shadow,
        _ => {
            let pct = v
                .strip_prefix("soft")
                .map(str::trim)
                .and_then(|p| p.strip_suffix('%'))
                .map(|p| p.trim().parse::<u32>());
            match pct {
                Some(Ok(p)) if p <= 1000 => Mode::Soft { percent: p },
                _ => {
                    errs.at(
                        m,
                        format!("mode {v:?}: expected hard, shadow or soft N% (0 to 1000)"),
                    );
                    Mode::Hard
                }
            }
        }
    }
}

pub(super) fn count(errs: &mut Errors<'_>, n: &Spanned<i64>, what: &str) -> Option<u64> {
    if n.value <= 0 {
        errs.at(n, format!("{what} must be at least 1, not {}", n.value));
        return None;
    }
    Some(n.value as u64)
}

pub(super) fn limit(
    errs: &mut Errors<'_>,
    l: &Spanned<RawLimit>,
    max_wait: Option<Nanos>,
) -> Option<Limit> {
    let built = match &l.value {
        RawLimit::TokenBucket(b) => {
            let c = count(errs, &b.capacity, "capacity");
            let r = rate(errs, &b.refill, "refill");
            TokenBucket::new(c?, r?).map(Limit::TokenBucket)
        }
        RawLimit::LeakyBucket(b) => {
            let c = count(errs, &b.capacity, "capacity");
            let r = rate(errs, &b.leak, "leak");
            match max_wait {
                Some(w) => Shaper::new(c?, r?, w).map(Limit::Shaper),
                None => LeakyBucket::new(c?, r?).map(Limit::LeakyBucket),
            }
        }
        RawLimit::FixedWindow(w) => {
            let n = count(errs, &w.limit, "limit");
            let d = duration(errs, &w.window, "window", false);
            FixedWindow::new(n?, d?).map(Limit::FixedWindow)
        }
        RawLimit::SlidingWindowLog(w) => {
            let n = count(errs, &w.limit, "limit");
            let d = duration(errs, &w.window, "window", false);
            SlidingLog::new(n?, d?).map(Limit::SlidingLog)
        }
        RawLimit::SlidingWindowCounter(w) => {
            let n = count(errs, &w.limit, "limit");
            let d = duration(errs, &w.window, "window", false);
            SlidingCounter::new(n?, d?).map(Limit::SlidingCounter)
        }
        RawLimit::Gcra(g) => {
            let r = rate(errs, &g.rate, "rate");
            let b = match &g.burst {
                Some(b) => count(errs, b, "burst"),
                None => Some(1),
            };
            Gcra::new(r?, b?).map(Limit::Gcra)
        }
    };
    match built {
        Ok(limit) => Some(limit),
        Err(e) => {
            errs.at(l, e.to_string());
            None
        }
    }
}

/// Parses `500ms`, `1s`, `1m`, `1h`, `1d` (also `us`, `ns`; a decimal like
/// `1.5s`): [`spillway_core::parse_duration`], with its message as text.
///
/// # Errors
/// Not a duration.
pub fn parse_duration(s: &str) -> Result<Nanos, String> {
    spillway_core::parse_duration(s).map_err(|e| e.to_string())
}

/// Parses `N/s`, `N/m`, `N/h`, `N/d` or `N/<duration>` such as `100/1m`.
///
/// # Errors
/// Not a rate.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    s.parse::<Rate>().map_err(|e| e.to_string())
}

pub(super) fn duration(
    errs: &mut Errors<'_>,
    d: &Spanned<String>,
    what: &str,
    zero_ok: bool,
) -> Option<Nanos> {
    match parse_duration(&d.value) {
        Ok(n) if n.as_u64() == 0 && !zero_ok => {
            errs.at(d, format!("{what} must be longer than zero"));
            None
        }
        Ok(n) => Some(n),
        Err(e) => {
            errs.at(d, format!("{what}: {e}"));
            None
        }
    }
}

pub(super) fn rate(errs: &mut Errors<'_>, r: &Spanned<String>, what: &str) -> Option<Rate> {
    match parse_rate(&r.value) {
        Ok(rate) => Some(rate),
        Err(e) => {
            errs.at(r, format!("{what}: {e}"));
            None
        }
    }
}
