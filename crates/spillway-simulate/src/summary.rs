//! What a replay found: the data behind `--json` (a public contract:
//! fields may be added, never renamed) and the HTML report.

use serde::Serialize;

/// One replay of a trace through one or more rules files.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Well-formed requests replayed.
    pub requests: u64,
    /// Lines that could not be read as a request (not replayed).
    pub malformed: u64,
    /// The first malformed lines, with their line numbers and why.
    pub malformed_lines: Vec<BadLine>,
    /// Requests whose timestamp was earlier than one already replayed;
    /// they are replayed at the latest time seen (time never goes back).
    pub out_of_order: u64,
    /// The trace's first and last timestamps, ns since the Unix epoch.
    pub first_ns: u64,
    /// See `first_ns`.
    pub last_ns: u64,
    /// The trace file(s).
    pub trace: String,
    /// The rules file replayed (`--config`).
    pub config: String,
    /// Requests admitted (every rule admitted, or no rule applied).
    pub admitted: u64,
    /// Requests denied by at least one rule.
    pub denied: u64,
    /// Per rule of `--config`, in file order.
    pub rules: Vec<RuleSummary>,
    /// With `--compare`: one object per rules file (`--config` first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compare: Option<Vec<FileSummary>>,
    /// With `--compare`: requests admitted by one file and denied by the other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub differing: Option<Differing>,
    /// How long the replay took, and how fast it went.
    pub speed: Speed,
}

/// One rules file's results (the entries of `compare`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileSummary {
    /// The rules file.
    pub config: String,
    /// Requests replayed (the same for every file).
    pub requests: u64,
    /// Malformed lines (the same for every file).
    pub malformed: u64,
    /// Requests admitted under this file.
    pub admitted: u64,
    /// Requests denied under this file.
    pub denied: u64,
    /// Per rule, in file order.
    pub rules: Vec<RuleSummary>,
}

/// A line of the trace that was not a request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BadLine {
    /// The trace file it is in.
    pub file: String,
    /// 1-based line number (for CSV, counting the header).
    pub line: u64,
    /// Why it was refused.
    pub reason: String,
}

/// One rule's results.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleSummary {
    /// The rule's name.
    pub rule: String,
    /// `hard`, `soft N%`, `shadow` or `elastic N%`.
    pub mode: String,
    /// The rule's limits as written, e.g. `sliding_window_counter 10/1m`.
    pub limits: Vec<String>,
    /// Requests the rule decided (its route matched and the request had
    /// every part of its key). Not counted: a request another rule
    /// refused before any store was asked (a cost above what that rule's
    /// limit can ever admit), or, with `cost: response` rules, a request
    /// whose first group of rules already denied it: the engine does not
    /// ask this rule about those.
    pub applied: u64,
    /// Of those, the ones the rule admitted (`admitted + denied == applied`).
    pub admitted: u64,
    /// Of those, the ones the rule refused, or in shadow mode would have
    /// refused (`shadow_denied` of them).
    pub denied: u64,
    /// Denials a shadow rule only reported.
    pub shadow_denied: u64,
    /// Admissions above the limit within a soft rule's tolerance.
    pub soft_exceeded: u64,
    /// Requests the rule matched by route but skipped: a part of its key
    /// was missing.
    pub skipped: u64,
    /// Distinct keys (clients) the rule saw.
    pub clients: u64,
    /// Keys denied at least once.
    pub clients_limited: u64,
    /// `clients_limited / clients`, 0 when there are none.
    pub clients_limited_share: f64,
    /// The keys with the most requests, heaviest first.
    pub top_keys: Vec<KeyCount>,
    /// Offered and admitted requests over time.
    pub timeline: Timeline,
    /// The distribution of the keys' busiest window.
    pub distribution: Distribution,
    /// For each window-type limit: every algorithm against the exact
    /// sliding window log of the same limit and window.
    pub accuracy: Vec<Accuracy>,
    /// With `--target-limited`: the smallest size of each limit that
    /// limits at most that share of clients.
    pub suggestions: Vec<Suggestion>,
}

/// One key's counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KeyCount {
    /// The key's values joined with `+` (as `by:` names them).
    pub key: String,
    /// Requests the rule applied to for this key.
    pub requests: u64,
    /// Of those, denied (or shadow-denied).
    pub denied: u64,
}

/// Requests per time bucket, from the trace's first timestamp.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// Width of a bucket, seconds: from 1 ms, doubled until the trace
    /// fits in at most 480 buckets.
    pub bucket_secs: f64,
    /// Start of the first bucket, ns since the Unix epoch.
    pub start_ns: u64,
    /// Requests the rule applied to, per bucket.
    pub offered: Vec<u64>,
    /// Of those, admitted per bucket.
    pub admitted: Vec<u64>,
}

/// How many keys had their busiest window at each request count: what the
/// limit is drawn against.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Distribution {
    /// The window the counts are per, seconds (the rule's first limit's
    /// window, or its refill period for buckets).
    pub window_secs: f64,
    /// The rule's first limit's size in that window (limit, capacity or burst).
    pub limit: u64,
    /// Histogram buckets, ascending: keys whose busiest window held more
    /// than the previous bucket's `upto` and at most this one's (cost units).
    pub buckets: Vec<HistogramBucket>,
}

/// One bar of a [`Distribution`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct HistogramBucket {
    /// Upper bound of the bucket, inclusive (cost units per window).
    pub upto: u64,
    /// Keys in the bucket.
    pub keys: u64,
}

/// One window-type limit's algorithm comparison.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Accuracy {
    /// Index of the limit in the rule.
    pub limit_index: usize,
    /// The limit's size (requests, or cost units) per window.
    pub limit: u64,
    /// The window, seconds.
    pub window_secs: f64,
    /// The reference: always `sliding_window_log`.
    pub reference: String,
    /// Requests compared (the rule's `applied`).
    pub decisions: u64,
    /// One row per algorithm, each run on its own over the same requests.
    pub algorithms: Vec<AlgorithmError>,
}

/// One algorithm's disagreement with the exact log.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AlgorithmError {
    /// `fixed_window`, `sliding_window_counter`, `token_bucket`, `gcra`,
    /// `leaky_bucket` or `sliding_window_log` (the reference itself).
    pub algorithm: String,
    /// The limit as this algorithm was configured, e.g.
    /// `token_bucket { capacity: 10, refill: 10/1m }`.
    pub configured: String,
    /// Admitted here, denied by the log.
    pub wrongly_allowed: u64,
    /// Denied here, admitted by the log.
    pub wrongly_denied: u64,
    /// `wrongly_allowed / decisions`, percent.
    pub wrongly_allowed_pct: f64,
    /// `wrongly_denied / decisions`, percent.
    pub wrongly_denied_pct: f64,
    /// Both, percent.
    pub wrong_pct: f64,
}

/// The smallest size of one limit that limits at most the target share of
/// clients, found by replaying each key's requests through the limit's
/// algorithm (exact for the algorithm: a key is limited at size `s` iff the
/// size it needed exceeds `s`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Suggestion {
    /// Index of the limit in the rule.
    pub limit_index: usize,
    /// The algorithm.
    pub algorithm: String,
    /// What is suggested: `limit` (windows) or `capacity` / `burst`
    /// (buckets, at the limit's own rate).
    pub parameter: String,
    /// The size written in the file.
    pub current: u64,
    /// Share of clients the current size limits (this limit alone).
    pub current_limited_share: f64,
    /// The smallest size limiting at most `target` of the clients.
    pub suggested: u64,
    /// Share of clients the suggested size limits (this limit alone).
    pub suggested_limited_share: f64,
    /// The target share (`--target-limited`), 0..1.
    pub target: f64,
    /// Whether `suggested` limits at most `target` of the clients: false
    /// when some clients need more than the algorithm's largest size (a
    /// cost above it), and the suggestion is that largest size.
    pub reaches_target: bool,
}

/// Requests whose outcome differs between the two files of `--compare`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Differing {
    /// Admitted under `--config`, denied under `--compare`.
    pub admitted_then_denied: u64,
    /// Denied under `--config`, admitted under `--compare`.
    pub denied_then_admitted: u64,
    /// The first differing requests.
    pub samples: Vec<DifferingRequest>,
}

/// One request admitted by one file and denied by the other.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DifferingRequest {
    /// The trace file.
    pub file: String,
    /// Line in the trace.
    pub line: u64,
    /// Its timestamp, ns since the Unix epoch.
    pub ts_ns: u64,
    /// `METHOD /path` (or the path alone).
    pub api: String,
    /// The user, if the trace names one.
    pub user: String,
    /// The client IP, if the trace has one.
    pub ip: String,
    /// Whether `--config` admitted it.
    pub first_admitted: bool,
    /// The rules that denied it under the file that denied it.
    pub denied_by: Vec<String>,
}

/// How long the replay took.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Speed {
    /// Wall-clock seconds for reading and replaying.
    pub seconds: f64,
    /// `requests / seconds`.
    pub requests_per_second: f64,
}
