use super::*;

fn conn(budget: &Budget, ip: [u8; 4]) -> Arc<ConnState> {
    Arc::new(ConnState::new(budget, IpAddr::from(ip)))
}

const IDLE: Duration = Duration::from_secs(60);

#[test]
fn streams_are_counted_and_all_come_back() {
    let budget = Budget::new(100, 10);
    let a = conn(&budget, [10, 0, 0, 1]);
    let guards: Vec<_> = (0..5)
        .map(|_| budget.open_stream(&a, IDLE).unwrap())
        .collect();
    assert_eq!(budget.streams(), 5);
    assert!(!a.is_idle());
    drop(guards);
    assert_eq!(budget.streams(), 0);
    assert!(a.is_idle());
    assert_eq!(budget.holders.load(Ordering::Relaxed), 0);
}

/// At the bound, the address holding every stream is refused, and
/// another address (a gateway multiplexing over one connection, say)
/// still gets its share, however many connections the first uses.
#[test]
fn at_the_bound_each_address_keeps_its_share() {
    let budget = Budget::new(10_000, 100);
    let attacker: Vec<_> = (0..100).map(|_| conn(&budget, [10, 0, 0, 66])).collect();
    let held: Vec<_> = attacker
        .iter()
        .map(|c| budget.open_stream(c, IDLE).expect("under the bound"))
        .collect();
    assert_eq!(budget.streams(), 100);
    // Over its share: refused, on a new connection as on an old one,
    // from another address of its network as from its own.
    assert!(budget.open_stream(&attacker[0], IDLE).is_none());
    assert!(
        budget
            .open_stream(&conn(&budget, [10, 0, 0, 67]), IDLE)
            .is_none()
    );
    // A gateway's one connection (another network): its share of two
    // holders is 50.
    let gateway = conn(&budget, [10, 0, 1, 7]);
    let mine: Vec<_> = (0..50)
        .map(|i| {
            budget
                .open_stream(&gateway, IDLE)
                .unwrap_or_else(|| panic!("stream {i}"))
        })
        .collect();
    assert!(
        budget.open_stream(&gateway, IDLE).is_none(),
        "past its share"
    );
    drop(mine);
    drop(held);
    assert_eq!(budget.streams(), 0);
}

/// However many networks ask, the streams stay below twice the bound.
#[test]
fn no_more_than_twice_the_bound_in_all() {
    let budget = Budget::new(10_000, 50);
    let mut held = Vec::new();
    for i in 0..1_000u32 {
        let c = conn(&budget, (0x0a00_0000 + (i << 8)).to_be_bytes());
        if let Some(g) = budget.open_stream(&c, IDLE) {
            held.push(g);
        }
    }
    assert!(budget.streams() <= 100, "{}", budget.streams());
    assert!(budget.streams() >= 50);
}

/// At the cap, room is made out of the address holding the most idle
/// connections, silent ones first, even when a lone client's
/// connection is older.
#[tokio::test(start_paused = true)]
async fn room_is_made_from_the_crowd_not_the_lone_client() {
    let budget = Budget::new(4, 10);
    let add = |ip: [u8; 4], heard: bool| {
        let c = conn(&budget, ip);
        c.heard.store(heard, Ordering::Relaxed);
        let id = budget.next_id();
        budget.register(id, 1, c, || {
            tokio::spawn(std::future::pending::<()>()).abort_handle()
        });
        id
    };
    let lone = add([10, 0, 0, 1], true);
    let talking = add([10, 0, 0, 66], true);
    let silent = add([10, 0, 0, 66], false);
    // Nothing is shed within the grace.
    assert!(!budget.shed_idle());
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    let left = |b: &Budget| {
        let mut ids: Vec<u64> = b.table.lock().keys().copied().collect();
        ids.sort_unstable();
        ids
    };
    assert!(budget.shed_idle());
    assert_eq!(
        left(&budget),
        [lone, talking],
        "the crowd's silent {silent} goes first"
    );
    assert!(budget.shed_idle());
    // One each: the oldest goes.
    assert_eq!(left(&budget), [talking]);
}

/// A lone client still in its handshake when the machine is busy (it
/// has sent its first bytes, and the grace has passed) is not closed
/// while a crowd's connections trickle request bodies in: the crowd
/// makes room out of its own, silent ones first, then idle ones, then
/// those in a request.
#[tokio::test(start_paused = true)]
async fn a_slow_handshake_outlasts_a_crowd_of_trickled_bodies() {
    let budget = Budget::new(8, 10);
    let add = |ip: [u8; 4], heard: bool, in_body: bool| {
        let c = conn(&budget, ip);
        c.heard.store(heard, Ordering::Relaxed);
        if in_body {
            // On the direct path, a head read and its body awaited.
            c.idle.store(false, Ordering::SeqCst);
            c.waiting(&budget.clock, IDLE);
        }
        let id = budget.next_id();
        budget.register(id, 1, c, || {
            tokio::spawn(std::future::pending::<()>()).abort_handle()
        });
        id
    };
    let body1 = add([10, 0, 0, 66], true, true);
    let body2 = add([10, 0, 0, 66], true, true);
    let lone = add([10, 0, 0, 1], true, false);
    let talking = add([10, 0, 0, 66], true, false);
    let silent = add([10, 0, 0, 66], false, false);
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    let left = |b: &Budget| {
        let mut ids: Vec<u64> = b.table.lock().keys().copied().collect();
        ids.sort_unstable();
        ids
    };
    assert!(budget.shed_idle());
    assert_eq!(left(&budget), [body1, body2, lone, talking], "{silent}");
    assert!(budget.shed_idle());
    assert_eq!(left(&budget), [body1, body2, lone]);
    assert!(budget.shed_idle());
    assert_eq!(left(&budget), [body2, lone], "the oldest body goes");
    // One each: even now, one waiting for a request goes before one in
    // a request.
    assert!(budget.shed_idle());
    assert_eq!(left(&budget), [body2]);
}

/// A crowd whose connections are all busy on hyper (requests in
/// flight on a handler) and that holds more than its share when the
/// budget is full makes room out of its own busy connections: busy
/// connections are capped at the network's fair share. A lone
/// client's handshake kept past the grace by a busy machine stays.
#[tokio::test(start_paused = true)]
async fn a_busy_crowd_over_its_share_makes_room_out_of_its_own() {
    let budget = Budget::new(8, 100);
    let mut guards = Vec::new();
    let mut crowd = Vec::new();
    for _ in 0..7 {
        let c = conn(&budget, [10, 0, 0, 66]);
        c.heard.store(true, Ordering::Relaxed);
        c.hyper.store(true, Ordering::Relaxed);
        guards.push(budget.open_stream(&c, IDLE).unwrap());
        crowd.push(add(&budget, c));
    }
    let lone = conn(&budget, [10, 0, 1, 1]);
    lone.heard.store(true, Ordering::Relaxed);
    let lone_id = add(&budget, lone);
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    assert!(budget.full());
    assert!(budget.shed_idle(), "the crowd kept its busy connections");
    let table = budget.table.lock();
    assert!(table.contains_key(&lone_id), "the lone client was closed");
    assert_eq!(table.len(), 7);
}

fn add(budget: &Budget, c: Arc<ConnState>) -> u64 {
    let id = budget.next_id();
    budget.register(id, 1, c, || {
        tokio::spawn(std::future::pending::<()>()).abort_handle()
    });
    id
}

/// A hyper connection whose every request waits for its body (a
/// chunked body trickling, an HTTP/2 stream whose body never comes)
/// waits on its client: it is closed to make room like an idle one,
/// where it used to count as busy and hold the budget.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_its_body_on_hyper_is_sheddable() {
    let budget = Budget::new(2, 100);
    let waiting = conn(&budget, [10, 0, 0, 1]);
    waiting.hyper.store(true, Ordering::Relaxed);
    let _g = budget.open_stream(&waiting, IDLE).unwrap();
    waiting.body_begins(u64::MAX);
    assert!(waiting.waits_on_client());
    let working = conn(&budget, [10, 0, 1, 1]);
    let _w = budget.open_stream(&working, IDLE).unwrap();
    assert!(!working.waits_on_client());
    let waiting_id = add(&budget, waiting.clone());
    let working_id = add(&budget, working);
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    assert!(budget.shed_idle());
    let table = budget.table.lock();
    assert!(!table.contains_key(&waiting_id));
    assert!(table.contains_key(&working_id));
    drop(table);
    // Its body in: busy again.
    waiting.body_ends();
    assert!(!waiting.waits_on_client());
}

/// A request whose handler has answered but whose answer the client
/// does not take (an HTTP/2 client that opens no window, an HTTP/1.1
/// client that does not read) waits on its client: its connection
/// is closed to make room like one waiting for a body, and the answer
/// has the write timeout to be taken, where it used to count as busy
/// and hold the budget for as long as the client liked.
#[tokio::test(start_paused = true)]
async fn an_answer_not_taken_waits_on_the_client() {
    let budget = Budget::new(10, 100);
    let stuck = conn(&budget, [10, 0, 0, 1]);
    stuck.hyper.store(true, Ordering::Relaxed);
    let mut held: Vec<_> = (0..3)
        .map(|_| budget.open_stream(&stuck, IDLE).unwrap())
        .collect();
    assert!(!stuck.waits_on_client(), "handlers at work");
    let write = Duration::from_secs(2);
    for g in &mut held[..2] {
        g.answered(write);
    }
    assert!(!stuck.waits_on_client(), "one handler still at work");
    assert_eq!(
        stuck.deadline.load(Ordering::Relaxed),
        budget.clock.after(IDLE)
    );
    held[2].answered(write);
    assert!(stuck.waits_on_client());
    assert_eq!(
        stuck.deadline.load(Ordering::Relaxed),
        budget.clock.after(write),
        "the answers have the write timeout to be taken"
    );
    let working = conn(&budget, [10, 0, 1, 1]);
    let _w = budget.open_stream(&working, IDLE).unwrap();
    let stuck_id = add(&budget, stuck.clone());
    let working_id = add(&budget, working);
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    assert!(budget.shed_idle());
    let table = budget.table.lock();
    assert!(!table.contains_key(&stuck_id));
    assert!(table.contains_key(&working_id));
    drop(table);
    // Its answers taken: nothing in flight, and nothing left waiting.
    drop(held);
    assert_eq!(stuck.answers.load(Ordering::SeqCst), 0);
    assert!(stuck.is_idle());
}

/// A served connection (of a network within its share) is never
/// closed while an unserved one could be, even one still in its
/// grace: the accept loop waits the grace out, then closes the
/// unserved one.
#[tokio::test(start_paused = true)]
async fn a_served_connection_goes_after_every_unserved_one() {
    let budget = Budget::new(2, 10);
    let kept = conn(&budget, [10, 0, 0, 1]);
    kept.heard.store(true, Ordering::Relaxed);
    kept.served.store(true, Ordering::Relaxed);
    let kept_id = add(&budget, kept);
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    let fresh = conn(&budget, [10, 0, 1, 9]);
    let fresh_id = add(&budget, fresh);
    assert!(!budget.shed_idle(), "the served connection was closed");
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    assert!(budget.shed_idle());
    let table = budget.table.lock();
    assert!(table.contains_key(&kept_id));
    assert!(!table.contains_key(&fresh_id));
}

/// A crowd whose requests are all answered (served connections, a
/// refusal being an answer) and whose new connections keep arriving
/// in their grace does not keep the table: the newcomer waiting to be
/// accepted counts as a network, the crowd is over its share, and its
/// served connections go. It used to be alone in the table, its share
/// the whole budget, and every served connection waited for the grace
/// of the crowd's newest: nothing was ever shed, and the newcomer
/// waited in the backlog (`answer_not_read` on the admin listener,
/// `stream_held` on forward-auth).
#[tokio::test(start_paused = true)]
async fn a_served_crowd_makes_room_while_its_newcomers_are_in_their_grace() {
    let budget = Budget::new(8, 10);
    let mut served = Vec::new();
    for _ in 0..7 {
        let c = conn(&budget, [10, 0, 0, 66]);
        c.heard.store(true, Ordering::Relaxed);
        c.served.store(true, Ordering::Relaxed);
        served.push(add(&budget, c));
    }
    tokio::time::advance(GRACE * 2).await;
    budget.clock.tick();
    let newest = add(&budget, conn(&budget, [10, 0, 0, 66]));
    assert!(budget.full());
    assert!(budget.shed_idle(), "the served crowd kept the table");
    let table = budget.table.lock();
    assert!(table.contains_key(&newest), "the one in its grace went");
    assert_eq!(table.len(), 7);
}

/// Shares are by network: 200 addresses of one /24 holding streams
/// are one holder, held at its share, and a client on another network
/// gets a stream from the reserve; an IPv6 client's addresses within
/// one /64 are one network too.
#[test]
fn shares_are_by_network_with_a_reserve_for_networks_holding_none() {
    let budget = Budget::new(10_000, 40);
    let mut held = Vec::new();
    for i in 0..200u8 {
        for _ in 0..2 {
            if let Some(g) = budget.open_stream(&conn(&budget, [10, 0, 0, i]), IDLE) {
                held.push(g);
            }
        }
    }
    assert_eq!(budget.streams(), 40, "one network, at its share");
    let fresh = conn(&budget, [10, 9, 0, 1]);
    held.extend(budget.open_stream(&fresh, IDLE));
    assert_eq!(budget.streams(), 41, "a fresh network is refused");
    let v6 = |last: u16| {
        let ip = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, last);
        Arc::new(ConnState::new(&budget, IpAddr::from(ip)))
    };
    // A hundred addresses of one /64: one network, held at its share
    // (a third of the bound, with three networks holding), where a
    // hundred fresh addresses would each have taken the reserve.
    let before = budget.streams();
    for i in 1..=100 {
        if let Some(g) = budget.open_stream(&v6(i), IDLE) {
            held.push(g);
        }
    }
    let taken = budget.streams() - before;
    assert!((1..=14).contains(&taken), "{taken} streams for one /64");
    drop(held);
    assert_eq!(budget.streams(), 0);
}

/// The stream bound never exceeds the connections the budget carries.
#[test]
fn the_stream_bound_is_at_most_the_connection_cap() {
    let budget = Budget::new(100, 4096);
    assert_eq!(budget.max_streams(), 100);
    budget.reserve(30);
    assert_eq!(budget.max_streams(), 70);
    assert_eq!(Budget::new(100, 10).max_streams(), 10);
}

#[test]
fn a_connection_with_a_stream_in_flight_is_not_idle_whatever_the_flag() {
    let budget = Budget::new(10, 10);
    let c = conn(&budget, [127, 0, 0, 1]);
    let g = budget.open_stream(&c, IDLE).unwrap();
    // As if a guard on another thread had just marked it idle.
    c.idle.store(true, Ordering::SeqCst);
    assert!(!c.is_idle());
    drop(g);
    assert!(c.is_idle());
}

/// At the cap, a newcomer whose network holds its share already is
/// closed on arrival (it would only push out one of its own); one from a
/// network holding less, or a lone network's (a gateway in front), is
/// let in by making room.
#[tokio::test]
async fn at_the_cap_a_network_holding_its_share_is_refused_on_arrival() {
    let budget = Budget::new(4, 10);
    for _ in 0..3 {
        add(&budget, conn(&budget, [10, 0, 0, 66]));
    }
    // One network alone: room is made among its own.
    assert!(!budget.refuses([10, 0, 0, 66].into()));
    add(&budget, conn(&budget, [10, 0, 1, 1]));
    assert!(budget.full());
    // Two networks: the share is 2; the crowd holds 3, from any of its
    // addresses.
    assert!(budget.refuses([10, 0, 0, 66].into()));
    assert!(budget.refuses([10, 0, 0, 9].into()));
    // The other holds 1, and a fresh network none.
    assert!(!budget.refuses([10, 0, 1, 1].into()));
    assert!(!budget.refuses([10, 0, 2, 1].into()));
}
