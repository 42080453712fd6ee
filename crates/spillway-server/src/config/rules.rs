//! Rules: key, route, mode, limits.

use serde_saphyr::Spanned;
use spillway_core::{
    FailPolicy, FixedWindow, Gcra, KeyPart, KeySpec, LeakyBucket, Limit, Mode, Nanos, PathMatching,
    Rate, Route, Rule, Shaper, SlidingCounter, SlidingLog, TokenBucket,
};

use super::errors::Errors;
use super::raw::{RawLimit, RawPathMatching, RawRule};

pub const DEFAULT_MAX_KEYS: usize = 10_000_000;

/// The key parts spillway knows by name, in the order suggestions prefer.
const BUILT_IN_PARTS: [&str; 3] = ["user", "ip", "route"];

/// What every rule of a file is checked and built against.
#[derive(Debug)]
pub(super) struct RuleContext<'a> {
    /// Names declared in `descriptors:`, which `by:` may use bare.
    pub(super) descriptors: &'a [String],
    /// Accept any bare name: set only when the `descriptors:` list itself
    /// could not be read, so its error is not repeated for every rule.
    pub(super) any_descriptor: bool,
    /// The file's `path_matching:` (every switch on when absent).
    pub(super) path_matching: PathMatching,
    /// The plans' limits as written, by plan name.
    pub(super) plans: &'a std::collections::BTreeMap<String, &'a [Spanned<super::raw::RawLimit>]>,
}

/// The file's `descriptors:` list: names that are not built in, each once.
pub(super) fn descriptor_names(errs: &mut Errors<'_>, list: &[Spanned<String>]) -> Vec<String> {
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
pub(super) fn path_matching(raw: &RawPathMatching, base: PathMatching) -> PathMatching {
    PathMatching {
        trailing_slash: raw.trailing_slash.unwrap_or(base.trailing_slash),
        path_params: raw.path_params.unwrap_or(base.path_params),
        encoded_slash: raw.encoded_slash.unwrap_or(base.encoded_slash),
        head_as_get: raw.head_as_get.unwrap_or(base.head_as_get),
    }
}

/// A rule's `by:`. A bare name that is neither built in nor declared in
/// `descriptors:` is an error: read as a descriptor no request carries,
/// a typo (`usr`, `IP`) would skip the rule for every request.
fn key_spec(errs: &mut Errors<'_>, b: &Spanned<String>, ctx: &RuleContext<'_>) -> KeySpec {
    let k = match KeySpec::parse(&b.value) {
        Ok(k) => k,
        Err(e) => {
            errs.at(b, format!("by: {e}"));
            return KeySpec::from_parts(Vec::new());
        }
    };
    if k.parts().len() > spillway_store::MAX_KEY_PARTS {
        errs.at(
            b,
            format!("by: at most {} parts", spillway_store::MAX_KEY_PARTS),
        );
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
pub(super) fn suggest(part: &str, declared: &[String]) -> Option<String> {
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

pub(super) fn policy(errs: &mut Errors<'_>, p: &Spanned<String>) -> FailPolicy {
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

pub(super) fn rule(
    errs: &mut Errors<'_>,
    r: &Spanned<RawRule>,
    ctx: &RuleContext<'_>,
) -> Option<Rule> {
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
    let written: &[Spanned<super::raw::RawLimit>] = match (&raw.limits, &raw.plan) {
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
    let mut scratch = Errors {
        file: errs.file,
        list: Vec::new(),
    };
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
    errs: &mut Errors<'_>,
    c: &Spanned<super::raw::RawCost>,
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

pub(super) fn mode(errs: &mut Errors<'_>, m: &Spanned<String>) -> Mode {
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

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    fn by(by: &str, head: &str) -> String {
        format!(
            "{head}rules:\n  - name: r\n    by: {by}\n    limits: [ {{ gcra: {{ rate: 1/s }} }} ]\n"
        )
    }

    /// The issue "No way past a limit": `by: usr` passed and turned the
    /// rule off (read as a descriptor no request carries).
    #[test]
    fn a_misspelt_key_part_is_an_error_with_a_suggestion() {
        for (typo, want) in [
            ("usr", "`user`"),
            ("IP", "`ip`"),
            ("User+ip", "`user`"),
            ("rout", "`route`"),
            ("Header:X-Api-Key", "`header:X-Api-Key`"),
            ("heder:x", "`header:x`"),
            ("tenat", "`tenant`"),
        ] {
            let e = parse("r.yaml", &by(typo, "descriptors: [tenant]\n")).unwrap_err();
            assert_eq!(e.0.len(), 1, "{typo}: {e}");
            let shown = e.to_string();
            assert!(
                shown.starts_with("r.yaml:4:9: by: unknown key part"),
                "{shown}"
            );
            assert!(
                shown.contains(&format!("did you mean {want}?")),
                "{typo}: {shown}"
            );
        }
        let e = parse("r.yaml", &by("customer", "")).unwrap_err();
        assert!(!e.to_string().contains("did you mean"), "{e}");
    }

    #[test]
    fn a_declared_descriptor_may_be_used_bare() {
        for (spec, want) in [("tenant", "tenant"), ("user+plan", "user+plan")] {
            let c = parse("r.yaml", &by(spec, "descriptors: [tenant, plan]\n")).unwrap();
            assert_eq!(c.rules[0].by().to_string(), want);
            assert_eq!(c.descriptors, ["tenant", "plan"]);
        }
        for spec in ["user", "ip", "route", "header:X-Key", "user+ip+route"] {
            parse("r.yaml", &by(spec, "")).unwrap();
        }
    }

    #[test]
    fn bad_descriptor_names_are_errors() {
        for list in ["[user]", "[a, a]", "['a b']", "[a+b]", "['']"] {
            let e = parse("r.yaml", &format!("descriptors: {list}\nrules: []\n")).unwrap_err();
            assert_eq!(e.0[0].line, 1, "{list}: {e}");
        }
    }

    #[test]
    fn suggestions_need_something_in_common() {
        assert_eq!(suggest("ab", &[]), None);
        assert_eq!(suggest("iP", &[]).as_deref(), Some("ip"));
        assert_eq!(suggest("users", &[]).as_deref(), Some("user"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn path_matching_at_the_top_and_per_rule() {
        let text = "\
path_matching: { trailing_slash: false }
rules:
  - name: plain
    api: GET /a
    limits: [ { gcra: { rate: 1/s } } ]
  - name: own
    api: GET /b
    path_matching: { head_as_get: false }
    limits: [ { gcra: { rate: 1/s } } ]
";
        let c = parse("r.yaml", text).unwrap();
        let global = PathMatching {
            trailing_slash: false,
            ..PathMatching::LENIENT
        };
        assert_eq!(c.path_matching, global);
        assert_eq!(c.rules[0].path_matching(), Some(global));
        assert_eq!(
            c.rules[1].path_matching(),
            Some(PathMatching {
                head_as_get: false,
                ..global
            })
        );
        // The default sets nothing on rules.
        let c = parse("r.yaml", &by("user", "")).unwrap();
        assert_eq!(c.path_matching, PathMatching::default());
        assert_eq!(c.rules[0].path_matching(), None);
        let e = parse("r.yaml", "path_matching: { trailing_slashes: false }\n").unwrap_err();
        assert!(
            e.to_string().contains("unknown field `trailing_slashes`"),
            "{e}"
        );
    }

    #[test]
    fn reload_quiet() {
        let c = parse("r.yaml", "rules: []\n").unwrap();
        assert_eq!(c.reload_quiet, super::super::DEFAULT_RELOAD_QUIET);
        assert!(c.has_rules);
        let c = parse("r.yaml", "reload: { quiet: 300ms }\n").unwrap();
        assert_eq!(c.reload_quiet, std::time::Duration::from_millis(300));
        assert!(!c.has_rules);
        for bad in ["50ms", "0s", "soon"] {
            let e = parse("r.yaml", &format!("reload: {{ quiet: {bad} }}\n")).unwrap_err();
            assert!(
                e.to_string().starts_with("r.yaml:1:18: reload.quiet"),
                "{bad}: {e}"
            );
        }
    }

    /// `cost: { response_header, estimate }` is read into the rule; a name
    /// that is not a header name, or an estimate no request could pass,
    /// is an error at its line.
    #[test]
    fn a_cost_from_the_answer_is_read_and_checked() {
        let rule = |cost: &str| {
            format!(
                "rules:\n  - name: t\n    by: user\n    cost: {cost}\n    limits: [ {{ token_bucket: {{ capacity: 100, refill: 100/1h }} }} ]\n"
            )
        };
        let c = parse("r.yaml", &rule("{ response_header: X-Tokens-Used }")).unwrap();
        assert_eq!(
            c.rules[0].response_cost(),
            Some(&spillway_core::ResponseCost {
                header: "x-tokens-used".into(),
                estimate: 0
            })
        );
        let c = parse("r.yaml", &rule("{ response_header: x-t, estimate: 10 }")).unwrap();
        assert_eq!(c.rules[0].response_cost().unwrap().estimate, 10);
        for (bad, says) in [
            ("{ response_header: \"x t\" }", "is not a header name"),
            ("{ response_header: \"\" }", "is not a header name"),
            (
                "{ response_header: x, estimate: 101 }",
                "more than the limit's size 100",
            ),
            ("{ header: x }", "unknown field"),
        ] {
            let e = parse("r.yaml", &rule(bad)).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.contains("r.yaml:4"), "{bad}: {e}");
        }
    }
}
