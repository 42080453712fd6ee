//! The rules file: raw YAML (with locations) → validated [`Config`].
//!
//! Parsing happens in two stages, as in ripgrep's flags: serde reads the file
//! into raw structs that keep each value's line and column, then
//! validation turns them into core types, collecting every error it finds
//! with the location it belongs to.

mod admin;
mod envoy;
mod envoy_settings;
mod raw;
#[cfg(test)]
mod recover;
#[cfg(test)]
mod rules;
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;
use spillway_core::{FailPolicy, Nanos, PathMatching, Rule};

pub use admin::limits_from_json;
pub use envoy::{load_envoy, parse_envoy};
pub use spillway_rules::env::Secrets;
pub use spillway_rules::{
    Error as ConfigError, Errors as ConfigErrors, parse_duration, parse_rate,
};
pub use tls::{TlsFiles, TlsSettings};

use crate::proxy::{IpNet, UpstreamUrl, UserSource};
use raw::{RawConfig, RawProxy, RawRedis, RawServer, RawStore};
use spillway_rules::build::{
    Collector, RuleContext, count, descriptor_names, duration, path_matching, policy,
};

/// Most keys the memory store holds when `store.memory.max_keys` is not
/// given.
pub const DEFAULT_MAX_KEYS: usize = 10_000_000;

// A rule's `by:` is checked against the parts a store key can hold.
const _: () = assert!(spillway_rules::MAX_KEY_PARTS == spillway_store::MAX_KEY_PARTS);

/// The rules file compiled into the binary, used when no `--config` is given.
pub const EXAMPLE_RULES: &str = include_str!("../../../../examples/rules.yaml");

/// How long a changed rules file must stay unchanged before a reload
/// applies it, unless `reload.quiet` says otherwise: long enough for a
/// writer that truncates, then writes in pieces, to finish.
pub const DEFAULT_RELOAD_QUIET: Duration = Duration::from_secs(2);

/// The shortest `reload.quiet` accepted: shorter, a file still being
/// written would apply half-written (for tests and atomic writers).
pub const MIN_RELOAD_QUIET: Duration = Duration::from_millis(100);

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where state lives.
    pub store: StoreConfig,
    /// Failure policy for rules that set none.
    pub on_store_error: FailPolicy,
    /// The rules, in file order.
    pub rules: Vec<Rule>,
    /// Address from the file's `listen` field, if any (the flag wins).
    pub listen: Option<SocketAddr>,
    /// The `proxy:` section, if any.
    pub proxy: Option<crate::proxy::Settings>,
    /// Where `spillway serve` serves the admin API (metrics, status, rules)
    /// instead of its decision port (`admin_listen`).
    pub admin_listen: Option<SocketAddr>,
    /// Connection bounds of every HTTP listener (the `server:` section).
    pub server: spillway_wire::Limits,
    /// Where to serve the Envoy gRPC API, from `grpc_listen` (the flag wins).
    pub grpc_listen: Option<SocketAddr>,
    /// Add RateLimit headers to gRPC answers (`grpc_response_headers`).
    pub grpc_response_headers: bool,
    /// The Envoy rate limit service's settings (`envoy:`, and the
    /// environment variables envoyproxy/ratelimit reads).
    pub envoy: crate::grpc::service::settings::EnvoySettings,
    /// Descriptor trees for the gRPC API (`domains:`, and `--envoy-config`
    /// files), one per domain name (see [`load_all`]).
    pub domains: Vec<crate::grpc::Domain>,
    /// Several files may give one domain, whose descriptors are then merged
    /// (`--merge-domains`, envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`);
    /// set by [`load_all`], kept for reloads.
    pub merge_domains: bool,
    /// Descriptor names rules may key by bare (`descriptors:`).
    pub descriptors: Vec<String>,
    /// Which respellings of a path count as the path for rules that set
    /// none (`path_matching:`). Every rule also carries it when it is not
    /// the default (see [`Rule::path_matching`]), so a rule set built with
    /// the default one matches the same requests; a rule set built with
    /// this one files the rules in its index as usual.
    pub path_matching: PathMatching,
    /// How long a changed file must stay unchanged before a reload
    /// applies it (`reload.quiet`, default [`DEFAULT_RELOAD_QUIET`]).
    pub reload_quiet: Duration,
    /// How the binary logs, from `log.format` (`--log-format` wins);
    /// `None` when the file says nothing. Taken at start only.
    pub log_format: Option<LogFormat>,
    /// The operator's plane (`admin:`): tokens, top keys, near-limit
    /// share. Its address is [`Config::admin_listen`].
    pub admin: crate::admin::settings::AdminSettings,
    /// The decision API's settings (`api:`): its tokens.
    pub api: crate::credentials::ApiSettings,
    /// The plans (`plans:`) and the rules' plan settings.
    pub plans: crate::admin::settings::PlanBook,
    /// What "the service has room" means (`health:`).
    pub health: crate::admin::settings::HealthSettings,
    /// HTTPS on the listeners (`tls:`, `admin.tls:`, the `--tls-*` flags).
    pub tls: TlsSettings,
    /// The file has a `rules:` key (`rules: []` included). A reload
    /// refuses a file without one: an empty or truncated file is not a
    /// request to drop every limit.
    pub has_rules: bool,
    /// The values the file took from the environment (`${NAME}`), to hide
    /// wherever configuration is shown: errors, the log, `/v1/status`.
    pub secrets: Secrets,
}

impl Config {
    /// Whether `on_store_error: share` is asked for, by default or by a
    /// rule.
    pub fn shares(&self) -> bool {
        self.on_store_error == FailPolicy::Share
            || self
                .rules
                .iter()
                .any(|r| r.fail_policy() == Some(FailPolicy::Share))
    }

    /// The settings that take effect only at start (the store, addresses,
    /// the proxy section, gRPC headers) and differ in `newer`: a reload
    /// applies the rules and says these wait for a restart.
    pub fn start_only_changes(&self, newer: &Config) -> Vec<&'static str> {
        [
            ("store", self.store != newer.store),
            ("listen", self.listen != newer.listen),
            ("grpc_listen", self.grpc_listen != newer.grpc_listen),
            ("proxy", self.proxy != newer.proxy),
            (
                "health (the proxy's measurements and in-flight target)",
                self.proxy.is_some()
                    && (self.health.latency_target != newer.health.latency_target
                        || self.health.percentile != newer.health.percentile
                        || self.health.errors_max != newer.health.errors_max
                        || self.health.window != newer.health.window),
            ),
            ("admin_listen", self.admin_listen != newer.admin_listen),
            (
                "admin.state_file",
                self.admin.state_file != newer.admin.state_file,
            ),
            ("server", self.server != newer.server),
            ("log", self.log_format != newer.log_format),
            ("tls", self.tls != newer.tls),
            (
                "grpc_response_headers",
                self.grpc_response_headers != newer.grpc_response_headers,
            ),
            ("envoy", self.envoy != newer.envoy),
            // The per-decision Redis store keeps heartbeats and a share
            // only when share is asked for at start.
            (
                "on_store_error: share",
                matches!(self.store, StoreConfig::Redis(_)) && self.shares() != newer.shares(),
            ),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }
}

/// Which store to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded in-memory store.
    Memory {
        /// Most keys held.
        max_keys: usize,
    },
    /// Redis or Redis Cluster, shared by many instances.
    Redis(spillway_redis::RedisConfig),
    /// Local-first decisions shared through Redis (`store.redis.sync`).
    Sync(SyncSettings),
}

/// `store.redis.sync`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSettings {
    /// This region's store.
    pub redis: spillway_redis::RedisConfig,
    /// Mode, interval, region.
    pub sync: spillway_sync::SyncConfig,
    /// The other regions' stores, by name (the home store's settings with
    /// their own URL).
    pub regions: Vec<(String, spillway_redis::RedisConfig)>,
}

/// How the binary writes its log (`log.format`, `--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Lines for people, as tracing writes them.
    #[default]
    Text,
    /// One JSON object per line and event (see docs/OPERATIONS.md).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format {other:?}: expected text or json")),
        }
    }
}

/// Reads and validates the file at `path`.
///
/// # Errors
/// The file cannot be read, is not valid YAML, or fails validation.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let (name, text) = spillway_rules::recover::read_file(path)?;
    parse(&name, &text)
}

/// The configuration source: a file, or the built-in example.
#[derive(Debug, Clone)]
pub enum Source {
    /// The rules file at this path.
    File(PathBuf),
    /// The built-in `examples/rules.yaml`.
    Example,
}

impl Source {
    /// Loads and validates.
    ///
    /// # Errors
    /// As [`load`].
    pub fn load(&self) -> Result<Config, ConfigErrors> {
        self.load_from(&Preread::default())
    }

    /// As [`Source::load`], taking the file's text from `pre` when it
    /// was read already.
    fn load_from(&self, pre: &Preread) -> Result<Config, ConfigErrors> {
        match self {
            Source::File(p) => {
                let (name, text) = pre.read(p)?;
                parse(&name, &text)
            }
            Source::Example => parse("<examples/rules.yaml>", EXAMPLE_RULES),
        }
    }
}

/// Files read once already. A pipe, `/dev/stdin` or a process
/// substitution (`<(...)`) gives its text once: `check-config`, which
/// looks into each file to tell a rules file from an envoyproxy/ratelimit
/// one, hands what it read to the loader instead of letting it read an
/// empty pipe (which checked as a valid file of no rules).
#[derive(Debug, Default)]
pub struct Preread {
    /// Each path, and its text or why it could not be read.
    files: Vec<(PathBuf, Result<String, String>)>,
}

impl Preread {
    /// Reads `path` (once: a second call gives the same text); `None`
    /// when it cannot be read (the loader reports why).
    pub fn text(&mut self, path: &Path) -> Option<&str> {
        let at = match self.files.iter().position(|(p, _)| p == path) {
            Some(i) => i,
            None => {
                let read = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"));
                self.files.push((path.to_path_buf(), read));
                self.files.len() - 1
            }
        };
        self.files[at].1.as_deref().ok()
    }

    /// `path`'s name and text: as read before, else read now.
    fn read(&self, path: &Path) -> Result<(String, String), ConfigErrors> {
        match self.files.iter().find(|(p, _)| p == path) {
            None => spillway_rules::recover::read_file(path),
            Some((_, Ok(text))) => Ok((path.display().to_string(), text.clone())),
            Some((_, Err(message))) => Err(ConfigErrors(vec![ConfigError {
                file: path.display().to_string(),
                line: 0,
                column: 0,
                message: message.clone(),
            }])),
        }
    }
}

/// Why a file without a `rules:` key is refused.
pub const NO_RULES: &str = "no `rules:` key (an empty or cut-short file?): it would limit \
     nothing; write `rules: []` for a file of no rules";

/// The files an `--envoy-config` directory gives: its `*.yaml` and `*.yml`
/// files (following links; hidden ones left out, as editors' and
/// Kubernetes' `..data` are), in name order.
///
/// # Errors
/// The directory cannot be listed.
pub fn envoy_dir_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if yaml && !hidden && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// What `spillway serve` loads: the rules file (or the built-in example)
/// and every `--envoy-config` path, a file or a directory of them (see
/// [`envoy_dir_files`]). A domain given twice (by two files, or by a file
/// and the rules file's `domains:`) is refused, as envoyproxy/ratelimit
/// refuses it, unless `merge_domains`: then its top-level descriptors are
/// merged, in file order, and only a composite key given twice is refused.
///
/// # Errors
/// Every problem in every file.
pub fn load_all(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
) -> Result<Config, ConfigErrors> {
    load_with(source, envoy, merge_domains, None, &Preread::default()).map(|(c, _)| c)
}

/// As [`load_all`], taking each file's text from `pre` when it was read
/// already (`check-config`'s pipes).
///
/// # Errors
/// As [`load_all`].
pub fn load_all_read(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    pre: &Preread,
) -> Result<Config, ConfigErrors> {
    load_with(source, envoy, merge_domains, None, pre).map(|(c, _)| c)
}

/// As [`load_all`], for a reload: an `--envoy-config` file that is gone
/// drops its domain (and is returned) instead of failing the load. A
/// directory that is gone (one of `dirs`, the paths that were directories
/// at start) still fails it: an unmounted volume is not a request to drop
/// every domain.
///
/// # Errors
/// As [`load_all`].
pub fn reload_all(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    dirs: &[PathBuf],
) -> Result<(Config, Vec<PathBuf>), ConfigErrors> {
    load_with(
        source,
        envoy,
        merge_domains,
        Some(dirs),
        &Preread::default(),
    )
}

/// `reload`: a file gone is dropped, unless it is one of these directories.
fn load_with(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    reload: Option<&[PathBuf]>,
    pre: &Preread,
) -> Result<(Config, Vec<PathBuf>), ConfigErrors> {
    let mut errors = Vec::new();
    let source_name = match source {
        Source::File(p) => p.display().to_string(),
        Source::Example => "<examples/rules.yaml>".to_string(),
    };
    let mut config = match source.load_from(pre) {
        // Start, check and reload refuse alike a file without `rules:`:
        // an empty or cut-short file is not a request to limit nothing.
        Ok(c) if !c.has_rules => {
            errors.push(ConfigError {
                file: source_name.clone(),
                line: 0,
                column: 0,
                message: NO_RULES.to_string(),
            });
            None
        }
        Ok(c) => Some(c),
        Err(e) => {
            errors.extend(e.0);
            None
        }
    };
    // Each domain, and the file it came from.
    let start: Vec<(crate::grpc::Domain, String)> = config
        .as_mut()
        .map(|c| std::mem::take(&mut c.domains))
        .unwrap_or_default()
        .into_iter()
        .map(|d| (d, source_name.clone()))
        .collect();
    let (domains, gone) = envoy_domains(start, envoy, merge_domains, reload, pre, &mut errors);
    match config {
        Some(mut c) if errors.is_empty() => {
            c.domains = domains;
            c.merge_domains = merge_domains;
            Ok((c, gone))
        }
        _ => Err(ConfigErrors(errors)),
    }
}

/// The domains of `--envoy-config` paths alone (`spillway check-config`
/// without a rules file), checked as [`load_all`] checks them.
///
/// # Errors
/// Every problem in every file.
pub fn load_envoy_all(
    envoy: &[PathBuf],
    merge_domains: bool,
) -> Result<Vec<crate::grpc::Domain>, ConfigErrors> {
    load_envoy_all_read(envoy, merge_domains, &Preread::default())
}

/// As [`load_envoy_all`], taking each file's text from `pre` when it was
/// read already.
///
/// # Errors
/// As [`load_envoy_all`].
pub fn load_envoy_all_read(
    envoy: &[PathBuf],
    merge_domains: bool,
    pre: &Preread,
) -> Result<Vec<crate::grpc::Domain>, ConfigErrors> {
    let mut errors = Vec::new();
    let (domains, _) = envoy_domains(Vec::new(), envoy, merge_domains, None, pre, &mut errors);
    if errors.is_empty() {
        Ok(domains)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// `start`'s domains and those of every `--envoy-config` path; and, on a
/// `reload` (the paths that were directories), the files found gone.
fn envoy_domains(
    mut domains: Vec<(crate::grpc::Domain, String)>,
    envoy: &[PathBuf],
    merge_domains: bool,
    reload: Option<&[PathBuf]>,
    pre: &Preread,
    errors: &mut Vec<ConfigError>,
) -> (Vec<crate::grpc::Domain>, Vec<PathBuf>) {
    let mut gone = Vec::new();
    let mut files = Vec::new();
    for p in envoy {
        if p.is_dir() || reload.is_some_and(|dirs| dirs.contains(p)) {
            match envoy_dir_files(p) {
                Ok(list) => files.extend(list),
                Err(e) => errors.push(ConfigError {
                    file: p.display().to_string(),
                    line: 0,
                    column: 0,
                    message: format!("cannot read the directory: {e}"),
                }),
            }
        } else if reload.is_some() && !p.exists() {
            gone.push(p.clone());
        } else {
            files.push(p.clone());
        }
    }
    for f in files {
        match pre
            .read(&f)
            .and_then(|(name, text)| envoy::parse_located(&name, &text))
        {
            Ok(l) => add_domain(&mut domains, l, merge_domains, errors),
            Err(e) => errors.extend(e.0),
        }
    }
    (domains.into_iter().map(|(d, _)| d).collect(), gone)
}

/// Adds a file's domain: a new one, or (merging) its descriptors to the
/// one of that name.
fn add_domain(
    domains: &mut Vec<(crate::grpc::Domain, String)>,
    l: envoy::Located,
    merge: bool,
    errors: &mut Vec<ConfigError>,
) {
    let envoy::Located {
        domain,
        file,
        at,
        tops,
    } = l;
    let Some((existing, other)) = domains.iter_mut().find(|(d, _)| d.name == domain.name) else {
        domains.push((domain, file));
        return;
    };
    let error = |(line, column): (u64, u64), message: String| ConfigError {
        file: file.clone(),
        line,
        column,
        message,
    };
    if !merge {
        errors.push(error(
            at,
            format!(
                "duplicate domain {:?}: {other} gives it too (one file per domain; --merge-domains, or MERGE_DOMAIN_CONFIG=true, merges them)",
                domain.name
            ),
        ));
        return;
    }
    for (node, at) in domain.nodes.into_iter().zip(tops) {
        let key = envoy::composite(&node.key, node.value.as_deref());
        if existing
            .nodes
            .iter()
            .any(|n| envoy::composite(&n.key, n.value.as_deref()) == key)
        {
            errors.push(error(
                at,
                format!(
                    "duplicate descriptor composite key '{}.{key}' in the merged domain: {other} gives it too",
                    domain.name
                ),
            ));
        } else {
            existing.nodes.push(node);
        }
    }
}

/// Parses and validates YAML `text`; `file` names it in errors.
///
/// # Errors
/// Every problem found, each with line and column.
///
/// The file is read as `spillway_rules` reads one (its size checked,
/// `${NAME}` substituted, every structural error found), into the whole
/// file's raw struct.
pub fn parse(file: &str, text: &str) -> Result<Config, ConfigErrors> {
    let (mut config, secrets) =
        spillway_rules::parse_with_secrets::<RawConfig, _>(file, text, validate)?;
    config.secrets = secrets;
    Ok(config)
}

/// `raw` checked and built; `any_descriptor` accepts every bare name in
/// `by:` (when the `descriptors:` list could not be read).
fn validate(file: &str, raw: RawConfig, any_descriptor: bool) -> Result<Config, ConfigErrors> {
    let mut errs = Collector::new(file);
    let store = match &raw.store {
        None => StoreConfig::Memory {
            max_keys: DEFAULT_MAX_KEYS,
        },
        Some(s) => match &s.value {
            RawStore::Name(n) if n == "memory" => StoreConfig::Memory {
                max_keys: DEFAULT_MAX_KEYS,
            },
            RawStore::Name(n) => {
                errs.at(
                    s,
                    format!("unknown store {n:?}: expected memory, or a redis: section"),
                );
                StoreConfig::Memory {
                    max_keys: DEFAULT_MAX_KEYS,
                }
            }
            RawStore::Map(m) if m.redis.is_some() => {
                if m.memory.is_some() {
                    errs.at(s, "store: choose one of memory or redis");
                }
                redis_config(
                    &mut errs,
                    m.redis.as_ref().unwrap_or_else(|| unreachable!()),
                )
            }
            RawStore::Map(m) => {
                let mem = m.memory.as_ref();
                let max_keys = mem
                    .and_then(|m| m.max_keys)
                    .unwrap_or(DEFAULT_MAX_KEYS as u64);
                if max_keys == 0 {
                    errs.at(s, "store.memory.max_keys must be at least 1");
                }
                if mem.is_none() {
                    errs.at(s, "store needs one of: memory, redis");
                }
                StoreConfig::Memory {
                    max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX),
                }
            }
        },
    };
    let on_store_error = raw
        .on_store_error
        .as_ref()
        .map(|p| policy(&mut errs, p))
        .unwrap_or_default();
    let listen = raw
        .listen
        .as_ref()
        .and_then(|l| address(&mut errs, l, "listen", 8080));
    let proxy = raw.proxy.as_ref().map(|p| proxy_config(&mut errs, p));
    let grpc_listen = raw
        .grpc_listen
        .as_ref()
        .and_then(|l| address(&mut errs, l, "grpc_listen", 8081));
    let mut admin_listen = raw
        .admin_listen
        .as_ref()
        .and_then(|l| address(&mut errs, l, "admin_listen", 9090));
    let env = |v: &str| std::env::var(v).ok();
    let api = crate::credentials::ApiSettings {
        tokens: raw
            .api
            .as_ref()
            .and_then(|a| a.value.tokens.as_ref())
            .map(|list| admin::tokens(&mut errs, list, &env, "api.tokens"))
            .unwrap_or_default(),
    };
    let admin_settings = match &raw.admin {
        None => crate::admin::settings::AdminSettings::default(),
        Some(a) => {
            let (settings, listen) = admin::admin(&mut errs, a, &env);
            if let (Some(l), Some(other)) = (listen, admin_listen)
                && l != other
            {
                errs.at(
                    a.value.listen.as_ref().unwrap_or_else(|| unreachable!()),
                    format!(
                        "admin.listen {l} and admin_listen {other} name the same listener: give one address (or remove one)"
                    ),
                );
            }
            if let (Some(l), Some(p)) = (listen, &proxy)
                && let Some(other) = p.admin_listen
                && l != other
            {
                errs.at(
                    a.value.listen.as_ref().unwrap_or_else(|| unreachable!()),
                    format!(
                        "admin.listen {l} and proxy.admin_listen {other} name the same listener: give one address (or remove one)"
                    ),
                );
            }
            admin_listen = admin_listen.or(listen);
            settings
        }
    };
    let mut proxy = proxy;
    if let Some(p) = proxy.as_mut() {
        if let (Some(mine), Some(other), Some(at)) = (
            p.admin_listen,
            raw.admin_listen.as_ref().and(admin_listen),
            raw.proxy
                .as_ref()
                .and_then(|x| x.value.admin_listen.as_ref()),
        ) && mine != other
        {
            errs.at(
                at,
                format!(
                    "proxy.admin_listen {mine} and admin_listen {other} name the same listener: give one address (or remove one)"
                ),
            );
        }
        p.admin_listen = p.admin_listen.or(admin_listen);
    }
    let (plan_words, plan_raws) = admin::plans(&mut errs, raw.plans.as_ref());
    let health = raw
        .health
        .as_ref()
        .map(|h| admin::health(&mut errs, h))
        .unwrap_or_default();
    let server = raw.server.as_ref().map_or_else(
        || spillway_wire::Limits {
            max_connections: default_max_connections(),
            ..spillway_wire::Limits::default()
        },
        |s| server_limits(&mut errs, s),
    );
    let tls = TlsSettings {
        listeners: raw.tls.as_ref().and_then(|t| tls::tls(&mut errs, t, "tls")),
        admin: raw
            .admin
            .as_ref()
            .and_then(|a| a.value.tls.as_ref())
            .and_then(|t| tls::tls(&mut errs, t, "admin.tls")),
    };
    let (envoy, envoy_errors) = envoy_settings::load(raw.envoy.as_ref(), errs.file, &|var| {
        std::env::var(var).ok()
    });
    errs.list.extend(envoy_errors);
    let mut domains: Vec<crate::grpc::Domain> = Vec::new();
    let mut domain_lines: Vec<u64> = Vec::new();
    for d in &raw.domains {
        let (domain, at) = envoy::domain(
            &mut errs,
            &d.value,
            (d.referenced.line(), d.referenced.column()),
        );
        if let Some(i) = domains.iter().position(|x| x.name == domain.name) {
            errs.at_loc(
                at,
                format!(
                    "domain {:?} appears twice in `domains:` (first at line {}): give its descriptors under one item",
                    domain.name, domain_lines[i]
                ),
            );
        }
        domain_lines.push(at.0);
        domains.push(domain);
    }
    let descriptors = raw
        .descriptors
        .as_ref()
        .map(|d| descriptor_names(&mut errs, &d.value))
        .unwrap_or_default();
    let global_matching = raw
        .path_matching
        .as_ref()
        .map_or_else(PathMatching::default, |m| {
            path_matching(&m.value, PathMatching::default())
        });
    let reload_quiet = raw
        .reload
        .as_ref()
        .and_then(|r| r.value.quiet.as_ref())
        .and_then(|q| {
            let d: Duration = duration(&mut errs, q, "reload.quiet", false)?.into();
            if d < MIN_RELOAD_QUIET {
                errs.at(
                    q,
                    format!(
                        "reload.quiet: at least {}ms (shorter, a file still being written could apply)",
                        MIN_RELOAD_QUIET.as_millis()
                    ),
                );
            }
            Some(d)
        })
        .unwrap_or(DEFAULT_RELOAD_QUIET);
    let log_format = raw
        .log
        .as_ref()
        .and_then(|l| l.value.format.as_ref())
        .and_then(|f| {
            f.value
                .parse()
                .map_err(|e: String| errs.at(f, format!("log.format: {e}")))
                .ok()
        });
    let ctx = RuleContext {
        descriptors: &descriptors,
        any_descriptor,
        path_matching: global_matching,
        plans: &plan_raws,
    };
    let mut rule_plans = std::collections::BTreeMap::new();
    let leased =
        matches!(&store, StoreConfig::Sync(s) if s.sync.mode == spillway_sync::SyncMode::Lease);
    let list = raw.rules.as_deref().unwrap_or_default();
    let rules = spillway_rules::build::rules(&mut errs, list, &ctx, |errs, r, rule| {
        let max_wait = rule.limits().iter().find_map(|l| match l {
            spillway_core::Limit::Shaper(s) => Some(s.max_wait()),
            _ => None,
        });
        let default = r.value.plan.as_ref().map(|p| p.value.default.value.clone());
        rule_plans.insert(
            rule.name().to_string(),
            admin::rule_plans(&plan_raws, default, max_wait),
        );
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
    });
    if errs.list.is_empty() {
        Ok(Config {
            store,
            on_store_error,
            rules,
            listen,
            proxy,
            admin_listen,
            server,
            grpc_listen,
            grpc_response_headers: raw.grpc_response_headers.unwrap_or(false),
            envoy,
            domains,
            merge_domains: false,
            descriptors,
            path_matching: global_matching,
            reload_quiet,
            log_format,
            admin: admin_settings,
            api,
            plans: admin::book(plan_words, rule_plans),
            health,
            tls,
            has_rules: raw.rules.is_some(),
            secrets: Secrets::default(),
        })
    } else {
        Err(ConfigErrors(errs.list))
    }
}

/// Most slots of the Redis over-limit cache (32 bytes each).
const MAX_OVER_LIMIT_CACHE: usize = 1 << 24;

/// Most Redis buckets: more would only cost memory (one key each).
const MAX_BUCKETS: u32 = 1 << 24;

fn redis_config(errs: &mut Collector<'_>, r: &Spanned<RawRedis>) -> StoreConfig {
    let raw = &r.value;
    let mut cfg = spillway_redis::RedisConfig::default();
    match (&raw.url, &raw.cluster) {
        (Some(_), Some(c)) => errs.at(c, "redis: give url or cluster, not both"),
        (None, None) => errs.at(r, "redis: needs url (or cluster: a list of node urls)"),
        _ => {}
    }
    let check_url = |errs: &mut Collector<'_>, u: &str, at: &dyn Fn(&mut Collector<'_>, String)| {
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            at(
                errs,
                format!(
                    "{:?} is not a redis:// or rediss:// url",
                    spillway_redis::redact(u)
                ),
            );
        }
    };
    if let Some(u) = &raw.url {
        check_url(errs, &u.value, &|e, m| e.at(u, m));
        cfg.url = u.value.clone();
    }
    if let Some(c) = &raw.cluster {
        if c.value.is_empty() {
            errs.at(c, "redis.cluster: list at least one node");
        }
        for u in &c.value {
            check_url(errs, u, &|e, m| e.at(c, m));
        }
        cfg.cluster = c.value.clone();
    }
    if let Some(t) = &raw.timeout
        && let Some(d) = duration(errs, t, "redis.timeout", false)
    {
        cfg.timeout = d.into();
    }
    if let Some(p) = &raw.probe_interval
        && let Some(d) = duration(errs, p, "redis.probe_interval", false)
    {
        cfg.probe_interval = d.into();
    }
    if let Some(b) = &raw.breaker_failures
        && let Some(n) = count(errs, b, "redis.breaker_failures")
    {
        cfg.breaker_failures = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(b) = &raw.buckets
        && let Some(n) = count(errs, b, "redis.buckets")
    {
        match u32::try_from(n) {
            Ok(n) if n <= MAX_BUCKETS => cfg.buckets = n,
            _ => errs.at(b, format!("redis.buckets: at most {MAX_BUCKETS}")),
        }
    }
    if let Some(n) = &raw.over_limit_cache {
        match usize::try_from(n.value) {
            Ok(v) if v <= MAX_OVER_LIMIT_CACHE => cfg.over_limit_cache = v,
            _ => errs.at(
                n,
                format!("redis.over_limit_cache: 0 (off) to {MAX_OVER_LIMIT_CACHE} entries"),
            ),
        }
    }
    if let Some(p) = &raw.prefix {
        if p.value.len() > 64 || p.value.contains(['{', '}']) {
            errs.at(p, "redis.prefix: at most 64 characters, without { or }");
        }
        cfg.prefix = p.value.clone();
    }
    match &raw.sync {
        None => StoreConfig::Redis(cfg),
        Some(s) => StoreConfig::Sync(sync_config(errs, s, cfg)),
    }
}

/// Longest sync interval: past it, instances would not see each other's
/// traffic for longer than most windows last.
const MAX_SYNC_INTERVAL: Nanos = Nanos(60_000_000_000);

fn sync_config(
    errs: &mut Collector<'_>,
    s: &Spanned<raw::RawSync>,
    redis: spillway_redis::RedisConfig,
) -> SyncSettings {
    let raw = &s.value;
    let mut sync = spillway_sync::SyncConfig::default();
    if !redis.cluster.is_empty() {
        errs.at(
            s,
            "redis.sync needs one server per region (url): a Redis Cluster is decided per request only",
        );
    }
    if let Some(m) = &raw.mode {
        sync.mode = match m.value.as_str() {
            "eventual" => spillway_sync::SyncMode::Eventual,
            "lease" => spillway_sync::SyncMode::Lease,
            other => {
                errs.at(
                    m,
                    format!("redis.sync.mode {other:?}: expected eventual or lease"),
                );
                spillway_sync::SyncMode::Eventual
            }
        };
    }
    if let Some(i) = &raw.interval
        && let Some(d) = duration(errs, i, "redis.sync.interval", false)
    {
        if d > MAX_SYNC_INTERVAL {
            errs.at(i, "redis.sync.interval: at most 60s");
        } else {
            sync.interval = d.into();
        }
    }
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.len() <= 64
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    if let Some(r) = &raw.region {
        if !name_ok(&r.value) {
            errs.at(
                r,
                "redis.sync.region: 1 to 64 letters, digits, '-', '_' or '.'",
            );
        }
        sync.region = Some(r.value.clone());
    }
    let mut regions = Vec::new();
    if let Some(rs) = &raw.regions {
        if raw.region.is_none() && !rs.value.is_empty() {
            errs.at(
                rs,
                "redis.sync.regions needs redis.sync.region: this instance's own region",
            );
        }
        for (name, url) in &rs.value {
            if !name_ok(name) {
                errs.at(rs, format!("redis.sync.regions: region name {name:?}: 1 to 64 letters, digits, '-', '_' or '.'"));
            }
            if sync.region.as_deref() == Some(name.as_str()) {
                errs.at(
                    rs,
                    format!("redis.sync.regions: {name:?} is this instance's own region"),
                );
            }
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                errs.at(
                    rs,
                    format!(
                        "redis.sync.regions.{name}: {:?} is not a redis:// or rediss:// url",
                        spillway_redis::redact(url)
                    ),
                );
            }
            regions.push((
                name.clone(),
                spillway_redis::RedisConfig {
                    url: url.clone(),
                    ..redis.clone()
                },
            ));
        }
    }
    if let Some(n) = &raw.max_keys
        && let Some(n) = count(errs, n, "redis.sync.max_keys")
    {
        sync.max_keys = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = &raw.failures
        && let Some(n) = count(errs, n, "redis.sync.failures")
    {
        sync.failures = u32::try_from(n).unwrap_or(u32::MAX);
    }
    SyncSettings {
        redis,
        sync,
        regions,
    }
}

fn proxy_config(errs: &mut Collector<'_>, p: &Spanned<RawProxy>) -> crate::proxy::Settings {
    let raw = &p.value;
    let mut cfg = crate::proxy::Settings::default();
    if let Some(u) = &raw.upstream {
        let mut url =
            |errs: &mut Collector<'_>, at: &dyn Fn(&mut Collector<'_>, String), s: &str| {
                match UpstreamUrl::parse(s) {
                    Ok(url) => cfg.upstream = Some(url),
                    Err(e) => at(errs, format!("proxy.upstream: {e}")),
                }
            };
        match &u.value {
            raw::RawUpstream::Url(s) => url(errs, &|errs, m| errs.at(u, m), s),
            raw::RawUpstream::Map(m) => {
                match &m.url {
                    Some(s) => url(errs, &|errs, msg| errs.at(s, msg), &s.value),
                    None => errs.at(u, "proxy.upstream: a map needs `url:`"),
                }
                if let Some(n) = &m.max_connections
                    && let Some(n) = count(errs, n, "proxy.upstream.max_connections")
                {
                    cfg.max_connections = Some(usize::try_from(n).unwrap_or(usize::MAX));
                }
            }
        }
    }
    if let Some(u) = &raw.user {
        match UserSource::parse(&u.value) {
            Ok(src) => cfg.user = Some(src),
            Err(e) => errs.at(u, format!("proxy.user: {e}")),
        }
    }
    if let Some(t) = &raw.trusted_proxies {
        for n in &t.value {
            match IpNet::parse(n) {
                Ok(net) => cfg.trusted_proxies.push(net),
                Err(e) => errs.at(t, format!("proxy.trusted_proxies: {e}")),
            }
        }
    }
    if let Some(t) = &raw.timeout
        && let Some(d) = duration(errs, t, "proxy.timeout", false)
    {
        cfg.timeout = d.into();
    }
    if let Some(u) = &raw.upgrades {
        cfg.upgrades.clear();
        for p in &u.value {
            let p = p.trim().to_ascii_lowercase();
            if p == "h2c" {
                errs.at(
                    u,
                    "proxy.upgrades: h2c is never passed through (its requests would escape the limits)",
                );
            } else if p.is_empty() || !p.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
                errs.at(u, format!("proxy.upgrades: {p:?} is not a protocol name"));
            } else {
                cfg.upgrades.push(p);
            }
        }
    }
    if let Some(c) = &raw.concurrency {
        cfg.concurrency = concurrency(errs, c);
    }
    if let Some(b) = &raw.buffer_body {
        match size(&b.value) {
            Ok(n) if n <= crate::proxy::MOST_BUFFERED => cfg.buffer_body = n,
            Ok(n) => errs.at(
                b,
                format!(
                    "proxy.buffer_body: at most {} bytes (16 MiB), not {n}",
                    crate::proxy::MOST_BUFFERED
                ),
            ),
            Err(e) => errs.at(b, format!("proxy.buffer_body: {e}")),
        }
    }
    cfg.listen = raw
        .listen
        .as_ref()
        .and_then(|l| address(errs, l, "proxy.listen", 8080));
    cfg.admin_listen = raw
        .admin_listen
        .as_ref()
        .and_then(|l| address(errs, l, "proxy.admin_listen", 9090));
    cfg
}

/// A size in bytes: a whole number, or one with a unit (`B`, `KiB`, `MiB`;
/// `kB` and `MB` are 1,000 and 1,000,000).
fn size(s: &raw::RawSize) -> Result<usize, String> {
    let text = match s {
        raw::RawSize::Bytes(n) => {
            return usize::try_from(*n).map_err(|_| format!("{n} is not a size"));
        }
        raw::RawSize::Text(t) => t.trim(),
    };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = text[..digits]
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 64KiB"))?;
    let unit: u64 = match text[digits..].trim() {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        "kB" | "KB" => 1000,
        "MB" => 1_000_000,
        other => return Err(format!("{other:?} is not a unit: B, KiB or MiB")),
    };
    n.checked_mul(unit)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `proxy.concurrency`: exactly one of `adaptive: { min, max }` and
/// `limit: N`, and an optional queue.
fn concurrency(
    errs: &mut Collector<'_>,
    c: &Spanned<raw::RawConcurrency>,
) -> Option<crate::proxy::ConcurrencySettings> {
    use crate::proxy::LimitKind;
    /// The most in flight a limit may allow.
    const MOST: i64 = 1_000_000;
    let raw = &c.value;
    let mut size = |n: &Spanned<i64>, what: &str| -> Option<u32> {
        if (1..=MOST).contains(&n.value) {
            u32::try_from(n.value).ok()
        } else {
            errs.at(n, format!("{what}: from 1 to {MOST}, not {}", n.value));
            None
        }
    };
    let limit = match (&raw.adaptive, &raw.limit) {
        (Some(_), Some(l)) => {
            errs.at(
                l,
                "proxy.concurrency: give adaptive: { min, max } or limit: N, not both",
            );
            None
        }
        (None, None) => {
            errs.at(
                c,
                "proxy.concurrency needs adaptive: { min: N, max: N } or limit: N",
            );
            None
        }
        (None, Some(l)) => size(l, "proxy.concurrency.limit").map(LimitKind::Fixed),
        (Some(a), None) => {
            let min = size(&a.value.min, "proxy.concurrency.adaptive.min");
            let max = size(&a.value.max, "proxy.concurrency.adaptive.max");
            match (min, max) {
                (Some(min), Some(max)) if min <= max => Some(LimitKind::Adaptive { min, max }),
                (Some(_), Some(_)) => {
                    errs.at(a, "proxy.concurrency.adaptive: min must not be above max");
                    None
                }
                _ => None,
            }
        }
    };
    let mut out = crate::proxy::ConcurrencySettings {
        limit: limit?,
        max_wait: std::time::Duration::from_millis(500),
        max_queued: 1024,
    };
    if let Some(q) = &raw.queue {
        if let Some(w) = &q.value.max_wait
            && let Some(d) = duration(errs, w, "proxy.concurrency.queue.max_wait", true)
        {
            out.max_wait = d.into();
        }
        if let Some(n) = &q.value.max_queued {
            if (0..=MOST).contains(&n.value) {
                out.max_queued = usize::try_from(n.value).unwrap_or(0);
            } else {
                errs.at(
                    n,
                    format!(
                        "proxy.concurrency.queue.max_queued: from 0 to {MOST}, not {}",
                        n.value
                    ),
                );
            }
        }
    }
    Some(out)
}

/// The `server:` section: connection bounds of every HTTP listener.
fn server_limits(errs: &mut Collector<'_>, s: &Spanned<RawServer>) -> spillway_wire::Limits {
    let raw = &s.value;
    let mut l = spillway_wire::Limits {
        max_connections: default_max_connections(),
        ..spillway_wire::Limits::default()
    };
    for (field, what, slot) in [
        (
            &raw.head_timeout,
            "server.head_timeout",
            &mut l.head_timeout,
        ),
        (
            &raw.idle_timeout,
            "server.idle_timeout",
            &mut l.idle_timeout,
        ),
        (
            &raw.body_timeout,
            "server.body_timeout",
            &mut l.body_timeout,
        ),
        (
            &raw.write_timeout,
            "server.write_timeout",
            &mut l.write_timeout,
        ),
    ] {
        if let Some(t) = field
            && let Some(d) = duration(errs, t, what, false)
        {
            *slot = d.into();
        }
    }
    if let Some(n) = &raw.max_connections
        && let Some(n) = count(errs, n, "server.max_connections")
    {
        l.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = &raw.max_streams
        && let Some(v) = count(errs, n, "server.max_streams")
    {
        match u32::try_from(v) {
            Ok(v) if v > 0 => l.max_streams = v,
            _ => errs.at(
                n,
                format!("server.max_streams: from 1 to {}, not {v}", u32::MAX),
            ),
        }
    }
    if let Some(n) = &raw.max_streams_total
        && let Some(v) = count(errs, n, "server.max_streams_total")
    {
        l.max_streams_total = usize::try_from(v).unwrap_or(usize::MAX);
    }
    if let Some(d) = raw.direct_path {
        l.direct_path = d;
    }
    l
}

/// The descriptor budget for connections when the file sets none: the
/// process's descriptor limit less 64 for listeners, files and the
/// runtime; at least 64. Every connection the process holds counts
/// against it: clients of every listener, and what the process reserves
/// for its upstream pool and its store (see `spillway_wire::Budget`).
pub fn default_max_connections() -> usize {
    let nofile = crate::descriptor_limit().unwrap_or(1024);
    nofile.saturating_sub(64).max(64)
}

/// A listening address (`ADDR:PORT`); `example_port` goes in the message.
fn address(
    errs: &mut Collector<'_>,
    l: &Spanned<String>,
    what: &str,
    example_port: u16,
) -> Option<SocketAddr> {
    match l.value.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.at(
                l,
                format!(
                    "{what} {:?} is not an address like 127.0.0.1:{example_port}",
                    l.value
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    /// spillway-rules skips the sections of a server's file and refuses
    /// any other key: its list must be exactly the sections read here.
    #[test]
    fn spillway_rules_knows_every_section_of_the_file() {
        let e = parse("r.yaml", "zzz: 1\nrules: []\n")
            .unwrap_err()
            .to_string();
        let listed = e
            .split("expected one of ")
            .nth(1)
            .unwrap_or_else(|| panic!("no field list in {e:?}"));
        let mut ours: Vec<&str> = listed.trim().split(", ").collect();
        let mut theirs = spillway_rules::SECTIONS.to_vec();
        ours.sort_unstable();
        theirs.sort_unstable();
        assert_eq!(ours, theirs);
    }

    use super::*;
    use spillway_core::Nanos;

    /// `proxy.upstream` as a URL (as before) or a map with `url` and
    /// `max_connections`; a bad bound or a map without a URL is a located
    /// error.
    #[test]
    fn the_upstream_is_a_url_or_a_map_with_its_connection_bound() {
        let proxy = |upstream: &str| {
            parse(
                "r.yaml",
                &format!("proxy:\n  upstream: {upstream}\nrules: []\n"),
            )
            .map(|c| c.proxy.expect("a proxy section"))
        };
        let p = proxy("http://127.0.0.1:9").unwrap();
        assert_eq!(p.upstream.unwrap().authority(), "127.0.0.1:9");
        assert_eq!(p.max_connections, None);
        let p = proxy("{ url: http://127.0.0.1:9/api, max_connections: 50 }").unwrap();
        assert_eq!(p.upstream.unwrap().base(), "/api");
        assert_eq!(p.max_connections, Some(50));
        let p = proxy("\n    url: http://x:1\n").unwrap();
        assert_eq!(
            (p.upstream.unwrap().authority(), p.max_connections),
            ("x:1", None)
        );
        for (bad, says) in [
            ("{ url: http://x, max_connections: 0 }", "r.yaml:2:"),
            ("{ url: ftp://x }", "r.yaml:2:"),
            ("{ max_connections: 3 }", "needs `url:`"),
            ("{ url: http://x, max_conections: 3 }", "unknown field"),
            ("[http://x]", "r.yaml:2:"),
        ] {
            let e = proxy(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(crate::proxy::default_upstream_connections(1000), 250);
    }

    /// `proxy.buffer_body`: bytes, or a number with a unit; 0 turns it
    /// off; past 16 MiB, a negative number or an unknown unit is a
    /// located error.
    #[test]
    fn the_buffered_body_size_is_read_with_its_unit() {
        let buffered = |v: &str| {
            parse(
                "r.yaml",
                &format!("proxy:\n  buffer_body: {v}\nrules: []\n"),
            )
            .map(|c| c.proxy.expect("a proxy section").buffer_body)
        };
        assert_eq!(crate::proxy::Settings::default().buffer_body, 64 * 1024);
        for (v, want) in [
            ("0", 0),
            ("1000", 1000),
            ("64KiB", 65536),
            ("\"1 MiB\"", 1 << 20),
            ("2kB", 2000),
            ("16MiB", 16 << 20),
        ] {
            assert_eq!(buffered(v).unwrap(), want, "{v}");
        }
        for bad in ["-1", "17MiB", "64 KB x", "lots", "1.5MiB", "[1]"] {
            let e = buffered(bad).unwrap_err().to_string();
            assert!(e.contains("r.yaml:2:"), "{bad}: {e}");
        }
        assert_eq!(crate::proxy::default_upstream_connections(10), 8);
    }

    proptest::proptest! {
        /// The example rules with a few edits anywhere (numbers, units,
        /// brackets, anchors, odd characters): accepted or refused with
        /// located errors, never a panic.
        #[test]
        fn edited_rules_files_are_accepted_or_refused_with_locations(
            edits in proptest::collection::vec(
                (
                    0usize..4096,
                    0usize..4,
                    proptest::sample::select(vec![
                        "", "0", "-1", "18446744073709551616", "99999999999d", "1e9", "/0s",
                        "ms", "%", "soft 1001%", "{", "}", "[", "]", ":", "- ", "\n", "\t",
                        "&a", "*a", "!!binary", "~", "\"", "'", "é", "\u{0}", "#",
                        "user+ip+user", "header:", "queue: { max_wait: 0s }",
                    ]),
                ),
                1..4,
            ),
        ) {
            let mut text = EXAMPLE_RULES.to_string();
            for (at, cut, insert) in edits {
                let mut at = at % (text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                let mut end = (at + cut).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                text.replace_range(at..end, insert);
            }
            if let Err(e) = parse("r.yaml", &text) {
                let shown = e.to_string();
                proptest::prop_assert!(!e.0.is_empty());
                for line in shown.lines().filter(|l| !l.starts_with(' ')) {
                    proptest::prop_assert!(line.starts_with("r.yaml:"), "{line}");
                }
            }
        }
    }

    #[test]
    fn parser_messages_lose_their_own_location_and_name_what_was_expected() {
        for (value, want) in [
            (
                "1.5",
                "r.yaml:4:32: expected a whole number (at most 9223372036854775807)",
            ),
            (
                "99999999999999999999",
                "r.yaml:4:32: expected a whole number",
            ),
        ] {
            let text = format!(
                "rules:\n  - name: a\n    limits:\n      - fixed_window: {{ limit: {value}, window: 1m }}\n"
            );
            let e = parse("r.yaml", &text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{value}: {e}");
        }
        let e = parse("r.yaml", "store: { memory: { max_keys: -1 } }\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("expected a whole number from 0 to 18446744073709551615"),
            "{e}"
        );
        let e = parse("r.yaml", "colour: red\n").unwrap_err().to_string();
        assert!(e.starts_with("r.yaml:1:1: unknown field `colour`"), "{e}");
        // Structure the parser expected, in the user's words, and no parser
        // options.
        for (text, want) in [
            ("rules: 5\n", "r.yaml:1:8: expected a list"),
            ("rules: [1]\n", "r.yaml:1:9: expected a map"),
            (
                "rules:\n  - name: [a]\n    limits: [ { gcra: { rate: 1/s } } ]\n",
                "r.yaml:2:11: expected a string",
            ),
            (
                "rules:\n  - name: a\n    name: b\n    limits: [ { gcra: { rate: 1/s } } ]\n",
                "r.yaml:3:5: duplicate key `name`",
            ),
        ] {
            let e = parse("r.yaml", text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
            assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
        }
    }

    #[test]
    fn a_reload_names_the_settings_that_wait_for_a_restart() {
        let rules = "rules:\n  - name: a\n    limits:\n      - gcra: { rate: 1/s, burst: 1 }\n";
        let start = parse("a.yaml", rules).unwrap();
        let same = parse("a.yaml", &rules.replace("1/s", "5/s")).unwrap();
        assert!(start.start_only_changes(&same).is_empty());
        let moved = format!(
            "store: {{ redis: {{ url: redis://127.0.0.1:1 }} }}\nlisten: 127.0.0.1:9\nproxy: {{ upstream: http://127.0.0.1:2 }}\n{rules}"
        );
        let moved = parse("a.yaml", &moved).unwrap();
        assert_eq!(
            start.start_only_changes(&moved),
            ["store", "listen", "proxy"]
        );
    }

    #[test]
    fn durations_and_rates() {
        assert_eq!(parse_duration("500ms").unwrap(), Nanos::from_millis(500));
        assert_eq!(parse_duration("1d").unwrap(), Nanos::from_secs(86_400));
        assert_eq!(parse_duration("1.5s").unwrap(), Nanos::from_millis(1500));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
        let r = parse_rate("100/1m").unwrap();
        assert_eq!((r.count(), r.per()), (100, Nanos::from_secs(60)));
        let r = parse_rate("5/s").unwrap();
        assert_eq!((r.count(), r.per()), (5, Nanos::from_secs(1)));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("5").is_err());
        assert!(parse_rate("x/s").is_err());
    }

    #[test]
    fn the_example_file_is_valid() {
        let c = parse("example", EXAMPLE_RULES).unwrap();
        assert!(c.rules.len() >= 4);
    }

    #[test]
    fn errors_name_line_and_column() {
        let text =
            "rules:\n  - name: a\n    limits:\n      - fixed_window: { limit: 0, window: 1m }\n";
        let e = parse("f.yaml", text).unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert_eq!((e.0[0].line, e.0[0].column), (4, 32), "{e}");
        let text = "rules:\n  - name: a\n    bogus: 1\n    limits: []\n";
        let e = parse("f.yaml", text).unwrap_err();
        assert_eq!(e.0[0].line, 3, "{e}");
    }

    /// `store.redis.sync` as the issue writes it, and `share`.
    #[test]
    fn sync_as_written() {
        let text = "store:\n  redis:\n    url: redis://10.0.0.5:6379/0\n    sync:\n      mode: eventual\n      interval: 100ms\n      region: eu-west\n      regions:\n        us-east: redis://10.1.0.5:6379/0\non_store_error: share\nrules: []\n";
        let c = parse("s.yaml", text).unwrap();
        assert_eq!(c.on_store_error, FailPolicy::Share);
        let StoreConfig::Sync(s) = &c.store else {
            panic!("{:?}", c.store)
        };
        assert_eq!(s.redis.url, "redis://10.0.0.5:6379/0");
        assert_eq!(s.sync.mode, spillway_sync::SyncMode::Eventual);
        assert_eq!(s.sync.interval, Duration::from_millis(100));
        assert_eq!(s.sync.region.as_deref(), Some("eu-west"));
        assert_eq!(s.regions.len(), 1);
        assert_eq!(s.regions[0].0, "us-east");
        assert_eq!(s.regions[0].1.url, "redis://10.1.0.5:6379/0");
        let lease = parse("s.yaml", &text.replace("eventual", "lease")).unwrap();
        assert!(
            matches!(lease.store, StoreConfig::Sync(s) if s.sync.mode == spillway_sync::SyncMode::Lease)
        );
        let rule_share = "rules:\n  - name: a\n    on_store_error: share\n    limits:\n      - gcra: { rate: 1/s, burst: 1 }\n";
        let c = parse("r.yaml", rule_share).unwrap();
        assert_eq!(c.rules[0].fail_policy(), Some(FailPolicy::Share));
    }

    /// Every mistake in a sync section is an error with its place.
    #[test]
    fn sync_errors() {
        let base = |sync: &str| {
            format!("store:\n  redis:\n    url: redis://h:1\n    sync: {sync}\nrules: []\n")
        };
        for (sync, want) in [
            (
                "{ mode: fast }",
                "redis.sync.mode \"fast\": expected eventual or lease",
            ),
            (
                "{ interval: 0s }",
                "redis.sync.interval must be longer than zero",
            ),
            ("{ interval: 2m }", "redis.sync.interval: at most 60s"),
            ("{ interval: soon }", "redis.sync.interval"),
            ("{ regions: { b: redis://h:2 } }", "needs redis.sync.region"),
            (
                "{ region: a, regions: { a: redis://h:2 } }",
                "is this instance's own region",
            ),
            (
                "{ region: a, regions: { b: http://h:2 } }",
                "is not a redis:// or rediss:// url",
            ),
            ("{ region: 'a b' }", "redis.sync.region: 1 to 64"),
            ("{ max_keys: 0 }", "redis.sync.max_keys must be at least 1"),
            ("{ speed: 1 }", "unknown field"),
        ] {
            let e = parse("s.yaml", &base(sync)).unwrap_err().to_string();
            assert!(e.contains(want), "{sync}: {e}");
            assert!(e.contains("s.yaml:4:"), "{sync}: {e}");
        }
        let cluster = "store:\n  redis:\n    cluster: [redis://h:1]\n    sync: { mode: eventual }\nrules: []\n";
        let e = parse("c.yaml", cluster).unwrap_err().to_string();
        assert!(
            e.contains("a Redis Cluster is decided per request only"),
            "{e}"
        );
        let e = parse("p.yaml", "on_store_error: half\nrules: []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected allow, deny or share"), "{e}");
        let shaper = "store:\n  redis:\n    url: redis://h:1\n    sync: { mode: lease }\nrules:\n  - name: q\n    limits:\n      - leaky_bucket: { capacity: 5, leak: 1/s }\n    queue: { max_wait: 1s }\n";
        let e = parse("q.yaml", shaper).unwrap_err().to_string();
        assert!(e.contains("cannot be leased"), "{e}");
        assert!(parse("q.yaml", &shaper.replace("lease", "eventual")).is_ok());
    }

    #[test]
    fn redis_buckets() {
        let with = |b: &str| {
            format!("store:\n  redis:\n    url: redis://h:1\n    buckets: {b}\nrules: []\n")
        };
        let c = parse("f.yaml", &with("1024")).unwrap();
        assert!(matches!(c.store, StoreConfig::Redis(r) if r.buckets == 1024));
        for bad in ["0", "-3", "99999999999"] {
            let e = parse("f.yaml", &with(bad)).unwrap_err();
            assert_eq!(e.0[0].line, 4, "{bad}: {e}");
            assert!(e.0[0].message.contains("buckets"), "{bad}: {e}");
        }
    }

    #[test]
    fn redis_over_limit_cache() {
        let with = |n: &str| {
            format!(
                "store:\n  redis:\n    url: redis://h:1\n    over_limit_cache: {n}\nrules: []\n"
            )
        };
        for (n, want) in [("0", 0), ("100", 100)] {
            let c = parse("f.yaml", &with(n)).unwrap();
            assert!(matches!(c.store, StoreConfig::Redis(r) if r.over_limit_cache == want));
        }
        let c = parse(
            "f.yaml",
            "store:\n  redis:\n    url: redis://h:1\nrules: []\n",
        )
        .unwrap();
        assert!(matches!(c.store, StoreConfig::Redis(r)
            if r.over_limit_cache == spillway_redis::DEFAULT_OVER_LIMIT_CACHE));
        for bad in ["-1", "99999999999"] {
            let e = parse("f.yaml", &with(bad)).unwrap_err();
            assert_eq!(e.0[0].line, 4, "{bad}: {e}");
            assert!(e.0[0].message.contains("over_limit_cache"), "{bad}: {e}");
        }
    }
}
