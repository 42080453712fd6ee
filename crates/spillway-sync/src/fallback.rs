//! The per-decision Redis store with a share to fall back on.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::time::Duration;

use spillway_core::{Decision, Verdict};
use spillway_redis::{RedisStore, SyncItem, SyncOp};
use spillway_store::{Charge, Store, StoreError};

use crate::clock::StoreClock;
use crate::live_ttl;
use crate::share::{Doubt, Share};
use crate::status::{Health, SyncStatus, instance_id};

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
    /// The name of the data Redis holds, as last read (see
    /// `RedisStore::incarnation`); empty until read.
    incarnation: Mutex<Arc<[u8]>>,
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
            incarnation: Mutex::new(Arc::from(&[][..])),
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
        let owed = i.share.owed.lock().waiting() + i.share.doubted();
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
            links: vec![i.health.status("home", true, owed)],
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

    fn decide_share(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        error: &StoreError,
    ) -> Option<Decision> {
        // A request sent to a Redis that did not answer in time may still
        // be run by it (a stopped server runs its queue when it resumes),
        // or not (the connection was lost, the server killed): decided
        // here, its charge waits until Redis answers again and says which
        // (`FallbackInner::tick`).
        let share = &self.inner.share;
        Some(if error.maybe_applied() {
            let doubt = Doubt {
                losses: self.inner.redis.link_losses(),
                incarnation: self.inner.incarnation.lock().clone(),
            };
            share.decide_in_doubt(charges, cost, after, &doubt, spillway_redis::tag)
        } else {
            share.decide(charges, cost, after, true, spillway_redis::tag)
        })
    }

    /// Redis's view, where decisions are made; an error when Redis cannot
    /// answer (the share is this instance's fallback, not the key's
    /// standing).
    async fn peek(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> Result<Vec<Vec<Verdict>>, StoreError> {
        self.inner.redis.peek(charges, cost).await
    }

    /// Resets the keys in Redis. What this instance's share admitted
    /// while Redis was unreachable and has not charged yet is still
    /// charged when Redis answers again.
    ///
    /// # Errors
    /// Redis could not reset them (named as the home region's failure).
    async fn reset(&self, charges: &[Charge<'_>]) -> Result<(), StoreError> {
        match self.inner.redis.reset_keys(charges).await {
            Ok(_) => Ok(()),
            Err(e) => crate::store::reset_failures(&[("home", e)]),
        }
    }
}

impl FallbackInner {
    async fn tick(&self) {
        let sent = std::time::Instant::now();
        let mark = self.share.mark();
        match self
            .redis
            .heartbeat(&self.instance, live_ttl(Duration::from_secs(1)))
            .await
        {
            Ok((_, live)) => self.share.set_live(live as u64),
            Err(_) => {
                self.health.failed();
                return;
            }
        }
        // Redis answered on its connection after every doubt recorded
        // before `mark`: with the connection and the data it had then, it
        // ran their calls; otherwise they are owed.
        let losses = self.redis.link_losses();
        match self.redis.incarnation(&self.instance).await {
            Ok(name) => {
                let name: Arc<[u8]> = Arc::from(name);
                *self.incarnation.lock() = name.clone();
                self.share.settle(mark, losses, &name);
                // Answered once both are: a doubt from now on is settled.
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
        if self.share.owed.lock().waiting() == 0
            && self.share.doubted() == 0
            && self.redis.is_healthy()
        {
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
        // A heartbeat a second; four a second until the first is answered
        // (with it the name of Redis's data, which settles later doubts)
        // and while sharing, so the shared counts are reconciled soon
        // after the store returns.
        let unanswered = inner.health.last_ok_ms.load(Ordering::Relaxed) == 0;
        if beat.is_multiple_of(4) || inner.share.active() || unanswered {
            inner.tick().await;
        }
        beat = beat.wrapping_add(1);
    }
}
