//! [`SyncStore`]: eventual mode, the exchange loop, and what lease mode
//! shares with it (`lease.rs` has the rest).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use spillway_core::{Clock, Decision, Nanos, Outcome, Rule, Verdict};
use spillway_redis::{RedisStore, SyncItem, SyncOp, SyncReply};
use spillway_store::{Charge, MemoryConfig, MemoryStore, Store, StoreError};

use crate::clock::StoreClock;
use crate::keys::{Entry, Keys};
use crate::lease::{Tick, grant, lease_ops};
use crate::link::Link;
use crate::share::Share;
use crate::status::{Health, LinkStatus, SyncStatus, instance_id, unix_ms};
use crate::{SyncConfig, SyncMode, live_ttl};

/// Exchanges a key may go unused before it is no longer synced.
const IDLE_EXCHANGES: u32 = 10;

/// One store an instance pushes to: its region's, or another region's.
#[derive(Debug)]
pub(crate) struct Remote {
    pub(crate) name: String,
    pub(crate) store: RedisStore,
    pub(crate) link: Mutex<Link<Arc<Rule>>>,
    pub(crate) health: Health,
}

pub(crate) struct Inner {
    pub(crate) config: SyncConfig,
    pub(crate) instance: String,
    pub(crate) clock: StoreClock,
    pub(crate) local: MemoryStore<StoreClock>,
    pub(crate) keys: Keys,
    pub(crate) home: Remote,
    pub(crate) remotes: Vec<Remote>,
    pub(crate) share: Share,
    /// Set after `config.failures` failed exchanges in a row with the
    /// home store; decisions then fail (so the policy, or the share,
    /// answers) until one succeeds.
    pub(crate) down: AtomicBool,
    /// Wakes the exchange early (lease mode: a slice running low).
    pub(crate) wake: tokio::sync::Notify,
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

    /// Whether the home store has answered at least once (an exchange
    /// or a heartbeat): before that, decisions are this instance's alone
    /// (eventual) or wait for a store that may not be there (lease).
    pub fn answered(&self) -> bool {
        self.inner.clock.synced()
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
    StoreError::new(true, format!("{what} unreachable: sync stopped"))
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

    fn decide_share(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        _: &StoreError,
    ) -> Option<Decision> {
        // Decisions here never reach the store (a lease's lost answer
        // costs units, not this request): what the share admits is owed.
        Some(
            self.inner
                .share
                .decide(charges, cost, after, true, spillway_redis::tag),
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
    pub(crate) fn track<T>(
        &self,
        c: &Charge<'_>,
        tag: u64,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        let mut made = false;
        let out = self.keys.with(
            tag,
            || {
                made = true;
                Entry::new(self.keys.intern(c.rule), self.local.key_hash(c))
            },
            |e| {
                e.idle = 0;
                f(e)
            },
        );
        // A key new here is decided on this instance's memory alone until
        // it is caught up: the exchange loop pulls it at once.
        if made && self.config.mode == SyncMode::Eventual {
            self.wake.notify_one();
        }
        out
    }

    /// Eventual mode: decided in memory, admissions recorded.
    fn eventual(&self, charges: &[Charge<'_>], cost: u64, after: bool) -> Decision {
        let mut tags = smallvec::SmallVec::<[u64; 2]>::new();
        for c in charges {
            let tag = spillway_redis::tag(c);
            if self.track(c, tag, |_| ()).is_none() {
                // No room to share this key's count: its own share of the
                // limit is what this instance may admit for it alone.
                return self
                    .share
                    .decide(charges, cost, after, true, spillway_redis::tag);
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

/// Exchanges every interval until the store is dropped; between them,
/// when woken by new keys, pulls just those (at most every tenth of an
/// interval).
async fn exchange_loop(weak: Weak<Inner>) {
    let Some(interval) = weak.upgrade().map(|i| i.config.interval) else {
        return;
    };
    let interval = interval.max(Duration::from_millis(1));
    let gap = interval / 10;
    let mut next = tokio::time::Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let woken = tokio::select! {
            () = tokio::time::sleep_until(next) => false,
            () = inner.wake.notified() => true,
        };
        if woken {
            inner.pull_fresh().await;
            drop(inner);
            tokio::time::sleep(gap).await;
            continue;
        }
        inner.exchange().await;
        drop(inner);
        next += interval;
        let now = tokio::time::Instant::now();
        if next < now {
            next = now;
        }
    }
}

/// One item of an exchange, owned: which key, its rule, what to do.
pub(crate) struct Item {
    pub(crate) tag: u64,
    pub(crate) rule: Arc<Rule>,
    pub(crate) op: SyncOp,
}

impl Inner {
    async fn exchange(&self) {
        let lease = self.config.mode == SyncMode::Lease;
        let now = self.clock.now();
        let mut drained: Vec<(u64, Arc<Rule>, u64, u64)> = Vec::new();
        let mut ops: Vec<Item> = Vec::new();
        let live = self.share.live();
        let ttl = (self.config.interval * 2).as_nanos() as u64;
        let tick = Tick {
            now,
            ttl,
            live,
            idle_after: IDLE_EXCHANGES,
        };
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
                lease_ops(e, tag, &tick, self.leasing(&e.rule), &mut ops);
            } else if used || e.idle <= IDLE_EXCHANGES {
                e.fresh = false;
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
        let (called, ()) = tokio::join!(self.exchange_home(ops), futures_join_all(remotes));
        self.heartbeat(!called).await;
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
    /// Returns whether it called the store.
    async fn exchange_home(&self, mut ops: Vec<Item>) -> bool {
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
            return false;
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
        true
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
                    let waiting_after = self.home.link.lock().unacked_for(item.tag);
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

    /// Pulls the keys new here since the last exchange (a check each, no
    /// push) and catches them up: a key another instance has used is
    /// decided on what it has left within about a round trip of its first
    /// request here, not an interval.
    async fn pull_fresh(&self) {
        let mut items = Vec::new();
        self.keys.retain(|tag, e| {
            if std::mem::take(&mut e.fresh) {
                items.push(Item {
                    tag,
                    rule: e.rule.clone(),
                    op: SyncOp::Charge(0),
                });
            }
            true
        });
        if items.is_empty() {
            return;
        }
        let call: Vec<SyncItem<'_>> = items
            .iter()
            .map(|i| SyncItem {
                rule: &i.rule,
                tag: i.tag,
                op: i.op,
            })
            .collect();
        let sent = self.clock.elapsed();
        if let Ok(reply) = self.home.store.exchange(&call, None).await {
            self.clock.learn(reply.now_us, sent, self.clock.elapsed());
            drop(call);
            self.absorb(&items, &reply);
        }
    }

    /// Records this instance as alive and learns how many are (and the
    /// store's time: an idle instance stays in step and shows as healthy).
    /// A failed heartbeat counts as a failed exchange only when no
    /// exchange was made (`alone`): an idle instance still notices.
    async fn heartbeat(&self, alone: bool) {
        let sent = self.clock.elapsed();
        if let Ok((now_us, live)) = self
            .home
            .store
            .heartbeat(&self.instance, live_ttl(self.config.interval))
            .await
        {
            let received = self.clock.elapsed();
            self.clock.learn(now_us, sent, received);
            self.home.health.alive(received.saturating_sub(sent));
            self.share.set_live(live as u64);
            if self.down.swap(false, Ordering::Relaxed) {
                tracing::info!(store = %self.home.store.describe(), "sync: store answers again");
            }
        } else if alone && self.home.health.failed() >= self.config.failures.max(1) {
            self.down.store(true, Ordering::Relaxed);
        }
    }
}

/// The most limiting remaining of a reply's limits.
pub(crate) fn min_remaining(limits: &[Verdict]) -> u64 {
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
