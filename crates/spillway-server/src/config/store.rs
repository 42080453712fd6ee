//! `store:`: the memory store's bound, Redis and Redis Cluster, and
//! local-first sync.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Most slots of the Redis over-limit cache (32 bytes each).
pub(super) const MAX_OVER_LIMIT_CACHE: usize = 1 << 24;

/// Most Redis buckets: more would only cost memory (one key each).
pub(super) const MAX_BUCKETS: u32 = 1 << 24;

pub(super) fn redis_config(errs: &mut Collector<'_>, r: &Spanned<RawRedis>) -> StoreConfig {
    let raw = &r.value;
    let mut cfg = spillway_redis::RedisConfig::default();
    match (&raw.url, &raw.cluster, &raw.sentinel) {
        (Some(_), Some(c), _) => errs.at(c, "redis: give url or cluster, not both"),
        (Some(_), None, Some(s)) => errs.at(s, "redis: give url or sentinel, not both"),
        (None, Some(_), Some(s)) => errs.at(s, "redis: give cluster or sentinel, not both"),
        (None, None, None) => errs.at(
            r,
            "redis: needs url (or cluster: a list of node urls, or sentinel: { master, nodes })",
        ),
        _ => {}
    }
    if let Some(t) = &raw.tls {
        cfg.tls = redis_tls(errs, t, raw);
    }
    if let Some(s) = &raw.sentinel {
        let mut sentinel = sentinel_config(errs, s);
        sentinel.certs.clone_from(&cfg.tls);
        cfg.sentinel = Some(sentinel);
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

/// `redis.tls`: the files read now. Only where every connection speaks
/// TLS (`rediss://` URLs, a sentinel set with `tls: true`): files named
/// for a plain connection could not be used there.
fn redis_tls(
    errs: &mut Collector<'_>,
    t: &Spanned<raw::RawRedisTls>,
    redis: &RawRedis,
) -> Option<spillway_redis::RedisTls> {
    let path = |v: &Option<Spanned<String>>| v.as_ref().map(|v| std::path::PathBuf::from(&v.value));
    let (ca, cert, key) = (path(&t.value.ca), path(&t.value.cert), path(&t.value.key));
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            errs.at(t, "redis.tls: cert needs its key, and key its certificate");
            return None;
        }
    };
    if ca.is_none() && client.is_none() {
        errs.at(t, "redis.tls: name ca, or cert and key (or both)");
        return None;
    }
    let plain = redis.url.iter().map(|u| u.value.as_str()).chain(
        redis
            .cluster
            .iter()
            .flat_map(|c| c.value.iter().map(String::as_str)),
    );
    let plain = plain
        .chain(
            redis
                .sync
                .iter()
                .flat_map(|s| s.value.regions.iter().flat_map(|r| r.value.values()))
                .map(String::as_str),
        )
        .find(|u| !u.starts_with("rediss://"))
        .map(spillway_redis::redact);
    let sentinel_plain = redis
        .sentinel
        .as_ref()
        .is_some_and(|s| s.value.tls != Some(true));
    if let Some(u) = plain {
        errs.at(
            t,
            format!("redis.tls: {u:?} is not rediss://: the files would not be used on it"),
        );
        return None;
    }
    if sentinel_plain {
        errs.at(
            t,
            "redis.tls: the sentinels are reached without TLS: set redis.sentinel.tls: true",
        );
        return None;
    }
    let paths = client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    match crate::tls::read_pem_files("Redis", ca.as_deref(), paths) {
        Ok(pem) => Some(spillway_redis::RedisTls {
            ca: pem.ca,
            client: pem.client,
        }),
        Err(why) => {
            errs.at(t, format!("redis.tls: {why}"));
            None
        }
    }
}

/// `redis.sentinel`: the master's name, the sentinels, and how to log in
/// to both.
fn sentinel_config(
    errs: &mut Collector<'_>,
    s: &Spanned<raw::RawSentinel>,
) -> spillway_redis::SentinelConfig {
    let raw = &s.value;
    let text = |v: &Option<Spanned<String>>| v.as_ref().map(|v| v.value.clone());
    let master = match &raw.master {
        None => {
            errs.at(
                s,
                "redis.sentinel: needs master: the name the sentinels monitor",
            );
            String::new()
        }
        Some(m) => {
            if m.value.is_empty() || m.value.len() > 256 || m.value.contains(char::is_whitespace) {
                errs.at(m, "redis.sentinel.master: 1 to 256 characters, no spaces");
            }
            m.value.clone()
        }
    };
    let nodes = match &raw.nodes {
        None => {
            errs.at(s, "redis.sentinel: needs nodes: a list of host:port");
            Vec::new()
        }
        Some(n) => {
            if n.value.is_empty() {
                errs.at(n, "redis.sentinel.nodes: list at least one sentinel");
            }
            for node in &n.value {
                if let Err(e) = spillway_redis::parse_sentinel_node(node) {
                    errs.at(n, format!("redis.sentinel.nodes: {e}"));
                }
            }
            n.value.clone()
        }
    };
    let mut db = 0;
    if let Some(d) = &raw.db {
        if (0..=i64::from(u16::MAX)).contains(&d.value) {
            db = d.value;
        } else {
            errs.at(d, "redis.sentinel.db: a database number, 0 or more");
        }
    }
    for (user, password, what) in [
        (&raw.username, &raw.password, "username"),
        (
            &raw.sentinel_username,
            &raw.sentinel_password,
            "sentinel_username",
        ),
    ] {
        if let (Some(u), None) = (user, password) {
            errs.at(u, format!("redis.sentinel.{what} needs its password"));
        }
    }
    spillway_redis::SentinelConfig {
        master,
        nodes,
        username: text(&raw.username),
        password: text(&raw.password),
        sentinel_username: text(&raw.sentinel_username),
        sentinel_password: text(&raw.sentinel_password),
        tls: raw.tls.unwrap_or(false),
        certs: None,
        db,
    }
}

/// Longest sync interval: past it, instances would not see each other's
/// traffic for longer than most windows last.
pub(super) const MAX_SYNC_INTERVAL: Nanos = Nanos(60_000_000_000);

pub(super) fn sync_config(
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
                    sentinel: None,
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
