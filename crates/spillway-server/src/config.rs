//! The rules file: raw YAML (with locations) → validated [`Config`].
//!
//! Parsing happens in two stages, as in ripgrep's flags: serde reads the file
//! into raw structs that keep each value's line and column, then
//! validation turns them into core types, collecting every error it finds
//! with the location it belongs to.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;
use spillway_core::{
    FailPolicy, FixedWindow, Gcra, KeySpec, LeakyBucket, Limit, Mode, Nanos, Rate, Route, Rule,
    Shaper, SlidingCounter, SlidingLog, TokenBucket,
};

/// The rules file compiled into the binary, used when no `--config` is given.
pub const EXAMPLE_RULES: &str = include_str!("../../../examples/rules.yaml");

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
    pub proxy: Option<ProxyConfig>,
    /// Where to serve the Envoy gRPC API, from `grpc_listen` (the flag wins).
    pub grpc_listen: Option<SocketAddr>,
    /// Add RateLimit headers to gRPC answers (`grpc_response_headers`).
    pub grpc_response_headers: bool,
    /// Descriptor trees for the gRPC API (`domains:`, and `--envoy-config` files).
    pub domains: Vec<crate::envoy::Domain>,
}

impl Config {
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
                "grpc_response_headers",
                self.grpc_response_headers != newer.grpc_response_headers,
            ),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }
}

/// Reverse-proxy settings (`spillway proxy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Where admitted requests go, e.g. `http://127.0.0.1:9000`.
    pub upstream: Option<String>,
    /// Where the user identity comes from.
    pub user: Option<UserSource>,
    /// Peers whose `Forwarded` / `X-Forwarded-For` are believed.
    pub trusted_proxies: Vec<crate::proxy::IpNet>,
    /// Longest wait for the upstream's response headers.
    pub timeout: Duration,
    /// Where `spillway proxy` listens (before the file's `listen`).
    pub listen: Option<SocketAddr>,
    /// Where `spillway proxy` serves the HTTP API (metrics, health, status,
    /// rules, decisions), which its own address forwards upstream.
    pub admin_listen: Option<SocketAddr>,
}

impl Default for ProxyConfig {
    fn default() -> ProxyConfig {
        ProxyConfig {
            upstream: None,
            user: None,
            trusted_proxies: Vec::new(),
            timeout: Duration::from_secs(30),
            listen: None,
            admin_listen: None,
        }
    }
}

/// Where a proxied request's user comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserSource {
    /// A header, by lower-case name.
    Header(String),
    /// A query parameter.
    Query(String),
}

impl UserSource {
    /// Parses `header:<Name>` or `query:<name>`.
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(s: &str) -> Result<UserSource, String> {
        match s.split_once(':') {
            Some(("header", h)) if !h.trim().is_empty() => {
                Ok(UserSource::Header(h.trim().to_ascii_lowercase()))
            }
            Some(("query", q)) if !q.trim().is_empty() => {
                Ok(UserSource::Query(q.trim().to_string()))
            }
            _ => Err(format!("{s:?}: expected header:<Name> or query:<name>")),
        }
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
}

/// One problem in a rules file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<example>` for the built-in one).
    pub file: String,
    /// 1-based line; 0 if unknown.
    pub line: u64,
    /// 1-based column; 0 if unknown.
    pub column: u64,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

/// Every problem found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    store: Option<Spanned<RawStore>>,
    #[serde(default)]
    on_store_error: Option<Spanned<String>>,
    #[serde(default)]
    listen: Option<Spanned<String>>,
    #[serde(default)]
    proxy: Option<Spanned<RawProxy>>,
    #[serde(default)]
    grpc_listen: Option<Spanned<String>>,
    #[serde(default)]
    grpc_response_headers: Option<bool>,
    #[serde(default)]
    domains: Vec<Spanned<RawDomain>>,
    #[serde(default)]
    rules: Vec<Spanned<RawRule>>,
}

/// A domain: envoyproxy/ratelimit's file format, also spillway's `domains:` items.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomain {
    domain: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: Spanned<String>,
    #[serde(default)]
    value: Option<Spanned<String>>,
    /// Envoy's own limit: a fixed window of `requests_per_unit` per `unit`.
    #[serde(default)]
    rate_limit: Option<Spanned<RawEnvoyRate>>,
    /// spillway's: any algorithm.
    #[serde(default)]
    limit: Option<Spanned<RawLimit>>,
    #[serde(default)]
    descriptors: Vec<Spanned<RawDescriptor>>,
    #[serde(default)]
    shadow_mode: Option<bool>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
    #[serde(default)]
    name: Option<Spanned<String>>,
    /// Accepted for compatibility; spillway's metrics are per rule already.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvoyRate {
    #[serde(default)]
    unit: Option<Spanned<String>>,
    #[serde(default)]
    requests_per_unit: Option<Spanned<i64>>,
    #[serde(default)]
    unlimited: Option<bool>,
    #[serde(default)]
    name: Option<Spanned<String>>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(default)]
    upstream: Option<Spanned<String>>,
    #[serde(default)]
    user: Option<Spanned<String>>,
    #[serde(default)]
    trusted_proxies: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    timeout: Option<Spanned<String>>,
    #[serde(default)]
    listen: Option<Spanned<String>>,
    #[serde(default)]
    admin_listen: Option<Spanned<String>>,
}

#[derive(Debug)]
enum RawStore {
    Name(String),
    Map(Box<RawStoreMap>),
}

// By hand rather than `#[serde(untagged)]`: untagged enums buffer their
// input, which loses the line and column of every value inside.
impl<'de> Deserialize<'de> for RawStore {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RawStore, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawStore;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`memory`, or a map with `memory:` or `redis:`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawStore, E> {
                Ok(RawStore::Name(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<RawStore, A::Error> {
                RawStoreMap::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(|m| RawStore::Map(Box::new(m)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStoreMap {
    #[serde(default)]
    memory: Option<RawMemory>,
    #[serde(default)]
    redis: Option<Spanned<RawRedis>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    #[serde(default)]
    url: Option<Spanned<String>>,
    #[serde(default)]
    cluster: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    timeout: Option<Spanned<String>>,
    #[serde(default)]
    prefix: Option<Spanned<String>>,
    #[serde(default)]
    breaker_failures: Option<Spanned<i64>>,
    #[serde(default)]
    probe_interval: Option<Spanned<String>>,
    #[serde(default)]
    buckets: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMemory {
    #[serde(default)]
    max_keys: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Spanned<String>,
    #[serde(default)]
    api: Option<Spanned<String>>,
    #[serde(default)]
    by: Option<Spanned<String>>,
    limits: Vec<Spanned<RawLimit>>,
    #[serde(default)]
    mode: Option<Spanned<String>>,
    #[serde(default)]
    on_store_error: Option<Spanned<String>>,
    #[serde(default)]
    queue: Option<Spanned<RawQueue>>,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    max_wait: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum RawLimit {
    TokenBucket(RawBucket),
    LeakyBucket(RawLeaky),
    FixedWindow(RawWindow),
    SlidingWindowLog(RawWindow),
    SlidingWindowCounter(RawWindow),
    Gcra(RawGcra),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    limit: Spanned<i64>,
    window: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    capacity: Spanned<i64>,
    refill: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLeaky {
    capacity: Spanned<i64>,
    leak: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGcra {
    rate: Spanned<String>,
    #[serde(default)]
    burst: Option<Spanned<i64>>,
}

/// Reads and validates the file at `path`.
///
/// # Errors
/// The file cannot be read, is not valid YAML, or fails validation.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let (name, text) = read(path)?;
    parse(&name, &text)
}

/// The file's name as errors show it, and its text.
fn read(path: &Path) -> Result<(String, String), ConfigErrors> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((name, text)),
        Err(e) => Err(ConfigErrors(vec![ConfigError {
            file: name,
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        }])),
    }
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
        match self {
            Source::File(p) => load(p),
            Source::Example => parse("<examples/rules.yaml>", EXAMPLE_RULES),
        }
    }
}

/// Parses and validates YAML `text`; `file` names it in errors.
///
/// # Errors
/// Every problem found, each with line and column.
pub fn parse(file: &str, text: &str) -> Result<Config, ConfigErrors> {
    if text.len() > 16 << 20 {
        return Err(ConfigErrors(vec![ConfigError {
            file: file.to_string(),
            line: 0,
            column: 0,
            message: "file larger than 16 MiB".to_string(),
        }]));
    }
    let raw: RawConfig = serde_saphyr::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        ConfigErrors(vec![ConfigError {
            file: file.to_string(),
            line,
            column,
            message: first_line(&e.to_string()),
        }])
    })?;
    validate(file, raw)
}

/// serde-saphyr renders a snippet after the message; the message is the
/// first line, without the location the library may put before it
/// (`error: line X column Y: `) or after it (` at line X column Y`): we
/// print our own. Its word for a value that is not a whole number (or too
/// large) is the type's name; ours says what was expected.
fn first_line(s: &str) -> String {
    let mut line = s.lines().next().unwrap_or(s).trim();
    line = line.strip_prefix("error: ").unwrap_or(line);
    if let Some(rest) = line.strip_prefix("line ")
        && let Some((at, msg)) = rest.split_once(": ")
        && at.split(" column ").all(|n| n.parse::<u64>().is_ok())
    {
        line = msg;
    }
    if let Some(i) = line.find(" at line ") {
        line = &line[..i];
    }
    if let Some(rest) = line.strip_prefix("duplicate mapping key: ") {
        // The library's advice that follows (a parser option) is not the
        // user's to act on.
        let key = rest.split_once(", set ").map_or(rest, |(k, _)| k);
        return format!("duplicate key `{key}`");
    }
    match line {
        "invalid i64" => format!("expected a whole number (at most {})", i64::MAX),
        "invalid u64" => format!("expected a whole number from 0 to {}", u64::MAX),
        "expected sequence start" => {
            "expected a list (`[a, b]` or lines starting with `- `)".into()
        }
        "expected mapping start" => {
            "expected a map (`{ key: value }` or `key: value` lines)".into()
        }
        "expected string scalar" => "expected a string".into(),
        _ => line.to_string(),
    }
}

struct Errors<'a> {
    file: &'a str,
    list: Vec<ConfigError>,
}

impl Errors<'_> {
    fn at<T>(&mut self, span: &Spanned<T>, message: impl Into<String>) {
        self.list.push(ConfigError {
            file: self.file.to_string(),
            line: span.referenced.line(),
            column: span.referenced.column(),
            message: message.into(),
        });
    }
}

fn validate(file: &str, raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Errors {
        file,
        list: Vec::new(),
    };
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
    let domains = raw
        .domains
        .iter()
        .map(|d| domain(&mut errs, &d.value))
        .collect();
    let mut rules = Vec::new();
    let mut names: Vec<&Spanned<String>> = Vec::new();
    for r in &raw.rules {
        if let Some(prev) = names.iter().find(|n| n.value == r.value.name.value) {
            errs.at(
                &r.value.name,
                format!(
                    "duplicate rule name {:?} (first used at line {})",
                    r.value.name.value,
                    prev.referenced.line()
                ),
            );
        }
        names.push(&r.value.name);
        if let Some(rule) = rule(&mut errs, r) {
            rules.push(rule);
        }
    }
    if errs.list.is_empty() {
        Ok(Config {
            store,
            on_store_error,
            rules,
            listen,
            proxy,
            grpc_listen,
            grpc_response_headers: raw.grpc_response_headers.unwrap_or(false),
            domains,
        })
    } else {
        Err(ConfigErrors(errs.list))
    }
}

/// Most Redis buckets: more would only cost memory (one key each).
const MAX_BUCKETS: u32 = 1 << 24;

fn redis_config(errs: &mut Errors<'_>, r: &Spanned<RawRedis>) -> StoreConfig {
    let raw = &r.value;
    let mut cfg = spillway_redis::RedisConfig::default();
    match (&raw.url, &raw.cluster) {
        (Some(_), Some(c)) => errs.at(c, "redis: give url or cluster, not both"),
        (None, None) => errs.at(r, "redis: needs url (or cluster: a list of node urls)"),
        _ => {}
    }
    let check_url = |errs: &mut Errors<'_>, u: &str, at: &dyn Fn(&mut Errors<'_>, String)| {
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
    if let Some(p) = &raw.prefix {
        if p.value.len() > 64 || p.value.contains(['{', '}']) {
            errs.at(p, "redis.prefix: at most 64 characters, without { or }");
        }
        cfg.prefix = p.value.clone();
    }
    StoreConfig::Redis(cfg)
}

fn proxy_config(errs: &mut Errors<'_>, p: &Spanned<RawProxy>) -> ProxyConfig {
    let raw = &p.value;
    let mut cfg = ProxyConfig::default();
    if let Some(u) = &raw.upstream {
        match crate::proxy::parse_upstream(&u.value) {
            Ok(_) => cfg.upstream = Some(u.value.clone()),
            Err(e) => errs.at(u, format!("proxy.upstream: {e}")),
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
            match crate::proxy::IpNet::parse(n) {
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

/// A listening address (`ADDR:PORT`); `example_port` goes in the message.
fn address(
    errs: &mut Errors<'_>,
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

/// Parses an envoyproxy/ratelimit configuration file (one domain).
///
/// # Errors
/// Every problem, with line and column.
pub fn parse_envoy(file: &str, text: &str) -> Result<crate::envoy::Domain, ConfigErrors> {
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
pub fn load_envoy(path: &Path) -> Result<crate::envoy::Domain, ConfigErrors> {
    let (name, text) = read(path)?;
    parse_envoy(&name, &text)
}

fn domain(errs: &mut Errors<'_>, d: &RawDomain) -> crate::envoy::Domain {
    let name = d.domain.value.trim().to_string();
    if name.is_empty() {
        errs.at(&d.domain, "domain must not be empty");
    }
    let nodes = descriptors(errs, &name, &d.descriptors);
    crate::envoy::Domain { name, nodes }
}

fn descriptors(
    errs: &mut Errors<'_>,
    path: &str,
    list: &[Spanned<RawDescriptor>],
) -> Vec<crate::envoy::Node> {
    use crate::envoy::{Action, Node, proto::Unit};
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
                        (Some(u), Some(n)) => match crate::envoy::envoy_rule(&name, n, u, shadow) {
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
        });
    }
    out
}

/// Default cap on keys in the memory store.
pub const DEFAULT_MAX_KEYS: usize = 10_000_000;

fn policy(errs: &mut Errors<'_>, p: &Spanned<String>) -> FailPolicy {
    match p.value.as_str() {
        "allow" => FailPolicy::Allow,
        "deny" => FailPolicy::Deny,
        other => {
            errs.at(
                p,
                format!("on_store_error {other:?}: expected allow or deny"),
            );
            FailPolicy::Allow
        }
    }
}

fn rule(errs: &mut Errors<'_>, r: &Spanned<RawRule>) -> Option<Rule> {
    let raw = &r.value;
    let before = errs.list.len();
    let name = raw.name.value.trim();
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        errs.at(&raw.name, "rule name must be 1 to 128 printable characters");
    }
    let route = raw.api.as_ref().and_then(|a| match Route::parse(&a.value) {
        Ok(route) => Some(route),
        Err(e) => {
            errs.at(a, format!("api: {e}"));
            None
        }
    });
    let by = match &raw.by {
        None => KeySpec::from_parts(Vec::new()),
        Some(b) => match KeySpec::parse(&b.value) {
            Ok(k) if k.parts().len() > spillway_store::MAX_KEY_PARTS => {
                errs.at(
                    b,
                    format!("by: at most {} parts", spillway_store::MAX_KEY_PARTS),
                );
                k
            }
            Ok(k) => k,
            Err(e) => {
                errs.at(b, format!("by: {e}"));
                KeySpec::from_parts(Vec::new())
            }
        },
    };
    let mode = raw.mode.as_ref().map_or(Mode::Hard, |m| mode(errs, m));
    let max_wait = raw.queue.as_ref().and_then(|q| {
        let mw = &q.value.max_wait;
        duration(errs, mw, "queue.max_wait", true)
    });
    if raw.limits.is_empty() {
        errs.at(r, format!("rule {name:?} needs at least one limit"));
    }
    let mut limits = Vec::new();
    for l in &raw.limits {
        if let Some(limit) = limit(errs, l, max_wait) {
            limits.push(limit);
        }
    }
    if let (Some(q), Some(_)) = (&raw.queue, max_wait)
        && !limits.iter().any(|l| matches!(l, Limit::Shaper(_)))
    {
        errs.at(
            q,
            "queue needs a leaky_bucket limit in the same rule to shape with",
        );
    }
    let policy = raw.on_store_error.as_ref().map(|p| policy(errs, p));
    if errs.list.len() != before {
        return None;
    }
    match Rule::new(name, route, by, limits, mode) {
        Ok(rule) => Some(match policy {
            Some(p) => rule.with_fail_policy(p),
            None => rule,
        }),
        Err(e) => {
            errs.at(r, e.to_string());
            None
        }
    }
}

fn mode(errs: &mut Errors<'_>, m: &Spanned<String>) -> Mode {
    let v = m.value.trim();
    match v {
        "hard" => Mode::Hard,
        "shadow" => Mode::Shadow,
        _ => {
            let pct = v
                .strip_prefix("soft")
                .map(str::trim)
                .and_then(|p| p.strip_suffix('%'))
                .map(|p| p.trim().parse::<u32>());
            match pct {
                Some(Ok(p)) if p <= 1000 => Mode::Soft { percent: p },
                _ => {
                    errs.at(
                        m,
                        format!("mode {v:?}: expected hard, shadow or soft N% (0 to 1000)"),
                    );
                    Mode::Hard
                }
            }
        }
    }
}

fn count(errs: &mut Errors<'_>, n: &Spanned<i64>, what: &str) -> Option<u64> {
    if n.value <= 0 {
        errs.at(n, format!("{what} must be at least 1, not {}", n.value));
        return None;
    }
    Some(n.value as u64)
}

fn limit(errs: &mut Errors<'_>, l: &Spanned<RawLimit>, max_wait: Option<Nanos>) -> Option<Limit> {
    let built = match &l.value {
        RawLimit::TokenBucket(b) => {
            let c = count(errs, &b.capacity, "capacity");
            let r = rate(errs, &b.refill, "refill");
            TokenBucket::new(c?, r?).map(Limit::TokenBucket)
        }
        RawLimit::LeakyBucket(b) => {
            let c = count(errs, &b.capacity, "capacity");
            let r = rate(errs, &b.leak, "leak");
            match max_wait {
                Some(w) => Shaper::new(c?, r?, w).map(Limit::Shaper),
                None => LeakyBucket::new(c?, r?).map(Limit::LeakyBucket),
            }
        }
        RawLimit::FixedWindow(w) => {
            let n = count(errs, &w.limit, "limit");
            let d = duration(errs, &w.window, "window", false);
            FixedWindow::new(n?, d?).map(Limit::FixedWindow)
        }
        RawLimit::SlidingWindowLog(w) => {
            let n = count(errs, &w.limit, "limit");
            let d = duration(errs, &w.window, "window", false);
            SlidingLog::new(n?, d?).map(Limit::SlidingLog)
        }
        RawLimit::SlidingWindowCounter(w) => {
            let n = count(errs, &w.limit, "limit");
            let d = duration(errs, &w.window, "window", false);
            SlidingCounter::new(n?, d?).map(Limit::SlidingCounter)
        }
        RawLimit::Gcra(g) => {
            let r = rate(errs, &g.rate, "rate");
            let b = match &g.burst {
                Some(b) => count(errs, b, "burst"),
                None => Some(1),
            };
            Gcra::new(r?, b?).map(Limit::Gcra)
        }
    };
    match built {
        Ok(limit) => Some(limit),
        Err(e) => {
            errs.at(l, e.to_string());
            None
        }
    }
}

/// Parses `500ms`, `1s`, `1m`, `1h`, `1d` (also `us`, `ns`; a decimal like `1.5s`).
pub fn parse_duration(s: &str) -> Result<Nanos, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{s:?} has no unit: write e.g. 500ms, 1s, 1m, 1h, 1d"))?;
    let (num, unit) = s.split_at(split);
    let unit_ns: u128 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}: use ms, s, m, h or d"
            ));
        }
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(format!("{s:?} has no number"));
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| format!("{s:?} is not a number"))?
    };
    let mut total = int.saturating_mul(unit_ns);
    if !frac.is_empty() {
        if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{s:?}: at most 9 decimals"));
        }
        let f: u128 = frac.parse().map_err(|_| format!("{s:?} is not a number"))?;
        total = total.saturating_add(f * unit_ns / 10u128.pow(frac.len() as u32));
    }
    let ns = u64::try_from(total).map_err(|_| format!("{s:?} is too long"))?;
    Ok(Nanos(ns))
}

/// Parses `N/s`, `N/m`, `N/h`, `N/d` or `N/<duration>` such as `100/1m`.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let (n, per) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not a rate: write e.g. 5/s, 100/1m"))?;
    let n: u64 = n
        .trim()
        .parse()
        .map_err(|_| format!("{:?} in rate {s:?} is not a whole number", n.trim()))?;
    let per = per.trim();
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(per)?
    } else {
        parse_duration(&format!("1{per}"))?
    };
    Rate::new(n, per).map_err(|e| format!("rate {s:?}: {e}"))
}

fn duration(
    errs: &mut Errors<'_>,
    d: &Spanned<String>,
    what: &str,
    zero_ok: bool,
) -> Option<Nanos> {
    match parse_duration(&d.value) {
        Ok(n) if n.as_u64() == 0 && !zero_ok => {
            errs.at(d, format!("{what} must be longer than zero"));
            None
        }
        Ok(n) => Some(n),
        Err(e) => {
            errs.at(d, format!("{what}: {e}"));
            None
        }
    }
}

fn rate(errs: &mut Errors<'_>, r: &Spanned<String>, what: &str) -> Option<Rate> {
    match parse_rate(&r.value) {
        Ok(rate) => Some(rate),
        Err(e) => {
            errs.at(r, format!("{what}: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
