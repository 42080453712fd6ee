//! [`SyncStore`]: eventual mode, the exchange loop, and what lease mode
//! shares with it (`lease.rs` has the rest).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use spillway_core::{Clock, Decision, Limit, Mode, Nanos, Outcome, Rule, Verdict};
use spillway_redis::{RedisStore, SyncItem, SyncOp, SyncReply};
use spillway_store::{Charge, MemoryConfig, MemoryStore, Store, StoreError};

use crate::clock::StoreClock;
use crate::keys::{Entry, Keys};
use crate::lease::{Tick, grant, lease_ops, refused};
use crate::link::Link;
use crate::share::Share;
use crate::status::{Health, LinkStatus, SyncStatus, instance_id};
use crate::{SyncConfig, SyncMode, live_ttl};

/// Exchanges a key may go unused before it is no longer synced.
const IDLE_EXCHANGES: u32 = 10;

/// Most keys in one script call: Redis runs a call to its end before any
/// other client's command, and a call must come back within its timeout.
const MAX_ITEMS: usize = crate::link::MAX_PUSH_KEYS;

/// Most pushes to one store per exchange (each at most [`MAX_ITEMS`]
/// keys); what is left waits for the next exchange.
const MAX_PUSHES: usize = 8;

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
    /// Wakes the exchange loop to pull the keys in `fresh` at once.
    pub(crate) wake: tokio::sync::Notify,
    /// Keys new here since the last pull (eventual mode).
    pub(crate) fresh: Mutex<Vec<(u64, Arc<Rule>)>>,
    /// One exchange or pull at a time (the loop makes them in turn;
    /// [`SyncStore::exchange_now`] waits for the loop's).
    pub(crate) turn: tokio::sync::Mutex<()>,
    /// Exchanges started (not pulls): a key new here is gated until two
    /// more have (see [`gate`]).
    pub(crate) rounds: AtomicU64,
    /// The horizon of the last heartbeat (Redis's TIME, µs): every live
    /// instance has pushed all it admitted before it (see `gate`).
    horizon_seen: AtomicU64,
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
            fresh: Mutex::new(Vec::new()),
            turn: tokio::sync::Mutex::new(()),
            rounds: AtomicU64::new(0),
            horizon_seen: AtomicU64::new(0),
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

    /// Pulls the keys new here now (tests that want the early pulls done
    /// at a known point; the background loop makes them when woken).
    pub async fn pull_new_keys_now(&self) {
        self.inner.pull_fresh().await;
    }

    /// Runs one exchange now (tests and benchmarks that want one at a
    /// known point; the background loop runs them every interval anyway).
    pub async fn exchange_now(&self) {
        self.inner.exchange().await;
    }
}

fn link_status(r: &Remote, home: bool) -> LinkStatus {
    let waiting = r.link.lock().waiting();
    r.health.status(&r.name, home, waiting)
}

fn outage(what: &str) -> StoreError {
    StoreError::new(true, format!("{what} unreachable: sync stopped"))
}

impl Store for SyncStore {
    async fn decide(&self, charges: &[Charge<'_>], cost: u64) -> Result<Decision, StoreError> {
        self.inner.run(charges, cost, false).await
    }

    async fn charge(&self, charges: &[Charge<'_>], cost: u64) -> Result<Decision, StoreError> {
        self.inner.run(charges, cost, true).await
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

    /// Where decisions are made: in eventual mode this instance's memory
    /// (which holds every instance's admissions up to the last exchange,
    /// and its own since); in lease mode the home store, which counted
    /// every slice leased (a slice an instance holds is spent there
    /// already), since the memory store is not used.
    ///
    /// A key this instance decides on its share (the map of keys full, or
    /// the store unreachable) is seen as the store or memory hold it.
    async fn peek(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> Result<Vec<Vec<Verdict>>, StoreError> {
        match self.inner.config.mode {
            SyncMode::Eventual => Ok(self.inner.local.peek_now(charges, cost)),
            SyncMode::Lease => self.inner.home.store.peek(charges, cost).await,
        }
    }

    /// Makes the keys fresh everywhere this instance can reach: its
    /// memory and what it tracks of them (admissions not yet pushed, a
    /// lease's slice, a refusal), then the home store and every other
    /// region's store (each tried, whatever the others answer). No
    /// exchange runs meanwhile, so none brings the old counts back.
    ///
    /// Other instances' memories keep what they hold of the keys until
    /// it ages out (an exchange only ever catches a memory up, never
    /// down), and deltas already numbered in a push that was not answered
    /// yet are still sent: a reset is exact on the shared stores, and
    /// eventually everywhere.
    ///
    /// # Errors
    /// Each store that failed, by region (the home one first); transient
    /// if every failure was. The local state is reset whatever the
    /// stores answer.
    async fn reset(&self, charges: &[Charge<'_>]) -> Result<(), StoreError> {
        self.inner.reset(charges).await
    }
}

impl Inner {
    /// See [`SyncStore`]'s `Store::reset`.
    async fn reset(&self, charges: &[Charge<'_>]) -> Result<(), StoreError> {
        let _turn = self.turn.lock().await;
        self.local.reset_now(charges);
        for c in charges {
            self.keys.get(spillway_redis::tag(c), |e| {
                // As if new: nothing to push, no slice (the store's count
                // of it goes with the store's state), nothing refused.
                e.pending = 0;
                e.after = 0;
                e.units = 0;
                e.stale = 0;
                e.refused_until = Nanos::ZERO;
                e.verdict = None;
                e.remaining = u64::MAX;
                e.epoch = Nanos::ZERO;
            });
        }
        let stores = std::iter::once(&self.home).chain(&self.remotes);
        let failed = Mutex::new(Vec::new());
        join_all(stores.map(|r| {
            let failed = &failed;
            async move {
                if let Err(e) = r.store.reset_keys(charges).await {
                    failed.lock().push((r.name.as_str(), e));
                }
            }
        }))
        .await;
        let mut failed = failed.into_inner();
        // The home store first, then the regions in their order.
        let order = |name: &str| {
            std::iter::once(&self.home)
                .chain(&self.remotes)
                .position(|r| r.name == name)
        };
        failed.sort_by_key(|(name, _)| order(name));
        reset_failures(&failed)
    }

    /// The entry of `c`, made if new; `None` when the map is full.
    pub(crate) fn track<T>(
        &self,
        c: &Charge<'_>,
        tag: u64,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        let mut made = None;
        let out = self.keys.with(
            tag,
            || {
                let rule = self.keys.intern(c.rule);
                made = Some(rule.clone());
                Entry::new(rule, self.local.key_hash(c))
            },
            |e| {
                e.idle = 0;
                f(e)
            },
        );
        // A key new here is decided on this instance's memory alone until
        // it is caught up: the exchange loop pulls it at once.
        if let Some(rule) = made
            && self.config.mode == SyncMode::Eventual
        {
            self.fresh.lock().push((tag, rule));
            self.wake.notify_one();
        }
        out
    }

    /// Decides (or, if `after`, charges) by the mode; an error while the
    /// store is unreachable, so that `on_store_error` answers.
    async fn run(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
    ) -> Result<Decision, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(outage(&self.home.store.describe()));
        }
        Ok(match self.config.mode {
            SyncMode::Eventual => self.eventual(charges, cost, after),
            SyncMode::Lease => self.lease(charges, cost, after).await?,
        })
    }

    /// Eventual mode: decided in memory, admissions recorded, two locks
    /// of the key map per rule while it has room (the gate, then the
    /// record).
    fn eventual(&self, charges: &[Charge<'_>], cost: u64, after: bool) -> Decision {
        let tags: smallvec::SmallVec<[u64; 2]> = charges.iter().map(spillway_redis::tag).collect();
        // A key new here (or at its fixed window's start) is admitted up
        // to this instance's share until the others' first admissions can
        // have reached it; the cost is set aside at the gate, all rules or
        // none.
        let mut gated = smallvec::SmallVec::<[bool; 2]>::from_elem(false, charges.len());
        let now = self.clock.now();
        let at = GateAt {
            rounds: self.rounds.load(Ordering::Acquire),
            live: self.share.live(),
        };
        for (j, (c, &tag)) in charges.iter().zip(&tags).enumerate() {
            match self.track(c, tag, |e| gate(e, c.rule, now, &at, cost, after)) {
                // A key the map does not hold cannot be shared: its own
                // share of the limit is what this instance may admit for
                // it alone.
                None => {
                    self.ungate(&tags, &gated, cost);
                    return self
                        .share
                        .alone(charges, cost, after, true, spillway_redis::tag);
                }
                Some(Gate::Open) => {}
                Some(Gate::Taken) => gated[j] = true,
                Some(Gate::Shut) => {
                    self.ungate(&tags, &gated, cost);
                    return refused(charges, j, Nanos::from(self.config.interval), None);
                }
            }
        }
        let d = if after {
            self.local.charge_now(charges, cost)
        } else {
            self.local.decide_now(charges, cost)
        };
        let mut added = smallvec::SmallVec::<[u64; 2]>::from_elem(0, charges.len());
        if (d.allowed || after) && cost > 0 {
            for rd in &d.rules {
                if after || rd.outcome != Outcome::ShadowDenied {
                    added[rd.rule] = cost;
                }
            }
        }
        for (((c, &tag), &add), &held) in charges.iter().zip(&tags).zip(&added).zip(&gated) {
            let kept = self.track(c, tag, |e| {
                e.pending = e.pending.saturating_add(add);
                if held && add == 0 {
                    e.gated = e.gated.saturating_sub(cost);
                }
            });
            if kept.is_none() && add > 0 {
                // The map filled meanwhile: the admission still reaches
                // the store, through the share's pushes.
                self.share.owe(tag, c.rule, add);
            }
        }
        d
    }

    /// Gives back what the gate set aside for the keys of `tags` (where
    /// `held`) for a request that was not decided.
    fn ungate(&self, tags: &[u64], held: &[bool], cost: u64) {
        for (&tag, _) in tags.iter().zip(held).filter(|(_, h)| **h) {
            self.keys
                .get(tag, |e| e.gated = e.gated.saturating_sub(cost));
        }
    }
}

/// What the gate of eventual mode reads besides the key: exchanges
/// started and live instances.
#[derive(Clone, Copy)]
struct GateAt {
    rounds: u64,
    live: u64,
}

/// What the gate of a key new here says of a request.
enum Gate {
    /// The key is not new here: decide as usual.
    Open,
    /// New, and the cost fits this instance's share: it is set aside.
    Taken,
    /// New, and the cost does not fit: refused.
    Shut,
}

/// The gate of eventual mode, on a key's entry at `now`, with `rounds`
/// exchanges started and `live` instances: a key new here, or at the
/// start of its rule's shortest fixed window (a window's count starts
/// from 0 on every instance at once), is admitted here up to this
/// instance's share of it, `size / live` (at least 1) of its smallest
/// enforced limit, until the second exchange after its first request
/// *and* until every live instance has pushed all it admitted before
/// this instance's first exchange round after that request (the
/// heartbeats' horizon, which Redis computes from every instance's
/// rounds: see `lua/heartbeat.lua`).
///
/// Why: the first exchange pushes what was admitted here while the key
/// was new, and the others push theirs in their own exchanges; the gate
/// opens on a read that holds them all. It once assumed that exchanges
/// come every interval, so that by the second every other instance had
/// pushed: on a busy machine one came late, the read missed its share,
/// and 3 instances hammering one key admitted 510 in 4 fixed windows of
/// 100 (issue 35). Opened earlier,
/// at the first exchange or at the early pull of a new key, each instance
/// read a store that did not have the others' admissions yet, and each
/// admitted up to the whole limit: 3 instances admitted 300 of a limit
/// of 100 at a fresh key, and 1,200 in 4 fixed windows of 100. A charge
/// after the fact is never refused, but counts against the share. A
/// shadow rule never refuses, and is not gated.
fn gate(e: &mut Entry, rule: &Rule, now: Nanos, at: &GateAt, cost: u64, after: bool) -> Gate {
    let GateAt { rounds, live } = *at;
    if rule.mode() == Mode::Shadow {
        return Gate::Open;
    }
    if e.epoch <= now {
        e.epoch = epoch_end(rule, now);
        e.gate = rounds + 2;
        e.gated = 0;
        e.gate_after_us = 0;
    }
    if e.gate == 0 {
        return Gate::Open;
    }
    let share = rule
        .enforced_limits()
        .iter()
        .map(|l| (l.size() / live.max(1)).max(1))
        .min()
        .unwrap_or(u64::MAX);
    let total = e.gated.saturating_add(cost);
    if total > share && !after {
        return Gate::Shut;
    }
    e.gated = total;
    Gate::Taken
}

/// When the epoch of `rule` that `now` falls in ends: the end of its
/// shortest fixed window, or never.
fn epoch_end(rule: &Rule, now: Nanos) -> Nanos {
    rule.enforced_limits()
        .iter()
        .filter_map(|l| match l {
            Limit::FixedWindow(w) => {
                let w = w.window().as_u64();
                Some(Nanos((now.as_u64() - now.as_u64() % w).saturating_add(w)))
            }
            _ => None,
        })
        .min()
        .unwrap_or(Nanos::MAX)
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
        let _turn = self.turn.lock().await;
        self.rounds.fetch_add(1, Ordering::AcqRel);
        // Every key in use is read now: the early pull has nothing to add.
        self.fresh.lock().clear();
        let lease = self.config.mode == SyncMode::Lease;
        let now = self.clock.now();
        let mut drained: Vec<(u64, Arc<Rule>, u64, u64)> = Vec::new();
        let mut ops: Vec<Item> = Vec::new();
        let live = self.share.live();
        let ttl =
            u64::try_from(self.config.interval.saturating_mul(2).as_nanos()).unwrap_or(u64::MAX);
        let tick = Tick {
            now,
            ttl,
            live,
            idle_after: IDLE_EXCHANGES,
        };
        self.keys.retain(|tag, e| {
            let used = e.idle == 0;
            let moved = e.pending > 0 || e.after > 0;
            if !used
                && !moved
                && e.units == 0
                && e.stale == 0
                && e.idle >= IDLE_EXCHANGES
                && e.asking.is_none()
            {
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
        // only charges after the fact are new to it (`pending` holds every
        // unit admitted here, from a slice or charged after the fact).
        fan_out(
            &self.home,
            &self.remotes,
            drained.iter().map(|(tag, rule, pending, after)| {
                (*tag, rule, if lease { *after } else { *pending }, *pending)
            }),
        );
        // What this instance admitted alone while the store was gone: once
        // the store answers again (a heartbeat may say so first), in this
        // very exchange.
        if !self.down.load(Ordering::Relaxed) || self.share.active() {
            self.reconcile_share();
        }
        let remotes = self
            .remotes
            .iter()
            .map(|r| push_only(r, &self.instance, self.sync_timeout()));
        let (called, ()) = tokio::join!(self.exchange_home(ops), join_all(remotes));
        self.heartbeat(!called).await;
    }

    /// How long an exchange in the background may wait: the decisions'
    /// timeout, or an interval if longer (it carries many keys, and waits
    /// for nobody).
    fn sync_timeout(&self) -> Duration {
        self.home.store.timeout().max(self.config.interval)
    }

    /// Moves what the share admitted into the home and remote links, once.
    fn reconcile_share(&self) {
        let mut owed = self.share.owed.lock();
        while let Some(push) = owed.to_send().cloned() {
            fan_out(
                &self.home,
                &self.remotes,
                push.items
                    .iter()
                    .map(|(tag, rule, cost)| (*tag, rule, *cost, *cost)),
            );
            owed.answered(push.seq);
        }
    }

    /// The exchange with the home store: the pushes waiting (numbered, one
    /// after another, each at most [`MAX_ITEMS`] keys), then the ops of the
    /// keys in use in calls of at most [`MAX_ITEMS`], together; then the
    /// catch-up (eventual) or the leases granted. In lease mode the ops
    /// never share a call with a push: a replayed push runs every op of
    /// its call as a check. Returns whether it called the store.
    async fn exchange_home(&self, mut ops: Vec<Item>) -> bool {
        let eventual = self.config.mode == SyncMode::Eventual;
        let mut called = false;
        for _ in 0..MAX_PUSHES {
            let Some(push) = self.home.link.lock().to_send().cloned() else {
                break;
            };
            let mut items = charges_of(&push);
            if eventual {
                // A charge answers as a check would: its key needs no
                // check of its own.
                let pushed: HashSet<u64> = items.iter().map(|i| i.tag).collect();
                ops.retain(|i| !pushed.contains(&i.tag));
                let room = MAX_ITEMS.saturating_sub(items.len()).min(ops.len());
                items.extend(ops.drain(..room));
            }
            called = true;
            if self.call(&items, Some(push.seq), true).await.is_err() {
                // Sent again, unchanged, next time. The other ops still go:
                // a lease's refunds were taken out of its slices already.
                break;
            }
        }
        let chunks = ops.chunks(MAX_ITEMS).map(|c| self.call(c, None, true));
        called |= !ops.is_empty();
        join_all(chunks.map(|f| async move {
            let _ = f.await;
        }))
        .await;
        called
    }

    /// One call to the home store, taken in: the clock, the link's health,
    /// the push answered, the store back; then [`absorb`](Self::absorb).
    /// `round`: a call of an exchange round (not an early pull).
    async fn call(&self, items: &[Item], seq: Option<u64>, round: bool) -> Result<(), ()> {
        let call = sync_items(items);
        let sent = self.clock.elapsed();
        let push = seq.map(|n| (self.instance.as_str(), n));
        let reply = self
            .home
            .store
            .exchange_within(&call, push, self.sync_timeout())
            .await;
        drop(call);
        let received = self.clock.elapsed();
        match reply {
            Ok(reply) => {
                self.clock.learn(reply.now_us, sent, received);
                if let Some(n) = seq {
                    self.home.link.lock().answered(n);
                }
                self.home
                    .health
                    .ok(received.saturating_sub(sent), items.len());
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(store = %self.home.store.describe(), "sync: store answers again");
                }
                self.share.end();
                self.absorb(items, &reply, round);
                Ok(())
            }
            Err(e) => {
                let n = self.home.health.failed();
                if n >= self.config.failures.max(1) && !self.down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        store = %self.home.store.describe(),
                        error = %e.message(),
                        "sync: {n} exchanges failed in a row; decisions follow on_store_error until the store answers"
                    );
                }
                // Slices granted by a lost answer are lost (never used
                // twice); refunded units are gone from the entries already.
                Err(())
            }
        }
    }

    /// Takes in an exchange's answer: catches local states up with the
    /// store's (eventual), or hands out the slices granted (lease).
    fn absorb(&self, items: &[Item], reply: &SyncReply, round: bool) {
        let now = self.clock.now();
        let interval = Nanos::from(self.config.interval);
        let rounds = self.rounds.load(Ordering::Acquire);
        // Known before this call was sent: what the store holds of every
        // live instance's admissions up to then is in this reply.
        let horizon = self.horizon_seen.load(Ordering::Acquire);
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
                        // Read at the second exchange after it was new
                        // here, once every live instance has pushed all
                        // it admitted before the first: the others'
                        // first admissions are in, however late their
                        // exchanges came (see `gate`).
                        // The first exchange is one started after the key
                        // was new (`rounds`, under the turn lock, numbers
                        // this one; the gate was set to two past the one
                        // running then): an exchange already in flight
                        // when a window began ran at a store time before
                        // the others' first admissions of the window, and
                        // taken as the first, it opened the gate on a read
                        // that missed them (132 of 100 admitted in one
                        // window beside two CPU hogs, issue 35).
                        if e.gate != 0 {
                            if e.gate_after_us == 0 {
                                if round && rounds.saturating_add(1) >= e.gate {
                                    e.gate_after_us = reply.now_us.max(1);
                                }
                            } else if rounds >= e.gate && horizon >= e.gate_after_us {
                                e.gate = 0;
                            }
                        }
                        let unpushed = e.pending.saturating_add(waiting_after);
                        e.remaining = min_remaining(&r.limits);
                        let limits = item.rule.enforced_limits();
                        for (li, (limit, v)) in limits.iter().zip(&r.limits).enumerate() {
                            let here = self.local.limit_at(&item.rule, e.local, li, 0, now);
                            let behind = behind(limit, v, &here, unpushed);
                            if behind > 0 {
                                self.local.limit_at(&item.rule, e.local, li, behind, now);
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
        let _turn = self.turn.lock().await;
        let fresh = std::mem::take(&mut *self.fresh.lock());
        let items: Vec<Item> = fresh
            .into_iter()
            .map(|(tag, rule)| Item {
                tag,
                rule,
                op: SyncOp::Charge(0),
            })
            .collect();
        for chunk in items.chunks(MAX_ITEMS) {
            let _ = self.call(chunk, None, false).await;
        }
    }

    /// Records this instance as alive and learns how many are (and the
    /// store's time: an idle instance stays in step and shows as healthy).
    /// A failed heartbeat counts as a failed exchange only when no
    /// exchange was made (`alone`): an idle instance still notices.
    async fn heartbeat(&self, alone: bool) {
        let sent = self.clock.elapsed();
        // Every push so far applied: what this instance admitted before
        // this round began is in the store (the horizon, see `gate`).
        let synced = self.home.link.lock().waiting() == 0;
        if let Ok(beat) = self
            .home
            .store
            .beat(&self.instance, live_ttl(self.config.interval), synced)
            .await
        {
            let received = self.clock.elapsed();
            self.clock.learn(beat.now_us, sent, received);
            self.share.set_live(beat.live as u64);
            self.horizon_seen
                .fetch_max(beat.horizon_us, Ordering::AcqRel);
            // With no exchange to tell, the heartbeat says how the link is;
            // else the exchange's answer does (a store that answers small
            // heartbeats but not the exchanges is not in sync).
            if alone {
                self.home.health.alive(received.saturating_sub(sent));
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(store = %self.home.store.describe(), "sync: store answers again");
                }
            }
        } else if alone && self.home.health.failed() >= self.config.failures.max(1) {
            self.down.store(true, Ordering::Relaxed);
        }
    }
}

/// How many units this instance's state of `limit` is behind the store's
/// (`store`, a check after every push so far), given `unpushed` units it
/// admitted that the store has not counted: what to charge locally.
///
/// The buckets and GCRA are compared by what they owe, in units (`reset`,
/// the time back to full, over the time one unit takes): their state may
/// be past full (debt from charges after the fact, or from every
/// instance's admissions pushed at once), which `remaining`, never below
/// 0, cannot tell. Windows are compared by what they have left: their
/// debt ends with the window.
fn behind(limit: &Limit, store: &Verdict, here: &Verdict, unpushed: u64) -> u64 {
    let per_unit = match limit {
        Limit::TokenBucket(a) => Some(a.refill().interval()),
        Limit::LeakyBucket(a) => Some(a.leak().interval()),
        Limit::Shaper(a) => Some(a.leak().interval()),
        Limit::Gcra(a) => Some(a.rate().interval()),
        Limit::FixedWindow(_) | Limit::SlidingLog(_) | Limit::SlidingCounter(_) => None,
    };
    match per_unit {
        Some(per) => {
            let owed = |v: &Verdict| v.reset.as_u64() / per.max(1);
            (owed(store).saturating_add(unpushed)).saturating_sub(owed(here))
        }
        None => here
            .remaining
            .saturating_sub(store.remaining.saturating_sub(unpushed)),
    }
}

/// The most limiting remaining of a reply's limits.
pub(crate) fn min_remaining(limits: &[Verdict]) -> u64 {
    limits.iter().map(|v| v.remaining).min().unwrap_or(0)
}

/// Pushes the deltas waiting for another region's store (a few pushes
/// of at most [`MAX_ITEMS`] keys, one after another); a store that does
/// not answer keeps them waiting, and its health says so.
async fn push_only(r: &Remote, instance: &str, timeout: Duration) {
    for _ in 0..MAX_PUSHES {
        let Some(push) = r.link.lock().to_send().cloned() else {
            return;
        };
        let items = charges_of(&push);
        let call = sync_items(&items);
        let sent = std::time::Instant::now();
        match r
            .store
            .exchange_within(&call, Some((instance, push.seq)), timeout)
            .await
        {
            Ok(_) => {
                r.link.lock().answered(push.seq);
                r.health.ok(sent.elapsed().as_nanos() as u64, call.len());
            }
            Err(e) => {
                if r.health.failed() == 3 {
                    tracing::warn!(region = %r.name, error = %e.message(), "sync: region's store unreachable; its deltas wait");
                }
                return;
            }
        }
    }
}

/// Deltas for the stores: `(tag, rule, units for the home store, units
/// for the other regions' stores)`.
fn fan_out<'a>(
    home: &Remote,
    remotes: &[Remote],
    deltas: impl Iterator<Item = (u64, &'a Arc<Rule>, u64, u64)> + Clone,
) {
    {
        let mut link = home.link.lock();
        for (tag, rule, units, _) in deltas.clone() {
            link.add(tag, rule, units);
        }
    }
    for r in remotes {
        let mut link = r.link.lock();
        for (tag, rule, _, units) in deltas.clone() {
            link.add(tag, rule, units);
        }
    }
}

/// A push's deltas as items: a charge after the fact each.
fn charges_of(push: &crate::link::Push<Arc<Rule>>) -> Vec<Item> {
    push.items
        .iter()
        .map(|(tag, rule, cost)| Item {
            tag: *tag,
            rule: rule.clone(),
            op: SyncOp::Charge(*cost),
        })
        .collect()
}

/// Owned items as the store's call takes them.
pub(crate) fn sync_items(items: &[Item]) -> Vec<SyncItem<'_>> {
    items
        .iter()
        .map(|i| SyncItem {
            rule: &i.rule,
            tag: i.tag,
            op: i.op,
        })
        .collect()
}

/// One error for the stores that could not reset a key (`(region,
/// error)`), or none: transient if every failure was.
pub(crate) fn reset_failures(failed: &[(&str, StoreError)]) -> Result<(), StoreError> {
    if failed.is_empty() {
        return Ok(());
    }
    let what: Vec<String> = failed
        .iter()
        .map(|(name, e)| format!("region {name}: {}", e.message()))
        .collect();
    Err(StoreError::new(
        failed.iter().all(|(_, e)| e.transient()),
        format!("reset failed in {}", what.join("; ")),
    ))
}

/// Runs the futures together, to the end of the last.
async fn join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut futures: Vec<Option<std::pin::Pin<Box<F>>>> =
        futures.map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in futures.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{FixedWindow, Gcra, Rate};

    fn verdict(remaining: u64, reset: Nanos) -> Verdict {
        Verdict {
            allowed: true,
            limit: 10,
            remaining,
            reset,
            retry_after: Nanos::ZERO,
            wait: Nanos::ZERO,
        }
    }

    /// A GCRA the store has in debt (every instance's admissions pushed:
    /// 30 units owed, 10 of burst) is caught up by what it owes, which its
    /// `remaining` (0 either way) cannot tell; a window by what is left.
    #[test]
    fn states_are_caught_up_by_what_they_owe_or_have_left() {
        let g = Limit::Gcra(Gcra::new(Rate::new(10, Nanos::from_secs(1)).unwrap(), 10).unwrap());
        let store = verdict(0, Nanos::from_secs(3));
        let here = verdict(0, Nanos::from_secs(1));
        assert_eq!(behind(&g, &store, &here, 0), 20);
        assert_eq!(behind(&g, &store, &here, 5), 25, "admitted since the push");
        assert_eq!(behind(&g, &here, &store, 0), 0, "never raised");
        let w = Limit::FixedWindow(FixedWindow::new(10, Nanos::from_secs(60)).unwrap());
        assert_eq!(
            behind(&w, &verdict(3, Nanos::ZERO), &verdict(8, Nanos::ZERO), 1),
            6
        );
        assert_eq!(
            behind(&w, &verdict(8, Nanos::ZERO), &verdict(3, Nanos::ZERO), 0),
            0
        );
    }
}
