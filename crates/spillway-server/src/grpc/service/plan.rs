//! What each descriptor of a call asks: the limit that decides it (or a
//! request's `limit` override, a ban, none), and how its hits are asked of
//! the store.

use std::borrow::Cow;

use spillway_core::Rule;

use super::super::proto::{RateLimitDescriptor, Unit};
use super::super::{Action, Domain, Node, envoy_rule, find};
use super::OVERRIDE;

/// How a descriptor's hits are asked of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// A descriptor `hits_addend` of 0: is the key over its limit? Nothing
    /// is counted.
    Check,
    /// The request's `hits_addend` (0 means 1): the cost of this request,
    /// charged only if every descriptor of its group admits it.
    Request(u64),
    /// A descriptor's own `hits_addend` above 0 (Envoy's cost-based limits,
    /// and its `apply_on_stream_done` call once the answer is known):
    /// always counted, even past the limit, as envoyproxy/ratelimit always
    /// counts; OVER_LIMIT if the key is now over.
    Charge(u64),
}

impl Ask {
    /// The hits the descriptor adds (0 for a check).
    pub(super) fn hits(self) -> u64 {
        match self {
            Ask::Check => 0,
            Ask::Request(n) | Ask::Charge(n) => n,
        }
    }
}

/// One store call of a `ShouldRateLimit` call, in the order they are
/// made (checks first: they see the state before this call's charges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Group {
    /// Every check.
    Check,
    /// The request's cost on every descriptor not in quota mode, all or
    /// none: a request one of them refuses is counted by none. Only a
    /// check if the call is refused already (by a ban, or a check).
    Request(u64),
    /// The request's cost on one descriptor in quota mode (descriptor,
    /// cost), on its own: one over its quota does not keep the others
    /// from being counted, since the call passes unless all are over. Only
    /// a check if the call is refused already.
    Quota(usize, u64),
    /// Every charge of one cost.
    Charge(u64),
}

/// A descriptor's hits and how they are asked: its own `hits_addend` if
/// set (0 allowed), else the request's, 0 meaning 1.
pub(super) fn ask_of(d: &RateLimitDescriptor, request_hits: u32) -> Ask {
    match &d.hits_addend {
        Some(h) if h.value == 0 => Ask::Check,
        Some(h) => Ask::Charge(h.value),
        None => Ask::Request(u64::from(request_hits.max(1))),
    }
}

/// What decides one descriptor.
pub(super) enum Plan<'a> {
    /// No limit: OK, nothing counted.
    Free,
    /// `unlimited: true`: OK, nothing counted.
    Unlimited,
    /// `requests_per_unit: 0` (or a 0 override): always over the limit.
    Ban {
        /// The internal name (metrics).
        label: Cow<'a, str>,
        /// `current_limit.name`.
        shown: &'a str,
        unit: Unit,
        shadow: bool,
        node: Option<&'a Node>,
    },
    /// A limit the store decides.
    Limit {
        rule: RuleOf<'a>,
        key: String,
        /// `current_limit.name`.
        shown: &'a str,
        node: Option<&'a Node>,
    },
}

/// A configured rule, or one made for a request's override.
pub(super) enum RuleOf<'a> {
    Configured(&'a Rule),
    Override(Box<Rule>),
}

impl RuleOf<'_> {
    pub(super) fn get(&self) -> &Rule {
        match self {
            RuleOf::Configured(r) => r,
            RuleOf::Override(r) => r,
        }
    }
}

impl Plan<'_> {
    /// The node's quota mode, for a plan that limits.
    pub(super) fn quota(&self) -> bool {
        match self {
            Plan::Ban { node, .. } | Plan::Limit { node, .. } => node.is_some_and(|n| n.quota_mode),
            Plan::Free | Plan::Unlimited => false,
        }
    }

    /// The node's `detailed_metric`, for a plan that limits.
    pub(super) fn detailed(&self) -> bool {
        match self {
            Plan::Ban { node, .. } | Plan::Limit { node, .. } => {
                node.is_some_and(|n| n.detailed_metric)
            }
            Plan::Free | Plan::Unlimited => false,
        }
    }
}

/// The counter key of a descriptor no node decides (an override's): each
/// entry's key and value, length-prefixed.
pub(super) fn entries_key(d: &RateLimitDescriptor) -> String {
    let mut key = String::new();
    for e in &d.entries {
        for s in [&e.key, &e.value] {
            key.push_str(itoa::Buffer::new().format(s.len()));
            key.push(':');
            key.push_str(s);
        }
    }
    key
}

/// A descriptor as envoyproxy/ratelimit names it in statistics
/// (`key_value.key_value`), for `detailed_metric`.
pub(super) fn descriptor_label(d: &RateLimitDescriptor) -> String {
    let mut s = String::new();
    for (i, e) in d.entries.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        s.push_str(&e.key);
        if !e.value.is_empty() {
            s.push('_');
            s.push_str(&e.value);
        }
    }
    s
}

/// How one descriptor is decided, before `replaces` applies: a request
/// `limit` override (in a known domain) replaces whatever the descriptor
/// matches, as envoyproxy/ratelimit applies it: on any descriptor, matched
/// or not, `unlimited` or not; never shadow, never quota mode, unnamed; a
/// 0 override is a ban. An override whose unit Envoy does not know is
/// ignored (envoyproxy/ratelimit fails the call).
/// Also the names of the limits the matched node replaces (none for an
/// override, as in envoyproxy/ratelimit).
pub(super) fn plan<'a>(domain: &'a Domain, d: &'a RateLimitDescriptor) -> (Plan<'a>, &'a [String]) {
    let entries: Vec<(&str, &str)> = d
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    let found = find(&domain.nodes, &entries);
    let overridden = d.limit.as_ref().and_then(|o| {
        let unit = Unit::try_from(o.unit).ok()?;
        (unit != Unit::Unknown).then_some((o.requests_per_unit, unit))
    });
    if let Some((rpu, unit)) = overridden {
        // The configured limit's counters when its rule is the same (same
        // name and fixed window), as envoyproxy/ratelimit counts an
        // override of the same unit on the configured limit's counter.
        let (label, key): (Cow<'a, str>, String) = match &found {
            Some(m) if matches!(m.node.action, Action::Limit(_) | Action::Ban { .. }) => (
                Cow::Borrowed(m.node.action.rule_name().unwrap_or_default()),
                m.key.clone(),
            ),
            _ => (
                Cow::Owned(format!("{}.{OVERRIDE}", domain.name)),
                entries_key(d),
            ),
        };
        if rpu == 0 {
            let ban = Plan::Ban {
                label,
                shown: "",
                unit,
                shadow: false,
                node: None,
            };
            return (ban, &[]);
        }
        let plan = match envoy_rule(&label, u64::from(rpu), unit, false) {
            Ok(rule) => Plan::Limit {
                rule: RuleOf::Override(Box::new(rule)),
                key,
                shown: "",
                node: None,
            },
            Err(_) => Plan::Free,
        };
        return (plan, &[]);
    }
    let Some(m) = found else {
        return (Plan::Free, &[]);
    };
    let node = m.node;
    let plan = match &node.action {
        // No limit here: nothing to replace others with either.
        Action::None => return (Plan::Free, &[]),
        Action::Unlimited => Plan::Unlimited,
        Action::Ban { name, unit, shadow } => Plan::Ban {
            label: Cow::Borrowed(name),
            shown: &node.name,
            unit: *unit,
            shadow: *shadow,
            node: Some(node),
        },
        Action::Limit(rule) => Plan::Limit {
            rule: RuleOf::Configured(rule),
            key: m.key,
            shown: &node.name,
            node: Some(node),
        },
    };
    (plan, &node.replaces)
}
