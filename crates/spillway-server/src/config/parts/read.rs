//! One file of a configuration in parts, read: its rules built against
//! the settings in force (or, for the file that gives the settings,
//! against its own), with where each rule's name is written, so that a
//! name another file uses too is refused at both places.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_saphyr::Spanned;
use spillway_core::Rule;
use spillway_rules::build::{Collector, RuleContext};

use super::super::raw::{RawConfig, RawRule};
use super::super::{Config, ConfigError, ConfigErrors, NO_RULES, Preread, StoreConfig, admin};
use crate::admin::settings::RulePlans;

/// What a file's rules are built against: the settings file's
/// validated settings (its rules left out) and its `plans:` as written
/// (a rule with `plan:` builds its own limits from them).
#[derive(Debug)]
pub(crate) struct Settings {
    /// Every section but `rules:`, validated; `rules` and the plan
    /// book's per-rule entries are empty (each file holds its own).
    pub(crate) config: Config,
    /// `plans:` as written.
    plans: Option<super::super::raw::RawPlans>,
    /// What rules are built against, as one number: when a reload
    /// changes it, every file's rules are built again; when it does not,
    /// only the files that changed are read.
    pub(crate) key: u64,
}

impl Settings {
    /// Splits a settings file's validated `config` (with its own rules)
    /// into the settings and the file's rules; `plans` as written.
    fn split(
        mut config: Config,
        plans: Option<super::super::raw::RawPlans>,
        any_descriptor: bool,
    ) -> (Settings, Vec<Rule>, BTreeMap<String, RulePlans>) {
        let rules = std::mem::take(&mut config.rules);
        let rule_plans = std::mem::take(&mut config.plans.rules);
        let key = {
            use std::hash::{Hash as _, Hasher as _};
            // The plans' limits as built, not as written: an edit above
            // them (their lines move) rebuilds no other file.
            let built = spillway_rules::build::plans(&mut Collector::new(""), plans.as_ref());
            let mut h = std::collections::hash_map::DefaultHasher::new();
            format!(
                "{:?}|{any_descriptor}|{:?}|{}|{:?}",
                config.descriptors,
                config.path_matching,
                leased(&config),
                built.limits
            )
            .hash(&mut h);
            h.finish()
        };
        (Settings { config, plans, key }, rules, rule_plans)
    }

    /// The settings of a configuration directory without a settings
    /// file: every section's default.
    pub(crate) fn defaults(name: &str) -> Result<Arc<Settings>, ConfigErrors> {
        let config = super::super::validate(name, &RawConfig::default(), false)?;
        Ok(Arc::new(Settings::split(config, None, false).0))
    }
}

/// Whether leases decide (`store.redis.sync.mode: lease`): a shaper's
/// rule cannot be leased.
fn leased(config: &Config) -> bool {
    matches!(&config.store, StoreConfig::Sync(s) if s.sync.mode == spillway_sync::SyncMode::Lease)
}

/// What a file of a configuration in parts may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The main file of `rules_dir:`: the settings, and rules.
    Main,
    /// A file of `rules_dir:`: `rules:` only.
    RulesOnly,
    /// A file of `--config DIR`: rules, and the settings if it is the
    /// one file that gives them.
    Member,
}

/// One version of a file, read and built.
#[derive(Debug)]
pub(crate) struct Version {
    /// Its rules, in file order.
    pub(crate) rules: Vec<Rule>,
    /// Where each rule's name is written (line, column), beside
    /// `rules`: 8 bytes a rule, for an error that names both places.
    pub(crate) at: Vec<(u32, u32)>,
    /// Per rule, its plans (only rules with a plan or a queue).
    pub(crate) plans: BTreeMap<String, RulePlans>,
    /// It has a `rules:` key.
    pub(crate) has_rules: bool,
    /// The settings it gives, with the first section's name and place.
    pub(crate) settings: Option<(Arc<Settings>, &'static str, (u32, u32))>,
    /// The `${...}` references it makes, to hide their values wherever
    /// the composed configuration is shown (at most [`MAX_REFS`]).
    pub(crate) refs: Vec<String>,
}

/// The most `${...}` references kept of a file.
const MAX_REFS: usize = 1000;

/// Reads `path` (its text from `pre` when read already) as a file of
/// `role`, building its rules against `ctx` unless it gives settings of
/// its own; with the digest of the text read (`None`: unreadable).
///
/// Every problem in the file, each with its line and column, is the
/// error.
pub(crate) fn read(
    path: &Path,
    pre: &Preread,
    role: Role,
    ctx: Option<&Settings>,
) -> (Option<(u64, u64)>, Result<Version, ConfigErrors>) {
    match pre.read(path) {
        Ok((name, text)) => (
            Some(super::super::digest(text.as_bytes())),
            read_text(&name, text, role, ctx),
        ),
        Err(e) => (None, Err(e)),
    }
}

/// [`read`], of the text `text` named `name`.
fn read_text(
    name: &str,
    text: String,
    role: Role,
    ctx: Option<&Settings>,
) -> Result<Version, ConfigErrors> {
    let refs = references(&text);
    let parsed =
        spillway_rules::parse_with_secrets::<RawConfig, _>(name, &text, |file, raw, any| {
            build(file, raw, any, role, ctx)
        });
    // The text is not kept: a file of 10,000 rules is 2 MB.
    drop(text);
    let (mut version, _secrets) = parsed?;
    version.refs = refs;
    Ok(version)
}

/// `raw` (the file `file`) checked for what `role` allows, and built.
fn build(
    file: &str,
    mut raw: RawConfig,
    any: bool,
    role: Role,
    ctx: Option<&Settings>,
) -> Result<Version, ConfigErrors> {
    let given = sections(&raw);
    let mut errs = Collector::new(file);
    match role {
        Role::RulesOnly => {
            for (key, (line, column)) in &given {
                errs.at_loc(
                    (u64::from(*line), u64::from(*column)),
                    format!(
                        "`{key}:` in a file of a rules_dir: its files hold only `rules:`; move `{key}:` to the main file"
                    ),
                );
            }
            if raw.rules.is_none() && given.is_empty() {
                errs.at_loc((0, 0), NO_RULES);
            }
        }
        Role::Member => {
            if let Some(d) = &raw.rules_dir {
                errs.at(
                    d,
                    "rules_dir: not in a file of a --config directory (every file of the directory is read already); give rules_dir in a main file, or put the files in this directory",
                );
            }
            if raw.rules.is_none() && given.is_empty() {
                errs.at_loc(
                    (0, 0),
                    "no section at all (an empty or cut-short file?): it would configure nothing; write `rules: []` for a file of no rules",
                );
            }
        }
        Role::Main => {}
    }
    let gives_settings = role == Role::Main || (role == Role::Member && !given.is_empty());
    if gives_settings {
        // As a single file is read, with its own rules: the same checks
        // in the same order, with the same messages.
        let at: Vec<(u32, u32)> = raw.rules.iter().flatten().map(name_at).collect();
        let config = match super::super::validate(file, &raw, any) {
            Ok(c) if errs.list.is_empty() => c,
            Ok(_) => return Err(ConfigErrors(errs.list)),
            Err(e) => {
                errs.list.extend(e.0);
                return Err(ConfigErrors(errs.list));
            }
        };
        let has_rules = config.has_rules;
        let (settings, rules, plans) = Settings::split(config, raw.plans.take(), any);
        // Every rule built (else validation failed), in order. A large
        // file's rules were read a chunk at a time (`spillway_rules::chunks`),
        // their places not kept: each name still claims, placed at the
        // file alone.
        let at = if at.len() == rules.len() {
            at
        } else {
            vec![(0, 0); rules.len()]
        };
        let (key, place) = given.first().copied().unwrap_or(("rules_dir", (0, 0)));
        return Ok(Version {
            rules,
            at,
            plans,
            has_rules,
            settings: Some((Arc::new(settings), key, place)),
            refs: Vec::new(),
        });
    }
    let Some(ctx) = ctx else {
        errs.at_loc(
            (0, 0),
            "not built: the settings its rules are built against are not valid (see their errors)",
        );
        return Err(ConfigErrors(errs.list));
    };
    let (_, plan_raws) = admin::plans(&mut Collector::new(""), ctx.plans.as_ref());
    let rule_ctx = RuleContext {
        descriptors: &ctx.config.descriptors,
        any_descriptor: any,
        path_matching: ctx.config.path_matching,
        plans: &plan_raws,
    };
    let list = raw.rules.as_deref().unwrap_or_default();
    let mut at = Vec::with_capacity(list.len());
    let chunks = raw.rule_chunks.as_ref();
    let (rules, plans) = build_rules(
        &mut errs,
        list,
        chunks,
        &rule_ctx,
        leased(&ctx.config),
        |r, _| {
            at.push(name_at(r));
        },
    );
    if errs.list.is_empty() {
        Ok(Version {
            rules,
            at,
            plans,
            has_rules: raw.rules.is_some(),
            settings: None,
            refs: Vec::new(),
        })
    } else {
        Err(ConfigErrors(errs.list))
    }
}

/// Where a rule's name is written.
fn name_at(r: &Spanned<RawRule>) -> (u32, u32) {
    let loc = &r.value.name.referenced;
    (
        u32::try_from(loc.line()).unwrap_or(u32::MAX),
        u32::try_from(loc.column()).unwrap_or(u32::MAX),
    )
}

/// Every rule of `list` (or of `chunks`, a large file's rules read a
/// chunk at a time: see `spillway_rules::chunks`) built against `ctx`, and the plans of those that
/// have any: the server's checks over `spillway_rules`' (a shaper cannot
/// be leased). `each` sees every rule that built, in order. Shared by a
/// single file's validation and a file of rules read alone.
pub(in crate::config) fn build_rules(
    errs: &mut Collector<'_>,
    list: &[Spanned<RawRule>],
    chunks: Option<&spillway_rules::chunks::Chunks>,
    ctx: &RuleContext<'_>,
    leased: bool,
    mut each: impl FnMut(&Spanned<RawRule>, &Rule),
) -> (Vec<Rule>, BTreeMap<String, RulePlans>) {
    let mut rule_plans = BTreeMap::new();
    let rules = spillway_rules::build::rules_in(errs, list, chunks, ctx, |errs, r, rule| {
        let max_wait = rule.limits().iter().find_map(|l| match l {
            spillway_core::Limit::Shaper(s) => Some(s.max_wait()),
            _ => None,
        });
        let default = r.value.plan.as_ref().map(|p| p.value.default.value.clone());
        let plans = admin::rule_plans(ctx.plans, default, max_wait);
        // A rule with no plan, no plan limits and no queue has nothing
        // here (every reader takes a missing entry as that): a million
        // empty entries cost 300 bytes a rule, twice.
        if plans.default.is_some() || plans.max_wait.is_some() || !plans.limits.is_empty() {
            rule_plans.insert(rule.name().to_string(), plans);
        }
        if leased
            && rule
                .limits()
                .iter()
                .any(|l| matches!(l, spillway_core::Limit::Shaper(_)))
        {
            // A slice admits at once; a shaper's answer is a wait.
            errs.at(
                &r.value.name,
                format!(
                    "rule {:?}: a leaky_bucket with a queue (a shaper) cannot be leased: use redis.sync.mode eventual",
                    rule.name()
                ),
            );
        }
        each(r, rule);
    });
    (rules, rule_plans)
}

/// The sections `raw` gives besides `rules:` and where each is written
/// (`(0, 0)` for a bare `grpc_response_headers`), in the struct's order.
/// Destructured, so a section added to the file cannot be forgotten here.
fn sections(raw: &RawConfig) -> Vec<(&'static str, (u32, u32))> {
    fn at<T>(s: &Spanned<T>) -> (u32, u32) {
        (
            u32::try_from(s.referenced.line()).unwrap_or(u32::MAX),
            u32::try_from(s.referenced.column()).unwrap_or(u32::MAX),
        )
    }
    let RawConfig {
        store,
        on_store_error,
        listen,
        proxy,
        forward_auth,
        grpc_listen,
        grpc_response_headers,
        envoy,
        admin_listen,
        admin,
        api,
        plans,
        server,
        tls,
        grpc_tls,
        domains,
        descriptors,
        path_matching,
        log,
        reload,
        health,
        rules: _,
        rule_chunks: _,
        rules_dir,
        traces,
    } = raw;
    let mut out = Vec::new();
    let mut add = |key: &'static str, place: Option<(u32, u32)>| {
        if let Some(p) = place {
            out.push((key, p));
        }
    };
    add("store", store.as_ref().map(at));
    add("on_store_error", on_store_error.as_ref().map(at));
    add("listen", listen.as_ref().map(at));
    add("proxy", proxy.as_ref().map(at));
    add("forward_auth", forward_auth.as_ref().map(at));
    add("grpc_listen", grpc_listen.as_ref().map(at));
    add(
        "grpc_response_headers",
        grpc_response_headers.map(|_| (0, 0)),
    );
    add("envoy", envoy.as_ref().map(at));
    add("traces", traces.as_ref().map(at));
    add("admin_listen", admin_listen.as_ref().map(at));
    add("admin", admin.as_ref().map(at));
    add("api", api.as_ref().map(at));
    add("plans", plans.as_ref().map(at));
    add("server", server.as_ref().map(at));
    add("tls", tls.as_ref().map(at));
    add("grpc_tls", grpc_tls.as_ref().map(at));
    add("domains", domains.first().map(at));
    add("descriptors", descriptors.as_ref().map(at));
    add("path_matching", path_matching.as_ref().map(at));
    add("log", log.as_ref().map(at));
    add("reload", reload.as_ref().map(at));
    add("health", health.as_ref().map(at));
    add("rules_dir", rules_dir.as_ref().map(at));
    out
}

/// Whether `text` may give a section besides `rules:`: a line at the
/// left margin that is not `rules:`, a comment, a list item or a
/// document marker. Only an order to read files in (a settings file
/// first, so the others are built once); a wrong guess costs a second
/// reading, never a wrong result.
pub(crate) fn may_give_settings(text: &str) -> bool {
    text.lines().any(|l| {
        let Some(first) = l.chars().next() else {
            return false;
        };
        !(first.is_whitespace()
            || first == '#'
            || first == '-'
            || l.starts_with("rules:")
            || l.starts_with("..."))
    })
}

/// The `${...}` references in `text`, each once, at most [`MAX_REFS`]
/// (a literal `$${` and one in a comment are taken too: more is hidden,
/// never less).
fn references(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        rest = &rest[i..];
        let Some(end) = rest.find('}') else {
            break;
        };
        let r = &rest[..=end];
        // A reference is a name (and `:url`): no line break, no quote.
        if !r.contains(['\n', '"', '\'']) && !out.iter().any(|o| o == r) {
            out.push(r.to_string());
            if out.len() >= MAX_REFS {
                break;
            }
        }
        rest = &rest[2..];
    }
    out
}

/// The values `refs` (of every file) take from the environment, to hide.
pub(crate) fn secrets_of<'a>(
    refs: impl Iterator<Item = &'a String>,
) -> spillway_rules::env::Secrets {
    use std::fmt::Write as _;
    let mut text = String::new();
    for (i, r) in refs.enumerate() {
        let _ = writeln!(text, "r{i}: \"{r}\"");
    }
    spillway_rules::env::Secrets::of(&text)
}

/// An error of the file `path` as a whole (no line).
pub(crate) fn whole(path: &Path, message: impl Into<String>) -> ConfigError {
    ConfigError::new(path.display().to_string(), 0, 0, message)
}
