//! What a status page and metrics show of the sync, and how each link
//! to a store is doing.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// How a link to a store is doing, for the status page and metrics.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Unix milliseconds of the last exchange answered.
    pub(crate) last_ok_ms: AtomicU64,
    /// Round trip of the last exchange answered, nanoseconds.
    pub(crate) rtt_ns: AtomicU64,
    /// Failed exchanges in a row.
    pub(crate) failures: AtomicU32,
    /// Keys the last exchange carried.
    pub(crate) keys: AtomicU64,
}

impl Health {
    pub(crate) fn ok(&self, rtt: u64, keys: usize) {
        self.last_ok_ms.store(unix_ms(), Ordering::Relaxed);
        self.rtt_ns.store(rtt, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        self.keys.store(keys as u64, Ordering::Relaxed);
    }

    /// The store answered a heartbeat: alive, though no keys moved.
    pub(crate) fn alive(&self, rtt: u64) {
        self.last_ok_ms.store(unix_ms(), Ordering::Relaxed);
        self.rtt_ns.store(rtt, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
    }

    /// What a status page shows of the link to `region`, with `waiting`
    /// units not yet counted there.
    pub(crate) fn status(&self, region: &str, home: bool, waiting: u64) -> LinkStatus {
        let last = self.last_ok_ms.load(Ordering::Relaxed);
        LinkStatus {
            region: region.to_string(),
            home,
            last_ok_unix_ms: last,
            lag_ms: if last == 0 {
                0
            } else {
                unix_ms().saturating_sub(last)
            },
            rtt_us: self.rtt_ns.load(Ordering::Relaxed) / 1000,
            failures: self.failures.load(Ordering::Relaxed),
            deltas_waiting: waiting,
            keys_synced: self.keys.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn failed(&self) -> u32 {
        self.failures.fetch_add(1, Ordering::Relaxed) + 1
    }
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A random instance id: a restarted process is a new instance, so its
/// push numbers never collide with those of its previous life.
pub(crate) fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// What a status page shows of one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    /// The region's name (`home` for an unnamed own region).
    pub region: String,
    /// Whether this is the instance's own region's store.
    pub home: bool,
    /// Unix milliseconds of the last exchange answered (0: never).
    pub last_ok_unix_ms: u64,
    /// How long ago that was, in milliseconds: how far behind this
    /// instance's view of the store may be, less one interval.
    pub lag_ms: u64,
    /// Round trip of the last exchange answered, in microseconds.
    pub rtt_us: u64,
    /// Failed exchanges in a row.
    pub failures: u32,
    /// Units admitted here and not yet counted by that store.
    pub deltas_waiting: u64,
    /// Keys the last exchange carried.
    pub keys_synced: u64,
}

/// What a status page shows of the sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncStatus {
    /// `eventual`, `lease`, or `per-decision`.
    pub mode: &'static str,
    /// This instance's id in the stores.
    pub instance: String,
    /// Its region, if named.
    pub region: Option<String>,
    /// Live instances last seen (heartbeats).
    pub live: u64,
    /// Whether this instance decides on its share now (store unreachable).
    pub sharing: bool,
    /// Decisions made on the share since the store was last lost.
    pub share_decisions: u64,
    /// Keys tracked.
    pub keys: usize,
    /// New keys not tracked because the map was full (decided on the share).
    pub untracked: u64,
    /// The last correction of the local clock to the store's, in microseconds.
    pub clock_step_us: i64,
    /// One per store.
    pub links: Vec<LinkStatus>,
}
