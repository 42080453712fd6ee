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
    /// `/a/` is `/a`.
    #[serde(default)]
    pub trailing_slash: Option<bool>,
    /// `/a;x=1` is `/a`.
    #[serde(default)]
    pub path_params: Option<bool>,
    /// `/a%2Fb` is `/a/b`.
    #[serde(default)]
    pub encoded_slash: Option<bool>,
    /// `HEAD` is `GET` for rules that name a method.
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
    /// The plan's limits, as a rule's.
    pub limits: Spanned<Vec<Spanned<RawLimit>>>,
    /// Free text for people (the dashboard, the admin API).
    #[serde(default)]
    pub description: Option<String>,
}

/// `plans:`: plans by name.
pub type RawPlans = Spanned<std::collections::BTreeMap<String, Spanned<RawPlan>>>;

/// A rule's `plan:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRulePlan {
    /// The plan of keys assigned none.
    pub default: Spanned<String>,
}

/// One item of `rules:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Its name, unique in the file (metrics, answers, admin calls).
    pub name: Spanned<String>,
    /// Which requests it applies to: `METHOD /path` or `/path`.
    #[serde(default)]
    pub api: Option<Spanned<String>>,
    /// What it keys by: `user`, `ip`, `user+ip`, `header:X`, a descriptor name.
    #[serde(default)]
    pub by: Option<Spanned<String>>,
    /// Absent when the rule takes its limits from `plan:`.
    #[serde(default)]
    pub limits: Option<Vec<Spanned<RawLimit>>>,
    /// The key's assigned plan picks its limits, else this default.
    #[serde(default)]
    pub plan: Option<Spanned<RawRulePlan>>,
    /// `hard`, `soft N%`, `shadow` or `elastic ...`.
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    /// How much the rule's traffic matters under overload.
    #[serde(default)]
    pub priority: Option<Spanned<String>>,
    /// What it does while its store cannot decide (`allow`, `deny`, `share`).
    #[serde(default)]
    pub on_store_error: Option<Spanned<String>>,
    /// A leaky bucket's queue: requests wait their turn instead of a 429.
    #[serde(default)]
    pub queue: Option<Spanned<RawQueue>>,
    /// This rule's own switches (unset ones are the file's).
    #[serde(default)]
    pub path_matching: Option<Spanned<RawPathMatching>>,
    /// A cost known after the answer: `cost: { response_header: ... }`.
    #[serde(default)]
    pub cost: Option<Spanned<RawCost>>,
    /// Free text for people (the dashboard, `check-config`).
    #[serde(default)]
    pub description: Option<String>,
}

/// `cost:` of a rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    /// The upstream's response header that says what the request cost.
    pub response_header: Spanned<String>,
    /// What is charged at admission, before the header is known.
    #[serde(default)]
    pub estimate: Option<Spanned<u64>>,
}

/// `queue:` of a rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQueue {
    /// The longest a request waits for its turn.
    pub max_wait: Spanned<String>,
}

/// One limit: its algorithm's name, then its parameters.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawLimit {
    /// `token_bucket: { capacity, refill }`.
    TokenBucket(RawBucket),
    /// `leaky_bucket: { capacity, leak }`.
    LeakyBucket(RawLeaky),
    /// `fixed_window: { limit, window }`.
    FixedWindow(RawWindow),
    /// `sliding_window_log: { limit, window }`.
    SlidingWindowLog(RawWindow),
    /// `sliding_window_counter: { limit, window }`.
    SlidingWindowCounter(RawWindow),
    /// `gcra: { rate, burst }`.
    Gcra(RawGcra),
}

/// The parameters of the window algorithms.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    /// Requests per window.
    pub limit: Spanned<i64>,
    /// The window, a duration.
    pub window: Spanned<String>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}

/// `token_bucket`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBucket {
    /// The most tokens it holds (the burst).
    pub capacity: Spanned<i64>,
    /// Tokens added back, a rate such as `10/1s`.
    pub refill: Spanned<String>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}

/// `leaky_bucket`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLeaky {
    /// The most requests the bucket holds.
    pub capacity: Spanned<i64>,
    /// How fast it drains, a rate such as `10/1s`.
    pub leak: Spanned<String>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}

/// `gcra`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGcra {
    /// The sustained rate, such as `100/1m`.
    pub rate: Spanned<String>,
    /// How many may come at once (default 1).
    #[serde(default)]
    pub burst: Option<Spanned<i64>>,
    /// How long past its limit a charge may keep a key out (default:
    /// one period of the limit).
    #[serde(default)]
    pub max_debt: Option<Spanned<String>>,
}
