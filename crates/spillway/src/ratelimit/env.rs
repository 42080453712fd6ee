//! envoyproxy/ratelimit's variables read as ratelimit reads them (Go's
//! `strconv.ParseBool`, `time.ParseDuration`, envconfig's maps), each
//! into what `serve` takes, or refused with why.

use std::time::Duration;

use spillway_server::config::{Overlay, RedisOverlay};
use spillway_server::xds::{ClientTls, Settings as XdsSettings, split_host};

/// The environment, as `(name, value)` pairs.
pub(crate) struct Env<'a> {
    pub(crate) vars: &'a [(String, String)],
}

impl Env<'_> {
    /// The value of `name`, if set and not empty (envconfig takes an empty
    /// value as unset).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// Go's `strconv.ParseBool`: `None` when unset.
    pub(crate) fn bool(&self, name: &str, refused: &mut Vec<String>) -> Option<bool> {
        let v = self.get(name)?;
        match v {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
            _ => {
                refused.push(format!("{name}: {v:?} is not a boolean (true or false)"));
                None
            }
        }
    }

    /// Whether `name` is set to a true value.
    pub(crate) fn on(&self, name: &str, refused: &mut Vec<String>) -> bool {
        self.bool(name, refused) == Some(true)
    }

    /// Go's `time.ParseDuration`.
    pub(crate) fn duration(&self, name: &str, refused: &mut Vec<String>) -> Option<Duration> {
        let v = self.get(name)?;
        go_duration(v)
            .map_err(|e| refused.push(format!("{name}: {e}")))
            .ok()
    }

    /// An integer of at least `min`.
    pub(crate) fn int(&self, name: &str, min: i64, refused: &mut Vec<String>) -> Option<i64> {
        let v = self.get(name)?;
        match v.trim().parse::<i64>() {
            Ok(n) if n >= min => Some(n),
            _ => {
                refused.push(format!(
                    "{name}: {v:?} is not a whole number of at least {min}"
                ));
                None
            }
        }
    }
}

/// Go's `time.ParseDuration`: `0`, or numbers with units (`ns`, `us`,
/// `µs`, `ms`, `s`, `m`, `h`), e.g. `1h30m`, `1.5s`.
pub(crate) fn go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 500ms, 3s, 1h30m)");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = t;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(n);
        let num: f64 = num.parse().map_err(|_| bad())?;
        let u = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(u);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += num * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// `REDIS_*`: the store, or nothing when `REDIS_URL` is unset (the
/// embedded store).
pub(crate) fn redis(env: &Env<'_>, refused: &mut Vec<String>) -> Option<RedisOverlay> {
    let mut known = vec![
        "REDIS_URL",
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
    ];
    let mut refuse = |name: &'static str, why: &str, refused: &mut Vec<String>| {
        known.push(name);
        if env.get(name).is_some() {
            refused.push(format!("{name}: {why}"));
        }
    };
    for name in [
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
    ] {
        refuse(
            name,
            "spillway does not wait for Redis at start: until it answers, decisions follow the rules file's on_store_error",
            refused,
        );
    }
    // Tuning of ratelimit's connection pool and pipelining: spillway
    // multiplexes one connection per node and batches calls itself, so
    // these are checked as ratelimit checks them and have nothing to set.
    env.int("REDIS_POOL_SIZE", 1, refused);
    env.int("REDIS_PIPELINE_LIMIT", 0, refused);
    env.int("REDIS_CLUSTER_PIPELINE_PARALLELISM", 0, refused);
    env.duration("REDIS_PIPELINE_WINDOW", refused);
    // /healthcheck fails while the store is unusable, with or without it.
    env.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", refused);
    known.extend([
        "REDIS_POOL_SIZE",
        "REDIS_PIPELINE_LIMIT",
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "REDIS_PIPELINE_WINDOW",
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "REDIS_SOCKET_TYPE",
        "REDIS_TYPE",
        "REDIS_AUTH",
        "REDIS_TLS",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_TIMEOUT",
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "REDIS_PERSECOND",
        "REDIS_SENTINEL_AUTH",
    ]);
    if let Some(b) = env.get("REDIS_POOL_ON_EMPTY_BEHAVIOR")
        && !b.eq_ignore_ascii_case("wait")
    {
        refused.push(format!(
            "REDIS_POOL_ON_EMPTY_BEHAVIOR: {b:?}: only WAIT (ratelimit's radix v4 has no other either)"
        ));
    }
    if env.on("REDIS_PERSECOND", refused) {
        refused.push(
            "REDIS_PERSECOND: a second Redis for per-second limits is not a store spillway has"
                .into(),
        );
    }
    if env.on("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", refused) {
        refused.push("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: spillway's Redis client verifies the server's name and certificate, or nothing; it does not skip the name alone".into());
    }
    // Anything else under REDIS_: a setting this entry does not know is
    // not passed over.
    for (name, value) in env.vars {
        if name.starts_with("REDIS_")
            && !name.starts_with("REDIS_PERSECOND_")
            && !value.is_empty()
            && !known.contains(&name.as_str())
        {
            refused.push(format!("{name}: not a setting spillway knows"));
        }
    }
    let sentinel_type = env
        .get("REDIS_TYPE")
        .is_some_and(|t| t.eq_ignore_ascii_case("sentinel"));
    if env.get("REDIS_SENTINEL_AUTH").is_some() && !sentinel_type {
        refused.push("REDIS_SENTINEL_AUTH: only read with REDIS_TYPE=sentinel".into());
    }
    let tls = env.on("REDIS_TLS", refused);
    let timeout = env.duration("REDIS_TIMEOUT", refused);
    // The files TLS is given (read, and checked to be usable, when the
    // overlay is laid: they need TLS on).
    let ca = env.get("REDIS_TLS_CACERT").map(std::path::PathBuf::from);
    let client = match (
        env.get("REDIS_TLS_CLIENT_CERT"),
        env.get("REDIS_TLS_CLIENT_KEY"),
    ) {
        (Some(c), Some(k)) => Some((c.into(), k.into())),
        (None, None) => None,
        _ => {
            refused.push("REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: one needs the other".into());
            None
        }
    };
    let Some(url) = env.get("REDIS_URL") else {
        for name in [
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_TLS_CACERT",
            "REDIS_TLS_CLIENT_CERT",
            "REDIS_TLS_CLIENT_KEY",
        ] {
            if env.get(name).is_some() {
                refused.push(format!(
                    "{name}: REDIS_URL is unset, so no Redis is used (spillway's embedded store); set REDIS_URL"
                ));
            }
        }
        return None;
    };
    match env.get("REDIS_SOCKET_TYPE").map(str::to_ascii_lowercase).as_deref() {
        Some("tcp") => {}
        None => refused.push(
            "REDIS_SOCKET_TYPE: unset, which ratelimit reads as unix; spillway reaches Redis over tcp: set REDIS_SOCKET_TYPE=tcp".into(),
        ),
        Some("unix") => {
            refused.push(
                "REDIS_SOCKET_TYPE: unix sockets are not a way spillway reaches Redis; use tcp"
                    .into(),
            );
            return None;
        }
        Some(other) => {
            refused.push(format!(
                "REDIS_SOCKET_TYPE: {other:?}: expected tcp or unix"
            ));
            return None;
        }
    }
    let cluster = match env
        .get("REDIS_TYPE")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("single") => false,
        Some("cluster") => true,
        Some("sentinel") => {
            let mut overlay = sentinel(env, url, tls, timeout, refused);
            overlay.ca = ca;
            overlay.client = client;
            return Some(overlay);
        }
        Some(other) => {
            refused.push(format!(
                "REDIS_TYPE: {other:?}: expected single, cluster or sentinel"
            ));
            return None;
        }
    };
    let userinfo = env.get("REDIS_AUTH").map(|a| match a.split_once(':') {
        Some((user, pass)) => format!("{}:{}@", encode(user), encode(pass)),
        None => format!(":{}@", encode(a)),
    });
    let scheme = if tls { "rediss" } else { "redis" };
    let mut urls = Vec::new();
    let list: Vec<&str> = if cluster {
        url.split(',').map(str::trim).collect()
    } else {
        vec![url.trim()]
    };
    for addr in list {
        match split_host(addr) {
            Ok((host, port)) => {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.to_string()
                };
                urls.push(format!(
                    "{scheme}://{}{host}:{port}",
                    userinfo.as_deref().unwrap_or("")
                ));
            }
            Err(e) => refused.push(format!(
                "REDIS_URL: {e}{}",
                if cluster {
                    ""
                } else {
                    " (several nodes: REDIS_TYPE=cluster)"
                }
            )),
        }
    }
    Some(RedisOverlay {
        named_by: "REDIS_URL".into(),
        urls,
        cluster,
        timeout,
        sentinel: None,
        ca,
        client,
    })
}

/// `REDIS_TYPE=sentinel`: `REDIS_URL` is the master's name, then the
/// sentinels (`name,host:port,...`, as ratelimit reads it); `REDIS_AUTH`
/// logs in to the master, `REDIS_SENTINEL_AUTH` to the sentinels (each a
/// password, or `user:password`); `REDIS_TLS` speaks TLS to both.
fn sentinel(
    env: &Env<'_>,
    url: &str,
    tls: bool,
    timeout: Option<Duration>,
    refused: &mut Vec<String>,
) -> RedisOverlay {
    let mut parts = url.split(',').map(str::trim);
    let master = parts.next().unwrap_or("").to_string();
    let nodes: Vec<String> = parts.map(str::to_string).collect();
    if master.is_empty() || master.contains(':') || nodes.is_empty() {
        refused.push(format!(
            "REDIS_URL: {url:?}: with REDIS_TYPE=sentinel, the master's name, then the sentinels (name,host:port,...)"
        ));
    }
    for node in &nodes {
        if let Err(e) = split_host(node) {
            refused.push(format!("REDIS_URL: {e}"));
        }
    }
    let login = |name: &str| match env.get(name) {
        None => (None, None),
        Some(a) => match a.split_once(':') {
            Some((user, pass)) => (Some(user.to_string()), Some(pass.to_string())),
            None => (None, Some(a.to_string())),
        },
    };
    let (username, password) = login("REDIS_AUTH");
    let (sentinel_username, sentinel_password) = login("REDIS_SENTINEL_AUTH");
    RedisOverlay {
        named_by: "REDIS_URL".into(),
        urls: Vec::new(),
        cluster: false,
        timeout,
        sentinel: Some(spillway_redis::SentinelConfig {
            master,
            nodes,
            username,
            password,
            sentinel_username,
            sentinel_password,
            tls,
            certs: None,
            db: 0,
        }),
        ca: None,
        client: None,
    }
}

/// Percent-encodes a URL's user or password.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `CONFIG_TYPE` and `CONFIG_GRPC_XDS_*`: the xDS client, or nothing for
/// `FILE`.
pub(crate) fn xds(env: &Env<'_>, refused: &mut Vec<String>) -> Option<XdsSettings> {
    let xds = match env
        .get("CONFIG_TYPE")
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        None | Some("FILE") => false,
        Some("GRPC_XDS_SOTW") => true,
        Some(other) => {
            refused.push(format!(
                "CONFIG_TYPE: {other:?}: expected FILE or GRPC_XDS_SOTW"
            ));
            false
        }
    };
    let force = env.on("FORCE_START_WITHOUT_INITIAL_CONFIG", refused);
    if !xds {
        for (name, value) in env.vars {
            if (name.starts_with("CONFIG_GRPC_XDS_") || name.starts_with("XDS_CLIENT_"))
                && !value.is_empty()
            {
                refused.push(format!(
                    "{name}: read only with CONFIG_TYPE=GRPC_XDS_SOTW (the rules now come from RUNTIME_ROOT's files)"
                ));
            }
        }
        return None;
    }
    let mut s = XdsSettings::new(
        env.get("CONFIG_GRPC_XDS_SERVER_URL")
            .unwrap_or("localhost:18000")
            .to_string(),
        env.get("CONFIG_GRPC_XDS_NODE_ID")
            .unwrap_or("default")
            .to_string(),
    );
    if let Err(e) = split_host(&s.server) {
        refused.push(format!("CONFIG_GRPC_XDS_SERVER_URL: {e}"));
    }
    s.wait_initial = !force;
    if let Some(m) = env.get("CONFIG_GRPC_XDS_NODE_METADATA") {
        for pair in m.split(',').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((k, v)) if !k.is_empty() => s.node_metadata.push((k.into(), v.into())),
                _ => refused.push(format!(
                    "CONFIG_GRPC_XDS_NODE_METADATA: {pair:?} is not KEY=VALUE"
                )),
            }
        }
    }
    if let Some(h) = env.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
        // envconfig's map: KEY:VALUE pairs, comma separated.
        for pair in h.split(',') {
            let ok = pair.split_once(':').filter(|(k, v)| {
                !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                    && v.bytes().all(|b| (0x20..0x7f).contains(&b))
            });
            match ok {
                Some((k, v)) => s.headers.push((k.to_ascii_lowercase(), v.trim().into())),
                None => refused.push(format!(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {pair:?} is not NAME:VALUE (a header name, a printable value)"
                )),
            }
        }
    }
    if let Some(d) = env.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", refused) {
        s.connect_retry = d;
    }
    if let Some(d) = env.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", refused) {
        s.backoff_initial = d;
    }
    if let Some(d) = env.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", refused) {
        s.backoff_max = d;
    }
    if s.backoff_max < s.backoff_initial {
        refused.push(
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL: less than XDS_CLIENT_BACKOFF_INITIAL_INTERVAL".into(),
        );
    }
    if let Some(j) = env.bool("XDS_CLIENT_BACKOFF_JITTER", refused) {
        s.jitter = j;
    }
    if env.get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR").is_some() {
        refused.push("XDS_CLIENT_BACKOFF_RANDOM_FACTOR: spillway's backoff doubles each time, with jitter between half and one and a half of the wait (XDS_CLIENT_BACKOFF_JITTER); it takes no factor".into());
    }
    if let Some(n) = env.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 1, refused) {
        s.max_message_bytes = usize::try_from(n).unwrap_or(usize::MAX);
    }
    let tls_vars = [
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    ];
    if env.on("CONFIG_GRPC_XDS_SERVER_USE_TLS", refused) {
        let client = match (
            env.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            env.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
        ) {
            (Some(c), Some(k)) => Some((c.into(), k.into())),
            (None, None) => None,
            _ => {
                refused.push("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY: give both or neither".into());
                None
            }
        };
        s.tls = Some(ClientTls {
            ca: env.get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT").map(Into::into),
            client,
            san: env.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN").map(Into::into),
        });
    } else {
        for name in tls_vars {
            if env.get(name).is_some() {
                refused.push(format!(
                    "{name}: set, but CONFIG_GRPC_XDS_SERVER_USE_TLS is not true (the connection would be plain)"
                ));
            }
        }
    }
    Some(s)
}

/// The overlay: Redis, xDS and health.
pub(crate) fn overlay(env: &Env<'_>, refused: &mut Vec<String>) -> Overlay {
    Overlay {
        redis: redis(env, refused),
        xds: xds(env, refused),
        healthy_needs_domains: env.on("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", refused),
        grpc_tls: grpc_tls(env, refused),
    }
}

/// `GRPC_SERVER_USE_TLS` and its files: the gRPC listener's TLS, with
/// client certificates required when a CA is given. ratelimit reads the
/// CA from `GRPC_CLIENT_TLS_CACERT`; Envoy Gateway sets
/// `GRPC_SERVER_TLS_CA_CERT` (its Envoy presents a certificate from that
/// CA), which ratelimit passes over: both are read here, so a CA given is
/// never a check skipped. `GRPC_CLIENT_TLS_SAN` names the one SAN a
/// client certificate must carry.
fn grpc_tls(env: &Env<'_>, refused: &mut Vec<String>) -> Option<spillway_server::config::TlsFiles> {
    const FILES: [&str; 5] = [
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_CLIENT_TLS_CACERT",
        "GRPC_SERVER_TLS_CA_CERT",
        "GRPC_CLIENT_TLS_SAN",
    ];
    if !env.on("GRPC_SERVER_USE_TLS", refused) {
        for name in FILES {
            if env.get(name).is_some() {
                refused.push(format!("{name}: only read with GRPC_SERVER_USE_TLS=true"));
            }
        }
        return None;
    }
    let file = |name: &str, refused: &mut Vec<String>| match env.get(name) {
        Some(p) => Some(std::path::PathBuf::from(p)),
        None => {
            refused.push(format!("{name}: GRPC_SERVER_USE_TLS=true needs it"));
            None
        }
    };
    let cert = file("GRPC_SERVER_TLS_CERT", refused);
    let key = file("GRPC_SERVER_TLS_KEY", refused);
    let client_ca = match (
        env.get("GRPC_CLIENT_TLS_CACERT"),
        env.get("GRPC_SERVER_TLS_CA_CERT"),
    ) {
        (Some(a), Some(b)) if a != b => {
            refused.push(format!(
                "GRPC_CLIENT_TLS_CACERT and GRPC_SERVER_TLS_CA_CERT name two CAs ({a}, {b}); give one"
            ));
            None
        }
        (Some(a), _) | (None, Some(a)) => Some(std::path::PathBuf::from(a)),
        (None, None) => None,
    };
    let client_san: Vec<String> = env
        .get("GRPC_CLIENT_TLS_SAN")
        .map(str::to_string)
        .into_iter()
        .collect();
    if !client_san.is_empty() && client_ca.is_none() {
        refused.push(
            "GRPC_CLIENT_TLS_SAN: needs the CA client certificates chain to (GRPC_CLIENT_TLS_CACERT)"
                .into(),
        );
    }
    Some(spillway_server::config::TlsFiles {
        cert: cert?,
        key: key?,
        named_by: "GRPC_SERVER_TLS_CERT/GRPC_SERVER_TLS_KEY".into(),
        client_ca,
        client_san,
    })
}

/// `LOG_LEVEL` (logrus's levels) as a log filter.
pub(crate) fn log_level(env: &Env<'_>, refused: &mut Vec<String>) -> Option<&'static str> {
    let v = env.get("LOG_LEVEL")?;
    Some(match v.to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        _ => {
            refused.push(format!(
                "LOG_LEVEL: {v:?}: expected trace, debug, info, warn, error, fatal or panic"
            ));
            return None;
        }
    })
}
