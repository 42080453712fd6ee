//! The rules part of a rules file as serde reads it: every value with its
//! line and column. spillway-server puts these in its own whole-file
//! struct; [`crate::parse`] reads them from any file.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// `path_matching:`, at the top or in a rule: each switch on (true)
/// counts a respelled request as the path it respells.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPathMatching {
    #[serde(default)]
    pub trailing_slash: Option<bool>,
    #[serde(default)]
    pub path_params: Option<bool>,
    #[serde(default)]
    pub encoded_slash: Option<bool>,
    #[serde(default)]
    pub head_as_get: Option<bool>,
    /// `case: insensitive`: `/Login` is `/login`.
    #[serde(default)]
    pub case: Option<PathCase>,
}

/// `path_matching.case`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathCase {
    /// `/a` and `/A` are two paths (the default).
    Sensitive,
    /// `/a` and `/A` are one path.
    Insensitive,
}

/// One plan of `plans:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlan {
    pub limits: Spanned<Vec<Spanned<RawLimit>>>,
    #[serde(default)]
    pub description: Option<String>,
}

/// `plans:`: plans by name.
pub type RawPlans = Spanned<std::collections::BTreeMap<String, Spanned<RawPlan>>>;

/// A rule's `plan:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRulePlan {
    pub default: Spanned<String>,
}

/// One item of `rules:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: Spanned<String>,
    #[serde(default)]
    pub api: Option<Spanned<String>>,
    #[serde(default)]
    pub by: Option<Spanned<String>>,
    /// Absent when the rule takes its limits from `plan:`.
    #[serde(default)]
    pub limits: Option<Vec<Spanned<RawLimit>>>,
    /// The key's assigned plan picks its limits, else this default.
    #[serde(default)]
    pub plan: Option<Spanned<RawRulePlan>>,
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    /// How much the rule's traffic matters under overload.
    #[serde(default)]
    pub priority: Option<Spanned<String>>,
    #[serde(default)]
    pub on_store_error: Option<Spanned<String>>,
    #[serde(default)]
    pub queue: Option<Spanned<RawQueue>>,
    /// This rule's own switches (unset ones are the file's).
    #[serde(default)]
    pub path_matching: Option<Spanned<RawPathMatching>>,
    /// A cost known after the answer: `cost: { response_header: ... }`.
    #[serde(default)]
    pub cost: Option<Spanned<RawCost>>,
    #[serde(default)]
    pub description: Option<String>,
}

/// `cost:` of a rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    pub response_header: Spanned<String>,
    #[serde(default)]
    pub estimate: Option<Spanned<u64>>,
}

/// `queue:` of a rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    pub max_wait: Spanned<String>,
}

/// One limit: its algorithm's name, then its parameters.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawLimit {
    TokenBucket(RawBucket),
    LeakyBucket(RawLeaky),
    FixedWindow(RawWindow),
    SlidingWindowLog(RawWindow),
    SlidingWindowCounter(RawWindow),
    Gcra(RawGcra),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    pub limit: Spanned<i64>,
    pub window: Spanned<String>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBucket {
    pub capacity: Spanned<i64>,
    pub refill: Spanned<String>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLeaky {
    pub capacity: Spanned<i64>,
    pub leak: Spanned<String>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGcra {
    pub rate: Spanned<String>,
    #[serde(default)]
    pub burst: Option<Spanned<i64>>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}
