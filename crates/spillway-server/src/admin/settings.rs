//! The admin plane's settings (`admin:`) and the plans (`plans:`), as the
//! config layer hands them over.

use std::collections::BTreeMap;
use std::path::PathBuf;

use spillway_core::{Limit, Nanos};

pub use crate::credentials::{Scope, Token};
pub use crate::health::HealthSettings;

/// The most slots a rule's top-keys sketch may have.
pub const MAX_TOP_SLOTS: usize = 65_536;

/// The `admin:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    /// Bearer tokens; none: the admin API answers 401 to every call that
    /// needs one, and metrics, status and rules are open (as before
    /// tokens existed).
    pub tokens: Vec<Token>,
    /// Count top keys at all (their sketches cost every decision a few
    /// hundred instructions; see docs/BENCHMARKS.md).
    pub top_keys: bool,
    /// Top keys as the client sent them; else as their hash.
    pub show_keys: bool,
    /// An admitted request with less than this share of its limit left is
    /// near the limit.
    pub near_limit: f64,
    /// Slots of each rule's top-keys sketch (per kind and minute).
    pub top_slots: usize,
    /// Where the memory store keeps overrides and plan assignments across
    /// restarts (none: in memory only).
    pub state_file: Option<PathBuf>,
    /// Audit entries kept in memory (older ones stay in the log).
    pub audit_entries: usize,
}

impl Default for AdminSettings {
    fn default() -> AdminSettings {
        AdminSettings {
            tokens: Vec::new(),
            top_keys: true,
            show_keys: false,
            near_limit: 0.2,
            top_slots: 256,
            state_file: None,
            audit_entries: 10_000,
        }
    }
}

impl AdminSettings {
    /// The token `given` is, if any.
    pub fn token(&self, given: &[u8]) -> Option<&Token> {
        crate::credentials::find(&self.tokens, given)
    }
}

/// The plans (`plans:`) and which rules use them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanBook {
    /// Each plan's limits in words, by name.
    pub plans: BTreeMap<String, Vec<String>>,
    /// Per rule: its default plan, its queue, and every plan's limits as
    /// that rule enforces them.
    pub rules: BTreeMap<String, RulePlans>,
}

/// What a rule needs to give one key other limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RulePlans {
    /// `plan: { default: NAME }`, if the rule takes its limits from a plan.
    pub default: Option<String>,
    /// The rule's `queue.max_wait` (a leaky bucket under it shapes).
    pub max_wait: Option<Nanos>,
    /// Every plan's limits, built for this rule.
    pub limits: BTreeMap<String, Vec<Limit>>,
}
