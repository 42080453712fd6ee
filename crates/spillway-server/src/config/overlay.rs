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
            match (r.cluster, r.urls.as_slice()) {
                (_, []) => return Err(format!("{}: no server", r.named_by)),
                (false, [one]) => cfg.url = one.clone(),
                (false, _) => {
                    return Err(format!(
                        "{}: several servers need REDIS_TYPE=cluster",
                        r.named_by
                    ));
                }
                (true, nodes) => cfg.cluster = nodes.to_vec(),
            }
            if let Some(t) = r.timeout {
                if t.is_zero() {
                    return Err("REDIS_TIMEOUT: must be more than 0".into());
                }
                cfg.timeout = t;
            }
            config.store = StoreConfig::Redis(cfg);
        }
        if let Some(x) = self.xds {
            crate::xds::check(&x).map_err(|e| format!("CONFIG_GRPC_XDS_*: {e}"))?;
            config.xds = Some(x);
        }
        config.healthy_needs_domains |= self.healthy_needs_domains;
        Ok(())
    }
}
