//! The store the server runs on: the closed set of stores, one `match` per
//! call (no trait objects on the hot path).

use spillway_redis::RedisStore;
use spillway_store::{MemoryStore, Store, SystemClock};
use spillway_sync::{Fallback, SyncStore};

use crate::metrics;

/// The store the server runs on: the closed set of stores, dispatched by match.
#[derive(Debug)]
pub enum ServerStore {
    /// The embedded in-memory store.
    Memory(MemoryStore<SystemClock>),
    /// Redis or Redis Cluster, one call per decision.
    Redis(RedisStore),
    /// Redis, one call per decision, with a per-instance share of every
    /// limit while it is unreachable (`on_store_error: share`).
    Shared(Fallback),
    /// Local-first decisions shared through Redis (`store.redis.sync`).
    Sync(SyncStore),
}

impl Store for ServerStore {
    async fn decide(
        &self,
        charges: &[spillway_store::Charge<'_>],
        cost: u64,
    ) -> Result<spillway_core::Decision, spillway_store::StoreError> {
        match self {
            ServerStore::Memory(s) => s.decide(charges, cost).await,
            ServerStore::Redis(s) => s.decide(charges, cost).await,
            ServerStore::Shared(s) => s.decide(charges, cost).await,
            ServerStore::Sync(s) => s.decide(charges, cost).await,
        }
    }

    async fn charge(
        &self,
        charges: &[spillway_store::Charge<'_>],
        cost: u64,
    ) -> Result<spillway_core::Decision, spillway_store::StoreError> {
        match self {
            ServerStore::Memory(s) => s.charge(charges, cost).await,
            ServerStore::Redis(s) => s.charge(charges, cost).await,
            ServerStore::Shared(s) => s.charge(charges, cost).await,
            ServerStore::Sync(s) => s.charge(charges, cost).await,
        }
    }

    fn decide_share(
        &self,
        charges: &[spillway_store::Charge<'_>],
        cost: u64,
        after: bool,
        error: &spillway_store::StoreError,
    ) -> Option<spillway_core::Decision> {
        match self {
            ServerStore::Shared(s) => s.decide_share(charges, cost, after, error),
            ServerStore::Sync(s) => s.decide_share(charges, cost, after, error),
            ServerStore::Memory(_) | ServerStore::Redis(_) => None,
        }
    }

    fn keys(&self) -> Option<usize> {
        match self {
            ServerStore::Memory(s) => s.keys(),
            ServerStore::Sync(s) => s.keys(),
            ServerStore::Redis(_) | ServerStore::Shared(_) => None,
        }
    }

    fn maintain(&self) {
        match self {
            ServerStore::Memory(s) => s.maintain(),
            ServerStore::Sync(s) => s.maintain(),
            ServerStore::Redis(_) | ServerStore::Shared(_) => {}
        }
    }

    async fn peek(
        &self,
        charges: &[spillway_store::Charge<'_>],
        cost: u64,
    ) -> Result<Vec<Vec<spillway_core::Verdict>>, spillway_store::StoreError> {
        match self {
            ServerStore::Memory(s) => s.peek(charges, cost).await,
            ServerStore::Redis(s) => s.peek(charges, cost).await,
            ServerStore::Shared(s) => s.peek(charges, cost).await,
            ServerStore::Sync(s) => s.peek(charges, cost).await,
        }
    }

    async fn reset(
        &self,
        charges: &[spillway_store::Charge<'_>],
    ) -> Result<(), spillway_store::StoreError> {
        match self {
            ServerStore::Memory(s) => s.reset(charges).await,
            ServerStore::Redis(s) => s.reset(charges).await,
            ServerStore::Shared(s) => s.reset(charges).await,
            ServerStore::Sync(s) => s.reset(charges).await,
        }
    }
}

impl ServerStore {
    /// The store's kind: `memory`, `redis`, `redis+share` or `redis+sync`.
    pub fn kind(&self) -> &'static str {
        match self {
            ServerStore::Memory(_) => "memory",
            ServerStore::Redis(_) => "redis",
            ServerStore::Shared(_) => "redis+share",
            ServerStore::Sync(_) => "redis+sync",
        }
    }

    /// The Redis store decisions go to (the home region's), if any.
    pub fn redis(&self) -> Option<&RedisStore> {
        match self {
            ServerStore::Memory(_) => None,
            ServerStore::Redis(r) => Some(r),
            ServerStore::Shared(f) => Some(f.redis()),
            ServerStore::Sync(s) => Some(s.home()),
        }
    }

    /// The sync's state, for the status page and metrics: `None` for
    /// stores that do not share counts in the background.
    pub fn sync_status(&self) -> Option<spillway_sync::SyncStatus> {
        match self {
            ServerStore::Shared(f) => Some(f.status()),
            ServerStore::Sync(s) => Some(s.status()),
            ServerStore::Memory(_) | ServerStore::Redis(_) => None,
        }
    }

    /// `None` when healthy, else why not (for readiness).
    pub fn degraded(&self) -> Option<String> {
        if let Some(st) = self.sync_status()
            && st.sharing
        {
            return Some(format!(
                "store unreachable: sharing, each of {} instances enforces 1/{} of every limit",
                st.live, st.live
            ));
        }
        if let ServerStore::Sync(s) = self {
            // Decisions are local: Redis's breaker says nothing of them.
            if !s.answered() {
                return Some(format!(
                    "{}: not answered yet, counts not shared",
                    s.home().describe()
                ));
            }
            return s
                .is_down()
                .then(|| format!("{}: unreachable, sync stopped", s.home().describe()));
        }
        match self.redis()? {
            r if !r.is_connected() => Some("redis: not connected".into()),
            r if !r.is_healthy() => Some(match r.last_error() {
                Some(why) => format!("redis: circuit breaker {:?}: {why}", r.breaker()),
                None => format!("redis: circuit breaker {:?}", r.breaker()),
            }),
            _ => None,
        }
    }

    /// The store's own counters, as Prometheus text: decisions made
    /// against the memory store's shared overflow state (a full table whose
    /// every candidate for eviction was limiting), Redis outages (times
    /// its circuit breaker opened) and decisions the over-limit cache
    /// answered; and whether Redis answers now (see
    /// [`metrics::redis_gauges`]).
    pub fn metrics(&self) -> String {
        let (name, help, value) = match (self, self.redis()) {
            (ServerStore::Memory(m), _) => (
                "spillway_memory_overflow_decisions_total",
                "Decisions made against a rule's shared overflow state because the key table was full of limiting clients.",
                m.overflowed(),
            ),
            (_, r) => (
                "spillway_redis_outages_total",
                "Times the Redis circuit breaker opened.",
                r.map_or(0, RedisStore::outages),
            ),
        };
        let mut out = format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n");
        if let Some(st) = self.sync_status() {
            out.push_str(&metrics::sync_metrics(&st));
        }
        if let Some(r) = self.redis() {
            out.push_str(&metrics::redis_gauges(r.is_connected(), r.breaker()));
            let name = "spillway_redis_over_limit_cache_hits_total";
            out.push_str(&format!(
                "# HELP {name} Decisions refused from the over-limit cache, without a Redis round trip.\n# TYPE {name} counter\n{name} {}\n",
                r.over_limit_cache_hits()
            ));
        }
        out
    }

    /// A name for logs.
    pub fn describe(&self) -> String {
        match self {
            ServerStore::Memory(_) => "memory".to_string(),
            ServerStore::Redis(r) => r.describe(),
            ServerStore::Shared(f) => format!("{} (on_store_error: share)", f.redis().describe()),
            ServerStore::Sync(s) => {
                let st = s.status();
                format!(
                    "{} (sync: {}, every {:?}{})",
                    s.home().describe(),
                    st.mode,
                    s.interval(),
                    match st.links.len() {
                        1 => String::new(),
                        n => format!(", {} other regions", n - 1),
                    }
                )
            }
        }
    }
}

/// Before serving behind Redis Sentinel: when the sentinels answer and
/// none knows the master's name, the start stops (a typo would otherwise
/// leave every decision to `on_store_error` for good). Sentinels that do
/// not answer stop nothing: the store serves by policy and keeps looking,
/// as it does for a Redis that is not there yet.
///
/// # Errors
/// No sentinel knows the master's name.
pub(crate) async fn preflight(store: &crate::config::StoreConfig) -> std::io::Result<()> {
    let redis = match store {
        crate::config::StoreConfig::Redis(r) => r,
        crate::config::StoreConfig::Sync(s) => &s.redis,
        crate::config::StoreConfig::Memory { .. } => return Ok(()),
    };
    let Some(s) = &redis.sentinel else {
        return Ok(());
    };
    match s.discover().await {
        Err(spillway_redis::Discovery::Unknown(why)) => Err(std::io::Error::other(format!(
            "store.redis.sentinel.master: {why}"
        ))),
        Err(spillway_redis::Discovery::Unreachable(why)) => {
            tracing::warn!(
                "redis sentinel: {why}; serving by on_store_error until a master answers"
            );
            Ok(())
        }
        Ok((host, port)) => {
            tracing::info!("redis sentinel: {:?} is at {host}:{port}", s.master);
            Ok(())
        }
    }
}
