//! Raw rules checked and built into core types: key, route, mode,
//! limits; each function adds what is wrong to a [`Collector`] at the
//! value's line and column.

use std::collections::BTreeMap;

use serde_saphyr::Spanned;
use spillway_core::{
    FailPolicy, FixedWindow, Gcra, KeyPart, KeySpec, LeakyBucket, Limit, Mode, Nanos, PathMatching,
    Rate, Route, Rule, Shaper, SlidingCounter, SlidingLog, TokenBucket,
};

pub use crate::error::{Collector, first_line};
use crate::raw::{RawCost, RawLimit, RawPathMatching, RawPlans, RawRule};

/// The key parts spillway knows by name, in the order suggestions prefer.
const BUILT_IN_PARTS: [&str; 3] = ["user", "ip", "route"];

/// What every rule of a file is checked and built against.
#[derive(Debug)]
pub struct RuleContext<'a> {
    /// Names declared in `descriptors:`, which `by:` may use bare.
    pub descriptors: &'a [String],
    /// Accept any bare name: set only when the `descriptors:` list itself
    /// could not be read, so its error is not repeated for every rule.
    pub any_descriptor: bool,
    /// The file's `path_matching:` (every switch on when absent).
    pub path_matching: PathMatching,
    /// The plans' limits as written, by plan name.
    pub plans: &'a BTreeMap<String, &'a [Spanned<RawLimit>]>,
}

/// `plans:` checked: each plan's limits as a rule without a queue builds
/// them, and as written (a rule with `plan:` builds its own from these).
#[derive(Debug, Default)]
pub struct Plans<'r> {
    /// The limits of each plan that built, by plan name.
    pub limits: BTreeMap<String, Vec<Limit>>,
    /// Each plan's limits as written, by plan name.
    pub raws: BTreeMap<String, &'r [Spanned<RawLimit>]>,
}

/// Reads `plans:`: each plan's limits checked once (as a rule without a
/// queue uses them).
pub fn plans<'r>(errs: &mut Collector<'_>, raw: Option<&'r RawPlans>) -> Plans<'r> {
    let mut out = Plans::default();
    for (name, plan) in raw.map(|p| p.value.iter()).into_iter().flatten() {
        if name.trim().is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            errs.at(plan, "plans: a plan name of 1 to 64 printable characters");
            continue;
        }
        if plan.value.limits.value.is_empty() {
            errs.at(
                &plan.value.limits,
                format!("plan {name:?} needs at least one limit"),
            );
            continue;
        }
        let mut list = Vec::new();
        for l in &plan.value.limits.value {
            if let Some(limit) = limit(errs, l, None) {
                list.push(limit);
            }
        }
        out.limits.insert(name.clone(), list);
        out.raws
            .insert(name.clone(), plan.value.limits.value.as_slice());
    }
    out
}

/// Every rule of `list` built, in file order: a name used twice is an
/// error at the second; `each` sees every rule that built (beside its
/// raw form) before it is kept, to check or note what its caller needs.
pub fn rules(
    errs: &mut Collector<'_>,
    list: &[Spanned<RawRule>],
    ctx: &RuleContext<'_>,
    mut each: impl FnMut(&mut Collector<'_>, &Spanned<RawRule>, &Rule),
) -> Vec<Rule> {
    let mut rules = Vec::with_capacity(list.len());
    let mut pool = spillway_core::rule::RuleInterner::default();
    // By name: a million rules checked in linear time, not quadratic.
    let mut names: std::collections::HashMap<&str, &Spanned<String>> =
        std::collections::HashMap::with_capacity(list.len());
    for r in list {
        if let Some(prev) = names.get(r.value.name.value.as_str()) {
            errs.at(
                &r.value.name,
                format!(
                    "duplicate rule name {:?} (first used at line {})",
                    r.value.name.value,
                    prev.referenced.line()
                ),
            );
        }
        names
            .entry(r.value.name.value.as_str())
            .or_insert(&r.value.name);
        if let Some(rule) = rule(errs, r, ctx) {
            // Rules of one key or one set of limits share it.
            let rule = rule.interned(&mut pool);
            each(errs, r, &rule);
            rules.push(rule);
        }
    }
    rules
}

/// [`rules`] over `list`, or, when the file's rules were cut into
/// `chunks` (see [`crate::chunks`]), over each chunk in turn: one chunk's
/// raw rules are alive at a time. With chunks, any error (a chunk that
/// does not parse, a rule that does not build, a name used twice) is
/// reported without its place: the caller reads the file whole for that.
pub fn rules_in(
    errs: &mut Collector<'_>,
    list: &[Spanned<RawRule>],
    chunks: Option<&crate::chunks::Chunks>,
    ctx: &RuleContext<'_>,
    mut each: impl FnMut(&mut Collector<'_>, &Spanned<RawRule>, &Rule),
) -> Vec<Rule> {
    let Some(chunks) = chunks else {
        return rules(errs, list, ctx, each);
    };
    let mut out = Vec::with_capacity(chunks.items());
    let mut pool = spillway_core::rule::RuleInterner::default();
    let file = errs.file;
    // Built on every core; taken (interned, handed to `each`) here, in
    // file order.
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let built = chunks.build(
        threads,
        |r| {
            let mut mine = Collector::new(file);
            match rule(&mut mine, r, ctx) {
                Some(rule) if mine.list.is_empty() => Ok(rule),
                _ => Err(mine
                    .list
                    .first()
                    .map_or_else(|| "a rule does not build".into(), |e| e.message.clone())),
            }
        },
        |r, rule| {
            let rule = rule.interned(&mut pool);
            each(errs, r, &rule);
            out.push(rule);
        },
    );
    let mut problem = built.err();
    if problem.is_none() {
        let mut seen = std::collections::HashSet::with_capacity(out.len());
        if !out.iter().all(|r| seen.insert(r.name())) {
            problem = Some("a rule name is used twice".into());
        }
    }
    if let Some(message) = problem {
        errs.list.push(crate::Error {
            file: errs.file.to_string(),
            line: 0,
            column: 0,
            message,
        });
    }
    out
}

/// The file's `descriptors:` list: names that are not built in, each once.
pub fn descriptor_names(errs: &mut Collector<'_>, list: &[Spanned<String>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in list {
        let name = d.value.trim();
        if name.is_empty() || name.contains(['+', ':']) || name.chars().any(char::is_whitespace) {
            errs.at(
                d,
                format!("descriptors: {name:?} is not a name (no spaces, `+` or `:`)"),
            );
        } else if BUILT_IN_PARTS.contains(&name) {
            errs.at(
                d,
                format!("descriptors: `{name}` is built in; use it in `by:` without declaring it"),
            );
        } else if out.iter().any(|o| o == name) {
            errs.at(d, format!("descriptors: `{name}` is listed twice"));
        } else {
            out.push(name.to_string());
        }
    }
    out
}

/// `path_matching:` over `base`: the switches it sets replace base's.
pub fn path_matching(raw: &RawPathMatching, base: PathMatching) -> PathMatching {
    PathMatching {
        trailing_slash: raw.trailing_slash.unwrap_or(base.trailing_slash),
        path_params: raw.path_params.unwrap_or(base.path_params),
        encoded_slash: raw.encoded_slash.unwrap_or(base.encoded_slash),
        head_as_get: raw.head_as_get.unwrap_or(base.head_as_get),
        case_insensitive: raw.case.map_or(base.case_insensitive, |c| {
            c == crate::raw::PathCase::Insensitive
        }),
    }
}

/// A rule's `by:`. A bare name that is neither built in nor declared in
/// `descriptors:` is an error: read as a descriptor no request carries,
/// a typo (`usr`, `IP`) would skip the rule for every request.
fn key_spec(errs: &mut Collector<'_>, b: &Spanned<String>, ctx: &RuleContext<'_>) -> KeySpec {
    let k = match KeySpec::parse(&b.value) {
        Ok(k) => k,
        Err(e) => {
            errs.at(b, format!("by: {e}"));
            return KeySpec::from_parts(Vec::new());
        }
    };
    if k.parts().len() > crate::MAX_KEY_PARTS {
        errs.at(b, format!("by: at most {} parts", crate::MAX_KEY_PARTS));
    }
    for part in k.parts() {
        if let KeyPart::Descriptor(d) = part
            && !ctx.any_descriptor
            && !ctx.descriptors.iter().any(|n| n == d)
        {
            let hint = match suggest(d, ctx.descriptors) {
                Some(s) => format!(" (did you mean `{s}`?)"),
                None => String::new(),
            };
            errs.at(
                b,
                format!(
                    "by: unknown key part `{d}`{hint}: expected user, ip, route, header:<Name>, or a descriptor name listed in `descriptors:`"
                ),
            );
        }
    }
    k
}

/// The known key part closest to `part` (case-insensitive edit distance
/// at most 2, and something in common), if any: built-in names first,
/// then declared ones; `header:<name>` for a misspelt `header` prefix.
pub fn suggest(part: &str, declared: &[String]) -> Option<String> {
    let lower = part.to_ascii_lowercase();
    if let Some((prefix, rest)) = part.split_once(':')
        && edit_distance(&prefix.to_ascii_lowercase(), "header") <= 2
        && !rest.trim().is_empty()
    {
        return Some(format!("header:{}", rest.trim()));
    }
    BUILT_IN_PARTS
        .iter()
        .copied()
        .chain(declared.iter().map(String::as_str))
        .map(|c| (edit_distance(&lower, &c.to_ascii_lowercase()), c))
        .filter(|&(d, c)| d <= 2 && d < lower.chars().count().max(c.chars().count()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c.to_string())
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// `on_store_error:` read: `allow`, `deny` or `share`, else an error at
/// its location (and `allow`).
pub fn policy(errs: &mut Collector<'_>, p: &Spanned<String>) -> FailPolicy {
    match p.value.as_str() {
        "allow" => FailPolicy::Allow,
        "deny" => FailPolicy::Deny,
        "share" => FailPolicy::Share,
        other => {
            errs.at(
                p,
                format!("on_store_error {other:?}: expected allow, deny or share"),
            );
            FailPolicy::Allow
        }
    }
}

/// One item of `rules:` checked and built, every error located; `None`
/// when it has any.
pub fn rule(errs: &mut Collector<'_>, r: &Spanned<RawRule>, ctx: &RuleContext<'_>) -> Option<Rule> {
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
        Some(b) => key_spec(errs, b, ctx),
    };
    let mode = raw.mode.as_ref().map_or(Mode::Hard, |m| mode(errs, m));
    let max_wait = raw.queue.as_ref().and_then(|q| {
        let mw = &q.value.max_wait;
        duration(errs, mw, "queue.max_wait", true)
    });
    let written: &[Spanned<RawLimit>] = match (&raw.limits, &raw.plan) {
        (Some(_), Some(p)) => {
            errs.at(
                p,
                format!(
                    "rule {name:?}: give limits: or plan:, not both (the plan gives the limits)"
                ),
            );
            &[]
        }
        (Some(l), None) => l,
        (None, Some(p)) => match ctx.plans.get(&p.value.default.value) {
            Some(l) => l,
            None => {
                let known: Vec<&str> = ctx.plans.keys().map(String::as_str).collect();
                errs.at(
                    &p.value.default,
                    format!(
                        "rule {name:?}: plan {:?} is not in plans: (known: {})",
                        p.value.default.value,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
                &[]
            }
        },
        (None, None) => {
            errs.at(
                r,
                format!("rule {name:?} needs limits: (or plan: {{ default: NAME }})"),
            );
            &[]
        }
    };
    if raw.plan.is_none() && raw.limits.as_ref().is_some_and(Vec::is_empty) {
        errs.at(r, format!("rule {name:?} needs at least one limit"));
    }
    let mut limits = Vec::new();
    // A plan's limits were checked once with `plans:`; a rule with a
    // queue builds them again as shapers, so errors are not repeated.
    let mut scratch = Collector::new(errs.file);
    let target = if raw.plan.is_some() {
        &mut scratch
    } else {
        &mut *errs
    };
    for l in written {
        if let Some(limit) = limit(target, l, max_wait) {
            limits.push(limit);
        }
    }
    if raw.plan.is_some() && !scratch.list.is_empty() && errs.list.len() == before {
        errs.at(
            r,
            format!("rule {name:?}: its plan's limits are not valid (see plans:)"),
        );
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
    let priority = raw.priority.as_ref().and_then(|p| {
        let v = p.value.trim();
        let parsed = spillway_core::Priority::parse(v);
        if parsed.is_none() {
            errs.at(
                p,
                format!("priority {v:?}: expected critical, default or sheddable"),
            );
        }
        parsed
    });
    let cost = raw
        .cost
        .as_ref()
        .and_then(|c| response_cost(errs, c, &limits));
    if errs.list.len() != before {
        return None;
    }
    // A rule carries its path matching when it sets one, and when the
    // file's differs from the default: so it holds whatever rule set the
    // rule is put in (a rule set with the same global one files it as
    // any other).
    let matching = raw
        .path_matching
        .as_ref()
        .map(|m| path_matching(&m.value, ctx.path_matching))
        .or((ctx.path_matching != PathMatching::default()).then_some(ctx.path_matching));
    match Rule::new(name, route, by, limits, mode) {
        Ok(rule) => {
            let rule = match policy {
                Some(p) => rule.with_fail_policy(p),
                None => rule,
            };
            let rule = match cost {
                Some(c) => rule.with_response_cost(c),
                None => rule,
            };
            let rule = match priority {
                Some(p) => rule.with_priority(p),
                None => rule,
            };
            Some(match matching {
                Some(m) => rule.with_path_matching(m),
                None => rule,
            })
        }
        Err(e) => {
            errs.at(r, e.to_string());
            None
        }
    }
}

/// `cost: { response_header: NAME, estimate: N }`: a header name as HTTP
/// writes one, and an estimate the rule's limits can admit.
fn response_cost(
    errs: &mut Collector<'_>,
    c: &Spanned<RawCost>,
    limits: &[Limit],
) -> Option<spillway_core::ResponseCost> {
    let header = c.value.response_header.value.trim();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if header.is_empty() || !header.bytes().all(token) {
        errs.at(
            &c.value.response_header,
            format!("cost.response_header {header:?} is not a header name"),
        );
        return None;
    }
    let estimate = c.value.estimate.as_ref().map_or(0, |e| e.value);
    if let Some(l) = limits.iter().find(|l| estimate > l.size()) {
        let message = format!(
            "cost.estimate {estimate} is more than the limit's size {}: no request could pass",
            l.size()
        );
        match &c.value.estimate {
            Some(e) => errs.at(e, message),
            None => errs.at(c, message),
        }
        return None;
    }
    Some(spillway_core::ResponseCost {
        header: header.to_ascii_lowercase(),
        estimate,
    })
}

/// `mode:` read (`hard`, `soft N%`, `shadow`, `elastic ...`), else an
/// error at its location (and hard).
pub fn mode(errs: &mut Collector<'_>, m: &Spanned<String>) -> Mode {
    let v = m.value.trim();
    match v {
        "hard" => Mode::Hard,
        "shadow" => Mode::Shadow,
        _ if v.starts_with("elastic") => {
            let pct = v["elastic".len()..]
                .trim()
                .strip_suffix('%')
                .map(|p| p.trim().parse::<u32>());
            match pct
                .and_then(Result::ok)
                .and_then(spillway_core::Elastic::new)
            {
                Some(e) => Mode::Elastic(e),
                None => {
                    errs.at(
                        m,
                        format!(
                            "mode {v:?}: expected elastic N% with N from 100 to {} (300% admits up to 3x the limit while the service is healthy)",
                            spillway_core::elastic::MAX_PERCENT
                        ),
                    );
                    Mode::Hard
                }
            }
        }
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
                        format!(
                            "mode {v:?}: expected hard, shadow, soft N% (0 to 1000) or elastic N% (100 to {})",
                            spillway_core::elastic::MAX_PERCENT
                        ),
                    );
                    Mode::Hard
                }
            }
        }
    }
}

/// A count that must be at least 1 (`what` names it in the error).
pub fn count(errs: &mut Collector<'_>, n: &Spanned<i64>, what: &str) -> Option<u64> {
    if n.value <= 0 {
        errs.at(n, format!("{what} must be at least 1, not {}", n.value));
        return None;
    }
    Some(n.value as u64)
}

/// One limit checked and built with its algorithm's parameters.
pub fn limit(
    errs: &mut Collector<'_>,
    l: &Spanned<RawLimit>,
    max_wait: Option<Nanos>,
) -> Option<Limit> {
    let max_debt = match &l.value {
        RawLimit::TokenBucket(b) => b.max_debt.as_ref(),
        RawLimit::LeakyBucket(b) => b.max_debt.as_ref(),
        RawLimit::FixedWindow(w)
        | RawLimit::SlidingWindowLog(w)
        | RawLimit::SlidingWindowCounter(w) => w.max_debt.as_ref(),
        RawLimit::Gcra(g) => g.max_debt.as_ref(),
    }
    .map(|d| (d, duration(errs, d, "max_debt", false)));
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
    let limit = match built {
        Ok(limit) => limit,
        Err(e) => {
            errs.at(l, e.to_string());
            return None;
        }
    };
    match max_debt {
        None => Some(limit),
        Some((_, None)) => None,
        Some((at, Some(d))) => match limit.with_max_debt(d) {
            Ok(limit) => Some(limit),
            Err(_) => {
                errs.at(
                    at,
                    format!(
                        "max_debt is longer than the longest accepted, {} days (about 146 years)",
                        spillway_core::MAX_DEBT.as_u64() / 86_400_000_000_000
                    ),
                );
                None
            }
        },
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

/// A duration such as `500ms` or `1m` (`what` names it in the error);
/// zero only when `zero_ok`.
pub fn duration(
    errs: &mut Collector<'_>,
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

/// A rate such as `10/1s` (`what` names it in the error).
pub fn rate(errs: &mut Collector<'_>, r: &Spanned<String>, what: &str) -> Option<Rate> {
    match parse_rate(&r.value) {
        Ok(rate) => Some(rate),
        Err(e) => {
            errs.at(r, format!("{what}: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_need_something_in_common() {
        assert_eq!(suggest("ab", &[]), None);
        assert_eq!(suggest("iP", &[]).as_deref(), Some("ip"));
        assert_eq!(suggest("users", &[]).as_deref(), Some("user"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
