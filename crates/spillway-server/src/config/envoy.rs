//! envoyproxy/ratelimit's configuration files, and spillway's `domains:`.
//!
//! A file is read as ratelimit reads it: its first YAML document only; a
//! missing or null field is empty (`descriptors:` with nothing after it, a
//! `rate_limit` without `requests_per_unit`, which is then 0); and refused
//! where ratelimit refuses it (an empty domain or key, two descriptors with
//! one composite key `key_value` at a level, an unknown unit, `unlimited`
//! with a unit, an empty or self-naming `replaces`, `share_threshold`
//! without a wildcard). Unlike ratelimit, every error is reported, each with
//! its line and column, and a field at a level it does not belong to is an
//! error rather than ignored.

use std::path::Path;
use std::sync::Arc;

use serde_saphyr::Spanned;
use spillway_core::{KeySpec, Limit, Mode, Rule};

use spillway_rules::build::{Collector, limit};
use spillway_rules::recover::read_file as read;

use super::raw::{RawDescriptor, RawDomain, RawEnvoyRate, RawLimit};
use super::{ConfigError, ConfigErrors};
use crate::grpc::{Action, Domain, Node, proto::Unit};

/// A domain as one file gives it, with where its parts are: for the errors
/// that involve two files (the same domain twice, or, merged, the same
/// top-level descriptor twice).
#[derive(Debug)]
pub(crate) struct Located {
    pub(crate) domain: Domain,
    /// The file's name as errors show it.
    pub(crate) file: String,
    /// Line and column of the `domain:` value (0, 0 if none).
    pub(crate) at: (u64, u64),
    /// Line and column of each top-level descriptor, in the order of
    /// `domain.nodes`.
    pub(crate) tops: Vec<(u64, u64)>,
}

/// Parses one envoyproxy/ratelimit file.
///
/// # Errors
/// Every problem, with line and column.
pub fn parse_envoy(file: &str, text: &str) -> Result<Domain, ConfigErrors> {
    parse_located(file, text).map(|l| l.domain)
}

/// Reads and parses an envoyproxy/ratelimit configuration file.
///
/// # Errors
/// As [`parse_envoy`], or the file cannot be read.
pub fn load_envoy(path: &Path) -> Result<Domain, ConfigErrors> {
    load_located(path).map(|l| l.domain)
}

pub(crate) fn load_located(path: &Path) -> Result<Located, ConfigErrors> {
    let (name, text) = read(path)?;
    parse_located(&name, &text)
}

pub(crate) fn parse_located(file: &str, text: &str) -> Result<Located, ConfigErrors> {
    let one = |line: u64, column: u64, message: &str| {
        ConfigErrors(vec![ConfigError::new(
            file.to_string(),
            line,
            column,
            message.to_string(),
        )])
    };
    spillway_rules::recover::check_size(file, text)?;
    let doc = first_document(text);
    if doc.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || l.starts_with('%') || is_marker(l, "---")
    }) {
        return Err(one(
            0,
            0,
            "no `domain:`: the file (or its first YAML document) is empty",
        ));
    }
    let raw: RawDomain = spillway_rules::recover::from_str(doc)
        .map_err(|e| ConfigErrors(vec![spillway_rules::recover::located(file, &e)]))?;
    let mut errs = Collector::new(file);
    let (domain, at) = domain(&mut errs, &raw, (0, 0));
    if !errs.list.is_empty() {
        return Err(ConfigErrors(errs.list));
    }
    let tops = raw.descriptors.iter().flatten().map(loc).collect();
    Ok(Located {
        domain,
        file: file.to_string(),
        at,
        tops,
    })
}

/// The text of the first YAML document: up to the next document marker
/// (`---` or `...` at the start of a line, which YAML reserves there, even
/// inside a quoted string). envoyproxy/ratelimit reads the first document
/// and nothing after it, whatever follows.
fn first_document(text: &str) -> &str {
    let mut started = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if is_marker(line, "...") {
            return &text[..offset];
        }
        if is_marker(line, "---") {
            if started {
                return &text[..offset];
            }
            started = true;
        } else if !started {
            let t = line.trim();
            if !(t.is_empty() || t.starts_with('#') || line.starts_with('%')) {
                started = true;
            }
        }
        offset += line.len();
    }
    text
}

/// `line` is the document marker `marker` (alone, or before a space).
fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|r| r.is_empty() || r.starts_with([' ', '\t', '\r', '\n']))
}

fn loc<T>(s: &Spanned<T>) -> (u64, u64) {
    (s.referenced.line(), s.referenced.column())
}

/// A descriptor's composite key, as envoyproxy/ratelimit names it: `key`,
/// or `key_value`. Two at one level may not share one.
pub(crate) fn composite(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_string(),
    }
}

/// One domain, checked: the domain and where its name is (`missing_at` if
/// it has none).
pub(super) fn domain(
    errs: &mut Collector<'_>,
    d: &RawDomain,
    missing_at: (u64, u64),
) -> (Domain, (u64, u64)) {
    let (name, at) = match &d.domain {
        Some(s) => {
            if s.value.is_empty() {
                errs.at(s, "domain must not be empty");
            }
            (s.value.clone(), loc(s))
        }
        None => {
            errs.at_loc(missing_at, "no `domain:` (every file names its domain)");
            (String::new(), missing_at)
        }
    };
    let nodes = descriptors(errs, &name, d.descriptors.as_deref().unwrap_or_default());
    (Domain { name, nodes }, at)
}

fn descriptors(errs: &mut Collector<'_>, path: &str, list: &[Spanned<RawDescriptor>]) -> Vec<Node> {
    let mut out: Vec<Node> = Vec::with_capacity(list.len());
    // By composite key: a domain of a million descriptors is checked in
    // linear time.
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for d in list {
        let raw = &d.value;
        let key_at = raw.key.as_ref().map_or_else(|| loc(d), loc);
        let key = match &raw.key {
            Some(k) if !k.value.is_empty() => k.value.clone(),
            Some(k) => {
                errs.at(k, "descriptor key must not be empty");
                String::new()
            }
            None => {
                errs.at(d, "descriptor without a `key:`");
                String::new()
            }
        };
        // An empty value is no value, as in envoyproxy/ratelimit: key only.
        let value = raw
            .value
            .as_ref()
            .map(|v| v.value.clone())
            .filter(|v| !v.is_empty());
        let composite = composite(&key, value.as_deref());
        let here = format!("{path}.{composite}");
        match seen.get(&composite) {
            Some(line) => errs.at_loc(
                key_at,
                format!("duplicate descriptor composite key '{here}' (first at line {line})"),
            ),
            None => {
                seen.insert(composite, key_at.0);
            }
        }
        let shadow = raw.shadow_mode.unwrap_or(false);
        let mode = if shadow { Mode::Shadow } else { Mode::Hard };
        // The name as written: `rate_limit.name`, else spillway's
        // descriptor-level `name`.
        let name = raw
            .rate_limit
            .as_ref()
            .and_then(|r| r.value.name.as_ref())
            .or(raw.name.as_ref())
            .map(|n| n.value.clone())
            .unwrap_or_default();
        let given = [
            raw.rate_limit.is_some(),
            raw.limit.is_some(),
            raw.limits.is_some(),
        ];
        let action = if given.iter().filter(|g| **g).count() > 1 {
            errs.at(
                d,
                "give one of rate_limit (Envoy's fixed window), limit or limits (spillway's algorithms)",
            );
            Action::None
        } else if let Some(r) = &raw.rate_limit {
            envoy_limit(errs, r, &here, shadow)
        } else if let Some(l) = &raw.limit {
            spillway_limits(errs, std::slice::from_ref(l), loc(l), &here, mode)
        } else if let Some(ls) = &raw.limits {
            if ls.value.is_empty() {
                errs.at(ls, "limits: list at least one limit");
                Action::None
            } else {
                spillway_limits(errs, &ls.value, loc(ls), &here, mode)
            }
        } else {
            Action::None
        };
        let mut replaces = Vec::new();
        let listed = raw.replaces.iter().flatten().chain(
            raw.rate_limit
                .iter()
                .flat_map(|r| r.value.replaces.iter().flatten()),
        );
        for rep in listed {
            match &rep.value.name {
                Some(n) if !n.value.is_empty() => {
                    if n.value == name {
                        errs.at(
                            n,
                            format!(
                                "a limit cannot replace itself: {:?} is this limit's own name",
                                n.value
                            ),
                        );
                    }
                    replaces.push(n.value.clone());
                }
                Some(n) => errs.at(n, "a `replaces` entry needs a name"),
                None => errs.at(rep, "a `replaces` entry needs a name"),
            }
        }
        let share_threshold = match &raw.share_threshold {
            Some(s) if s.value => {
                if !here[path.len()..].contains('*') {
                    errs.at(
                        s,
                        format!(
                            "share_threshold needs a wildcard value (one with `*`), and {here} has none"
                        ),
                    );
                }
                true
            }
            _ => false,
        };
        let children = descriptors(errs, &here, raw.descriptors.as_deref().unwrap_or_default());
        out.push(Node {
            key,
            value,
            action,
            replaces,
            children,
            name,
            share_threshold,
            quota_mode: raw.quota_mode.unwrap_or(false),
            detailed_metric: raw.detailed_metric.unwrap_or(false),
            metadata: raw
                .metadata
                .as_ref()
                .filter(|m| !m.is_empty())
                .map(|m| Arc::new(m.clone())),
        });
    }
    out
}

/// `rate_limit:`: a fixed window, a ban (0, or no number, per unit), or
/// unlimited.
fn envoy_limit(
    errs: &mut Collector<'_>,
    r: &Spanned<RawEnvoyRate>,
    here: &str,
    shadow: bool,
) -> Action {
    let rl = &r.value;
    let unit = rl.unit.as_ref().map(|u| (u, Unit::parse(&u.value)));
    if rl.unlimited == Some(true) {
        // An invalid unit beside `unlimited` is ignored, as ratelimit does.
        if let Some((u, Some(_))) = unit {
            errs.at(
                u,
                "no unit with `unlimited: true` (an unlimited descriptor counts nothing)",
            );
        }
        return Action::Unlimited;
    }
    let unit = match unit {
        Some((_, Some(u))) => Some(u),
        Some((u, None)) => {
            errs.at(
                u,
                format!(
                    "unit {:?}: expected second, minute, hour, day, week, month or year",
                    u.value
                ),
            );
            None
        }
        None => {
            errs.at(
                r,
                "rate_limit needs a unit (second, minute, hour, day, week, month or year), or `unlimited: true`",
            );
            None
        }
    };
    let per_unit = match &rl.requests_per_unit {
        // None given is 0, as in envoyproxy/ratelimit: every request over.
        None => Some(0),
        Some(n) if n.value < 0 || n.value > i64::from(u32::MAX) => {
            errs.at(
                n,
                format!("requests_per_unit {} must be 0 to {}", n.value, u32::MAX),
            );
            None
        }
        Some(n) => u64::try_from(n.value).ok(),
    };
    match (unit, per_unit) {
        (Some(u), Some(0)) => Action::Ban {
            name: here.to_string(),
            unit: u,
            shadow,
        },
        (Some(u), Some(n)) => match crate::grpc::envoy_rule(here, n, u, shadow) {
            Ok(rule) => Action::Limit(Box::new(rule)),
            Err(e) => {
                errs.at(r, e);
                Action::None
            }
        },
        _ => Action::None,
    }
}

/// `limit:` or `limits:`: one rule with every limit, all-or-none.
fn spillway_limits(
    errs: &mut Collector<'_>,
    list: &[Spanned<RawLimit>],
    at: (u64, u64),
    here: &str,
    mode: Mode,
) -> Action {
    let built: Vec<Limit> = list.iter().filter_map(|l| limit(errs, l, None)).collect();
    if built.len() != list.len() {
        return Action::None;
    }
    match Rule::new(here, None, KeySpec::from_parts(Vec::new()), built, mode) {
        Ok(rule) => Action::Limit(Box::new(rule)),
        Err(e) => {
            errs.at_loc(at, e.to_string());
            Action::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_document_is_read() {
        for (text, first) in [
            ("domain: a\n---\n'''\n", "domain: a\n"),
            ("---\ndomain: a\n---\ndomain: b\n", "---\ndomain: a\n"),
            (
                "# c\n%YAML 1.2\n---\ndomain: a\n...\n",
                "# c\n%YAML 1.2\n---\ndomain: a\n",
            ),
            ("---\n---\ndomain: a\n", "---\n"),
            ("domain: a\n----\n", "domain: a\n----\n"),
            ("domain: a\n  ---\n", "domain: a\n  ---\n"),
            ("domain: a\r\n--- \r\nx\r\n", "domain: a\r\n"),
        ] {
            assert_eq!(first_document(text), first, "{text:?}");
        }
        let d = parse_envoy("f.yaml", "domain: a\n---\nnot: [valid\n").unwrap();
        assert_eq!(d.name, "a");
        let e = parse_envoy("f.yaml", "---\n---\ndomain: a\n").unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }

    #[test]
    fn missing_fields_are_empty_as_in_ratelimit() {
        let d = parse_envoy("f.yaml", "domain: d\ndescriptors:\n").unwrap();
        assert!(d.nodes.is_empty());
        let d = parse_envoy(
            "f.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: ''\n    rate_limit: { unit: hour }\n  - key: n\n    rate_limit: ~\n",
        )
        .unwrap();
        assert_eq!(d.nodes[0].value, None);
        assert!(matches!(
            d.nodes[0].action,
            Action::Ban {
                unit: Unit::Hour,
                ..
            }
        ));
        assert!(matches!(d.nodes[1].action, Action::None));
    }

    #[test]
    fn names_are_kept_as_written_and_rules_are_named_by_path() {
        let d = parse_envoy(
            "f.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: { name: mine, unit: second, requests_per_unit: 5 }\n  - key: c\n    rate_limit: { unit: second, requests_per_unit: 5 }\n",
        )
        .unwrap();
        let b = &d.nodes[0].children[0];
        assert_eq!(b.name, "mine");
        assert_eq!(b.action.rule_name(), Some("d.a_x.b"));
        assert_eq!(d.nodes[1].name, "");
        assert_eq!(d.nodes[1].action.rule_name(), Some("d.c"));
    }
}
