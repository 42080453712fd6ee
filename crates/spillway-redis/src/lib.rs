//! # spillway-redis
//!
//! The Redis store: many spillway instances share their counters through a
//! Redis server or a Redis Cluster. One decision is one round trip: a Lua
//! script (`lua/decide.lua`, loaded once and called by its SHA, reloaded
//! transparently after `NOSCRIPT`) checks every limit of every rule and
//! charges them all or none.
//!
//! - **Clock**: the script reads Redis's `TIME`, so instances with skewed
//!   clocks agree. Times are in microseconds there (Lua numbers are doubles).
//! - **Keys**: a client's values and the rule are hashed to a 64-bit tag,
//!   so what a client sends never sizes a key. Counter states are fields
//!   (the tag's 8 bytes and the limit's index) of hashes shared by many
//!   clients, `<prefix>{<bucket>}`, [`RedisConfig::buckets`] of them: a
//!   state costs tens of bytes instead of a key's 130. Sliding logs are
//!   lists, `<prefix>{<bucket>}<tag>.<limit>`. The braces keep one rule's
//!   limits in one cluster slot. Every key gets a TTL in the same script,
//!   never shorter than its longest-lived state's (each state remembers
//!   until when its bucket is known to live, so most writes need no
//!   `PEXPIRE`), and writes sweep expired fields: idle state vanishes.
//! - **Batching**: on a single server, decisions that arrive while two
//!   script calls are under way go out together in the next call (up to
//!   64, each atomic and all-or-none on its own, sharing one `TIME`);
//!   rules shared by those decisions are sent once. A decision alone goes
//!   out at once, so "one round trip per decision" still holds for its
//!   latency while Redis does less work per decision under load.
//! - **Failures**: every decision has a deadline (a single server's are
//!   kept by the batcher, a cluster's by a timer each); errors are
//!   [`StoreError`]s for the limiter's fail-open/closed policy, transient
//!   when they may pass by themselves (timeouts, lost connections, `OOM`,
//!   `READONLY`, `LOADING`) and not when someone must act (script errors,
//!   `WRONGTYPE`, `NOPERM`). Every kind counts against a circuit breaker,
//!   which opens after [`RedisConfig::breaker_failures`] failures in a row
//!   (answers at once, without waiting for a hung server or asking a
//!   failing one) and lets one probe through every
//!   [`RedisConfig::probe_interval`]. Each opening and closing is logged
//!   once, with the kind of failure; [`RedisStore::last_error`] says why
//!   for a readiness check and [`RedisStore::outages`] counts them.
//!   Connecting happens in the background, with backoff: the store serves
//!   (by policy) before Redis exists.
//! - **Cluster**: decisions whose rules live in one slot are one atomic call.
//!   Rules in different slots cannot share a script call; they are decided by
//!   a dry run on every slot and then charged slot by slot, which is
//!   all-or-none unless a concurrent request changes a counter in between.
//! - **Checks**: a request of cost 0 is a check (is any key over its
//!   limit?) and a dry run: it writes nothing and changes no TTL, as in
//!   the memory store (on a cluster, the dry run alone).
//! - **Charges after the fact** ([`Store::charge`], and
//!   [`RedisStore::charge_at`] on a virtual clock): a cost known only once
//!   the request was served (an LLM answer's tokens, Envoy's
//!   `hits_addend` on stream done) is counted on every limit of every
//!   rule, shadow ones too, whatever the state, as
//!   [`spillway_core::charge`] does: past a limit the key is in debt,
//!   and checks are refused until the algorithm has paid it back at its
//!   own rate. The state is written with a TTL that covers the debt. The
//!   decision is a check of cost 0 after the charge. The script is sent
//!   the cost whole below 2^53 and caps what it keeps rather than fail:
//!   a time-based debt (token bucket, GCRA, shaper, leaky bucket) at
//!   2^51 µs, about 71 years, and a fixed window's count at 2^53 - 1;
//!   below those caps a charge is exact. On a cluster a charge over rules
//!   in several slots is one call per slot, each counted (nothing is
//!   refused, so nothing is undone), and the decision is replayed from
//!   all of them.
//! - **Over-limit cache** ([`RedisConfig::over_limit_cache`], default
//!   [`DEFAULT_OVER_LIMIT_CACHE`] slots, 0 off): keys Redis refused are
//!   refused locally, without a round trip, until the instant Redis gave
//!   (`retry_after` counted from when the call was sent, so never longer
//!   than Redis would refuse them: at most a round trip shorter). A
//!   refused request of cost 1 says every request of cost 1 or more is
//!   refused until then; a refused check, or a charge that leaves a key
//!   in debt, says checks are too. Charges after the fact always go to
//!   Redis, shadow rules are never cached, and only decisions on the
//!   server's clock use it ([`RedisStore::decide_at`] never does). A
//!   fixed table of 32-byte slots, two per hash (a new key takes the one
//!   whose refusal ends first). Denied requests are not
//!   charged, so the answer is the one Redis would give, all-or-none.
//!   [`RedisStore::over_limit_cache_hits`] counts its answers and
//!   [`RedisStore::script_calls`] the round trips made.
//! - **Local-first sync** ([`RedisStore::exchange`], single server only):
//!   an instance that decides in memory sends, every interval, one script
//!   call of thousands of items ([`SyncItem`]): charges after the fact,
//!   refunds of units a lease did not use, and leases of units to spend
//!   locally (the most every limit admits, up to what it wants,
//!   all-or-none). With a push (an instance's name and a sequence number)
//!   the call is idempotent: a push sent again changes nothing, and says
//!   so ([`SyncReply::applied`]). [`RedisStore::heartbeat`] keeps the set
//!   of live instances (on a cluster too).
//! - **An operator's look and reset** ([`Store::peek`], [`Store::reset`]):
//!   a look is the script's dry run for a request of the given cost
//!   (nothing written, no TTL changed, the over-limit cache bypassed); a
//!   reset deletes the key's field in each limit's bucket and a sliding
//!   log's list (`lua/reset.lua`, one call per key), and forgets what the
//!   over-limit cache knew of it.
//! - **Admin state** ([`RedisStore::admin_put`], [`RedisStore::admin_all`]
//!   and the rest): small maps (overrides, plans) shared by every instance
//!   on one Redis, under `<prefix>{admin}:`, one cluster slot, with a
//!   version bumped atomically by each change (`lua/admin.lua`).

#![warn(missing_docs, unreachable_pub)]

mod admin;
mod breaker;
mod fault;
mod keys;
mod look;
mod over;
use keys::Write;
pub use keys::tag;
pub use over::DEFAULT_ENTRIES as DEFAULT_OVER_LIMIT_CACHE;
mod msgpack;
mod reply;
mod rules;
mod sentinel;
mod tls;
pub use rules::{Precondition, RuleChange, RuleWrite};
pub use sentinel::{
    CHECK_INTERVAL as SENTINEL_CHECK_INTERVAL, Discovery, SentinelConfig,
    parse_node as parse_sentinel_node,
};
mod sync;
pub use sync::{Beat, SyncItem, SyncItemReply, SyncOp, SyncReply};
pub use tls::RedisTls;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, Script};
use spillway_core::Decision;
use spillway_store::{Charge, Store, StoreError};
use tokio::sync::{Semaphore, mpsc, oneshot};

use breaker::Breaker;
pub use breaker::BreakerState;
use fault::Fault;

/// Buckets unless configured: suits about 100,000 to 2,000,000 active keys.
pub const DEFAULT_BUCKETS: u32 = 16_384;

/// The decision script, with its KEYS/ARGV contract written at its top.
pub const DECIDE_LUA: &str = include_str!("../lua/decide.lua");

/// The script of [`RedisStore::heartbeat`], with its contract at its top.
pub const HEARTBEAT_LUA: &str = include_str!("../lua/heartbeat.lua");

/// The script of a reset ([`Store::reset`]), with its contract at its top.
pub const RESET_LUA: &str = include_str!("../lua/reset.lua");

/// The script of the admin maps ([`RedisStore::admin_put`] and the rest),
/// with its contract at its top.
pub const ADMIN_LUA: &str = include_str!("../lua/admin.lua");

/// The script of the API rules ([`RedisStore::rules_put`] and the rest),
/// with its contract at its top.
pub const RULES_LUA: &str = include_str!("../lua/rules.lua");

/// Settings of a [`RedisStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port/db` or `rediss://...` for TLS.
    /// Ignored when `cluster` is not empty.
    pub url: String,
    /// Seed nodes of a Redis Cluster, instead of `url`.
    pub cluster: Vec<String>,
    /// The sentinels that name the master, instead of `url` and
    /// `cluster` (see [`SentinelConfig`]).
    pub sentinel: Option<SentinelConfig>,
    /// A CA and a client certificate for TLS (`rediss://` URLs; a
    /// sentinel set's own, [`SentinelConfig::certs`], for sentinels).
    /// `None`: the web PKI roots, and no client certificate.
    pub tls: Option<RedisTls>,
    /// Longest wait for one decision.
    pub timeout: Duration,
    /// Prepended to every key.
    pub prefix: String,
    /// How many hashes ("buckets") share the counter states. A Redis key
    /// costs about 110 bytes before it holds anything, a field in a small
    /// hash about 20: with about 16 to 100 states per bucket, a state costs
    /// 25 to 35 bytes. Aim for the expected number of active keys / 32;
    /// past 128 states per bucket Redis stores the bucket as a hash table
    /// (about 80 bytes a state, still below one key each).
    pub buckets: u32,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// While open, how often one request may probe the server.
    pub probe_interval: Duration,
    /// Slots of the over-limit cache (0 turns it off; rounded up to a
    /// power of two): keys Redis said are over their limit are refused
    /// locally, without a round trip, until they may pass again (never
    /// longer than Redis would refuse them). One slot per rule, limit and
    /// key, 32 bytes each, out of two its hash allows: a new key takes the
    /// one whose refusal ends first. Default [`DEFAULT_OVER_LIMIT_CACHE`]
    /// (16,384: 512 KiB).
    pub over_limit_cache: usize,
}

impl Default for RedisConfig {
    fn default() -> RedisConfig {
        RedisConfig {
            url: "redis://127.0.0.1:6379/0".to_string(),
            cluster: Vec::new(),
            sentinel: None,
            tls: None,
            timeout: Duration::from_millis(50),
            prefix: "spillway:".to_string(),
            buckets: DEFAULT_BUCKETS,
            breaker_failures: 3,
            probe_interval: Duration::from_millis(250),
            over_limit_cache: DEFAULT_OVER_LIMIT_CACHE,
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

enum Target {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

struct Inner {
    config: RedisConfig,
    /// Set once, when the first connection is made (the connection manager
    /// and the cluster connection reconnect by themselves afterwards); read
    /// by every decision without a lock.
    conn: OnceLock<Conn>,
    script: Script,
    /// [`HEARTBEAT_LUA`].
    heartbeat: Script,
    breaker: Breaker,
    connected: tokio::sync::Notify,
    /// Why the first connection has not been made yet (the connect loop's
    /// last error), for [`RedisStore::last_error`].
    connect_error: Mutex<Option<String>>,
    /// Decisions for a single server, on their way to the batcher.
    queue: mpsc::Sender<Pending>,
    /// Keys known to be over their limit (see [`over`]).
    over: Option<over::OverLimit>,
    /// Script calls sent (see [`RedisStore::script_calls`]).
    calls: AtomicU64,
    /// Behind sentinels: the master's connection as it is now (`conn`
    /// keeps the first one, to say a connection was made).
    sentinel: Option<sentinel::Watch>,
}

impl Inner {
    /// The connection to call now: behind sentinels, the current
    /// master's.
    fn current(&self) -> Option<Conn> {
        match &self.sentinel {
            Some(w) => w.current().map(Conn::Single),
            None => self.conn.get().cloned(),
        }
    }
}

/// While this many script calls to a single server are under way, new
/// decisions wait and then go out together in one call: under load a call
/// carries many decisions (Redis then parses one command, starts the
/// script and reads the clock once for all of them); alone, a decision
/// goes out at once.
const MAX_IN_FLIGHT: usize = 2;
/// Most decisions in one call.
const MAX_BATCH: usize = 64;
/// Most decisions waiting for a call; more fail (as a store error, so by
/// policy) instead of queueing without bound.
const MAX_QUEUED: usize = 4096;

/// A decision waiting to be sent.
struct Pending {
    part: keys::Part,
    reply: oneshot::Sender<redis::RedisResult<Vec<i64>>>,
    /// When its caller stops waiting: the batcher answers it by then (a
    /// timer per decision cost 7-9 % of the server's user cycles per
    /// request on Redis).
    deadline: tokio::time::Instant,
}

/// The Redis / Redis Cluster store. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("at", &self.describe())
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Where it connects, for logs: the URL (password hidden), or the
    /// cluster's seed nodes. (A cluster has no `url`; naming the default
    /// one sent operators looking for a server they never configured.)
    pub fn describe(&self) -> String {
        let c = &self.inner.config;
        if let Some(s) = &c.sentinel {
            format!(
                "redis sentinel master {:?} [{}]",
                s.master,
                s.nodes.join(", ")
            )
        } else if c.cluster.is_empty() {
            format!("redis {}", redact(&c.url))
        } else {
            let nodes: Vec<String> = c.cluster.iter().map(|u| redact(u)).collect();
            format!("redis cluster [{}]", nodes.join(", "))
        }
    }
}

/// A URL with its password replaced, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

fn err(transient: bool, message: impl Into<String>) -> StoreError {
    StoreError::new(transient, message)
}

/// Why a decision that waited for a call slot past its deadline failed.
const LATE: &str = "waited for a call to redis past the timeout";

/// A decision that was never sent to Redis (it waited past its deadline,
/// found the queue full, or the batcher gone): whatever becomes of Redis,
/// it is not counted there. A client-side error kind, so that
/// [`RedisStore::failed`] can tell it from a call that went out.
fn unsent(why: &str) -> redis::RedisError {
    (
        redis::ErrorKind::Client,
        "not sent to redis",
        why.to_string(),
    )
        .into()
}

impl RedisStore {
    /// Validates `config` and starts connecting in the background (it must
    /// be called inside a Tokio runtime). Never fails because Redis is not
    /// there yet: decisions fail (by policy) until it is.
    ///
    /// # Errors
    /// A URL that does not parse.
    pub fn new(config: RedisConfig) -> Result<RedisStore, StoreError> {
        // TCP_NODELAY, as Redis sets on its side: redis-rs leaves Nagle's
        // algorithm on, which may hold a second script call written while
        // the first is unanswered until the first is acknowledged (over a
        // network with delayed acknowledgements, milliseconds). On
        // loopback it measured the same either way.
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let target = if config.sentinel.is_some() {
            None
        } else if config.cluster.is_empty() {
            let url_error = |e: redis::RedisError| {
                err(false, format!("redis url {}: {e}", redact(&config.url)))
            };
            let info = config
                .url
                .as_str()
                .into_connection_info()
                .map_err(url_error)?
                .set_tcp_settings(tcp);
            Some(Target::Single(
                tls::client(info, config.tls.as_ref()).map_err(url_error)?,
            ))
        } else {
            let builder = redis::cluster::ClusterClient::builder(config.cluster.clone());
            Some(Target::Cluster(
                tls::cluster(builder, config.tls.as_ref())
                    .tcp_settings(tcp)
                    .connection_timeout(Duration::from_secs(1))
                    .response_timeout(config.timeout.max(Duration::from_millis(10)))
                    .build()
                    .map_err(|e| err(false, format!("redis cluster: {e}")))?,
            ))
        };
        if let Some(s) = &config.sentinel {
            if s.nodes.is_empty() {
                return Err(err(false, "redis sentinel: list at least one sentinel"));
            }
            for n in &s.nodes {
                sentinel::parse_node(n).map_err(|e| err(false, format!("redis sentinel: {e}")))?;
            }
        }
        let config_sentinel = config.sentinel.clone();
        let (queue, queued) = mpsc::channel(MAX_QUEUED);
        let store = RedisStore {
            inner: Arc::new(Inner {
                breaker: Breaker::new(config.breaker_failures, config.probe_interval),
                over: over::OverLimit::new(config.over_limit_cache),
                config,
                conn: OnceLock::new(),
                script: Script::new(DECIDE_LUA),
                heartbeat: Script::new(HEARTBEAT_LUA),
                connected: tokio::sync::Notify::new(),
                connect_error: Mutex::new(None),
                queue,
                calls: AtomicU64::new(0),
                sentinel: config_sentinel.is_some().then(sentinel::Watch::new),
            }),
        };
        if let Some(target) = target {
            tokio::spawn(connect_loop(Arc::downgrade(&store.inner), target));
        } else if let Some(s) = config_sentinel {
            tokio::spawn(sentinel::watcher(Arc::downgrade(&store.inner), s));
        }
        tokio::spawn(batcher(Arc::downgrade(&store.inner), queued));
        Ok(store)
    }

    /// True once a connection has been made (it may have failed since; the
    /// breaker says whether it is healthy).
    pub fn is_connected(&self) -> bool {
        self.inner.conn.get().is_some()
    }

    /// The breaker's state: closed (healthy), open, or half-open.
    pub fn breaker(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// How many times the connection to Redis was found lost while it was
    /// believed up. A call that timed out before this count moved on, and
    /// that an answer on the connection follows while it has not, was run
    /// by Redis before that answer; one after which it moved may not have
    /// been run at all.
    pub fn link_losses(&self) -> u64 {
        self.inner.breaker.losses()
    }

    /// True when connected and the breaker is closed.
    pub fn is_healthy(&self) -> bool {
        self.is_connected() && self.breaker() == BreakerState::Closed
    }

    /// Why the store is not healthy, for a readiness check: the last
    /// failure while the breaker is open (`redis: OOM command not allowed
    /// when used memory > 'maxmemory'.`, `redis did not answer within
    /// 50ms`), or why it has not connected yet. `None` while healthy.
    pub fn last_error(&self) -> Option<String> {
        if self.is_healthy() {
            return None;
        }
        if !self.is_connected() {
            let connecting = self
                .inner
                .connect_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            return Some(connecting.unwrap_or_else(|| "not connected to redis yet".to_string()));
        }
        self.inner.breaker.last_error()
    }

    /// How many times Redis has failed the store since it was made: each
    /// time, the circuit breaker opened after
    /// [`RedisConfig::breaker_failures`] failed calls in a row and a
    /// warning was logged (with the kind of failure); it counts outages, not
    /// failed calls, and is what a metric of outages would read.
    pub fn outages(&self) -> u64 {
        self.inner.breaker.outages()
    }

    /// Decisions the over-limit cache answered without a round trip
    /// (see [`RedisConfig::over_limit_cache`]).
    pub fn over_limit_cache_hits(&self) -> u64 {
        self.inner.over.as_ref().map_or(0, over::OverLimit::hits)
    }

    /// The longest wait for one decision (`RedisConfig::timeout`).
    pub fn timeout(&self) -> Duration {
        self.inner.config.timeout
    }

    /// Script calls sent to Redis so far, each one round trip: on a single
    /// server one per batch (carrying up to 64 decisions), on a cluster one
    /// per slot group and round, plus the repeat after a `NOSCRIPT`. With
    /// [`over_limit_cache_hits`](Self::over_limit_cache_hits) and a count
    /// of decisions, what the over-limit cache saves.
    pub fn script_calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// Waits until connected or `timeout` passes; returns whether connected.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.connected.notified();
            if self.is_connected() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_connected();
            }
        }
    }

    /// Decides with `now_us` as the time (microseconds since the epoch)
    /// instead of Redis's clock; for tests that compare stores on a virtual
    /// clock.
    ///
    /// # Errors
    /// As [`Store::decide`].
    pub async fn decide_at(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, StoreError> {
        self.run(charges, cost, now_us, Write::IfAdmitted).await
    }

    /// Charges after the fact with `now_us` as the time, as
    /// [`decide_at`](Self::decide_at) decides.
    ///
    /// # Errors
    /// As [`Store::charge`].
    pub async fn charge_at(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
    ) -> Result<Decision, StoreError> {
        self.run(charges, cost, now_us, Write::Always).await
    }

    async fn run(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
        write: Write,
    ) -> Result<Decision, StoreError> {
        if charges.is_empty() {
            return Ok(Decision::unlimited());
        }
        let inner = &self.inner;
        // Only on the server's clock: a caller that gives the time (tests
        // on a virtual clock) is not answered from real instants. Charges
        // after the fact are never answered from it (they are never
        // refused), but what they say after them is learned.
        let over = inner.over.as_ref().filter(|_| now_us == 0);
        if write == Write::IfAdmitted
            && let Some(d) = over.and_then(|o| o.answer(charges, cost))
        {
            return Ok(d);
        }
        let sent = std::time::Instant::now();
        let conn = self.connection()?;
        // A single server's decisions are bounded by the batcher (see
        // `Pending::deadline`); a cluster's by a timer here. The cluster's
        // future is boxed: it is large (its connection, its calls' futures),
        // and inline it made every decision's future 1,200 bytes, copied
        // at each await up the stack.
        let result = match conn {
            Conn::Single(_) => self.call_single(charges, cost, now_us, write).await,
            Conn::Cluster(c) => {
                let _due = spillway_store::due::Awaiting::new();
                Box::pin(tokio::time::timeout(
                    inner.config.timeout,
                    self.call_cluster(c.clone(), charges, cost, now_us, write),
                ))
                .await
                .unwrap_or_else(|_| Err(timed_out()))
            }
        };
        match result {
            Ok(d) => {
                inner.breaker.success();
                if let Some(o) = over {
                    o.learn(charges, cost, write == Write::Always, &d, sent);
                }
                Ok(d)
            }
            Err(e) => Err(self.failed(&e)),
        }
    }

    /// The connection for a call, if the circuit breaker lets one through
    /// and a connection was made; else the error to answer (not being
    /// connected yet counts as a failure).
    fn connection(&self) -> Result<&Conn, StoreError> {
        let inner = &self.inner;
        if !inner.breaker.allow() {
            let fault = inner.breaker.fault();
            return Err(err(
                fault.transient(),
                format!("redis circuit breaker is open ({})", fault.name()),
            ));
        }
        let Some(conn) = inner.conn.get() else {
            let message = "not connected to redis yet";
            inner.breaker.failure(Fault::NotConnected, message);
            return Err(err(true, message));
        };
        Ok(conn)
    }

    /// Counts a failed call on the circuit breaker, and says why. Every
    /// failure counts, whatever its kind: a server that answers each call
    /// with OOM or READONLY is as unusable as one that does not answer,
    /// and must show as such.
    fn failed(&self, e: &redis::RedisError) -> StoreError {
        let inner = &self.inner;
        let sent = e.kind() != redis::ErrorKind::Client;
        let fault = if !sent && e.detail() == Some(LATE) {
            Fault::Timeout
        } else {
            Fault::of(e)
        };
        let message = if fault == Fault::Timeout {
            format!("redis did not answer within {:?}", inner.config.timeout)
        } else {
            format!("redis: {}", fault::said(e))
        };
        if sent && fault == Fault::Connection && inner.breaker.link_lost() {
            tracing::info!(
                "redis connection lost ({message}): calls that time out until one succeeds were not run by redis"
            );
        }
        inner.breaker.failure(fault, &message);
        // Behind sentinels, any failure may be a failover under way: the
        // watcher looks for the master at once (and keeps looking until
        // one answers as master).
        if let Some(w) = &inner.sentinel {
            w.suspect();
        }
        // Sent, and no answer in time: a stopped server may run it when
        // it resumes. Not while the connection is known lost (a killed
        // server): the call then waited for a reconnection, nothing will
        // run it, and a share that admits it must charge it later, or the
        // admission is lost (issue 35: two such units left a burst key
        // under-counted after reconciliation). Even when not known lost,
        // "may" is all it is: a share settles it later from whether the
        // connection and the data lasted (`link_losses`, `incarnation`).
        let maybe = sent && fault == Fault::Timeout && !inner.breaker.link_down();
        err(fault.transient(), message).maybe_applied_if(maybe)
    }

    /// A decision on a single server: queued for the batcher.
    async fn call_single(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
        write: Write,
    ) -> redis::RedisResult<Decision> {
        let answer = self.send_single(keys::part(charges, cost, now_us, write))?;
        let out = answer
            .await
            .map_err(|_| unsent("redis batcher stopped"))??;
        Ok(replay(charges, &out, cost, write))
    }

    /// Queues `part` for the batcher (a single server); the receiver of
    /// its numbers of the reply. Not async: the part is moved into the
    /// queue before anything waits, so no decision's future holds it (the
    /// future of every decision stays small).
    fn send_single(
        &self,
        part: keys::Part,
    ) -> redis::RedisResult<oneshot::Receiver<redis::RedisResult<Vec<i64>>>> {
        let (reply, answer) = oneshot::channel();
        let queued = self.inner.queue.try_send(Pending {
            part,
            reply,
            deadline: tokio::time::Instant::now() + self.inner.config.timeout,
        });
        if queued.is_err() {
            return Err(unsent("too many decisions waiting for redis"));
        }
        Ok(answer)
    }

    /// A decision on a cluster: one call when its rules share a slot, else
    /// a dry run in every slot, then the charges.
    async fn call_cluster(
        &self,
        mut c: redis::cluster_async::ClusterConnection,
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
        write: Write,
    ) -> redis::RedisResult<Decision> {
        let buckets = self.inner.config.buckets;
        let groups = keys::slot_groups(buckets, charges);
        if groups.len() == 1 {
            let part = keys::part(charges, cost, now_us, write);
            let cmd = keys::command(
                &self.inner.script,
                &self.inner.config.prefix,
                buckets,
                std::iter::once(&part),
            );
            let out = eval(&mut c, &cmd, &self.inner).await?;
            return Ok(replay(charges, &out, cost, write));
        }
        if write == Write::Always {
            // A charge is never refused: no dry run first, and it is
            // counted in every slot it reaches (not all-or-none across
            // slots; nothing is ever refused to undo).
            let outs = self
                .cluster_round(&mut c, &groups, charges, cost, now_us, Write::Always)
                .await?;
            return Ok(reply::charged_from_parts(charges, &parts(&outs), cost));
        }
        let dry = self
            .cluster_round(&mut c, &groups, charges, cost, now_us, Write::Dry)
            .await?;
        let d = reply::decision_from_parts(charges, &parts(&dry), cost);
        // A check (cost 0) is the dry run alone: it charges nothing.
        if !d.allowed || cost == 0 {
            return Ok(d);
        }
        let outs = self
            .cluster_round(&mut c, &groups, charges, cost, now_us, Write::IfAdmitted)
            .await?;
        Ok(reply::decision_from_parts(charges, &parts(&outs), cost))
    }

    /// One script call per slot group; each charge's slice of the replies.
    async fn cluster_round(
        &self,
        c: &mut redis::cluster_async::ClusterConnection,
        groups: &[Vec<usize>],
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
        write: Write,
    ) -> redis::RedisResult<Vec<Vec<i64>>> {
        let prefix = &self.inner.config.prefix;
        let buckets = self.inner.config.buckets;
        let mut outs = vec![Vec::new(); charges.len()];
        for group in groups {
            let part: Vec<Charge<'_>> = group.iter().map(|&i| charges[i]).collect();
            let args = keys::part(&part, cost, now_us, write);
            let cmd = keys::command(&self.inner.script, prefix, buckets, std::iter::once(&args));
            let out = eval(c, &cmd, &self.inner).await?;
            for (&i, numbers) in group.iter().zip(reply::split(&part, &out)) {
                outs[i] = numbers.to_vec();
            }
        }
        Ok(outs)
    }
}

/// Each charge's numbers as slices.
fn parts(owned: &[Vec<i64>]) -> Vec<&[i64]> {
    owned.iter().map(Vec::as_slice).collect()
}

/// Sends the decisions queued for a single server: up to [`MAX_IN_FLIGHT`]
/// script calls at a time, each carrying every decision that waited for it
/// (at most [`MAX_BATCH`]). Decisions whose caller went away are dropped
/// unsent; those past their deadline fail with a timeout. Ends with the
/// store.
async fn batcher(store: std::sync::Weak<Inner>, mut queued: mpsc::Receiver<Pending>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queued.recv().await else {
            return;
        };
        let mut batch = Vec::with_capacity(8);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queued.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        batch.retain(|p| !p.reply.is_closed());
        // Decisions whose time ran out while they waited for a slot fail
        // now; the call is bounded by the earliest deadline of the rest (the
        // queue is in arrival order, so calls in flight end before the
        // deadlines of the decisions waiting behind them).
        let now = tokio::time::Instant::now();
        let (late, batch): (Vec<Pending>, Vec<Pending>) =
            batch.into_iter().partition(|p| p.deadline <= now);
        if !late.is_empty() {
            answer(late, Err(unsent(LATE)));
        }
        let Some(deadline) = batch.iter().map(|p| p.deadline).min() else {
            continue;
        };
        let Some(inner) = store.upgrade() else { return };
        tokio::spawn(async move {
            let _slot = slot;
            let conn = inner.current();
            let result = match conn {
                Some(Conn::Single(mut c)) => {
                    let config = &inner.config;
                    let parts = batch.iter().map(|p| &p.part);
                    let cmd = keys::command(&inner.script, &config.prefix, config.buckets, parts);
                    // Bounded by its decisions' deadlines, so a call to a
                    // hung server answers them in time and gives its slot
                    // back.
                    let call = eval(&mut c, &cmd, &inner);
                    let _due = spillway_store::due::Awaiting::new();
                    match tokio::time::timeout_at(deadline, call).await {
                        Ok(r) => r,
                        Err(_) => Err(timed_out()),
                    }
                }
                _ => Err(unsent("not connected to redis")),
            };
            drop(inner);
            answer(batch, result);
        });
    }
}

/// The error of a decision that ran out of time.
fn timed_out() -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within the timeout").into()
}

/// Hands each decision of a call its own numbers from the reply.
fn answer(batch: Vec<Pending>, result: redis::RedisResult<Vec<i64>>) {
    let expected: usize = batch.iter().map(|p| p.part.reply_len).sum();
    let result = result.and_then(|out| {
        if out.len() == expected {
            Ok(out)
        } else {
            Err((redis::ErrorKind::Parse, "script reply of the wrong length").into())
        }
    });
    match result {
        Ok(out) => {
            let mut at = 0;
            for p in batch {
                let len = p.part.reply_len;
                let _ = p.reply.send(Ok(out[at..at + len].to_vec()));
                at += len;
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Runs the script call `cmd`; after `NOSCRIPT` (a restarted or failed-over
/// server has an empty script cache) loads the script and runs it again.
async fn eval<C: redis::aio::ConnectionLike>(
    c: &mut C,
    cmd: &redis::Cmd,
    inner: &Inner,
) -> redis::RedisResult<Vec<i64>> {
    eval_script(c, cmd, &inner.script, inner).await
}

/// [`eval`] of a call of `script`, whose reply is a MessagePack array of
/// numbers too.
async fn eval_script<C: redis::aio::ConnectionLike>(
    c: &mut C,
    cmd: &redis::Cmd,
    script: &Script,
    inner: &Inner,
) -> redis::RedisResult<Vec<i64>> {
    inner.calls.fetch_add(1, Ordering::Relaxed);
    let packed: Vec<u8> = match cmd.query_async(c).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(c).await?;
            inner.calls.fetch_add(1, Ordering::Relaxed);
            cmd.query_async(c).await?
        }
        other => other?,
    };
    msgpack::unpack_numbers(&packed)
        .map_err(|why| (redis::ErrorKind::Parse, "bad script reply", why.to_string()).into())
}

/// Connects (again and again, with backoff up to 500 ms) until it succeeds,
/// then hands the connection to the store. The connection manager and the
/// cluster connection reconnect by themselves afterwards.
async fn connect_loop(store: std::sync::Weak<Inner>, target: Target) {
    let mut delay = Duration::from_millis(50);
    let mut said = false;
    loop {
        let Some(inner) = store.upgrade() else { return };
        let attempt = match &target {
            Target::Single(client) => {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(None)
                    .set_number_of_retries(2)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(300));
                tokio::time::timeout(
                    Duration::from_secs(2),
                    ConnectionManager::new_with_config(client.clone(), cfg),
                )
                .await
                .map(|r| r.map(Conn::Single))
            }
            Target::Cluster(client) => {
                tokio::time::timeout(Duration::from_secs(2), client.get_async_connection())
                    .await
                    .map(|r| r.map(Conn::Cluster))
            }
        };
        let failed = match &attempt {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!(
                "cannot reach redis at {}: {e}",
                target_name(&inner.config)
            )),
            Err(_) => Some(format!(
                "redis at {} did not accept a connection within 2 s",
                target_name(&inner.config)
            )),
        };
        *inner
            .connect_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = failed;
        match attempt {
            Ok(Ok(conn)) => {
                let _ = inner.conn.set(conn);
                inner.breaker.success();
                inner.connected.notify_waiters();
                tracing::info!("connected to redis");
                return;
            }
            // The first failure is worth a warning (a wrong URL, Redis not
            // started); the retries that follow are not.
            Ok(Err(e)) if !said => tracing::warn!(
                "cannot reach redis at {} yet ({e}); decisions follow on_store_error until it answers",
                target_name(&inner.config)
            ),
            Err(_) if !said => tracing::warn!(
                "redis at {} did not accept a connection within 2 s; decisions follow on_store_error until it answers",
                target_name(&inner.config)
            ),
            Ok(Err(e)) => tracing::debug!("redis not reachable yet: {e}"),
            Err(_) => tracing::debug!("redis connect timed out"),
        }
        said = true;
        drop(inner);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// The server or cluster a config names, for logs (no password).
fn target_name(config: &RedisConfig) -> String {
    if let Some(s) = &config.sentinel {
        format!("sentinels {} (master {:?})", s.nodes.join(", "), s.master)
    } else if config.cluster.is_empty() {
        redact(&config.url)
    } else {
        format!(
            "cluster seeds {}",
            config
                .cluster
                .iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl Store for RedisStore {
    fn decide(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl std::future::Future<Output = Result<Decision, StoreError>> + Send {
        self.run(charges, cost, 0, Write::IfAdmitted)
    }

    fn charge(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl std::future::Future<Output = Result<Decision, StoreError>> + Send {
        self.run(charges, cost, 0, Write::Always)
    }

    /// A dry run of the decision script on Redis's clock (see
    /// [`RedisStore::peek_at`]).
    fn peek(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl std::future::Future<Output = Result<Vec<Vec<spillway_core::Verdict>>, StoreError>> + Send
    {
        self.peek_at(charges, cost, 0)
    }

    /// See [`RedisStore::reset_keys`].
    async fn reset(&self, charges: &[Charge<'_>]) -> Result<(), StoreError> {
        self.reset_keys(charges).await.map(|_| ())
    }
}

/// The decision a script reply over `charges` gives: replayed through
/// core's `decide`, or after a charge through core's `charge`.
fn replay(charges: &[Charge<'_>], out: &[i64], cost: u64, write: Write) -> Decision {
    if write == Write::Always {
        reply::charged_from_parts(charges, &reply::split(charges, out), cost)
    } else {
        reply::decision(charges, out, cost)
    }
}

/// Checks that the configured server (or every cluster node) answers PING
/// within `timeout`; for `spillway check-config`, which reports a failure as
/// a warning.
///
/// # Errors
/// The first node that cannot be reached, and why.
pub fn probe(config: &RedisConfig, timeout: Duration) -> Result<(), String> {
    if let Some(s) = &config.sentinel {
        return s.probe(timeout);
    }
    let urls: Vec<&str> = if config.cluster.is_empty() {
        vec![config.url.as_str()]
    } else {
        config.cluster.iter().map(String::as_str).collect()
    };
    for url in urls {
        let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", redact(url));
        let info = url.into_connection_info().map_err(|e| fail(&e))?;
        let client = tls::client(info, config.tls.as_ref()).map_err(|e| fail(&e))?;
        let mut conn = client
            .get_connection_with_timeout(timeout)
            .map_err(|e| fail(&e))?;
        redis::cmd("PING")
            .query::<String>(&mut conn)
            .map_err(|e| fail(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use spillway_core::{Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule};
    use spillway_store::{Charge, Key, Store};

    /// Every await up the stack (limiter, HTTP handler) copies the store's
    /// future into its own: it was 1,200 bytes while it held the cluster
    /// path inline (now boxed), a measurable part of the server's CPU.
    #[test]
    fn a_decision_future_stays_small() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in_runtime = rt.enter();
        let store = super::RedisStore::new(super::RedisConfig::default()).unwrap();
        let rate = Rate::new(1, Nanos::from_secs(1)).unwrap();
        let rule = Rule::new(
            "r",
            None,
            KeySpec::parse("user").unwrap(),
            vec![Limit::Gcra(Gcra::new(rate, 1).unwrap())],
            Mode::Hard,
        )
        .unwrap();
        let key = Key::from_parts(["a"]);
        let charges = [Charge {
            rule: &rule,
            key: &key,
        }];
        let size = std::mem::size_of_val(&store.decide(&charges, 1));
        assert!(size <= 512, "the decision future is {size} bytes");
    }
}
