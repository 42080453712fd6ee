//! The rules file: raw YAML (with locations) → validated [`Config`].
//!
//! Parsing happens in two stages, as in ripgrep's flags: serde reads the file
//! into raw structs that keep each value's line and column, then
//! validation turns them into core types, collecting every error it finds
//! with the location it belongs to.

mod admin;
mod envoy;
mod envoy_settings;
mod forward_auth;
mod load;
mod overlay;
mod parts;
mod raw;
#[cfg(test)]
mod recover;
#[cfg(test)]
mod rules;
mod server;
mod store;
mod tls;
mod traces;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;
use spillway_core::{FailPolicy, Nanos, PathMatching, Rule};

pub use crate::tls::{TlsFiles, TlsSettings};
pub use admin::limits_from_json;
pub use envoy::{load_envoy, parse_envoy};
pub use load::*;
pub use overlay::{Overlay, RedisOverlay};
pub use parts::{BadFile, FilesStatus, RuleFiles};
pub use server::default_max_connections;
use server::{address, server_limits};
pub use spillway_rules::env::Secrets;
pub use spillway_rules::{
    Error as ConfigError, Errors as ConfigErrors, parse_duration, parse_rate,
};
use store::redis_config;
pub use traces::ratelimit_tracing_env;

use crate::proxy::{IpNet, UpstreamUrl, UserSource};
use raw::{RawConfig, RawProxy, RawRedis, RawServer, RawStore};
use spillway_rules::build::{
    Collector, RuleContext, count, descriptor_names, duration, path_matching, policy,
};

mod proxy;
#[allow(clippy::wildcard_imports)]
use proxy::*;

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
    /// The gateways' way in (`forward_auth:`; its defaults without one).
    pub forward_auth: crate::api::forward_auth::Settings,
    /// Where `spillway serve` serves the admin API (metrics, status, rules)
    /// instead of its decision port (`admin_listen`).
    pub admin_listen: Option<SocketAddr>,
    /// Connection bounds of every HTTP listener (the `server:` section).
    pub server: spillway_wire::Limits,
    /// Where to serve the Envoy gRPC API: `grpc_listen` (an address or
    /// `unix:PATH`), or envoyproxy/ratelimit's `GRPC_UDS`, which wins over
    /// the file (the flag wins over both, except under the `ratelimit`
    /// entry, where `GRPC_UDS` replaces `GRPC_HOST:GRPC_PORT`).
    pub grpc_listen: Option<crate::grpc::GrpcListen>,
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
    pub health: crate::health::HealthSettings,
    /// HTTPS on the listeners (`tls:`, `admin.tls:`, the `--tls-*` flags).
    pub tls: TlsSettings,
    /// The file has a `rules:` key (`rules: []` included). A reload
    /// refuses a file without one: an empty or truncated file is not a
    /// request to drop every limit.
    pub has_rules: bool,
    /// The values the file took from the environment (`${NAME}`), to hide
    /// wherever configuration is shown: errors, the log, `/v1/status`.
    pub secrets: Secrets,
    /// `rules_dir:`, a directory whose files add their rules (see
    /// [`RuleFiles`]); relative to the file's directory once loaded.
    pub rules_dir: Option<PathBuf>,
    /// Domains over xDS from a management server besides the files' (set
    /// by `serve --xds-server` or the `ratelimit` entry's
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`; no file section says it).
    pub xds: Option<crate::xds::Settings>,
    /// `/healthcheck` fails while no gRPC domain is in force
    /// (envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub healthy_needs_domains: bool,
    /// OpenTelemetry traces (`traces:` and the `OTEL_*` variables):
    /// `None` when off, the default.
    pub traces: Option<crate::trace::TraceSettings>,
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

    /// The settings that take effect only at start and differ in
    /// `newer`: a reload applies the rules and says these wait for a
    /// restart. Read from [`SECTIONS`], where each section of the file
    /// says once when a change to it applies.
    pub fn start_only_changes(&self, newer: &Config) -> Vec<&'static str> {
        SECTIONS
            .iter()
            .filter(|s| s.applies != Applies::OnReload && (s.changed)(self, newer))
            .map(|s| match s.applies {
                Applies::PartlyAtStart(part) => part,
                Applies::OnReload | Applies::AtStart => s.key,
            })
            .collect()
    }
}

/// When a change to a section of the rules file takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// A reload applies it.
    OnReload,
    /// Only a restart does: a reload that changes it applies the rules and
    /// logs that the section waits for a restart.
    AtStart,
    /// A reload applies it but for the part named, which waits for a
    /// restart (the name is what the log says).
    PartlyAtStart(&'static str),
}

/// One top-level section of the rules file, and when a change to it
/// applies: the one place that says so, read by reloads
/// ([`Config::start_only_changes`]) and checked against the sections the
/// parser knows ([`spillway_rules::SECTIONS`]), so a new section cannot
/// be added without saying whether a reload applies it.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    /// The key, as the file writes it.
    pub key: &'static str,
    /// When a change applies.
    pub applies: Applies,
    /// Whether two configurations differ in what waits for a restart
    /// (for [`Applies::OnReload`], never read).
    changed: fn(&Config, &Config) -> bool,
}

impl Section {
    const fn on_reload(key: &'static str) -> Section {
        Section {
            key,
            applies: Applies::OnReload,
            changed: |_, _| false,
        }
    }

    const fn at_start(key: &'static str, changed: fn(&Config, &Config) -> bool) -> Section {
        Section {
            key,
            applies: Applies::AtStart,
            changed,
        }
    }
}

/// Every section of the rules file, in the order `check-config` and the
/// docs give them, with when a change to it applies.
pub const SECTIONS: &[Section] = &[
    Section::at_start("store", |a, b| a.store != b.store),
    Section {
        key: "on_store_error",
        // The per-decision Redis store keeps heartbeats and a share only
        // when share is asked for at start.
        applies: Applies::PartlyAtStart("on_store_error: share"),
        changed: |a, b| matches!(a.store, StoreConfig::Redis(_)) && a.shares() != b.shares(),
    },
    Section::at_start("listen", |a, b| a.listen != b.listen),
    Section::at_start("grpc_listen", |a, b| a.grpc_listen != b.grpc_listen),
    Section::at_start("proxy", |a, b| a.proxy != b.proxy),
    // The gateways' way in is built once, with its listener's routes.
    Section::at_start("forward_auth", |a, b| a.forward_auth != b.forward_auth),
    Section {
        key: "health",
        applies: Applies::PartlyAtStart("health (the proxy's measurements and in-flight target)"),
        changed: |a, b| {
            a.proxy.is_some()
                && (a.health.latency_target != b.health.latency_target
                    || a.health.percentile != b.health.percentile
                    || a.health.errors_max != b.health.errors_max
                    || a.health.window != b.health.window)
        },
    },
    Section::at_start("admin_listen", |a, b| a.admin_listen != b.admin_listen),
    Section {
        key: "admin",
        applies: Applies::PartlyAtStart("admin.state_file"),
        changed: |a, b| a.admin.state_file != b.admin.state_file,
    },
    Section::at_start("server", |a, b| a.server != b.server),
    Section::at_start("log", |a, b| a.log_format != b.log_format),
    Section::at_start("tls", |a, b| {
        a.tls.listeners != b.tls.listeners || a.tls.admin != b.tls.admin
    }),
    Section::at_start("grpc_tls", |a, b| a.tls.grpc != b.tls.grpc),
    Section::at_start("grpc_response_headers", |a, b| {
        a.grpc_response_headers != b.grpc_response_headers
    }),
    Section::at_start("envoy", |a, b| a.envoy != b.envoy),
    Section::on_reload("api"),
    Section::on_reload("plans"),
    Section::on_reload("domains"),
    Section::on_reload("descriptors"),
    Section::on_reload("path_matching"),
    Section::on_reload("reload"),
    Section::on_reload("rules"),
    // The directory is watched from the start; its files' changes apply.
    Section::at_start("rules_dir", |a, b| a.rules_dir != b.rules_dir),
    // The exporter is started once.
    Section::at_start("traces", |a, b| a.traces != b.traces),
];

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
        spillway_rules::parse_with_secrets::<RawConfig, _>(file, text, |f, raw, any| {
            validate(f, &raw, any)
        })?;
    config.secrets = secrets;
    Ok(config)
}

/// `raw` checked and built; `any_descriptor` accepts every bare name in
/// `by:` (when the `descriptors:` list could not be read).
fn validate(file: &str, raw: &RawConfig, any_descriptor: bool) -> Result<Config, ConfigErrors> {
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
    let forward_auth = raw
        .forward_auth
        .as_ref()
        .map(|f| forward_auth::forward_auth(&mut errs, f))
        .unwrap_or_default();
    let mut grpc_listen = raw
        .grpc_listen
        .as_ref()
        .and_then(|l| match l.value.parse() {
            Ok(at) => Some(at),
            Err(why) => {
                errs.at(l, format!("grpc_listen: {why}"));
                None
            }
        });
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
        grpc: raw
            .grpc_tls
            .as_ref()
            .and_then(|t| tls::tls(&mut errs, t, "grpc_tls")),
    };
    let (envoy, envoy_errors) = envoy_settings::load(raw.envoy.as_ref(), errs.file, &|var| {
        std::env::var(var).ok()
    });
    errs.list.extend(envoy_errors);
    if let Some(path) = &envoy.grpc_uds {
        grpc_listen = Some(crate::grpc::GrpcListen::Unix(path.clone()));
    }
    let (traces, trace_errors) = traces::load(raw.traces.as_ref(), errs.file, &|var| {
        std::env::var(var).ok()
    });
    errs.list.extend(trace_errors);
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
    let leased =
        matches!(&store, StoreConfig::Sync(s) if s.sync.mode == spillway_sync::SyncMode::Lease);
    let list = raw.rules.as_deref().unwrap_or_default();
    let chunks = raw.rule_chunks.as_ref();
    let (rules, rule_plans) = parts::build_rules(&mut errs, list, chunks, &ctx, leased, |_, _| {});
    let rules_dir = raw.rules_dir.as_ref().and_then(|d| {
        if d.value.trim().is_empty() {
            errs.at(
                d,
                "rules_dir: a directory path (relative to this file's directory)",
            );
            return None;
        }
        Some(PathBuf::from(&d.value))
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
            forward_auth,
            secrets: Secrets::default(),
            rules_dir,
            xds: None,
            healthy_needs_domains: false,
            traces,
        })
    } else {
        Err(ConfigErrors(errs.list))
    }
}

#[cfg(test)]
mod tests;
