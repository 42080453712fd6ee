//! The stores: [`SyncStore`] (eventual and lease modes) and [`Fallback`]
//! (the per-decision Redis store with a share to fall back on).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use spillway_core::{
    Clock, Decision, Limit, Mode, Nanos, Outcome, Rule, RuleDecision, RuleDecisions, Verdict,
};
use spillway_redis::{RedisStore, SyncItem, SyncOp, SyncReply};
use spillway_store::{Charge, MemoryConfig, MemoryStore, Store, StoreError};

use crate::clock::StoreClock;
use crate::keys::{Entry, Keys};
use crate::link::Link;
use crate::share::Share;
use crate::{SyncConfig, SyncMode, live_ttl};

/// Exchanges a key may go unused before it is no longer synced.
const IDLE_EXCHANGES: u32 = 10;

/// One store an instance pushes to: its region's, or another region's.
#[derive(Debug)]
struct Remote {
    name: String,
    store: RedisStore,
    link: Mutex<Link<Arc<Rule>>>,
    health: Health,
}

/// How a link to a store is doing, for the status page and metrics.
#[derive(Debug, Default)]
struct Health {
    /// Unix milliseconds of the last exchange answered.
    last_ok_ms: AtomicU64,
    /// Round trip of the last exchange answered, nanoseconds.
    rtt_ns: AtomicU64,
    /// Failed exchanges in a row.
    failures: AtomicU32,
    /// Keys the last exchange carried.
    keys: AtomicU64,
}

impl Health {
    fn ok(&self, rtt: u64, keys: usize) {
        self.last_ok_ms.store(unix_ms(), Ordering::Relaxed);
        self.rtt_ns.store(rtt, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        self.keys.store(keys as u64, Ordering::Relaxed);
    }

    fn failed(&self) -> u32 {
        self.failures.fetch_add(1, Ordering::Relaxed) + 1
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A random instance id: a restarted process is a new instance, so its
/// push numbers never collide with those of its previous life.
fn instance_id() -> String {
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

struct Inner {
    config: SyncConfig,
    instance: String,
    clock: StoreClock,
    local: MemoryStore<StoreClock>,
    keys: Keys,
    home: Remote,
    remotes: Vec<Remote>,
    share: Share,
    /// Set after `config.failures` failed exchanges in a row with the
    /// home store; decisions then fail (so the policy, or the share,
    /// answers) until one succeeds.
    down: AtomicBool,
    /// Wakes the exchange early (lease mode: a slice running low).
    wake: tokio::sync::Notify,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncStore")
            .field("mode", &self.config.mode)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// Local-first decisions shared through Redis (see the crate docs). Cheap
/// to clone.
#[derive(Debug, Clone)]
pub struct SyncStore {
    inner: Arc<Inner>,
}

impl SyncStore {
    /// Starts a sync store deciding in memory and exchanging with `home`
    /// (this region's store) and `remotes` (other regions' stores, by
    /// name) every `config.interval`. Must be called inside a Tokio runtime.
    pub fn new(
        config: SyncConfig,
        home: RedisStore,
        remotes: Vec<(String, RedisStore)>,
    ) -> SyncStore {
        let clock = StoreClock::new();
        let remote = |name: String, store: RedisStore| Remote {
            name,
            store,
            link: Mutex::new(Link::default()),
            health: Health::default(),
        };
        let inner = Arc::new(Inner {
            instance: instance_id(),
            local: MemoryStore::new(
                clock.clone(),
                MemoryConfig {
                    max_keys: config.max_keys.max(1),
                    ..MemoryConfig::default()
                },
            ),
            keys: Keys::new(config.max_keys),
            share: Share::new(clock.clone(), config.max_keys),
            clock,
            home: remote(config.region.clone().unwrap_or_else(|| "home".into()), home),
            remotes: remotes.into_iter().map(|(n, s)| remote(n, s)).collect(),
            down: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            config,
        });
        tokio::spawn(exchange_loop(Arc::downgrade(&inner)));
        SyncStore { inner }
    }

    /// The mode.
    pub fn mode(&self) -> SyncMode {
        self.inner.config.mode
    }

    /// How often it exchanges with the stores.
    pub fn interval(&self) -> Duration {
        self.inner.config.interval
    }

    /// Whether the home store answered the last exchanges (else decisions
    /// follow `on_store_error`).
    pub fn is_down(&self) -> bool {
        self.inner.down.load(Ordering::Relaxed)
    }

    /// Whether this instance decides on its share now.
    pub fn sharing(&self) -> bool {
        self.inner.share.active()
    }

    /// The home store.
    pub fn home(&self) -> &RedisStore {
        &self.inner.home.store
    }

    /// A snapshot for status pages and metrics.
    pub fn status(&self) -> SyncStatus {
        let i = &self.inner;
        let mut links = vec![link_status(&i.home, true)];
        links.extend(i.remotes.iter().map(|r| link_status(r, false)));
        // In lease mode what the home store has not counted yet is the
        // after-the-fact charges; admissions were counted with their leases.
        SyncStatus {
            mode: match i.config.mode {
                SyncMode::Eventual => "eventual",
                SyncMode::Lease => "lease",
            },
            instance: i.instance.clone(),
            region: i.config.region.clone(),
            live: i.share.live(),
            sharing: i.share.active(),
            share_decisions: i.share.decided(),
            keys: i.keys.len(),
            untracked: i.keys.untracked(),
            clock_step_us: i.clock.last_step() / 1000,
            links,
        }
    }

    /// Runs one exchange now (tests and benchmarks that want one at a
    /// known point; the background loop runs them every interval anyway).
    pub async fn exchange_now(&self) {
        self.inner.exchange().await;
    }
}

fn link_status(r: &Remote, home: bool) -> LinkStatus {
    let last = r.health.last_ok_ms.load(Ordering::Relaxed);
    let link = r.link.lock();
    LinkStatus {
        region: r.name.clone(),
        home,
        last_ok_unix_ms: last,
        lag_ms: if last == 0 {
            0
        } else {
            unix_ms().saturating_sub(last)
        },
        rtt_us: r.health.rtt_ns.load(Ordering::Relaxed) / 1000,
        failures: r.health.failures.load(Ordering::Relaxed),
        deltas_waiting: link.waiting(),
        keys_synced: r.health.keys.load(Ordering::Relaxed),
    }
}

fn outage(what: &str) -> StoreError {
    StoreError {
        transient: true,
        message: format!("{what} unreachable: sync stopped"),
    }
}

impl Store for SyncStore {
    async fn decide(&self, charges: &[Charge<'_>], cost: u64) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        if inner.down.load(Ordering::Relaxed) {
            return Err(outage(&inner.home.store.describe()));
        }
        Ok(match inner.config.mode {
            SyncMode::Eventual => inner.eventual(charges, cost, false),
            SyncMode::Lease => inner.lease(charges, cost, false).await?,
        })
    }

    async fn charge(&self, charges: &[Charge<'_>], cost: u64) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        if inner.down.load(Ordering::Relaxed) {
            return Err(outage(&inner.home.store.describe()));
        }
        Ok(match inner.config.mode {
            SyncMode::Eventual => inner.eventual(charges, cost, true),
            SyncMode::Lease => inner.lease(charges, cost, true).await?,
        })
    }

    fn decide_share(&self, charges: &[Charge<'_>], cost: u64, after: bool) -> Option<Decision> {
        Some(
            self.inner
                .share
                .decide(charges, cost, after, spillway_redis::tag),
        )
    }

    fn keys(&self) -> Option<usize> {
        Some(self.inner.keys.len())
    }

    fn maintain(&self) {
        let _ = self.inner.local.sweep(4096);
    }
}

impl Inner {
    /// The entry of `c`, made if new; `None` when the map is full.
    fn track<T>(&self, c: &Charge<'_>, tag: u64, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        self.keys.with(
            tag,
            || Entry::new(self.keys.intern(c.rule), self.local.key_hash(c)),
            |e| {
                e.idle = 0;
                f(e)
            },
        )
    }

    /// Eventual mode: decided in memory, admissions recorded.
    fn eventual(&self, charges: &[Charge<'_>], cost: u64, after: bool) -> Decision {
        let mut tags = smallvec::SmallVec::<[u64; 2]>::new();
        for c in charges {
            let tag = spillway_redis::tag(c);
            if self.track(c, tag, |_| ()).is_none() {
                // No room to share this key's count: its own share of the
                // limit is what this instance may admit for it alone.
                return self.share.decide(charges, cost, after, spillway_redis::tag);
            }
            tags.push(tag);
        }
        let d = if after {
            self.local.charge_now(charges, cost)
        } else {
            self.local.decide_now(charges, cost)
        };
        if (d.allowed || after) && cost > 0 {
            for rd in &d.rules {
                if after || rd.outcome != Outcome::ShadowDenied {
                    self.keys.get(tags[rd.rule], |e| {
                        e.pending = e.pending.saturating_add(cost)
                    });
                }
            }
        }
        d
    }
}

/// Exchanges every interval (earlier when woken) until the store is dropped.
async fn exchange_loop(weak: Weak<Inner>) {
    let Some(interval) = weak.upgrade().map(|i| i.config.interval) else {
        return;
    };
    let interval = interval.max(Duration::from_millis(1));
    let mut next = tokio::time::Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        next += interval;
        let now = tokio::time::Instant::now();
        if next < now {
            next = now;
        }
        {
            let woken = inner.wake.notified();
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = woken => {}
            }
        }
        inner.exchange().await;
        drop(inner);
    }
}

/// One item of an exchange, owned: which key, its rule, what to do.
struct Item {
    tag: u64,
    rule: Arc<Rule>,
    op: SyncOp,
}

impl Inner {
    async fn exchange(&self) {
        let lease = self.config.mode == SyncMode::Lease;
        let now = self.clock.now();
        let mut drained: Vec<(u64, Arc<Rule>, u64, u64)> = Vec::new();
        let mut ops: Vec<Item> = Vec::new();
        let live = self.share.live();
        let ttl = (self.config.interval * 2).as_nanos() as u64;
        self.keys.retain(|tag, e| {
            let used = e.idle == 0;
            let moved = e.pending > 0 || e.after > 0;
            if !used && !moved && e.units == 0 && e.idle >= IDLE_EXCHANGES && e.asking.is_none() {
                return false;
            }
            e.idle = e.idle.saturating_add(1);
            if moved {
                drained.push((tag, e.rule.clone(), e.pending, e.after));
                e.pending = 0;
                e.after = 0;
            }
            if lease {
                lease_ops(e, tag, now, ttl, live, &mut ops);
            } else if used || e.idle <= IDLE_EXCHANGES {
                ops.push(Item {
                    tag,
                    rule: e.rule.clone(),
                    op: SyncOp::Charge(0),
                });
            }
            true
        });
        // What each store has to count: in eventual mode every admission;
        // in lease mode the home store counted admissions as leases, and
        // only charges after the fact are new to it.
        {
            let mut home = self.home.link.lock();
            for (tag, rule, pending, after) in &drained {
                let for_home = if lease { *after } else { pending + after };
                home.add(*tag, rule, for_home);
            }
        }
        for r in &self.remotes {
            let mut link = r.link.lock();
            for (tag, rule, pending, after) in &drained {
                link.add(*tag, rule, pending + after);
            }
        }
        // What this instance admitted alone while the store was gone.
        if !self.down.load(Ordering::Relaxed) {
            self.reconcile_share();
        }
        let remotes = self.remotes.iter().map(|r| push_only(r, &self.instance));
        tokio::join!(self.exchange_home(ops), futures_join_all(remotes));
        self.heartbeat().await;
    }

    /// Moves what the share admitted into the home and remote links, once.
    fn reconcile_share(&self) {
        let mut owed = self.share.owed.lock();
        while let Some(push) = owed.to_send().cloned() {
            {
                let mut home = self.home.link.lock();
                for (tag, rule, cost) in &push.items {
                    home.add(*tag, rule, *cost);
                }
            }
            for r in &self.remotes {
                let mut link = r.link.lock();
                for (tag, rule, cost) in &push.items {
                    link.add(*tag, rule, *cost);
                }
            }
            owed.answered(push.seq);
        }
    }

    /// The exchange with the home store: the push (if any), the ops of the
    /// keys in use; then the catch-up (eventual) or the leases granted.
    async fn exchange_home(&self, mut ops: Vec<Item>) {
        let push = self.home.link.lock().to_send().cloned();
        let mut pushed: HashSet<u64> = HashSet::new();
        let mut items: Vec<Item> =
            Vec::with_capacity(ops.len() + push.as_ref().map_or(0, |p| p.items.len()));
        if let Some(p) = &push {
            for (tag, rule, cost) in &p.items {
                pushed.insert(*tag);
                items.push(Item {
                    tag: *tag,
                    rule: rule.clone(),
                    op: SyncOp::Charge(*cost),
                });
            }
        }
        if self.config.mode == SyncMode::Eventual {
            ops.retain(|i| !pushed.contains(&i.tag));
        }
        items.append(&mut ops);
        if items.is_empty() {
            return;
        }
        let sent = self.clock.elapsed();
        let call: Vec<SyncItem<'_>> = items
            .iter()
            .map(|i| SyncItem {
                rule: &i.rule,
                tag: i.tag,
                op: i.op,
            })
            .collect();
        let seq = push.as_ref().map(|p| (self.instance.as_str(), p.seq));
        let reply = self.home.store.exchange(&call, seq).await;
        drop(call);
        let received = self.clock.elapsed();
        match reply {
            Ok(reply) => {
                self.clock.learn(reply.now_us, sent, received);
                if let Some(p) = &push {
                    self.home.link.lock().answered(p.seq);
                }
                self.home
                    .health
                    .ok(received.saturating_sub(sent), items.len());
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(store = %self.home.store.describe(), "sync: store answers again");
                }
                self.share.end();
                self.absorb(&items, &reply);
            }
            Err(e) => {
                let n = self.home.health.failed();
                if n >= self.config.failures.max(1) && !self.down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        store = %self.home.store.describe(),
                        error = %e.message,
                        "sync: {n} exchanges failed in a row; decisions follow on_store_error until the store answers"
                    );
                }
                // Slices granted by a lost answer are lost (never used
                // twice); refunded units are gone from the entries already.
            }
        }
    }

    /// Takes in an exchange's answer: catches local states up with the
    /// store's (eventual), or hands out the slices granted (lease).
    fn absorb(&self, items: &[Item], reply: &SyncReply) {
        let now = self.clock.now();
        let interval = Nanos::from(self.config.interval);
        for (item, r) in items.iter().zip(&reply.items) {
            match item.op {
                SyncOp::Lease { .. } => {
                    self.keys.get(item.tag, |e| {
                        grant(e, r.granted, reply.now_us, &r.limits, now, interval);
                    });
                }
                _ if self.config.mode == SyncMode::Lease => {
                    self.keys.get(item.tag, |e| {
                        e.remaining = min_remaining(&r.limits);
                    });
                }
                _ => {
                    let waiting_after = self.home.link.lock().pending_for(item.tag);
                    self.keys.get(item.tag, |e| {
                        let unpushed = e.pending.saturating_add(waiting_after);
                        e.remaining = min_remaining(&r.limits);
                        for (li, v) in r.limits.iter().enumerate() {
                            let target = v.remaining.saturating_sub(unpushed);
                            let here = self
                                .local
                                .limit_at(&item.rule, e.local, li, 0, now)
                                .remaining;
                            if here > target {
                                self.local
                                    .limit_at(&item.rule, e.local, li, here - target, now);
                            }
                        }
                    });
                }
            }
        }
    }

    /// Records this instance as alive and learns how many are.
    async fn heartbeat(&self) {
        if let Ok((_, live)) = self
            .home
            .store
            .heartbeat(&self.instance, live_ttl(self.config.interval))
            .await
        {
            self.share.set_live(live as u64);
        }
    }
}

/// The most limiting remaining of a reply's limits.
fn min_remaining(limits: &[Verdict]) -> u64 {
    limits.iter().map(|v| v.remaining).min().unwrap_or(0)
}

/// Pushes the deltas waiting for another region's store.
async fn push_only(r: &Remote, instance: &str) {
    let Some(push) = r.link.lock().to_send().cloned() else {
        return;
    };
    let call: Vec<SyncItem<'_>> = push
        .items
        .iter()
        .map(|(tag, rule, cost)| SyncItem {
            rule,
            tag: *tag,
            op: SyncOp::Charge(*cost),
        })
        .collect();
    let sent = std::time::Instant::now();
    match r.store.exchange(&call, Some((instance, push.seq))).await {
        Ok(_) => {
            r.link.lock().answered(push.seq);
            r.health.ok(sent.elapsed().as_nanos() as u64, call.len());
        }
        Err(e) => {
            if r.health.failed() == 3 {
                tracing::warn!(region = %r.name, error = %e.message, "sync: region's store unreachable; its deltas wait");
            }
        }
    }
}

/// Runs the futures together (the remote regions' pushes).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let set: Vec<_> = futures.map(Box::pin).collect();
    for f in set {
        f.await;
    }
}

// ---------------------------------------------------------------- lease mode

/// How much to lease for a key: its demand over the last interval, twice
/// (a slice should last until the next exchange), at least its share of
/// what is left, and at least 1.
fn want(demand: u64, remaining: u64, live: u64) -> u64 {
    // Past its share of what is left, a busy instance takes what one
    // interval of its traffic needs, not two: the rest stays for others.
    let cap = if remaining == u64::MAX {
        u64::MAX
    } else {
        demand.max(remaining / live.max(1))
    };
    demand.saturating_mul(2).min(cap).max(1)
}

/// The ops of one key's lease at an exchange: expired or idle units back,
/// a new slice when demand is above what is held.
fn lease_ops(e: &mut Entry, tag: u64, now: Nanos, ttl: u64, live: u64, ops: &mut Vec<Item>) {
    let demand = std::mem::take(&mut e.demand);
    let expired = now >= e.expires;
    let give_back = if expired || demand == 0 {
        e.units
    } else {
        let keep = want(demand, e.remaining, live);
        e.units.saturating_sub(keep.saturating_mul(2))
    };
    if give_back > 0 {
        e.units -= give_back;
        ops.push(Item {
            tag,
            rule: e.rule.clone(),
            op: SyncOp::Refund {
                units: give_back,
                since_us: e.since_us,
            },
        });
    }
    if demand > 0 && e.asking.is_none() && now >= e.refused_until {
        let w = want(demand, e.remaining, live);
        // Topped up before it runs low or expires, so a busy key always
        // has a slice and never waits for the store.
        let expiring = now.saturating_add(Nanos(ttl / 2)) >= e.expires;
        if e.units < w / 2 + 1 || expiring {
            ops.push(Item {
                tag,
                rule: e.rule.clone(),
                op: SyncOp::Lease {
                    want: w - e.units.min(w),
                },
            });
        }
    }
}

/// Hands a granted slice to its key.
fn grant(
    e: &mut Entry,
    granted: u64,
    now_us: u64,
    limits: &[Verdict],
    now: Nanos,
    interval: Nanos,
) {
    e.remaining = min_remaining(limits);
    if granted == 0 {
        // The store refused: no more until it may admit again (at most an
        // interval: its state moves with other instances' slices too).
        let retry = limits
            .iter()
            .filter(|v| !v.allowed)
            .map(|v| v.retry_after)
            .max()
            .unwrap_or(interval)
            .min(interval);
        e.refused_until = now.saturating_add(retry);
        e.verdict = limits.iter().find(|v| !v.allowed).copied();
        return;
    }
    e.units = e.units.saturating_add(granted);
    e.since_us = now_us;
    let mut expires = now.saturating_add(Nanos(interval.as_u64().saturating_mul(2)));
    for (l, v) in e.rule.enforced_limits().iter().zip(limits) {
        if matches!(l, Limit::FixedWindow(_)) {
            expires = expires.min(now.saturating_add(v.reset));
        }
    }
    e.expires = expires;
    e.verdict = limits.iter().min_by_key(|v| v.remaining).copied();
}

impl Inner {
    /// Lease mode: admitted from the keys' slices; a key without one asks
    /// the store (once for all the requests waiting on it).
    async fn lease(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
    ) -> Result<Decision, StoreError> {
        let mut tags = smallvec::SmallVec::<[u64; 2]>::new();
        for c in charges {
            tags.push(spillway_redis::tag(c));
        }
        for attempt in 0..2 {
            let now = self.clock.now();
            match self.take(charges, &tags, cost, after, now) {
                Taken::Decided(d) => return Ok(d),
                Taken::Untracked => {
                    return Ok(self.share.decide(charges, cost, after, spillway_redis::tag));
                }
                Taken::Missing(j) if attempt == 0 => self.ask(&charges[j], tags[j], cost).await?,
                Taken::Missing(j) => {
                    let interval = Nanos::from(self.config.interval);
                    return Ok(refused(charges, j, interval, None));
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// Takes `cost` from every charge's slice, all or none.
    fn take(
        &self,
        charges: &[Charge<'_>],
        tags: &[u64],
        cost: u64,
        after: bool,
        now: Nanos,
    ) -> Taken {
        let mut rules = RuleDecisions::new();
        let mut taken = smallvec::SmallVec::<[usize; 2]>::new();
        let mut missing = None;
        let mut refused_by = None;
        for (j, c) in charges.iter().enumerate() {
            let shadow = c.rule.mode() == Mode::Shadow;
            let size = c.rule.limits().first().map_or(0, Limit::size);
            let r = self.track(c, tags[j], |e| slice_take(e, cost, after, now));
            match r {
                None => {
                    self.give_back(charges, tags, &taken, cost);
                    return Taken::Untracked;
                }
                Some(Ok(units)) => {
                    if cost > 0 && !after {
                        taken.push(j);
                    }
                    rules.push(RuleDecision {
                        rule: j,
                        limit: 0,
                        verdict: Verdict {
                            allowed: true,
                            limit: size,
                            remaining: units,
                            reset: Nanos::ZERO,
                            retry_after: Nanos::ZERO,
                            wait: Nanos::ZERO,
                        },
                        outcome: Outcome::Allowed,
                    });
                }
                Some(Err(_)) if shadow => {
                    rules.push(RuleDecision {
                        rule: j,
                        limit: 0,
                        verdict: Verdict::never(size),
                        outcome: Outcome::ShadowDenied,
                    });
                }
                Some(Err((true, _))) => {
                    missing.get_or_insert(j);
                }
                Some(Err((false, v))) => {
                    refused_by.get_or_insert((j, v));
                }
            }
        }
        if refused_by.is_some() || missing.is_some() {
            self.give_back(charges, tags, &taken, cost);
            if let Some((j, v)) = refused_by {
                return Taken::Decided(refused(charges, j, Nanos::from(self.config.interval), v));
            }
            return Taken::Missing(missing.unwrap_or(0));
        }
        // Units used from slices: what other regions' stores must count.
        if cost > 0 && !after {
            for &j in &taken {
                self.keys
                    .get(tags[j], |e| e.pending = e.pending.saturating_add(cost));
            }
        }
        let deciding = rules
            .iter()
            .filter(|r| r.outcome == Outcome::Allowed)
            .min_by_key(|r| r.verdict.remaining)
            .or(rules.first())
            .copied();
        Taken::Decided(Decision {
            allowed: true,
            wait: Nanos::ZERO,
            deciding,
            rules,
        })
    }

    fn give_back(&self, charges: &[Charge<'_>], tags: &[u64], taken: &[usize], cost: u64) {
        for &j in taken {
            let _ = charges[j];
            self.keys
                .get(tags[j], |e| e.units = e.units.saturating_add(cost));
        }
    }

    /// Asks the store for a slice of `c`'s key now; requests already
    /// waiting for one wait for that call instead.
    async fn ask(&self, c: &Charge<'_>, tag: u64, cost: u64) -> Result<(), StoreError> {
        let live = self.share.live();
        let mut waiter = None;
        let mut request = None;
        self.keys.get(tag, |e| match &e.asking {
            Some(n) => waiter = Some(n.clone()),
            None => {
                e.asking = Some(Arc::new(tokio::sync::Notify::new()));
                let w = want(e.demand.max(cost), e.remaining, live).max(cost);
                request = Some((e.rule.clone(), w));
            }
        });
        if let Some(n) = waiter {
            let notified = n.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            // The call may have ended between the look-up and `enable`.
            let still = self
                .keys
                .get(tag, |e| {
                    e.asking.as_ref().is_some_and(|a| Arc::ptr_eq(a, &n))
                })
                .unwrap_or(false);
            if still {
                let wait = self.config.timeout_hint();
                let _ = tokio::time::timeout(wait, notified).await;
            }
            return Ok(());
        }
        let Some((rule, w)) = request else {
            return Ok(());
        };
        let _ = c;
        let call = [SyncItem {
            rule: &rule,
            tag,
            op: SyncOp::Lease { want: w },
        }];
        let reply = self.home.store.exchange(&call, None).await;
        let now = self.clock.now();
        let interval = Nanos::from(self.config.interval);
        self.keys.get(tag, |e| {
            if let Ok(r) = &reply
                && let Some(item) = r.items.first()
            {
                grant(e, item.granted, r.now_us, &item.limits, now, interval);
            }
            if let Some(n) = e.asking.take() {
                n.notify_waiters();
            }
        });
        reply.map(|_| ())
    }
}

/// Takes `cost` from a key's slice: `Ok(units left)`, or why not:
/// `Err((true, _))` no live slice big enough (ask the store),
/// `Err((false, verdict))` the store refused the key lately. A charge
/// after the fact always counts: from the slice as far as it goes, the
/// rest charged to the store at the next exchange.
fn slice_take(
    e: &mut Entry,
    cost: u64,
    after: bool,
    now: Nanos,
) -> Result<u64, (bool, Option<Verdict>)> {
    e.demand = e.demand.saturating_add(cost);
    let live = now < e.expires;
    if after {
        let from_slice = if live { e.units.min(cost) } else { 0 };
        e.units -= from_slice;
        e.pending = e.pending.saturating_add(cost);
        e.after = e.after.saturating_add(cost - from_slice);
        return Ok(e.units);
    }
    if now < e.refused_until {
        return Err((false, e.verdict));
    }
    if cost == 0 {
        return Ok(if live { e.units } else { 0 });
    }
    if live && e.units >= cost {
        e.units -= cost;
        return Ok(e.units);
    }
    Err((true, e.verdict))
}

enum Taken {
    Decided(Decision),
    /// Charge `j` has no slice.
    Missing(usize),
    /// A new key found the map full.
    Untracked,
}

/// A denial by charge `j`, reporting the store's last verdict if known.
fn refused(charges: &[Charge<'_>], j: usize, interval: Nanos, v: Option<Verdict>) -> Decision {
    let size = charges[j].rule.limits().first().map_or(0, Limit::size);
    let verdict = match v {
        Some(v) if !v.allowed => Verdict { remaining: 0, ..v },
        _ => Verdict {
            allowed: false,
            limit: size,
            remaining: 0,
            reset: interval,
            retry_after: interval,
            wait: Nanos::ZERO,
        },
    };
    let rd = RuleDecision {
        rule: j,
        limit: 0,
        verdict: Verdict {
            allowed: false,
            ..verdict
        },
        outcome: Outcome::Denied,
    };
    let mut rules = RuleDecisions::new();
    rules.push(rd);
    Decision {
        allowed: false,
        wait: Nanos::ZERO,
        deciding: Some(rd),
        rules,
    }
}

// ------------------------------------------------------- per-decision mode

/// The per-decision Redis store with a share to fall back on
/// (`on_store_error: share`): decisions go to Redis; while it cannot
/// decide, [`Store::decide_share`] decides on this instance's share, and
/// what was admitted meanwhile is charged to Redis once when it answers
/// again. Heartbeats every second tell each instance how many are alive.
#[derive(Debug, Clone)]
pub struct Fallback {
    inner: Arc<FallbackInner>,
}

#[derive(Debug)]
struct FallbackInner {
    redis: RedisStore,
    share: Share,
    instance: String,
    health: Health,
}

impl Fallback {
    /// Wraps `redis`; starts the heartbeat and reconciliation task (inside
    /// a Tokio runtime).
    pub fn new(redis: RedisStore, max_keys: usize) -> Fallback {
        let inner = Arc::new(FallbackInner {
            share: Share::new(StoreClock::new(), max_keys),
            redis,
            instance: instance_id(),
            health: Health::default(),
        });
        tokio::spawn(fallback_loop(Arc::downgrade(&inner)));
        Fallback { inner }
    }

    /// The Redis store.
    pub fn redis(&self) -> &RedisStore {
        &self.inner.redis
    }

    /// A snapshot for status pages and metrics.
    pub fn status(&self) -> SyncStatus {
        let i = &self.inner;
        let last = i.health.last_ok_ms.load(Ordering::Relaxed);
        let owed = i.share.owed.lock().waiting();
        SyncStatus {
            mode: "per-decision",
            instance: i.instance.clone(),
            region: None,
            live: i.share.live(),
            sharing: i.share.active(),
            share_decisions: i.share.decided(),
            keys: 0,
            untracked: 0,
            clock_step_us: 0,
            links: vec![LinkStatus {
                region: "home".into(),
                home: true,
                last_ok_unix_ms: last,
                lag_ms: if last == 0 {
                    0
                } else {
                    unix_ms().saturating_sub(last)
                },
                rtt_us: i.health.rtt_ns.load(Ordering::Relaxed) / 1000,
                failures: i.health.failures.load(Ordering::Relaxed),
                deltas_waiting: owed,
                keys_synced: i.health.keys.load(Ordering::Relaxed),
            }],
        }
    }

    /// Whether this instance decides on its share now.
    pub fn sharing(&self) -> bool {
        self.inner.share.active()
    }

    /// Runs one heartbeat and reconciliation now (tests).
    pub async fn tick_now(&self) {
        self.inner.tick().await;
    }
}

impl Store for Fallback {
    async fn decide(&self, charges: &[Charge<'_>], cost: u64) -> Result<Decision, StoreError> {
        self.inner.redis.decide(charges, cost).await
    }

    async fn charge(&self, charges: &[Charge<'_>], cost: u64) -> Result<Decision, StoreError> {
        self.inner.redis.charge(charges, cost).await
    }

    fn decide_share(&self, charges: &[Charge<'_>], cost: u64, after: bool) -> Option<Decision> {
        Some(
            self.inner
                .share
                .decide(charges, cost, after, spillway_redis::tag),
        )
    }
}

impl FallbackInner {
    async fn tick(&self) {
        let sent = std::time::Instant::now();
        match self
            .redis
            .heartbeat(&self.instance, live_ttl(Duration::from_secs(1)))
            .await
        {
            Ok((_, live)) => {
                self.share.set_live(live as u64);
                self.health.ok(sent.elapsed().as_nanos() as u64, 0);
            }
            Err(_) => {
                self.health.failed();
                return;
            }
        }
        // Reachable: what the share admitted is charged, once. Decisions
        // go back to Redis as soon as its breaker lets them (they try it
        // first every time); sharing ends once nothing is owed and the
        // breaker is closed.
        let push = self.share.owed.lock().to_send().cloned();
        if let Some(push) = push {
            let call: Vec<SyncItem<'_>> = push
                .items
                .iter()
                .map(|(tag, rule, cost)| SyncItem {
                    rule,
                    tag: *tag,
                    op: SyncOp::Charge(*cost),
                })
                .collect();
            if self
                .redis
                .exchange(&call, Some((&self.instance, push.seq)))
                .await
                .is_ok()
            {
                self.share.owed.lock().answered(push.seq);
                self.health.keys.store(call.len() as u64, Ordering::Relaxed);
            }
        }
        if self.share.owed.lock().waiting() == 0 && self.redis.is_healthy() {
            self.share.end();
        }
    }
}

async fn fallback_loop(weak: Weak<FallbackInner>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beat = 0u32;
    loop {
        ticker.tick().await;
        let Some(inner) = weak.upgrade() else { return };
        // A heartbeat a second; while sharing, four a second so the
        // shared counts are reconciled soon after the store returns.
        beat = beat.wrapping_add(1);
        if beat.is_multiple_of(4) || inner.share.active() {
            inner.tick().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lease size: demand-driven, at least the fair share of what is
    /// left, never more than twice the demand, at least 1.
    #[test]
    fn lease_sizes() {
        assert_eq!(want(0, 100, 4), 1);
        assert_eq!(want(900, 1000, 4), 900);
        assert_eq!(want(33, 1000, 4), 66);
        assert_eq!(want(10, u64::MAX, 4), 20);
        assert_eq!(want(5, 0, 4), 5);
    }

    use proptest::prelude::*;
    use spillway_core::{FixedWindow, KeySpec};

    /// A store that counts one key's budget, as the script does for a
    /// fixed window: a lease takes what is left (up to the ask), a refund
    /// gives units back.
    struct Budget {
        left: u64,
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A request of cost 1 at instance `i`.
        Request(usize),
        /// Instance `i` exchanges; its answer is lost if `lost`.
        Exchange(usize, bool),
        /// Time passes (slices may expire).
        Pass(u64),
    }

    proptest! {
        /// Lease accounting, any order of requests, exchanges, lost
        /// answers and expiries over three instances sharing one budget:
        /// the requests admitted never exceed the budget; and what the
        /// store counts (budget - left) is always what was admitted plus
        /// what the instances hold plus what lost answers granted
        /// (nothing counted twice, nothing admitted uncounted).
        #[test]
        fn leases_never_admit_more_than_the_budget(
            budget in 1u64..60,
            steps in proptest::collection::vec(prop_oneof![
                (0..3usize).prop_map(Step::Request),
                (0..3usize, proptest::bool::weighted(0.2)).prop_map(|(i, l)| Step::Exchange(i, l)),
                (1u64..300).prop_map(Step::Pass),
            ], 0..200),
        ) {
            let rule = Arc::new(Rule::new("r", None, KeySpec::parse("user").unwrap(),
                vec![Limit::FixedWindow(FixedWindow::new(budget, Nanos::from_secs(1_000_000)).unwrap())],
                Mode::Hard).unwrap());
            let interval = Nanos::from_millis(100);
            let mut store = Budget { left: budget };
            let mut entries: Vec<Entry> = (0..3).map(|_| Entry::new(rule.clone(), 0)).collect();
            let (mut now, mut admitted, mut lost) = (Nanos::from_secs(1), 0u64, 0u64);
            for step in steps {
                match step {
                    Step::Request(i) => {
                        match slice_take(&mut entries[i], 1, false, now) {
                            Ok(_) => admitted += 1,
                            // The request asks the store at once: a lease
                            // of what it wants.
                            Err((true, _)) => {
                                let w = want(entries[i].demand.max(1), entries[i].remaining, 3);
                                let g = w.min(store.left);
                                store.left -= g;
                                let v = Verdict { allowed: g > 0, limit: budget, remaining: store.left,
                                    reset: Nanos::from_secs(1_000_000), retry_after: interval, wait: Nanos::ZERO };
                                grant(&mut entries[i], g, now.as_u64() / 1000, &[v], now, interval);
                                if slice_take(&mut entries[i], 1, false, now).is_ok() { admitted += 1; }
                            }
                            Err((false, _)) => {}
                        }
                    }
                    Step::Exchange(i, gone) => {
                        let mut ops = Vec::new();
                        lease_ops(&mut entries[i], 1, now, interval.as_u64() * 2, 3, &mut ops);
                        for op in ops {
                            match op.op {
                                SyncOp::Refund { units, .. } => store.left += units,
                                SyncOp::Lease { want } => {
                                    let g = want.min(store.left);
                                    store.left -= g;
                                    let v = Verdict { allowed: g > 0, limit: budget, remaining: store.left,
                                        reset: Nanos::from_secs(1_000_000), retry_after: interval, wait: Nanos::ZERO };
                                    if gone { lost += g } else {
                                        grant(&mut entries[i], g, now.as_u64() / 1000, &[v], now, interval);
                                    }
                                }
                                SyncOp::Charge(_) => {}
                            }
                        }
                    }
                    Step::Pass(ms) => now = now.saturating_add(Nanos::from_millis(ms)),
                }
                let held: u64 = entries.iter().map(|e| e.units).sum();
                prop_assert!(admitted <= budget, "admitted {admitted} of {budget}");
                prop_assert_eq!(budget - store.left, admitted + held + lost);
            }
        }
    }

    #[test]
    fn clock_is_a_clock() {
        let c = StoreClock::new();
        assert!(c.now().as_u64() > 0);
    }
}
