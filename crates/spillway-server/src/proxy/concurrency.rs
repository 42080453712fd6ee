//! The proxy's limit on calls in flight to its upstream, fixed or adaptive,
//! with a bounded priority queue in front of it.
//!
//! # Admission
//!
//! [`Concurrency::acquire`] takes a slot at once when fewer than
//! [`limit`](Concurrency::limit) calls are in flight and nobody waits.
//! Otherwise the request waits, at most `max_wait`, in a queue of at most
//! `max_queued` requests (all priorities together). Freed slots go to the
//! waiters strictly by priority (critical, then default, then sheddable),
//! first come first served within one. When the queue is full, an arrival
//! more important than the least important waiter takes that waiter's
//! place: the newest of the least important waiters is refused with
//! [`Shed::QueueFull`]; otherwise the arrival is. So under overload
//! sheddable traffic is refused first and critical traffic last.
//!
//! # Fair between clients
//!
//! Each request names its client (an address, hashed): [`Concurrency::acquire_for`].
//! While requests wait, a freed slot goes, within the most important
//! priority waiting, to the waiter whose client holds the fewest slots
//! (the oldest of those), not simply to the oldest: a client that keeps
//! the queue full of its own requests gets one slot in turn with each
//! other client waiting, however many it queued, so holding slots and
//! queueing cannot turn every other client's request into a 503. Nobody
//! waiting, a free slot is taken at once, whoever asks (the limit stays
//! work-conserving for one busy client).
//!
//! A slot is held by a [`Permit`]. [`Permit::done`] returns it with a
//! sample for the controller; dropping it (the client left) returns it
//! without one. A waiter that gives up leaves the queue, and a slot granted
//! to a waiter at the moment it gives up goes to the next one: the grant
//! travels as a `Permit`, whose drop returns the slot wherever it happens.
//!
//! # The adaptive limit
//!
//! With [`LimitKind::Adaptive`] a gradient controller moves the limit
//! between `min` and `max` (it starts at 16 clamped to that range). Finished
//! calls are gathered into windows; a window closes once it holds at least
//! 16 samples and either as many samples as the limit (capped at 1024) or
//! one second has passed since its first sample. Sixteen samples keep one
//! slow call from deciding at low rates; the second keeps a high limit
//! reacting when calls become slow. At each close:
//!
//! - `observed` is the window's latency at the `health:` percentile (the
//!   median without a target);
//! - `reference` is the target's latency, or without one twice the
//!   no-load latency: the smallest latency seen;
//! - `gradient = clamp(reference / observed, 0.5, 1.0)`;
//! - `new = limit × gradient + √limit`, but the limit only grows if the
//!   window saw it at least half used (in flight reached half the limit, or
//!   a request queued): an idle limit proves nothing;
//! - the limit moves a fifth of the way to `new` (smoothing the noise of a
//!   window), clamped to `[min, max]`;
//! - a window in which more than half the calls failed instead cuts the
//!   limit to 0.9 of itself: an upstream that fails fast looks fast. Failed
//!   calls otherwise count as samples at their latency.
//!
//! At equilibrium `limit × (1 − gradient) = √limit`: the limit settles a
//! little past the point where `observed` meets `reference`, so latency
//! sits a little above the target (for an upstream of `W` workers taking
//! `S` each and a target `T`, near `W·T/S + √(W·T/S)`). The `√limit` term is
//! the probing that finds new capacity.
//!
//! The no-load latency falls whenever a window sees a smaller one. It only
//! rises (a fifth of the way to the window's smallest latency) on windows
//! that show the upstream unloaded by the proxy: the limit not half used,
//! or held at `min`. Under saturation every call queues, so the smallest
//! latency of a busy window is queueing, not the upstream; a minimum that
//! decayed toward it would raise the reference, the limit with it, and
//! creep to `max`. An upstream that really became slower cuts the limit to
//! `min` (or idles it), and there its new no-load latency is learnt.
//!
//! When the limit rises, waiters get the new slots at once; when it falls,
//! calls in flight finish normally and no slot is granted until fewer than
//! the limit are in flight. A [`LimitKind::Fixed`] limit never moves.
//!
//! Time is a parameter: the controller sees time only as the `now` given
//! to [`Permit::done`]. Only waiting reads Tokio's clock (`max_wait`), so
//! tests pause it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use spillway_core::Priority;
use tokio::sync::oneshot;

use crate::health::HealthSettings;

/// How the limit on calls in flight is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// A fixed limit (0 is read as 1: a limit of none would refuse all).
    Fixed(u32),
    /// A limit the controller moves between `min` and `max` (`min` 0 is
    /// read as 1; `max` below `min` as `min`).
    Adaptive {
        /// The lowest it goes.
        min: u32,
        /// The highest it goes.
        max: u32,
    },
}

/// The limit and the queue in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencySettings {
    /// Fixed or adaptive.
    pub limit: LimitKind,
    /// How long a request may wait for a slot; zero: no waiting.
    pub max_wait: Duration,
    /// How many requests may wait at once, all priorities together.
    pub max_queued: usize,
}

/// Why a request was refused a slot: the answer is a 503 with
/// [`Concurrency::retry_after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shed {
    /// The queue was full of requests at least as important.
    QueueFull,
    /// No slot came free within `max_wait`.
    Timeout,
}

impl fmt::Display for Shed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shed::QueueFull => "the upstream's queue is full",
            Shed::Timeout => "no upstream slot came free in time",
        })
    }
}

impl std::error::Error for Shed {}

/// What a waiter receives: its slot, or the news it was evicted.
type Grant = Result<Permit, Shed>;

/// The in-flight limit and its queue. `Send + Sync`: one per proxy, behind
/// an `Arc` shared by every connection.
pub struct Concurrency {
    max_wait: Duration,
    max_queued: usize,
    state: Mutex<State>,
    /// Refusals by priority (`rank` order), read by metrics without the lock.
    shed: [AtomicU64; 3],
}

impl fmt::Debug for Concurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("Concurrency")
            .field("limit", &state.limit)
            .field("in_flight", &state.in_flight)
            .field("queued", &state.queued)
            .field("max_wait", &self.max_wait)
            .field("max_queued", &self.max_queued)
            .finish()
    }
}

/// Index of a priority in the queues and counters: least important first.
fn rank(p: Priority) -> usize {
    match p {
        Priority::Sheddable => 0,
        Priority::Default => 1,
        Priority::Critical => 2,
    }
}

/// A client, as [`Concurrency::acquire_for`] names it.
pub type Client = u64;

struct State {
    limit: u32,
    in_flight: u32,
    /// Waiters by `rank`, each keyed by arrival number (first is oldest),
    /// with their client.
    waiting: [BTreeMap<u64, (Client, oneshot::Sender<Grant>)>; 3],
    /// Slots held, by client (no entry: none). At most one entry per slot
    /// in flight.
    holding: HashMap<Client, u32>,
    queued: usize,
    next_id: u64,
    /// `None` for a fixed limit.
    controller: Option<Gradient>,
}

impl State {
    /// Takes a slot for `client`.
    fn take(&mut self, client: Client) {
        self.in_flight += 1;
        *self.holding.entry(client).or_insert(0) += 1;
        if let Some(c) = &mut self.controller {
            c.note_in_flight(self.in_flight);
        }
    }

    /// Returns a slot `client` held.
    fn give_back(&mut self, client: Client) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.holding.entry(client) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// Slots `client` holds.
    fn held_by(&self, client: Client) -> u32 {
        self.holding.get(&client).copied().unwrap_or(0)
    }

    /// The next waiter to grant: of the most important priority waiting,
    /// the oldest of those whose client holds the fewest slots.
    fn next_waiter(&mut self) -> Option<(Client, oneshot::Sender<Grant>)> {
        let q = self.waiting.iter_mut().rev().find(|q| !q.is_empty())?;
        let (&oldest, &(client, _)) = q.first_key_value()?;
        let mut pick = (self.holding.get(&client).copied().unwrap_or(0), oldest);
        // The oldest holds nothing (the common case): no scan.
        if pick.0 > 0 {
            for (&id, &(c, _)) in q.iter() {
                let held = self.holding.get(&c).copied().unwrap_or(0);
                if held < pick.0 {
                    pick = (held, id);
                    if held == 0 {
                        break;
                    }
                }
            }
        }
        q.remove(&pick.1)
    }

    /// Removes a waiter if it still waits; true if it did.
    fn leave(&mut self, priority: Priority, id: u64) -> bool {
        let gone = self.waiting[rank(priority)].remove(&id).is_some();
        if gone {
            self.queued -= 1;
        }
        gone
    }

    /// Grants free slots to waiters, most important and oldest first. The
    /// senders returned are owed a permit each, sent after the lock is let
    /// go (a permit that comes back from a waiter that left must be
    /// dropped without the lock held).
    fn grants(&mut self) -> Vec<(Client, oneshot::Sender<Grant>)> {
        let mut out = Vec::new();
        while self.in_flight < self.limit {
            let Some((client, tx)) = self.next_waiter() else {
                break;
            };
            self.queued -= 1;
            self.take(client);
            out.push((client, tx));
        }
        out
    }
}

impl Concurrency {
    /// A limit and queue as `settings` say; `health`'s latency target (at
    /// its percentile) steers an adaptive limit (see the
    /// [module docs](self)) and is ignored by a fixed one.
    /// Out-of-range settings are read as the nearest sensible ones (see
    /// [`LimitKind`]); validating them for the user is the config's job.
    pub fn new(settings: ConcurrencySettings, health: &HealthSettings) -> Arc<Concurrency> {
        let (limit, controller) = match settings.limit {
            LimitKind::Fixed(n) => (n.max(1), None),
            LimitKind::Adaptive { min, max } => {
                let g = Gradient::new(min, max, health);
                (g.limit(), Some(g))
            }
        };
        Arc::new(Concurrency {
            max_wait: settings.max_wait,
            max_queued: settings.max_queued,
            state: Mutex::new(State {
                limit,
                in_flight: 0,
                waiting: Default::default(),
                holding: HashMap::new(),
                queued: 0,
                next_id: 0,
                controller,
            }),
            shed: Default::default(),
        })
    }

    /// [`acquire_for`](Self::acquire_for) for an unnamed client (all such
    /// requests are one client to the fair share).
    ///
    /// # Errors
    /// As [`acquire_for`](Self::acquire_for).
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Result<Permit, Shed> {
        self.acquire_for(priority, 0).await
    }

    /// Waits for a slot to call the upstream for `client`, as the
    /// [module docs](self) describe.
    ///
    /// # Errors
    ///
    /// [`Shed::QueueFull`] when the queue is full of requests at least as
    /// important (or `max_queued` is 0); [`Shed::Timeout`] when no slot
    /// came free within `max_wait` (at once when it is zero).
    ///
    /// # Panics
    ///
    /// When it has to wait outside a Tokio runtime with its timer enabled.
    pub async fn acquire_for(
        self: &Arc<Self>,
        priority: Priority,
        client: Client,
    ) -> Result<Permit, Shed> {
        let mut waiter = {
            let mut state = self.state.lock();
            if state.queued == 0 && state.in_flight < state.limit {
                state.take(client);
                return Ok(Permit::new(self, client));
            }
            if self.max_wait.is_zero() {
                return Err(self.count_shed(priority, Shed::Timeout));
            }
            if state.queued >= self.max_queued {
                // Evict the newest of the least important waiters, if they
                // are less important than this arrival.
                let evict = (0..rank(priority))
                    .find_map(|r| state.waiting[r].pop_last().map(|(_, (_, tx))| (r, tx)));
                let Some((evicted, tx)) = evict else {
                    return Err(self.count_shed(priority, Shed::QueueFull));
                };
                state.queued -= 1;
                self.shed[evicted].fetch_add(1, Ordering::Relaxed);
                // Carries no permit, so it may be sent under the lock.
                let _ = tx.send(Err(Shed::QueueFull));
            }
            let id = state.next_id;
            state.next_id += 1;
            let (tx, rx) = oneshot::channel();
            state.waiting[rank(priority)].insert(id, (client, tx));
            state.queued += 1;
            if let Some(c) = &mut state.controller {
                c.note_queue();
            }
            Waiter {
                owner: Arc::clone(self),
                priority,
                id,
                rx,
                settled: false,
            }
        };
        let outcome = match tokio::time::timeout(self.max_wait, &mut waiter.rx).await {
            Ok(grant) => grant.unwrap_or(Err(Shed::Timeout)),
            Err(_elapsed) => {
                let left = self.state.lock().leave(priority, waiter.id);
                if left {
                    Err(self.count_shed(priority, Shed::Timeout))
                } else {
                    // Granted or evicted as time ran out: the sender is
                    // delivering it now.
                    (&mut waiter.rx).await.unwrap_or(Err(Shed::Timeout))
                }
            }
        };
        waiter.settled = true;
        outcome
    }

    /// The current limit on calls in flight.
    pub fn limit(&self) -> u32 {
        self.state.lock().limit
    }

    /// How many calls hold a slot (can exceed the limit just after it fell).
    pub fn in_flight(&self) -> u32 {
        self.state.lock().in_flight
    }

    /// How many requests wait for a slot.
    pub fn queued(&self) -> usize {
        self.state.lock().queued
    }

    /// How many slots `client` holds.
    pub fn held_by(&self, client: Client) -> u32 {
        self.state.lock().held_by(client)
    }

    /// How many requests of priority `p` were refused so far.
    pub fn shed_total(&self, p: Priority) -> u64 {
        self.shed[rank(p)].load(Ordering::Relaxed)
    }

    /// What a 503 tells the client to wait: `max_wait` rounded up to whole
    /// seconds, at least one second.
    pub fn retry_after(&self) -> Duration {
        let w = self.max_wait;
        let secs = w.as_secs().saturating_add(u64::from(w.subsec_nanos() > 0));
        Duration::from_secs(secs.max(1))
    }

    fn count_shed(&self, p: Priority, why: Shed) -> Shed {
        self.shed[rank(p)].fetch_add(1, Ordering::Relaxed);
        why
    }

    /// Returns a slot, with a sample for the controller if the call ended,
    /// and hands free slots to waiters.
    fn release(self: &Arc<Self>, client: Client, sample: Option<(Instant, Duration, bool)>) {
        let mut state = self.state.lock();
        debug_assert!(state.in_flight > 0, "a permit returned twice");
        state.give_back(client);
        if let Some((now, latency, ok)) = sample {
            let (in_flight, queued) = (state.in_flight, state.queued);
            if let Some(c) = &mut state.controller
                && c.sample(now, latency, ok, in_flight, queued > 0)
            {
                state.limit = c.limit();
            }
        }
        self.settle(state);
    }

    /// Grants what can be granted, then delivers the permits without the
    /// lock. A permit a waiter can no longer take (it left between the
    /// grant and the delivery) is taken back, and its slot offered again.
    fn settle<'a>(self: &'a Arc<Self>, mut state: MutexGuard<'a, State>) {
        loop {
            let grants = state.grants();
            drop(state);
            let mut returned = Vec::new();
            for (client, tx) in grants {
                if let Err(Ok(mut permit)) = tx.send(Ok(Permit::new(self, client))) {
                    permit.owner = None;
                    returned.push(client);
                }
            }
            if returned.is_empty() {
                return;
            }
            state = self.state.lock();
            for client in returned {
                state.give_back(client);
            }
        }
    }
}

/// A request in the queue; leaves it when dropped (the client went away).
struct Waiter {
    owner: Arc<Concurrency>,
    priority: Priority,
    id: u64,
    rx: oneshot::Receiver<Grant>,
    /// Its outcome is known: nothing to undo.
    settled: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.settled {
            self.owner.state.lock().leave(self.priority, self.id);
        }
        // A permit granted meanwhile is dropped with `rx`, after the lock
        // is let go, and goes to the next waiter.
    }
}

/// One slot of the in-flight limit. Return it with [`done`](Permit::done)
/// when the upstream call ends; dropping it returns the slot without a
/// sample (the client left before the upstream answered).
#[derive(Debug)]
pub struct Permit {
    /// `None` once returned.
    owner: Option<Arc<Concurrency>>,
    /// Whose slot it is.
    client: Client,
}

impl Permit {
    fn new(owner: &Arc<Concurrency>, client: Client) -> Permit {
        Permit {
            owner: Some(Arc::clone(owner)),
            client,
        }
    }

    /// Returns the slot after an upstream call that ended at `now`, took
    /// `latency`, and succeeded (`ok`) or failed (a 5xx, a connection
    /// failure, a timeout): a sample for the adaptive controller.
    pub fn done(mut self, now: Instant, latency: Duration, ok: bool) {
        if let Some(owner) = self.owner.take() {
            owner.release(self.client, Some((now, latency, ok)));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            owner.release(self.client, None);
        }
    }
}

/// A window closes with at least this many samples...
const WINDOW_MIN_SAMPLES: usize = 16;
/// ...and as many as the limit, up to this many...
const WINDOW_MAX_SAMPLES: usize = 1024;
/// ...or once this long has passed since its first sample.
const WINDOW_MAX_AGE: Duration = Duration::from_secs(1);
/// The share of the way to the new limit taken at each close.
const SMOOTHING: f64 = 0.2;
/// The limit after a window of mostly failures, as a share of the old one.
const ERROR_CUT: f64 = 0.9;
/// Where the adaptive limit starts (clamped to `[min, max]`).
const INITIAL_LIMIT: u32 = 16;

/// The adaptive limit's controller: a pure state machine fed samples and
/// the time they ended, described in the [module docs](self).
#[derive(Debug)]
struct Gradient {
    min: u32,
    max: u32,
    /// The target latency in nanoseconds and its percentile (0..=100).
    target: Option<(f64, f64)>,
    /// The limit before rounding.
    limit: f64,
    /// The window's latencies in nanoseconds.
    window: Vec<u64>,
    errors: usize,
    started: Option<Instant>,
    /// The most calls in flight seen during the window.
    peak: u32,
    /// Whether a request queued during the window.
    queued: bool,
    /// The no-load latency estimate in nanoseconds.
    no_load: Option<f64>,
}

impl Gradient {
    fn new(min: u32, max: u32, health: &HealthSettings) -> Gradient {
        let min = min.max(1);
        let max = max.max(min);
        let target = health.latency_target.map(|latency| {
            let p = if health.percentile.is_nan() {
                100.0
            } else {
                health.percentile.clamp(0.0, 100.0)
            };
            (latency.as_nanos() as f64, p)
        });
        Gradient {
            min,
            max,
            target,
            limit: f64::from(INITIAL_LIMIT.clamp(min, max)),
            window: Vec::new(),
            errors: 0,
            started: None,
            peak: 0,
            queued: false,
            no_load: None,
        }
    }

    fn limit(&self) -> u32 {
        (self.limit.round() as u32).clamp(self.min, self.max)
    }

    fn note_in_flight(&mut self, in_flight: u32) {
        self.peak = self.peak.max(in_flight);
    }

    fn note_queue(&mut self) {
        self.queued = true;
    }

    /// Takes one finished call; when it closes a window, moves the limit
    /// and returns true. `in_flight` and `queued` say how busy the limit is
    /// now, to start the next window's record of use.
    fn sample(
        &mut self,
        now: Instant,
        latency: Duration,
        ok: bool,
        in_flight: u32,
        queued: bool,
    ) -> bool {
        let started = *self.started.get_or_insert(now);
        self.window
            .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        self.errors += usize::from(!ok);
        let n = self.window.len();
        let full = n >= (self.limit() as usize).clamp(WINDOW_MIN_SAMPLES, WINDOW_MAX_SAMPLES);
        let old = now.saturating_duration_since(started) >= WINDOW_MAX_AGE;
        if n < WINDOW_MIN_SAMPLES || !(full || old) {
            return false;
        }
        self.close();
        self.window.clear();
        self.errors = 0;
        self.started = None;
        self.peak = in_flight;
        self.queued = queued;
        true
    }

    fn close(&mut self) {
        let current = self.limit();
        let used = self.queued || u64::from(self.peak) * 2 >= u64::from(current);
        let smallest = self.window.iter().copied().min().unwrap_or(0) as f64;
        self.no_load = Some(match self.no_load {
            Some(m) if smallest < m => smallest,
            Some(m) if !used || current == self.min => m + (smallest - m) * SMOOTHING,
            Some(m) => m,
            None => smallest,
        });
        if self.errors * 2 > self.window.len() {
            self.limit = (self.limit * ERROR_CUT).clamp(f64::from(self.min), f64::from(self.max));
            return;
        }
        let (reference, percentile) = match self.target {
            Some(t) => t,
            None => (2.0 * self.no_load.unwrap_or(smallest), 50.0),
        };
        let observed = percentile_of(&mut self.window, percentile) as f64;
        let gradient = if observed > 0.0 {
            (reference / observed).clamp(0.5, 1.0)
        } else {
            1.0
        };
        let mut new = self.limit * gradient + self.limit.sqrt();
        if !used {
            new = new.min(self.limit);
        }
        self.limit += (new - self.limit) * SMOOTHING;
        self.limit = self.limit.clamp(f64::from(self.min), f64::from(self.max));
    }
}

/// The value at `percentile` (0..=100) of a non-empty slice: the smallest
/// with at least that share of the values at or below it.
fn percentile_of(values: &mut [u64], percentile: f64) -> u64 {
    let n = values.len();
    let rank = ((percentile / 100.0 * n as f64).ceil() as usize).clamp(1, n);
    *values.select_nth_unstable(rank - 1).1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, HashMap};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use proptest::prelude::*;

    const S: Priority = Priority::Sheddable;
    const D: Priority = Priority::Default;
    const C: Priority = Priority::Critical;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn fixed(limit: u32, max_wait: Duration, max_queued: usize) -> Arc<Concurrency> {
        Concurrency::new(
            ConcurrencySettings {
                limit: LimitKind::Fixed(limit),
                max_wait,
                max_queued,
            },
            &HealthSettings::default(),
        )
    }

    /// A latency target at a percentile, as `health:` gives it.
    fn target(latency: Duration, percentile: f64) -> HealthSettings {
        HealthSettings {
            latency_target: Some(latency),
            percentile,
            ..HealthSettings::default()
        }
    }

    fn adaptive(min: u32, max: u32, target: Option<HealthSettings>) -> Arc<Concurrency> {
        Concurrency::new(
            ConcurrencySettings {
                limit: LimitKind::Adaptive { min, max },
                max_wait: ms(500),
                max_queued: 1024,
            },
            &target.unwrap_or_default(),
        )
    }

    type Acquire = Pin<Box<dyn Future<Output = Result<Permit, Shed>> + Send>>;

    /// Starts an acquire. Unconstrained by Tokio's cooperative budget: the
    /// tests poll hundreds of them in one go, and past the budget a ready
    /// channel would answer `Pending`.
    fn start(c: &Arc<Concurrency>, p: Priority) -> Acquire {
        start_for(c, p, 0)
    }

    /// [`start`] for `client`.
    fn start_for(c: &Arc<Concurrency>, p: Priority, client: Client) -> Acquire {
        let c = Arc::clone(c);
        Box::pin(tokio::task::unconstrained(async move {
            c.acquire_for(p, client).await
        }))
    }

    /// Polls once with a waker that does nothing: the tests poll again
    /// themselves after whatever should have woken it.
    fn poll(f: &mut Acquire) -> Poll<Result<Permit, Shed>> {
        f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }

    /// Acquires without waiting: a slot must be free.
    fn now(c: &Arc<Concurrency>, p: Priority) -> Permit {
        match poll(&mut start(c, p)) {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("no slot at once: {other:?}"),
        }
    }

    /// Starts an acquire that must queue.
    fn queue(c: &Arc<Concurrency>, p: Priority) -> Acquire {
        let mut f = start(c, p);
        assert!(poll(&mut f).is_pending(), "a {p} request did not queue");
        f
    }

    /// Issue 28: a client holding every slot and queueing many more
    /// requests gets one freed slot in turn with each other client
    /// waiting: a later client's request is granted before the first
    /// client's older ones (priority still comes first).
    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_to_the_waiting_client_holding_fewest() {
        let c = fixed(2, ms(1000), 100);
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut f = start_for(&c, D, 1);
            let Poll::Ready(Ok(p)) = poll(&mut f) else {
                panic!("a free slot");
            };
            held.push(p);
        }
        let mut greedy: Vec<Acquire> = (0..10).map(|_| start_for(&c, D, 1)).collect();
        for f in &mut greedy {
            assert!(poll(f).is_pending());
        }
        let mut other = start_for(&c, D, 2);
        assert!(poll(&mut other).is_pending());
        let mut sheddable = start_for(&c, S, 3);
        assert!(poll(&mut sheddable).is_pending());
        drop(held.pop());
        let Poll::Ready(Ok(p)) = poll(&mut other) else {
            panic!("client 2 first");
        };
        held.push(p);
        assert!(greedy.iter_mut().all(|f| poll(f).is_pending()));
        assert_eq!((c.held_by(1), c.held_by(2)), (1, 1));
        // Client 1's slot comes back: its oldest waiter goes next (it holds
        // none now), before the less important client 3.
        drop(held.remove(0));
        let Poll::Ready(Ok(p)) = poll(&mut greedy[0]) else {
            panic!("client 1's oldest next");
        };
        held.push(p);
        assert!(poll(&mut sheddable).is_pending());
    }

    #[test]
    fn futures_and_permits_are_send() {
        fn send<T: Send>(_: &T) {}
        let c = fixed(1, ms(10), 10);
        send(&c.acquire(D));
        send(&now(&c, D));
        fn sync<T: Send + Sync>() {}
        sync::<Concurrency>();
    }

    #[test]
    fn bad_settings_are_read_as_the_nearest_sensible_ones() {
        assert_eq!(fixed(0, ms(1), 1).limit(), 1);
        assert_eq!(adaptive(0, 0, None).limit(), 1);
        assert_eq!(adaptive(40, 10, None).limit(), 40);
        assert_eq!(adaptive(1, 8, None).limit(), 8);
        assert_eq!(adaptive(1, 1000, None).limit(), INITIAL_LIMIT);
        let nan = target(ms(10), f64::NAN);
        let g = Gradient::new(1, 10, &nan);
        assert_eq!(g.target, Some((1e7, 100.0)));
    }

    #[test]
    fn retry_after_is_max_wait_in_whole_seconds_at_least_one() {
        for (wait, secs) in [
            (Duration::ZERO, 1),
            (ms(500), 1),
            (ms(1000), 1),
            (ms(1001), 2),
            (Duration::from_secs(7), 7),
            (Duration::MAX, u64::MAX),
        ] {
            let c = fixed(1, wait, 1);
            assert_eq!(c.retry_after(), Duration::from_secs(secs), "{wait:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_taken_at_once_up_to_the_limit_then_queue() {
        let c = fixed(2, ms(500), 10);
        let a = now(&c, D);
        let _b = now(&c, S);
        assert_eq!(c.in_flight(), 2);
        let mut w = queue(&c, C);
        assert_eq!(c.queued(), 1);
        a.done(Instant::now(), ms(5), true);
        let Poll::Ready(Ok(_permit)) = poll(&mut w) else {
            panic!("the freed slot was not granted");
        };
        assert_eq!((c.in_flight(), c.queued()), (2, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_by_priority_then_arrival() {
        let c = fixed(1, Duration::from_secs(60), 10);
        let mut held = Some(now(&c, D));
        let order = [
            (S, "s1"),
            (D, "d1"),
            (C, "c1"),
            (S, "s2"),
            (D, "d2"),
            (C, "c2"),
        ];
        let mut waiting: Vec<_> = order
            .iter()
            .map(|&(p, name)| (name, queue(&c, p)))
            .collect();
        let mut granted = Vec::new();
        while let Some(permit) = held.take() {
            drop(permit);
            for (name, f) in &mut waiting {
                if let Poll::Ready(r) = poll(f) {
                    granted.push(*name);
                    held = Some(r.expect("granted"));
                }
            }
            waiting.retain(|(name, _)| !granted.contains(name));
            // Exactly one slot: one grant at a time.
            assert_eq!(c.in_flight(), u32::from(held.is_some()));
        }
        assert_eq!(granted, ["c1", "c2", "d1", "d2", "s1", "s2"]);
        assert_eq!((c.in_flight(), c.queued()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_sheds_the_newest_of_the_least_important() {
        let c = fixed(1, Duration::from_secs(60), 2);
        let _held = now(&c, D);
        let mut s1 = queue(&c, S);
        let mut s2 = queue(&c, S);
        // Full. A default request takes the newest sheddable's place.
        let mut d1 = queue(&c, D);
        assert!(matches!(poll(&mut s2), Poll::Ready(Err(Shed::QueueFull))));
        assert!(poll(&mut s1).is_pending());
        let mut d2 = queue(&c, D);
        assert!(matches!(poll(&mut s1), Poll::Ready(Err(Shed::QueueFull))));
        // Two defaults wait: another default is refused, not swapped.
        assert!(matches!(
            poll(&mut start(&c, D)),
            Poll::Ready(Err(Shed::QueueFull))
        ));
        // A sheddable one too.
        assert!(matches!(
            poll(&mut start(&c, S)),
            Poll::Ready(Err(Shed::QueueFull))
        ));
        // A critical one evicts the newer default.
        let _c1 = queue(&c, C);
        assert!(matches!(poll(&mut d2), Poll::Ready(Err(Shed::QueueFull))));
        assert!(poll(&mut d1).is_pending());
        assert_eq!(c.queued(), 2);
        assert_eq!(c.shed_total(S), 3);
        assert_eq!(c.shed_total(D), 2);
        assert_eq!(c.shed_total(C), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_queue_and_no_wait_refuse_at_once() {
        let c = fixed(1, ms(500), 0);
        let _held = now(&c, D);
        assert!(matches!(
            poll(&mut start(&c, C)),
            Poll::Ready(Err(Shed::QueueFull))
        ));
        let c = fixed(1, Duration::ZERO, 10);
        let _held = now(&c, D);
        assert!(matches!(
            poll(&mut start(&c, C)),
            Poll::Ready(Err(Shed::Timeout))
        ));
        assert_eq!(c.queued(), 0);
        assert_eq!(c.shed_total(C), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_after_max_wait() {
        let c = fixed(1, ms(500), 10);
        let held = now(&c, D);
        let mut w = queue(&c, S);
        tokio::time::advance(ms(499)).await;
        assert!(poll(&mut w).is_pending());
        tokio::time::advance(ms(2)).await;
        assert!(matches!(poll(&mut w), Poll::Ready(Err(Shed::Timeout))));
        assert_eq!((c.queued(), c.shed_total(S)), (0, 1));
        drop(held);
        assert_eq!(c.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_granted_as_time_runs_out_is_taken() {
        let c = fixed(1, ms(500), 10);
        let held = now(&c, D);
        let mut w = queue(&c, D);
        // The deadline passes, and the slot frees before the waiter looks.
        tokio::time::advance(ms(600)).await;
        drop(held);
        assert!(matches!(poll(&mut w), Poll::Ready(Ok(_))));
        assert_eq!((c.in_flight(), c.shed_total(D)), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_frees_its_place() {
        let c = fixed(1, ms(500), 10);
        let held = now(&c, D);
        let w = queue(&c, D);
        assert_eq!(c.queued(), 1);
        drop(w);
        assert_eq!(c.queued(), 0);
        drop(held);
        assert_eq!(c.in_flight(), 0);
        assert_eq!(c.shed_total(D), 0, "a client leaving is not shedding");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_granted_to_a_waiter_that_just_left_is_passed_on() {
        let c = fixed(1, ms(500), 10);
        let held = now(&c, D);
        let leaver = queue(&c, C);
        let mut next = queue(&c, D);
        // The slot goes to the critical waiter, which is gone before it
        // looks: the permit waiting in its channel must go on.
        held.done(Instant::now(), ms(1), true);
        assert_eq!((c.in_flight(), c.queued()), (1, 1));
        drop(leaver);
        let Poll::Ready(Ok(permit)) = poll(&mut next) else {
            panic!("the slot was lost");
        };
        assert_eq!((c.in_flight(), c.queued()), (1, 0));
        drop(permit);
        assert_eq!(c.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_limit_never_moves() {
        let c = fixed(3, ms(500), 10);
        let t0 = Instant::now();
        for i in 0..2000 {
            let p = now(&c, D);
            let slow = if i % 2 == 0 {
                Duration::from_secs(5)
            } else {
                ms(1)
            };
            p.done(t0 + ms(i), slow, i % 3 != 0);
            assert_eq!(c.limit(), 3);
        }
    }

    /// An upstream of `workers` workers taking `service` per call: a call
    /// that starts with `n` in flight takes `service × max(1, n / workers)`.
    #[derive(Clone, Copy)]
    struct Upstream {
        workers: f64,
        service: Duration,
        ok: bool,
    }

    impl Upstream {
        fn new(workers: u32, service: Duration) -> Upstream {
            Upstream {
                workers: f64::from(workers),
                service,
                ok: true,
            }
        }

        fn latency(&self, in_flight: u32) -> Duration {
            self.service
                .mul_f64((f64::from(in_flight) / self.workers).max(1.0))
        }
    }

    /// Drives `c` in virtual time: `clients(t)` clients call the upstream
    /// back to back, each call starting as soon as a slot is free. Runs
    /// `calls` calls from `t` and returns the time reached and the limit
    /// after each call; asserts it stays in `[min, max]`.
    struct Sim {
        c: Arc<Concurrency>,
        t0: Instant,
        t: Duration,
        flying: BinaryHeap<Reverse<(Duration, u64)>>,
        permits: HashMap<u64, (Permit, Duration, bool)>,
        next: u64,
    }

    impl Sim {
        fn new(c: Arc<Concurrency>) -> Sim {
            Sim {
                c,
                t0: Instant::now(),
                t: Duration::ZERO,
                flying: BinaryHeap::new(),
                permits: HashMap::new(),
                next: 0,
            }
        }

        fn run(
            &mut self,
            calls: usize,
            upstream: Upstream,
            clients: impl Fn(Duration) -> u32,
            bounds: (u32, u32),
        ) -> Vec<u32> {
            let mut limits = Vec::with_capacity(calls);
            for _ in 0..calls {
                while self.c.in_flight() < self.c.limit()
                    && self.c.in_flight() < clients(self.t).max(1)
                {
                    let permit = now(&self.c, D);
                    let latency = upstream.latency(self.c.in_flight());
                    self.flying.push(Reverse((self.t + latency, self.next)));
                    self.permits
                        .insert(self.next, (permit, latency, upstream.ok));
                    self.next += 1;
                }
                let Reverse((end, id)) = self.flying.pop().expect("calls in flight");
                self.t = end;
                let (permit, latency, ok) = self.permits.remove(&id).expect("its permit");
                permit.done(self.t0 + self.t, latency, ok);
                let limit = self.c.limit();
                assert!(
                    (bounds.0..=bounds.1).contains(&limit),
                    "limit {limit} outside {bounds:?}"
                );
                limits.push(limit);
            }
            limits
        }
    }

    fn mean_tail(limits: &[u32]) -> f64 {
        let tail = &limits[limits.len() / 2..];
        tail.iter().map(|&l| f64::from(l)).sum::<f64>() / tail.len() as f64
    }

    fn p99(latency: Duration) -> Option<HealthSettings> {
        Some(target(latency, 99.0))
    }

    #[test]
    fn converges_near_the_limit_that_meets_the_target() {
        // 10 workers of 10 ms and a 50 ms target: 50 in flight meet it.
        let c = adaptive(1, 1000, p99(ms(50)));
        let mut sim = Sim::new(c);
        let limits = sim.run(40_000, Upstream::new(10, ms(10)), |_| 10_000, (1, 1000));
        let settled = mean_tail(&limits);
        assert!((45.0..=75.0).contains(&settled), "settled at {settled}");
        // And stays: the last quarter does not wander.
        let last = &limits[limits.len() * 3 / 4..];
        let (lo, hi) = (last.iter().min().unwrap(), last.iter().max().unwrap());
        assert!(hi - lo <= 10, "wanders between {lo} and {hi}");
    }

    #[test]
    fn without_a_target_it_settles_near_twice_the_no_load_latency() {
        // Clients arrive one every 10 ms, so the controller sees the
        // upstream unloaded first: latency 10 ms, reference 20 ms, and 20
        // in flight make 20 ms.
        let c = adaptive(1, 1000, None);
        let mut sim = Sim::new(c);
        let ramp = |t: Duration| (t.as_millis() / 10).min(10_000) as u32;
        let limits = sim.run(60_000, Upstream::new(10, ms(10)), ramp, (1, 1000));
        let settled = mean_tail(&limits);
        assert!((18.0..=35.0).contains(&settled), "settled at {settled}");
    }

    #[test]
    fn without_a_target_a_saturated_start_does_not_creep() {
        // Saturated from the first call: the smallest latency ever seen is
        // already queueing (16 in flight on 10 workers), so the limit
        // settles higher than it should, but it settles.
        let c = adaptive(1, 1000, None);
        let mut sim = Sim::new(c);
        let up = Upstream::new(10, ms(10));
        let first = sim.run(30_000, up, |_| 10_000, (1, 1000));
        let second = sim.run(30_000, up, |_| 10_000, (1, 1000));
        let (a, b) = (mean_tail(&first), mean_tail(&second));
        assert!(a < 60.0, "settled at {a}");
        assert!((b - a).abs() <= 0.1 * a, "crept from {a} to {b}");
    }

    #[test]
    fn a_slower_upstream_cuts_the_limit_and_a_faster_one_raises_it() {
        let c = adaptive(1, 1000, p99(ms(50)));
        let mut sim = Sim::new(c);
        let busy = |_| 10_000;
        let before = mean_tail(&sim.run(30_000, Upstream::new(10, ms(10)), busy, (1, 1000)));
        // Four times slower: about 12 in flight meet the target.
        let slow = mean_tail(&sim.run(30_000, Upstream::new(10, ms(40)), busy, (1, 1000)));
        assert!(slow < before / 2.0, "{before} -> {slow}");
        assert!((8.0..=25.0).contains(&slow), "slow: {slow}");
        let again = mean_tail(&sim.run(30_000, Upstream::new(10, ms(10)), busy, (1, 1000)));
        assert!((45.0..=75.0).contains(&again), "again: {again}");
    }

    #[test]
    fn the_limit_stays_within_min_and_max() {
        // A generous target pushes it to max...
        let c = adaptive(4, 30, p99(Duration::from_secs(10)));
        let limits = Sim::new(c).run(20_000, Upstream::new(10, ms(10)), |_| 10_000, (4, 30));
        assert_eq!(*limits.last().unwrap(), 30);
        // ...an impossible one to min.
        let c = adaptive(4, 30, p99(Duration::from_micros(1)));
        let limits = Sim::new(c).run(20_000, Upstream::new(10, ms(10)), |_| 10_000, (4, 30));
        assert_eq!(*limits.last().unwrap(), 4);
    }

    #[test]
    fn an_idle_limit_does_not_grow() {
        // Two clients never use half of 16, however fast the upstream.
        let c = adaptive(1, 1000, p99(ms(50)));
        let limits = Sim::new(c).run(20_000, Upstream::new(10, ms(1)), |_| 2, (1, 1000));
        assert!(limits.iter().all(|&l| l <= INITIAL_LIMIT));
    }

    #[test]
    fn mostly_failing_windows_cut_the_limit() {
        let c = adaptive(2, 1000, p99(ms(50)));
        let mut up = Upstream::new(100, ms(1));
        let grown = mean_tail(&Sim::new(Arc::clone(&c)).run(20_000, up, |_| 10_000, (2, 1000)));
        assert!(grown > 100.0, "grew to {grown}");
        // Failing fast: the latency looks great, the errors cut anyway.
        up.ok = false;
        let limits = Sim::new(c).run(20_000, up, |_| 10_000, (2, 1000));
        assert_eq!(*limits.last().unwrap(), 2);
    }

    #[test]
    fn windows_wait_for_enough_samples_or_a_second() {
        let t0 = Instant::now();
        let mut g = Gradient::new(1, 1000, &target(ms(50), 99.0));
        // Fifteen samples never close a window, however long they take.
        for i in 0..15 {
            assert!(!g.sample(t0 + Duration::from_secs(i), ms(900), true, 1, false));
        }
        assert!(g.sample(t0 + Duration::from_secs(15), ms(900), true, 1, false));
        // At a limit of 200, a window closes after 200 samples...
        g.limit = 200.0;
        for i in 0..199 {
            assert!(!g.sample(t0 + ms(16_000 + i), ms(1), true, 1, false));
        }
        assert!(g.sample(t0 + ms(16_199), ms(1), true, 1, false));
        // ...or 16 once a second has passed.
        for i in 0..15 {
            assert!(!g.sample(t0 + ms(20_000 + i * 100), ms(1), true, 1, false));
        }
        assert!(g.sample(t0 + ms(21_500), ms(1), true, 1, false));
    }

    #[test]
    fn percentiles_of_a_window() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile_of(&mut v, 50.0), 50);
        assert_eq!(percentile_of(&mut v, 99.0), 99);
        assert_eq!(percentile_of(&mut v, 100.0), 100);
        assert_eq!(percentile_of(&mut v, 0.0), 1);
        assert_eq!(percentile_of(&mut [7], 99.0), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rising_limit_grants_waiters_at_once_and_a_falling_one_waits() {
        let c = adaptive(1, 1000, p99(ms(50)));
        let t0 = Instant::now();
        let mut held: Vec<Permit> = (0..16).map(|_| now(&c, D)).collect();
        let mut waiting: Vec<Acquire> = (0..1000).map(|_| queue(&c, D)).collect();
        // Fast calls: each window raises the limit, and the new slots go
        // to waiters at once.
        let mut rose = false;
        for i in 0..400 {
            let before = c.limit();
            held.pop().unwrap().done(t0 + ms(i), ms(5), true);
            grant(&mut waiting, &mut held);
            rose |= c.limit() > before;
            assert_eq!(c.in_flight(), c.limit());
            assert_eq!(held.len() as u32, c.in_flight());
        }
        assert!(rose && c.limit() > INITIAL_LIMIT);
        // Failing calls: the limit falls below the calls in flight, which
        // finish normally, and nobody is granted until below the limit.
        let mut i = 0;
        while c.limit() >= c.in_flight() {
            assert!(i < 100, "the limit did not fall");
            held.pop().unwrap().done(t0 + ms(100 + i), ms(5), false);
            grant(&mut waiting, &mut held);
            i += 1;
        }
        assert!(c.limit() + 1 < c.in_flight());
        let fallen = c.limit();
        while c.in_flight() > fallen {
            let queued = c.queued();
            // Dropped without a sample: the limit holds still.
            drop(held.pop());
            assert_eq!(c.queued(), queued, "granted above the limit");
        }
    }

    /// Polls every waiter once, moving the granted ones' permits to `held`.
    fn grant(waiting: &mut Vec<Acquire>, held: &mut Vec<Permit>) {
        waiting.retain_mut(|f| match poll(f) {
            Poll::Ready(r) => {
                held.push(r.expect("granted"));
                false
            }
            Poll::Pending => true,
        });
    }

    /// One step of a random interleaving.
    #[derive(Debug, Clone)]
    enum Op {
        Acquire(Priority, Client),
        Advance(u64),
        LeaveQueue(prop::sample::Index),
        Done(prop::sample::Index, u64, bool),
        DropPermit(prop::sample::Index),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (prop::sample::select(Priority::ALL.to_vec()), 0u64..3)
                .prop_map(|(p, client)| Op::Acquire(p, client)),
            2 => (0u64..300).prop_map(Op::Advance),
            1 => any::<prop::sample::Index>().prop_map(Op::LeaveQueue),
            3 => (any::<prop::sample::Index>(), 0u64..200, any::<bool>())
                .prop_map(|(i, l, ok)| Op::Done(i, l, ok)),
            1 => any::<prop::sample::Index>().prop_map(Op::DropPermit),
        ]
    }

    fn settings() -> impl Strategy<Value = (ConcurrencySettings, HealthSettings)> {
        let limit = prop_oneof![
            (0u32..4).prop_map(LimitKind::Fixed),
            (0u32..4, 0u32..8).prop_map(|(min, extra)| LimitKind::Adaptive {
                min,
                max: min + extra
            }),
        ];
        let health = proptest::option::of((1u64..100, 0.0f64..=100.0))
            .prop_map(|t| t.map_or_else(HealthSettings::default, |(l, p)| target(ms(l), p)));
        (limit, 0u64..200, 0usize..5, health).prop_map(|(limit, wait, max_queued, health)| {
            let settings = ConcurrencySettings {
                limit,
                max_wait: ms(wait),
                max_queued,
            };
            (settings, health)
        })
    }

    proptest! {
        /// Whatever the interleaving of arrivals, timeouts, clients leaving
        /// and calls ending: the counts match the permits and waiters that
        /// exist, nobody waits while a slot is free, a grant never goes
        /// above the limit, every refusal is counted, and all returns to 0.
        #[test]
        fn counts_never_drift(
            (settings, target) in settings(),
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let c = Concurrency::new(settings, &target);
                let t0 = Instant::now();
                let mut elapsed = Duration::ZERO;
                let mut waiting: Vec<Acquire> = Vec::new();
                let mut held: Vec<Permit> = Vec::new();
                let mut refused = 0u64;
                for op in ops {
                    match op {
                        Op::Acquire(p, client) => waiting.push(start_for(&c, p, client)),
                        Op::Advance(d) => {
                            elapsed += ms(d);
                            tokio::time::advance(ms(d)).await;
                        }
                        Op::LeaveQueue(i) if !waiting.is_empty() => {
                            drop(waiting.remove(i.index(waiting.len())));
                        }
                        Op::Done(i, latency, ok) if !held.is_empty() => {
                            let p = held.remove(i.index(held.len()));
                            p.done(t0 + elapsed, ms(latency), ok);
                        }
                        Op::DropPermit(i) if !held.is_empty() => {
                            drop(held.remove(i.index(held.len())));
                        }
                        _ => {}
                    }
                    // Poll until nothing moves, twice at least: an arrival
                    // polled late in a pass may evict a waiter polled
                    // earlier in it.
                    let mut granted = false;
                    for pass in 0.. {
                        let before = waiting.len();
                        let mut still = Vec::new();
                        for mut f in waiting.drain(..) {
                            match poll(&mut f) {
                                Poll::Ready(Ok(p)) => {
                                    granted = true;
                                    held.push(p);
                                }
                                Poll::Ready(Err(_)) => refused += 1,
                                Poll::Pending => still.push(f),
                            }
                        }
                        waiting = still;
                        if pass > 0 && waiting.len() == before {
                            break;
                        }
                    }
                    prop_assert_eq!(c.in_flight() as usize, held.len());
                    let by_client: u32 = (0..3).map(|k| c.held_by(k)).sum();
                    prop_assert_eq!(by_client as usize, held.len());
                    prop_assert_eq!(c.queued(), waiting.len());
                    prop_assert!(c.queued() <= settings.max_queued);
                    if c.queued() > 0 {
                        prop_assert!(c.in_flight() >= c.limit(), "a waiter beside a free slot");
                    }
                    if granted {
                        prop_assert!(c.in_flight() <= c.limit(), "granted above the limit");
                    }
                    if let LimitKind::Fixed(n) = settings.limit {
                        prop_assert_eq!(c.limit(), n.max(1));
                    }
                    let shed: u64 = Priority::ALL.iter().map(|&p| c.shed_total(p)).sum();
                    prop_assert_eq!(shed, refused);
                }
                drop(waiting);
                drop(held);
                prop_assert_eq!((c.in_flight(), c.queued()), (0, 0));
                Ok(())
            })?;
        }
    }

    #[test]
    fn threads_racing_leave_nothing_behind() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let c = Concurrency::new(
            ConcurrencySettings {
                limit: LimitKind::Adaptive { min: 1, max: 8 },
                max_wait: ms(2),
                max_queued: 6,
            },
            &target(ms(1), 99.0),
        );
        rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..400u64 {
                let c = Arc::clone(&c);
                let p = Priority::ALL[(i % 3) as usize];
                tasks.push(tokio::spawn(async move {
                    for j in 0..20u64 {
                        if let Ok(permit) = c.acquire(p).await {
                            tokio::task::yield_now().await;
                            if (i + j) % 4 == 0 {
                                drop(permit);
                            } else {
                                permit.done(
                                    Instant::now(),
                                    Duration::from_micros(i * j),
                                    j % 5 != 0,
                                );
                            }
                        }
                    }
                }));
            }
            // Abort some mid-way: their waiters and permits are dropped
            // wherever they were.
            for t in tasks.iter().step_by(7) {
                t.abort();
            }
            for t in tasks {
                let _ = t.await;
            }
        });
        assert_eq!((c.in_flight(), c.queued()), (0, 0));
        assert!(c.limit() <= 8);
    }
}
