//! Settings an environment gives (the `ratelimit` entry reads
//! envoyproxy/ratelimit's variables into an [`Overlay`]), laid over the
//! rules file's validated settings as flags are: each value is checked
//! here as the file's would be, and an error names the variable.

#[allow(clippy::wildcard_imports)]
use super::*;

/// What an environment says beside the rules file.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    /// The Redis store (`REDIS_*`).
    pub redis: Option<RedisOverlay>,
    /// Domains over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`, `CONFIG_GRPC_XDS_*`).
    pub xds: Option<crate::xds::Settings>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    pub healthy_needs_domains: bool,
    /// The gRPC listener's TLS (`GRPC_SERVER_USE_TLS` and its files), as
    /// the rules file's `grpc_tls:`.
    pub grpc_tls: Option<TlsFiles>,
}

/// A Redis store from an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOverlay {
    /// The variable that named the servers, for errors (`REDIS_URL`).
    pub named_by: String,
    /// `redis://` or `rediss://` URLs: one server, or a cluster's seed
    /// nodes.
    pub urls: Vec<String>,
    /// Whether `urls` are a Redis Cluster's nodes.
    pub cluster: bool,
    /// The longest wait for one decision (`REDIS_TIMEOUT`).
    pub timeout: Option<Duration>,
    /// Behind Redis Sentinel (`REDIS_TYPE=sentinel`): the master's name
    /// and the sentinels, instead of `urls`.
    pub sentinel: Option<spillway_redis::SentinelConfig>,
    /// The CA file the servers' certificates are verified against
    /// (`REDIS_TLS_CACERT`), with TLS on.
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate and its key (`REDIS_TLS_CLIENT_CERT`,
    /// `REDIS_TLS_CLIENT_KEY`), with TLS on.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Overlay {
    /// Lays the overlay over `config`.
    ///
    /// # Errors
    /// A value the store cannot use, or a setting the rules file makes
    /// too (one place says the store).
    pub fn apply(self, config: &mut Config) -> Result<(), String> {
        if let Some(r) = self.redis {
            if !matches!(config.store, StoreConfig::Memory { .. }) {
                return Err(format!(
                    "{}: the rules file's `store:` names a store too; say it in one place",
                    r.named_by
                ));
            }
            let mut cfg = spillway_redis::RedisConfig::default();
            for u in &r.urls {
                if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                    return Err(format!(
                        "{}: {:?} is not a redis:// or rediss:// url",
                        r.named_by,
                        spillway_redis::redact(u)
                    ));
                }
            }
            match (r.cluster, r.urls.as_slice(), r.sentinel) {
                (_, _, Some(s)) => {
                    if s.master.is_empty() || s.nodes.is_empty() {
                        return Err(format!(
                            "{}: REDIS_TYPE=sentinel reads it as the master's name, then the sentinels (name,host:port,...)",
                            r.named_by
                        ));
                    }
                    for node in &s.nodes {
                        spillway_redis::parse_sentinel_node(node)
                            .map_err(|e| format!("{}: {e}", r.named_by))?;
                    }
                    cfg.sentinel = Some(s);
                }
                (_, [], None) => return Err(format!("{}: no server", r.named_by)),
                (false, [one], None) => cfg.url = one.clone(),
                (false, _, None) => {
                    return Err(format!(
                        "{}: several servers need REDIS_TYPE=cluster",
                        r.named_by
                    ));
                }
                (true, nodes, None) => cfg.cluster = nodes.to_vec(),
            }
            if let Some(t) = r.timeout {
                if t.is_zero() {
                    return Err("REDIS_TIMEOUT: must be more than 0".into());
                }
                cfg.timeout = t;
            }
            if r.ca.is_some() || r.client.is_some() {
                let secure = match &cfg.sentinel {
                    Some(s) => s.tls,
                    None => r.urls.iter().all(|u| u.starts_with("rediss://")),
                };
                if !secure {
                    return Err(
                        "REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT: TLS is off (REDIS_TLS): the files would not be used"
                            .into(),
                    );
                }
                let client = r.client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
                let pem = crate::tls::read_pem_files("Redis", r.ca.as_deref(), client)
                    .map_err(|e| format!("REDIS_TLS_*: {e}"))?;
                let tls = spillway_redis::RedisTls {
                    ca: pem.ca,
                    client: pem.client,
                };
                if let Some(s) = &mut cfg.sentinel {
                    s.certs = Some(tls.clone());
                }
                cfg.tls = Some(tls);
            }
            config.store = StoreConfig::Redis(cfg);
        }
        if let Some(x) = self.xds {
            crate::xds::check(&x).map_err(|e| format!("CONFIG_GRPC_XDS_*: {e}"))?;
            config.xds = Some(x);
        }
        if let Some(t) = self.grpc_tls {
            if config.tls.grpc.is_some() {
                return Err(format!(
                    "{}: the rules file's `grpc_tls:` says it too; say it in one place",
                    t.named_by
                ));
            }
            config.tls.grpc = Some(t);
        }
        config.healthy_needs_domains |= self.healthy_needs_domains;
        Ok(())
    }
}
