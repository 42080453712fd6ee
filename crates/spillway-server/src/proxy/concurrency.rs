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
//! Clients are networks, not addresses: [`Clients::of`] names an address by
//! its network as the connection budget groups them (`server.ipv4_prefix`,
//! `ipv6_prefix`: by default IPv4 `/24`, IPv6 `/64`; an IPv6 client holds a whole `/64`, and
//! a flood from many addresses usually comes from few networks), so one
//! client cannot take more than one share by spreading over addresses.
//!
//! # A reserve for clients holding none
//!
//! An eighth of the limit (none below a limit of 8) is kept for clients
//! holding no slot: once the others hold all but the reserve, only a
//! client holding none (or the only client holding any: the limit stays
//! work-conserving for one busy client) takes a slot, at once even if
//! others wait. However many clients hold slots, a client arriving fresh
//! is answered while the reserve lasts, without waiting for a slot to
//! free (with `max_wait: 0`, it would otherwise be refused).
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

mod client;
pub use client::{Client, Clients};

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

    /// Whether a client holding `held` slots may take one now: under the
    /// limit, and out of the reserve only if it holds none or is the only
    /// client holding any (see the [module docs](self)).
    fn room_for(&self, held: u32) -> bool {
        if self.in_flight >= self.limit {
            return false;
        }
        let reserve = self.limit / 8;
        self.in_flight < self.limit - reserve || held == 0 || self.holding.len() <= 1
    }

    /// The next waiter to grant: of the most important priority waiting,
    /// the oldest of those whose client holds the fewest slots.
    /// None when that waiter may not take a slot now (the reserve).
    fn next_waiter(&mut self) -> Option<(Client, oneshot::Sender<Grant>)> {
        let rank = self.waiting.iter().rposition(|q| !q.is_empty())?;
        let q = &self.waiting[rank];
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
        if !self.room_for(pick.0) {
            return None;
        }
        self.waiting[rank].remove(&pick.1)
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
            let held = state.held_by(client);
            // Nobody waiting, or (the reserve) a client holding none.
            if (state.queued == 0 || held == 0) && state.room_for(held) {
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
mod tests;
