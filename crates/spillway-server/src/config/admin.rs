//! `admin:` and `plans:`: the operator's plane and per-tenant limits.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_saphyr::Spanned;
use spillway_core::{Limit, Nanos};

use spillway_rules::build::{Collector, duration, limit};

use super::raw::{RawAdmin, RawHealth, RawLimit, RawPlans, RawRatio};
use crate::admin::settings::{AdminSettings, MAX_TOP_SLOTS, PlanBook, RulePlans, Scope, Token};
use crate::health::HealthSettings;

/// The most tokens `admin.tokens` may list.
const MAX_TOKENS: usize = 64;

/// The shortest token accepted: a guessable token is no lock.
const MIN_TOKEN_LEN: usize = 16;

/// The longest token file read.
const MAX_TOKEN_FILE: u64 = 4096;

/// Reads `admin:` into its settings, and its `listen` address.
pub(super) fn admin(
    errs: &mut Collector<'_>,
    raw: &Spanned<RawAdmin>,
    env: &dyn Fn(&str) -> Option<String>,
) -> (AdminSettings, Option<SocketAddr>) {
    let a = &raw.value;
    let mut out = AdminSettings::default();
    let listen = a
        .listen
        .as_ref()
        .and_then(|l| super::address(errs, l, "admin.listen", 9090));
    if let Some(list) = &a.tokens {
        out.tokens = tokens(errs, list, env, "admin.tokens");
    }
    out.show_keys = a.show_keys.unwrap_or(false);
    out.top_keys = a.top_keys.unwrap_or(true);
    if let Some(r) = &a.near_limit {
        match ratio(&r.value) {
            Some(v) if v > 0.0 && v < 1.0 => out.near_limit = v,
            _ => errs.at(
                r,
                "admin.near_limit: a share between 0 and 1, like 0.2 or \"20%\"",
            ),
        }
    }
    if let Some(n) = &a.top_slots {
        match usize::try_from(n.value) {
            Ok(v) if (8..=MAX_TOP_SLOTS).contains(&v) => out.top_slots = v,
            _ => errs.at(
                n,
                format!(
                    "admin.top_slots: from 8 to {MAX_TOP_SLOTS}, not {}",
                    n.value
                ),
            ),
        }
    }
    if let Some(n) = &a.audit_entries {
        match usize::try_from(n.value) {
            Ok(v) if (1..=1_000_000).contains(&v) => out.audit_entries = v,
            _ => errs.at(
                n,
                format!("admin.audit_entries: from 1 to 1000000, not {}", n.value),
            ),
        }
    }
    if let Some(f) = &a.state_file {
        if f.value.trim().is_empty() {
            errs.at(f, "admin.state_file: give a path");
        } else {
            out.state_file = Some(f.value.clone().into());
        }
    }
    (out, listen)
}

/// Reads `health:`.
pub(super) fn health(errs: &mut Collector<'_>, raw: &Spanned<RawHealth>) -> HealthSettings {
    let mut out = HealthSettings::default();
    let h = &raw.value;
    if let Some(l) = &h.latency {
        out.latency_target =
            duration(errs, &l.value.target, "health.latency.target", false).map(Into::into);
        if let Some(p) = &l.value.percentile {
            if (50.0..100.0).contains(&p.value) {
                out.percentile = p.value;
            } else {
                errs.at(
                    p,
                    "health.latency.percentile: from 50 to below 100, like 99",
                );
            }
        }
    }
    if let Some(e) = &h.errors {
        match ratio(&e.value.max.value) {
            Some(v) if v > 0.0 && v <= 1.0 => out.errors_max = Some(v),
            _ => errs.at(
                &e.value.max,
                "health.errors.max: a share above 0 and at most 1, like 0.02 or \"2%\"",
            ),
        }
    }
    if let Some(s) = &h.stale_after
        && let Some(d) = duration(errs, s, "health.stale_after", false)
    {
        out.stale_after = d.into();
    }
    if let Some(w) = &h.window
        && let Some(d) = duration(errs, w, "health.window", false)
    {
        out.window = d.into();
    }
    out
}

fn ratio(r: &RawRatio) -> Option<f64> {
    match r {
        RawRatio::Number(v) => Some(*v),
        RawRatio::Text(t) => {
            let t = t.trim();
            match t.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().ok().map(|p| p / 100.0),
                None => t.parse::<f64>().ok(),
            }
        }
    }
    .filter(|v| v.is_finite())
}

/// A list of bearer tokens (`admin.tokens`, `api.tokens`: `what`), each
/// read from its file or variable; names and values each used once.
pub(super) fn tokens(
    errs: &mut Collector<'_>,
    list: &Spanned<Vec<Spanned<super::raw::RawToken>>>,
    env: &dyn Fn(&str) -> Option<String>,
    what: &str,
) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::new();
    if list.value.len() > MAX_TOKENS {
        errs.at(list, format!("{what}: at most {MAX_TOKENS} tokens"));
    }
    for t in &list.value {
        if let Some(token) = token(errs, t, env, what) {
            if out.iter().any(|o| o.name == token.name) {
                errs.at(
                    &t.value.name,
                    format!("{what}: the name {:?} is used twice", token.name),
                );
            } else if out.iter().any(|o| o.same_secret(&token)) {
                errs.at(
                    t,
                    format!(
                        "{what}: {:?} has the same value as another token: give each its own",
                        token.name
                    ),
                );
            } else {
                out.push(token);
            }
        }
    }
    out
}

fn token(
    errs: &mut Collector<'_>,
    t: &Spanned<super::raw::RawToken>,
    env: &dyn Fn(&str) -> Option<String>,
    what: &str,
) -> Option<Token> {
    let raw = &t.value;
    let name = raw.name.value.trim().to_string();
    if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control()) {
        errs.at(
            &raw.name,
            format!("{what}: a name of 1 to 64 printable characters"),
        );
        return None;
    }
    let scope = match raw.scope.value.trim() {
        "read" => Scope::Read,
        "write" => Scope::Write,
        other => {
            errs.at(
                &raw.scope,
                format!("{what}: scope {other:?}: expected read or write"),
            );
            return None;
        }
    };
    let (secret, source) = match (&raw.file, &raw.env) {
        (Some(_), Some(_)) | (None, None) => {
            errs.at(
                t,
                format!("{what}: {name:?} needs one of file: or env: (where its value is)"),
            );
            return None;
        }
        (Some(f), None) => match read_token_file(&f.value) {
            Ok(s) => (s, format!("file {}", f.value)),
            Err(e) => {
                errs.at(f, format!("{what}: {name:?}: {e}"));
                return None;
            }
        },
        (None, Some(v)) => match env(&v.value) {
            Some(s) => (s.trim().to_string(), format!("env {}", v.value)),
            None => {
                errs.at(
                    v,
                    format!(
                        "{what}: {name:?}: the environment variable {} is not set",
                        v.value
                    ),
                );
                return None;
            }
        },
    };
    if secret.len() < MIN_TOKEN_LEN {
        errs.at(
            t,
            format!(
                "{what}: {name:?} is shorter than {MIN_TOKEN_LEN} characters (make one with `openssl rand -hex 32`)"
            ),
        );
        return None;
    }
    if secret.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
        errs.at(
            t,
            format!("{what}: {name:?} has spaces or characters a header cannot carry"),
        );
        return None;
    }
    Some(Token::new(name, scope, source, &secret))
}

fn read_token_file(path: &str) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    if meta.len() > MAX_TOKEN_FILE {
        return Err(format!("{path} is longer than {MAX_TOKEN_FILE} bytes"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(text.trim().to_string())
}

/// Each plan's limits in words, and as written, by plan name.
type Plans<'r> = (
    BTreeMap<String, Vec<String>>,
    BTreeMap<String, &'r [Spanned<RawLimit>]>,
);

/// Reads `plans:`: each plan's limits checked once (as a rule without a
/// queue uses them, by `spillway_rules::build::plans`) and put in words.
/// Returns the plans' raw limits for the rules.
pub(super) fn plans<'r>(errs: &mut Collector<'_>, raw: Option<&'r RawPlans>) -> Plans<'r> {
    let plans = spillway_rules::build::plans(errs, raw);
    let described = plans
        .limits
        .into_iter()
        .map(|(name, list)| {
            (
                name,
                list.iter().map(spillway_core::Limit::describe).collect(),
            )
        })
        .collect();
    (described, plans.raws)
}

/// Every plan's limits as the rule with `max_wait` enforces them.
pub(super) fn rule_plans(
    raws: &BTreeMap<String, &[Spanned<RawLimit>]>,
    default: Option<String>,
    max_wait: Option<Nanos>,
) -> RulePlans {
    let mut limits = BTreeMap::new();
    for (name, list) in raws {
        // Checked once already (`plans`): errors here are not repeated.
        let mut scratch = Collector::new("");
        let built: Vec<Limit> = list
            .iter()
            .filter_map(|l| limit(&mut scratch, l, max_wait))
            .collect();
        if scratch.list.is_empty() && !built.is_empty() {
            limits.insert(name.clone(), built);
        }
    }
    RulePlans {
        default,
        max_wait,
        limits,
    }
}

/// The plan book for the rules: plans in words, and per rule its plans.
pub(super) fn book(
    described: BTreeMap<String, Vec<String>>,
    rules: BTreeMap<String, RulePlans>,
) -> PlanBook {
    PlanBook {
        plans: described,
        rules,
    }
}

/// `v` with every number that has no fraction (and fits an `i64`)
/// written as a whole number: `10.0` becomes `10`.
fn whole_numbers(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            #[allow(clippy::cast_possible_truncation)]
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(whole_numbers).collect()),
        Value::Object(o) => {
            Value::Object(o.into_iter().map(|(k, v)| (k, whole_numbers(v))).collect())
        }
        other => other,
    }
}

/// Limits given as JSON (an override's `limits`), read as a rules file's
/// `limits:` list is, for a rule with `max_wait`.
///
/// # Errors
/// What is wrong, in words.
pub fn limits_from_json(
    value: &serde_json::Value,
    max_wait: Option<Nanos>,
) -> Result<Vec<Limit>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wrap {
        limits: Vec<Spanned<RawLimit>>,
    }
    if !value.is_array() {
        return Err("limits: expected a list of limits, like [{\"gcra\": {\"rate\": \"600/1m\", \"burst\": 100}}]".into());
    }
    // JSON is YAML: the same reader, messages and checks as the file's.
    // JSON Schema's integers are numbers without a fraction however
    // written (`10.0` is 10); YAML's reader wants them written whole.
    let text = format!("limits: {}", whole_numbers(value.clone()));
    let wrap: Wrap = serde_saphyr::from_str(&text).map_err(|e| {
        format!(
            "limits: {}",
            spillway_rules::build::first_line(&e.to_string())
        )
    })?;
    if wrap.limits.is_empty() {
        return Err("limits: list at least one limit (or send \"block\": true)".into());
    }
    if wrap.limits.len() > 16 {
        return Err("limits: at most 16 limits".into());
    }
    let mut errs = Collector::new("limits");
    let built: Vec<Limit> = wrap
        .limits
        .iter()
        .filter_map(|l| limit(&mut errs, l, max_wait))
        .collect();
    match errs.list.first() {
        Some(e) => Err(format!("limits: {}", e.message)),
        None => Ok(built),
    }
}
