//! Reads the rules of a spillway rules file: the same YAML `spillway
//! serve` reads, into [`spillway_core::Rule`]s, so a client's outbound
//! limiter and the server enforce one file the same way.
//!
//! A whole rules file is accepted: the sections this crate does not read
//! (`store:`, `proxy:`, `admin:`, ...) are ignored; `rules:`,
//! `descriptors:`, `path_matching:`, `on_store_error:` and the `plans:`
//! a rule's `plan:` names are read and checked exactly as the server
//! checks them, with the same messages.
//!
//! `${NAME}` inside a value is the environment variable NAME, as the
//! server reads it (see [`mod@env`]); errors show the reference, not the
//! value.
//!
//! Reading happens in two stages: serde reads raw structs that keep each
//! value's line and column, then validation turns them into core types,
//! collecting every error with the place it belongs to. When serde stops
//! at a structural error (an unknown field, a wrong type), the file is
//! read again section by section and rule by rule, so every error is
//! reported, not just the first.
//!
//! # Examples
//!
//! ```
//! let text = "\
//! store: { redis: { url: redis://127.0.0.1:6379/0 } }  # not ours: ignored
//! rules:
//!   - name: login
//!     api: POST /v1/login
//!     by: ip
//!     limits:
//!       - sliding_window_log: { limit: 5, window: 1m }
//! ";
//! let file = spillway_rules::parse("rules.yaml", text).unwrap();
//! assert_eq!(file.rules[0].name(), "login");
//!
//! let bad = "rules:\n  - name: a\n    limits: [ { gcra: { rate: 0/s } } ]\n";
//! let errors = spillway_rules::parse("rules.yaml", bad).unwrap_err();
//! assert!(errors.to_string().starts_with("rules.yaml:3:"));
//! ```

#![warn(missing_docs, unreachable_pub)]

mod error;

pub mod build;
pub mod chunks;
pub mod env;
pub mod raw;
pub mod recover;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;
use spillway_core::{FailPolicy, PathMatching, Rule};

pub use build::{parse_duration, parse_rate};
pub use error::{Error, Errors};

/// The most parts a rule's `by:` may join (`user+ip+...`): as many as a
/// key of spillway-store holds (spillway-server checks they agree).
pub const MAX_KEY_PARTS: usize = 4;

/// What a rules file says about rules.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuleFile {
    /// The rules, in file order. A rule with `plan:` has its default
    /// plan's limits.
    pub rules: Vec<Rule>,
    /// Descriptor names rules may key by bare (`descriptors:`).
    pub descriptors: Vec<String>,
    /// Which respellings of a path count as the path for rules that set
    /// none (`path_matching:`). A rule carries it too when it is not the
    /// default (see [`Rule::path_matching`]).
    pub path_matching: PathMatching,
    /// The failure policy of rules that set none (`on_store_error:`).
    pub on_store_error: FailPolicy,
}

/// Parses the rules file `text`, named `file` in errors.
///
/// # Errors
/// Every problem found in what this crate reads, each with file, line,
/// column and message, in file order; a file without a `rules:` section
/// (`rules: []` is fine) is an error, since it would limit nothing, and so
/// is a top-level key that is not a section of a spillway rules file
/// ([`SECTIONS`]): a misspelt section would otherwise be skipped.
pub fn parse(file: &str, text: &str) -> Result<RuleFile, Errors> {
    let ((f, has_rules), _) =
        read_with::<RawRuleFile, _>(file, text, Some(&READ), |file, raw, any| {
            let has_rules = raw.rules.is_some();
            validate(file, raw, any).map(|f| (f, has_rules))
        })?;
    // The sections of a server's file are skipped, but a key that is none
    // of them is a typo: `on_store_eror: deny` read as absent would fail
    // open, `path_maching:` would count other paths than written.
    let mut errs = Vec::new();
    for (key, line, column) in recover::top_level_keys(text).unwrap_or_default() {
        if key == "rules_dir" {
            // Skipped, its rules would be missing: fewer limits than the
            // server enforces.
            errs.push(Error {
                file: file.to_string(),
                line: line as u64,
                column: column as u64,
                message: "`rules_dir:` names more rules files, which this reader does not follow: \
                          read the main file without it and each file of the directory on its own"
                    .into(),
            });
        } else if !SECTIONS.contains(&key.as_str()) {
            let hint = build::suggest(&key, &SECTIONS.map(String::from))
                .map_or_else(String::new, |s| format!(" (did you mean `{s}`?)"));
            errs.push(Error {
                file: file.to_string(),
                line: line as u64,
                column: column as u64,
                message: format!("unknown section `{key}`{hint}"),
            });
        }
    }
    if !has_rules && errs.is_empty() {
        // Without `rules:` the file would limit nothing, silently.
        errs.push(Error {
            file: file.to_string(),
            line: 0,
            column: 0,
            message: "no `rules:` section: the file limits nothing".into(),
        });
    }
    if errs.is_empty() {
        Ok(f)
    } else {
        Err(Errors(errs))
    }
}

/// Every top-level section of a spillway rules file: those this crate
/// reads, and the server's, which it skips. spillway-server checks that
/// this list is its own.
pub const SECTIONS: [&str; 24] = [
    "store",
    "on_store_error",
    "listen",
    "proxy",
    "forward_auth",
    "grpc_listen",
    "grpc_response_headers",
    "envoy",
    "admin_listen",
    "admin",
    "api",
    "plans",
    "server",
    "tls",
    "grpc_tls",
    "domains",
    "descriptors",
    "path_matching",
    "log",
    "reload",
    "health",
    "rules",
    "rules_dir",
    "traces",
];

/// `text` as [`parse`] reads it (its size checked, `${NAME}` substituted
/// from the process's environment, every structural error found), read
/// into `T` and handed to `validate`; errors hide the values substituted.
/// spillway-server reads its whole file with this.
///
/// # Errors
/// As [`parse`], with `validate`'s errors.
pub fn parse_with<T: recover::Sections, V>(
    file: &str,
    text: &str,
    validate: impl Fn(&str, T, bool) -> Result<V, Errors>,
) -> Result<V, Errors> {
    read_with(file, text, None, validate).map(|(v, _)| v)
}

/// As [`parse_with`], with the values substituted for `${NAME}`, for the
/// server to hide them again wherever it shows configuration (its log,
/// its status).
///
/// # Errors
/// As [`parse_with`].
pub fn parse_with_secrets<T: recover::Sections, V>(
    file: &str,
    text: &str,
    validate: impl Fn(&str, T, bool) -> Result<V, Errors>,
) -> Result<(V, env::Secrets), Errors> {
    read_with(file, text, None, validate)
}

/// The sections [`parse`] reads (and substitutes `${NAME}` in).
const READ: [&str; 5] = [
    "on_store_error",
    "plans",
    "descriptors",
    "path_matching",
    "rules",
];

/// [`parse_with`], substituting `${NAME}` only in the sections `only`
/// names (every section when `None`).
fn read_with<T: recover::Sections, V>(
    file: &str,
    text: &str,
    only: Option<&[&str]>,
    validate: impl Fn(&str, T, bool) -> Result<V, Errors>,
) -> Result<(V, env::Secrets), Errors> {
    recover::check_size(file, text)?;
    // `${NAME}` inside scalar values, before serde sees them; errors hide
    // the values put in again.
    let env = env::substitute_in(file, text, &env::process_env, only)?;
    // A large rules list is read a chunk at a time (see [`chunks`]); any
    // error there, and the file is read whole for every error's place.
    if let Some((rest, chunks)) = chunks::Chunks::split(&env.text)
        && let Ok(mut raw) = recover::from_str::<T>(&rest)
    {
        raw.set_rule_chunks(chunks);
        if let Ok(v) = validate(file, raw, false) {
            return Ok((v, env.secrets));
        }
    }
    match recover::read(file, &env.text, &validate) {
        Ok(v) => Ok((v, env.secrets)),
        Err(e) => Err(env.secrets.redact_errors(e)),
    }
}

/// Reads and parses the rules file at `path`.
///
/// # Errors
/// The file cannot be read, or as [`parse`].
pub fn load(path: &Path) -> Result<RuleFile, Errors> {
    let (name, text) = recover::read_file(path)?;
    parse(&name, &text)
}

/// The sections of a rules file this crate reads; any other key is
/// ignored (no `deny_unknown_fields`).
#[derive(Debug, Default, Deserialize)]
struct RawRuleFile {
    #[serde(default)]
    on_store_error: Option<Spanned<String>>,
    #[serde(default)]
    plans: Option<raw::RawPlans>,
    #[serde(default)]
    descriptors: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    path_matching: Option<Spanned<raw::RawPathMatching>>,
    #[serde(default)]
    rules: Option<Vec<Spanned<raw::RawRule>>>,
    /// The rules, when read a chunk at a time (see [`chunks`]).
    #[serde(skip)]
    rule_chunks: Option<chunks::Chunks>,
}

impl recover::Sections for RawRuleFile {
    fn set_rule_chunks(&mut self, chunks: chunks::Chunks) {
        self.rule_chunks = Some(chunks);
    }

    fn merge(&mut self, part: RawRuleFile) {
        let RawRuleFile {
            on_store_error,
            plans,
            descriptors,
            path_matching,
            rules,
            rule_chunks: _,
        } = part;
        fn take<T>(slot: &mut Option<T>, v: Option<T>) {
            if slot.is_none() {
                *slot = v;
            }
        }
        take(&mut self.on_store_error, on_store_error);
        take(&mut self.plans, plans);
        take(&mut self.descriptors, descriptors);
        take(&mut self.path_matching, path_matching);
        if let Some(rules) = rules {
            self.rules.get_or_insert_with(Vec::new).extend(rules);
        }
    }
}

/// `raw` checked and built, in the order spillway-server checks the same
/// sections (so the errors come in the same order).
fn validate(file: &str, raw: RawRuleFile, any_descriptor: bool) -> Result<RuleFile, Errors> {
    let mut errs = build::Collector::new(file);
    let on_store_error = raw
        .on_store_error
        .as_ref()
        .map(|p| build::policy(&mut errs, p))
        .unwrap_or_default();
    let plans = build::plans(&mut errs, raw.plans.as_ref());
    let descriptors = raw
        .descriptors
        .as_ref()
        .map(|d| build::descriptor_names(&mut errs, &d.value))
        .unwrap_or_default();
    let path_matching = raw
        .path_matching
        .as_ref()
        .map_or_else(PathMatching::default, |m| {
            build::path_matching(&m.value, PathMatching::default())
        });
    let raws: &BTreeMap<_, _> = &plans.raws;
    let ctx = build::RuleContext {
        descriptors: &descriptors,
        any_descriptor,
        path_matching,
        plans: raws,
    };
    let rules = build::rules_in(
        &mut errs,
        raw.rules.as_deref().unwrap_or_default(),
        raw.rule_chunks.as_ref(),
        &ctx,
        |_, _, _| {},
    );
    if errs.list.is_empty() {
        Ok(RuleFile {
            rules,
            descriptors,
            path_matching,
            on_store_error,
        })
    } else {
        Err(Errors(errs.list))
    }
}
