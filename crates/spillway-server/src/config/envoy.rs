//! envoyproxy/ratelimit's configuration files, and spillway's `domains:`.

use std::path::Path;

use serde_saphyr::Spanned;
use spillway_core::{KeySpec, Mode, Rule};

use super::errors::{ConfigError, ConfigErrors, Errors, first_line};
use super::raw::{RawDescriptor, RawDomain};
use super::read;
use super::rules::limit;

/// Every problem, with line and column.
pub fn parse_envoy(file: &str, text: &str) -> Result<crate::grpc::Domain, ConfigErrors> {
    let raw: RawDomain = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        ConfigErrors(vec![ConfigError {
            file: file.to_string(),
            line,
            column,
            message: first_line(&e.to_string()),
        }])
    })?;
    let mut errs = Errors {
        file,
        list: Vec::new(),
    };
    let d = domain(&mut errs, &raw);
    if errs.list.is_empty() {
        Ok(d)
    } else {
        Err(ConfigErrors(errs.list))
    }
}

/// Reads and parses an envoyproxy/ratelimit configuration file.
///
/// # Errors
/// As [`parse_envoy`], or the file cannot be read.
pub fn load_envoy(path: &Path) -> Result<crate::grpc::Domain, ConfigErrors> {
    let (name, text) = read(path)?;
    parse_envoy(&name, &text)
}

pub(super) fn domain(errs: &mut Errors<'_>, d: &RawDomain) -> crate::grpc::Domain {
    let name = d.domain.value.trim().to_string();
    if name.is_empty() {
        errs.at(&d.domain, "domain must not be empty");
    }
    let nodes = descriptors(errs, &name, &d.descriptors);
    crate::grpc::Domain { name, nodes }
}

fn descriptors(
    errs: &mut Errors<'_>,
    path: &str,
    list: &[Spanned<RawDescriptor>],
) -> Vec<crate::grpc::Node> {
    use crate::grpc::{Action, Node, proto::Unit};
    let mut out: Vec<Node> = Vec::new();
    for d in list {
        let raw = &d.value;
        let key = raw.key.value.clone();
        if key.is_empty() {
            errs.at(&raw.key, "descriptor key must not be empty");
        }
        let value = raw.value.as_ref().map(|v| v.value.clone());
        if out.iter().any(|n| n.key == key && n.value == value) {
            errs.at(
                &raw.key,
                format!("descriptor {key}={value:?} appears twice at this level"),
            );
        }
        let here = match &value {
            Some(v) => format!("{path}.{key}_{v}"),
            None => format!("{path}.{key}"),
        };
        let shadow = raw.shadow_mode.unwrap_or(false);
        let action = match (&raw.rate_limit, &raw.limit) {
            (Some(_), Some(l)) => {
                errs.at(
                    l,
                    "give rate_limit (Envoy's format) or limit (spillway's), not both",
                );
                Action::None
            }
            (Some(r), None) => {
                let rl = &r.value;
                let name = rl
                    .name
                    .as_ref()
                    .or(raw.name.as_ref())
                    .map_or(here.clone(), |n| n.value.clone());
                if rl.unlimited == Some(true) {
                    Action::Unlimited
                } else {
                    let unit = match &rl.unit {
                        Some(u) => Unit::parse(&u.value).or_else(|| {
                            errs.at(u, format!("unit {:?}: expected second, minute, hour, day, week, month or year", u.value));
                            None
                        }),
                        None => {
                            errs.at(r, "rate_limit needs a unit");
                            None
                        }
                    };
                    let rpu = match &rl.requests_per_unit {
                        Some(n) if n.value < 0 || n.value > i64::from(u32::MAX) => {
                            errs.at(
                                n,
                                format!("requests_per_unit {} must be 0 to {}", n.value, u32::MAX),
                            );
                            None
                        }
                        Some(n) => Some(n.value as u64),
                        None => {
                            errs.at(r, "rate_limit needs requests_per_unit");
                            None
                        }
                    };
                    match (unit, rpu) {
                        // 0 per unit: every request over the limit (a ban list entry).
                        (Some(u), Some(0)) => Action::Ban {
                            name,
                            unit: u,
                            shadow,
                        },
                        (Some(u), Some(n)) => match crate::grpc::envoy_rule(&name, n, u, shadow) {
                            Ok(rule) => Action::Limit(Box::new(rule)),
                            Err(e) => {
                                errs.at(r, e);
                                Action::None
                            }
                        },
                        _ => Action::None,
                    }
                }
            }
            (None, Some(l)) => {
                let name = raw.name.as_ref().map_or(here.clone(), |n| n.value.clone());
                match limit(errs, l, None) {
                    Some(lim) => match Rule::new(
                        &name,
                        None,
                        KeySpec::from_parts(Vec::new()),
                        vec![lim],
                        if shadow { Mode::Shadow } else { Mode::Hard },
                    ) {
                        Ok(rule) => Action::Limit(Box::new(rule)),
                        Err(e) => {
                            errs.at(l, e.to_string());
                            Action::None
                        }
                    },
                    None => Action::None,
                }
            }
            (None, None) => Action::None,
        };
        let children = descriptors(errs, &here, &raw.descriptors);
        out.push(Node {
            key,
            value,
            action,
            replaces: raw
                .replaces
                .iter()
                .chain(raw.rate_limit.iter().flat_map(|r| r.value.replaces.iter()))
                .map(|r| r.name.clone())
                .collect(),
            children,
            name: String::new(),
            share_threshold: false,
            quota_mode: false,
            detailed_metric: false,
        });
    }
    out
}
