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
            while self.c.in_flight() < self.c.limit() && self.c.in_flight() < clients(self.t).max(1)
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
    /// exist, nobody waits while a slot but the reserve is free, a grant never goes
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
                    // Only the reserve (for clients holding none) may
                    // stay free beside a waiter.
                    let reserve = c.limit() / 8;
                    prop_assert!(c.in_flight() >= c.limit() - reserve, "a waiter beside a free slot");
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
                            permit.done(Instant::now(), Duration::from_micros(i * j), j % 5 != 0);
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

/// An acquire for `client` that must settle at once.
fn at_once(c: &Arc<Concurrency>, client: Client) -> Result<Permit, Shed> {
    match poll(&mut start_for(c, D, client)) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("client {client} waits"),
    }
}

/// Issue 35: however many clients hold slots, a client holding none gets
/// one at once from the reserve (an eighth of the limit), even with no
/// waiting allowed; a client already holding one does not; and one client
/// alone still takes the whole limit.
#[tokio::test(start_paused = true)]
async fn a_reserve_stays_for_clients_holding_none() {
    let c = fixed(16, Duration::ZERO, 0);
    let mut held: Vec<Permit> = (1..=14)
        .map(|client| at_once(&c, client).unwrap())
        .collect();
    assert_eq!(c.in_flight(), 14);
    assert!(
        at_once(&c, 1).is_err(),
        "a client holding a slot took the reserve"
    );
    for fresh in [99, 100] {
        held.push(at_once(&c, fresh).expect("a client holding none is refused"));
    }
    assert_eq!(c.in_flight(), 16);
    assert!(at_once(&c, 101).is_err());
    drop(held);
    let alone: Vec<Permit> = (0..16)
        .map(|_| at_once(&c, 7).expect("one client alone takes the whole limit"))
        .collect();
    assert_eq!(c.in_flight(), 16);
    drop(alone);
}

/// Addresses of one network are one client: by default IPv4 by /24,
/// IPv6 by /64; `server.ipv4_prefix` / `ipv6_prefix` change it.
#[test]
fn clients_are_networks() {
    let c = Clients::new(24, 64);
    assert_eq!(c.of("10.0.0.1"), c.of("10.0.0.200"));
    assert_ne!(c.of("10.0.0.1"), c.of("10.0.1.1"));
    assert_eq!(c.of("2001:db8::1"), c.of("2001:db8::ffff:1"));
    assert_ne!(c.of("2001:db8::1"), c.of("2001:db8:0:1::1"));
    assert_eq!(c.of("not an ip"), c.of("not an ip"));
    // The prefixes set are the ones used.
    let c = Clients::new(32, 48);
    assert_ne!(c.of("10.0.0.1"), c.of("10.0.0.200"));
    assert_eq!(c.of("2001:db8::1"), c.of("2001:db8:0:1::1"));
    assert_ne!(c.of("2001:db8::1"), c.of("2001:db8:1::1"));
}
