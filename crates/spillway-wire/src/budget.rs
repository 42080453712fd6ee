//! One connection and stream budget for every listener of a process.
//!
//! Each listener used to count its own connections against its own cap,
//! so the decision port, the admin port and the gRPC port together could
//! hold three times the cap, and a listener without a cap (gRPC) could
//! take every descriptor the others needed. A [`Budget`] is shared by
//! every listener of a process ([`crate::server::serve_in`]):
//!
//! - **Connections.** Client connections of every listener count against
//!   one cap: `max_connections` less what the process [reserves](Budget::reserve)
//!   for the descriptors it opens itself (the proxy's upstream pool, the
//!   store's connections). At the cap, the connection that has waited
//!   longest for a request, on any listener, is closed to make room.
//! - **Deadlines.** One coarse clock and one sweeper end every connection
//!   whose wait for its client has expired.
//! - **Streams.** Requests in flight on connections handed to hyper
//!   (HTTP/2 streams, and HTTP/1.1 requests there) count against one
//!   process-wide bound, never more than the connection cap (an HTTP/1.1
//!   request is a connection: a bound above the cap would never bind).
//!   At the bound a new stream is refused only for a client network that
//!   already holds its fair share (the bound divided by the networks
//!   holding streams), so a client that holds many streams, over one
//!   connection or thousands, from one address or a whole network, cannot
//!   make another client's requests fail (a gateway multiplexing its calls
//!   over one connection keeps its share). Past the bound, a quarter of it
//!   is kept for networks holding none, up to twice the bound in all: a
//!   client on a fresh network is answered however many addresses hold
//!   streams.
//! - **Networks.** Fairness (connections and streams) counts clients by
//!   network, not by address: IPv6 by `/64` (an address costs an attacker
//!   nothing within its `/64`) and IPv4 by `/24`, configurable
//!   ([`Budget::group_by`]). Shares are only consulted under pressure (at
//!   the connection cap, at the stream bound); within a network, the
//!   address holding the most connections goes first.
//! - **Bodies.** A request on hyper whose body has not all arrived waits
//!   on its client: its connection may be closed to make room like an
//!   idle one, and the body has `body_timeout` in all (see
//!   [`RequestBody`](crate::RequestBody)).
//! - **Answers.** A request on hyper whose handler has answered, and
//!   whose answer the client has not taken (an HTTP/2 client that opens
//!   no window), waits on its client too: sheddable, and with every
//!   request of its connection waiting so, due within the write timeout.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::task::Waker;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod net;
mod room;
pub use net::network;

/// The connection and stream budget shared by a process's listeners.
pub struct Budget {
    /// Every descriptor the process's connections may use.
    total: usize,
    /// Of `total`, what the process holds outside its listeners.
    reserved: AtomicUsize,
    /// Requests in flight on hyper connections, process-wide, before new
    /// ones are refused on connections over their share (at most the
    /// connection cap: see [`Budget::max_streams`]).
    max_streams: usize,
    /// Every open client connection of every listener, but those closed
    /// to make room.
    table: parking_lot::Mutex<HashMap<u64, Entry>>,
    /// Client connections whose socket is open: those in the table, and
    /// those closed to make room whose task has not ended yet (an aborted
    /// task drops its socket when the runtime next gets to it).
    open: AtomicUsize,
    /// Of `open`, those closed to make room.
    shed: AtomicUsize,
    /// Connection and listener numbers: a smaller one is an older one.
    next_id: AtomicU64,
    /// Signalled when a connection ends.
    pub(crate) ended: Notify,
    /// The clock deadlines are read against.
    pub(crate) clock: Coarse,
    /// Requests in flight on hyper connections.
    streams: AtomicUsize,
    /// Requests in flight on hyper connections, by client network: each
    /// connection holds its network's counter (looked up once, when hyper
    /// takes it), so a stream costs a few atomic operations, not a lookup.
    peers: parking_lot::Mutex<HashMap<IpAddr, Arc<AtomicUsize>>>,
    /// Networks with requests in flight on hyper connections.
    holders: AtomicUsize,
    /// Whether the sweeper runs.
    sweeping: AtomicBool,
    /// How clients are grouped into networks for fairness: IPv4 and IPv6
    /// prefix lengths.
    prefixes: [AtomicU8; 2],
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("total", &self.total)
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .field("connections", &self.connections())
            .field("streams", &self.streams())
            .field("max_streams", &self.max_streams())
            .finish()
    }
}

/// An open connection, as the budget sees it.
pub(crate) struct Entry {
    /// Which listener accepted it.
    pub(crate) listener: u64,
    pub(crate) state: Arc<ConnState>,
    /// Its task; `None` for the moment between the insert and the spawn.
    pub(crate) task: Option<tokio::task::AbortHandle>,
}

impl Entry {
    fn abort(&self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// How often deadlines are checked: they are kept to within this.
const SWEEP: Duration = Duration::from_millis(100);

/// How long a hyper connection past its deadline has to close after its
/// GOAWAY before it is aborted.
const GOAWAY_MS: u64 = 1_000;

/// How long a new connection has to send its request before it may be
/// closed to make room. Without it, a flood of connections that reconnect
/// as soon as they are closed turns the whole table over faster than a
/// legitimate client's request is read (on loopback, every 40 ms), and the
/// legitimate connection, the oldest by then, is closed first; with it,
/// accepting slows to the cap per grace period during such a flood, and
/// every connection accepted gets the grace to be read.
pub const GRACE: Duration = Duration::from_millis(200);
const GRACE_MS: u64 = 200;

impl Budget {
    /// A budget of `max_connections` descriptors for connections (at least
    /// one) and `max_streams` requests in flight on hyper connections
    /// (at least one, at most the connections).
    pub fn new(max_connections: usize, max_streams: usize) -> Arc<Budget> {
        Arc::new(Budget {
            total: max_connections.max(1),
            reserved: AtomicUsize::new(0),
            max_streams: max_streams.max(1),
            table: parking_lot::Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            shed: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            ended: Notify::new(),
            clock: Coarse {
                start: Instant::now(),
                now_ms: AtomicU64::new(0),
            },
            streams: AtomicUsize::new(0),
            peers: parking_lot::Mutex::new(HashMap::new()),
            holders: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            prefixes: [
                AtomicU8::new(net::IPV4_PREFIX),
                AtomicU8::new(net::IPV6_PREFIX),
            ],
        })
    }

    /// Groups clients into networks for fairness: IPv4 addresses by their
    /// first `ipv4_prefix` bits (at most 32), IPv6 by `ipv6_prefix` (at
    /// most 128). Applies to connections accepted from now on.
    pub fn group_by(&self, ipv4_prefix: u8, ipv6_prefix: u8) {
        self.prefixes[0].store(ipv4_prefix.min(32), Ordering::Relaxed);
        self.prefixes[1].store(ipv6_prefix.min(128), Ordering::Relaxed);
    }

    /// The network `ip` is counted in.
    pub(crate) fn network(&self, ip: IpAddr) -> IpAddr {
        net::network(
            ip,
            self.prefixes[0].load(Ordering::Relaxed),
            self.prefixes[1].load(Ordering::Relaxed),
        )
    }

    /// Sets aside `n` of the budget's descriptors for connections the
    /// process opens itself (an upstream pool, a store's connections):
    /// the listeners' clients may then hold `max_connections - reserved`
    /// (at least one).
    pub fn reserve(&self, n: usize) {
        self.reserved.fetch_add(n, Ordering::Relaxed);
    }

    /// Client connections the listeners may hold at once.
    pub fn max_connections(&self) -> usize {
        self.total
            .saturating_sub(self.reserved.load(Ordering::Relaxed))
            .max(1)
    }

    /// Client connections open now, on every listener.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Requests in flight on hyper connections now.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// The process-wide bound on requests in flight on hyper connections:
    /// as made, but never more than the client connections the budget
    /// carries ([`Budget::max_connections`]). Past it, a connection over
    /// its network's share is refused, and each HTTP/1.1 request holds a
    /// connection: with a bound above the cap, HTTP/1.1 clients holding
    /// requests would fill the cap before any share was consulted.
    pub fn max_streams(&self) -> usize {
        self.max_streams.min(self.max_connections())
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether the listeners' clients hold every descriptor they may.
    pub(crate) fn full(&self) -> bool {
        self.open.load(Ordering::SeqCst) >= self.max_connections()
    }

    /// Whether the budget would still be full once the connections
    /// already closed to make room are gone: only then is another closed.
    pub(crate) fn needs_room(&self) -> bool {
        let open = self.open.load(Ordering::SeqCst);
        open.saturating_sub(self.shed.load(Ordering::SeqCst)) >= self.max_connections()
    }

    /// Registers a connection: inserted first, so a connection that ends
    /// at once is still removed after this insert; its task spawned by
    /// `spawn` outside the lock (a runtime shutting down cancels a new
    /// task inside `spawn`, and the cancelled connection's exit takes the
    /// lock: under it, that was a deadlock), then its handle kept.
    pub(crate) fn register(
        &self,
        id: u64,
        listener: u64,
        state: Arc<ConnState>,
        spawn: impl FnOnce() -> tokio::task::AbortHandle,
    ) {
        {
            let mut table = self.table.lock();
            self.open.fetch_add(1, Ordering::SeqCst);
            table.insert(
                id,
                Entry {
                    listener,
                    state,
                    task: None,
                },
            );
        }
        let task = spawn();
        if let Some(e) = self.table.lock().get_mut(&id) {
            e.task = Some(task);
        }
    }

    /// A connection ended: its socket is closed.
    pub(crate) fn remove(&self, id: u64, state: &ConnState) {
        if let Some(counter) = state.peer_streams.get() {
            let mut peers = self.peers.lock();
            // Only the table and this connection hold it: no other
            // connection of the network is open.
            if Arc::strong_count(counter) <= 2 {
                peers.remove(&state.net);
            }
        }
        if self.table.lock().remove(&id).is_none() {
            // Closed to make room, and now gone.
            self.shed.fetch_sub(1, Ordering::SeqCst);
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.ended.notify_waiters();
    }

    /// Closes a connection, on any listener, to make room. Which one:
    ///
    /// - **Whose.** Clients are weighed by network, by every connection
    ///   they hold whatever its state: while some network holds more than
    ///   its fair share (the cap divided by the networks, the client
    ///   waiting to be accepted counted as one more), only such a
    ///   network's connections are closed; of those, the network holding
    ///   the most, and within it the address holding the most (a flood
    ///   makes room out of its own connections, never a lone client's).
    /// - **Which of its connections.** One waiting on its client: idle
    ///   (waiting for a request, or a handshake) or in a request whose body
    ///   has not all arrived (on the direct path or on hyper, where an
    ///   HTTP/2 stream or a chunked body never finished would otherwise
    ///   hold its connection). Silent ones first (a client that has begun,
    ///   a TLS handshake on a slow link say, goes after every silent one),
    ///   then idle ones, then those in a request, the oldest first. A
    ///   network over its share when the budget is full has its busy
    ///   connections (requests in flight on a handler) closed too, after
    ///   its waiting ones: busy connections are capped at the share.
    /// - **Served last.** A connection that has been answered is never
    ///   closed while one that has not could be, unless its network is
    ///   over its share: a flood that reconnects within the grace waits
    ///   out the grace rather than take a served keep-alive connection,
    ///   its only other choice, and a flood whose own requests are
    ///   answered cannot hide behind its newest connections' grace.
    ///
    /// False if none qualifies, or every one that does was accepted less
    /// than [`GRACE`] ago (or is served, while one that is not is still in
    /// its grace).
    pub(crate) fn shed_idle(&self) -> bool {
        let mut table = self.table.lock();
        let now = self.clock.now();
        let mut by_net: HashMap<IpAddr, usize> = HashMap::new();
        let mut by_addr: HashMap<IpAddr, usize> = HashMap::new();
        for e in table.values() {
            *by_net.entry(e.state.net).or_insert(0) += 1;
            *by_addr.entry(e.state.peer).or_insert(0) += 1;
        }
        // Room is made for a client waiting to be accepted, whose address
        // is not known yet: it counts as one more network. Without it, a
        // crowd alone in the table had the whole budget for its share and
        // kept every connection it held, while the newcomer waited.
        let fair = (self.max_connections() / (by_net.len() + 1)).max(1);
        let crowded = by_net.values().any(|&n| n > fair);
        let over = |s: &ConnState| by_net[&s.net] > fair;
        // Could go, the grace aside.
        let could = |s: &ConnState| {
            (!crowded || over(s)) && (s.is_idle() || s.waits_on_client() || (crowded && over(s)))
        };
        let unserved = table
            .values()
            .any(|e| !e.state.served.load(Ordering::Relaxed) && could(&e.state));
        // A served connection waits out the grace of an unserved one,
        // unless its network holds more than its share: a crowd whose
        // requests are answered (a refusal is an answer) is not kept by
        // it, or the crowd's own newcomers in their grace would keep the
        // whole table from ever making room.
        let fits = |s: &ConnState| {
            now.saturating_sub(s.since) >= GRACE_MS
                && could(s)
                && !(unserved && s.served.load(Ordering::Relaxed) && !over(s))
        };
        let pick = table
            .iter()
            // One whose task is not spawned yet could not be closed.
            .filter(|(_, e)| e.task.is_some() && fits(&e.state))
            .min_by_key(|(id, e)| {
                let s = &e.state;
                let waits = s.is_idle() || s.waits_on_client();
                (
                    std::cmp::Reverse(by_net[&s.net]),
                    std::cmp::Reverse(by_addr[&s.peer]),
                    s.served.load(Ordering::Relaxed),
                    !waits,
                    s.heard.load(Ordering::Relaxed),
                    !s.is_idle(),
                    **id,
                )
            })
            .map(|(id, _)| *id);
        match pick.and_then(|id| table.remove(&id)) {
            Some(e) => {
                self.shed.fetch_add(1, Ordering::SeqCst);
                e.abort();
                true
            }
            None => false,
        }
    }

    /// Aborts `listener`'s connections; only those waiting for a request
    /// when `idle_only`.
    pub(crate) fn abort_listener(&self, listener: u64, idle_only: bool) {
        for e in self.table.lock().values() {
            if e.listener == listener && (!idle_only || e.state.is_idle()) {
                e.abort();
            }
        }
    }

    /// Starts the sweeper once (inside a runtime); it ends when the
    /// budget is dropped.
    pub(crate) fn start_sweeping(self: &Arc<Budget>) {
        if self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP).await;
                let Some(budget) = weak.upgrade() else {
                    return;
                };
                let now = budget.clock.tick();
                for e in budget.table.lock().values() {
                    let state = &e.state;
                    if state.body_deadline.load(Ordering::Relaxed) < now {
                        state.wake_bodies();
                    }
                    if state.deadline.load(Ordering::Relaxed) >= now {
                        continue;
                    }
                    if state.hyper.load(Ordering::Relaxed)
                        && !state.expiring.swap(true, Ordering::Relaxed)
                    {
                        // A hyper connection closes gracefully first (an
                        // HTTP/2 GOAWAY): a client sending a call at this
                        // moment learns it was not taken and retries it
                        // on a new connection, where an abort would fail
                        // it. Aborted if still open after the grace, which
                        // it gets once: nothing it sends or is sent moves
                        // this deadline again (see `ConnState::waiting`).
                        state
                            .deadline
                            .store(now.saturating_add(GOAWAY_MS), Ordering::Relaxed);
                        state.expire.notify_one();
                    } else {
                        e.abort();
                    }
                }
            }
        });
    }

    /// Opens a stream on `conn` unless the process is at its stream bound
    /// and `conn`'s client network already holds its share, or, for a
    /// network holding none, at twice the bound; the guard closes it.
    pub(crate) fn open_stream(
        self: &Arc<Budget>,
        conn: &Arc<ConnState>,
        idle: Duration,
    ) -> Option<StreamGuard> {
        let network = conn.peer_streams.get_or_init(|| {
            let mut peers = self.peers.lock();
            peers.entry(conn.net).or_default().clone()
        });
        let total = self.streams.load(Ordering::Relaxed);
        let bound = self.max_streams();
        if total >= bound {
            let mine = network.load(Ordering::Relaxed);
            let most = bound.saturating_mul(2);
            if mine == 0 {
                // The reserve: a network holding none is answered up to
                // twice the bound, however many others hold their share.
                if total >= most {
                    return None;
                }
            } else {
                let holders = self.holders.load(Ordering::Relaxed);
                let share = (bound / holders.max(1)).max(1);
                let reserve = (bound / 4).max(1);
                if mine >= share || total >= most.saturating_sub(reserve) {
                    return None;
                }
            }
        }
        self.streams.fetch_add(1, Ordering::Relaxed);
        if network.fetch_add(1, Ordering::Relaxed) == 0 {
            self.holders.fetch_add(1, Ordering::Relaxed);
        }
        if conn.streams.fetch_add(1, Ordering::SeqCst) == 0 {
            conn.idle.store(false, Ordering::Relaxed);
        }
        conn.waiting(&self.clock, idle);
        Some(StreamGuard {
            budget: self.clone(),
            conn: conn.clone(),
            idle,
            answered: false,
        })
    }
}

/// One request in flight on a hyper connection; dropping it (its answer
/// sent, or the stream reset) ends it.
pub(crate) struct StreamGuard {
    budget: Arc<Budget>,
    conn: Arc<ConnState>,
    idle: Duration,
    /// Its handler has answered: what is left is for the client to read.
    answered: bool,
}

impl StreamGuard {
    /// Its handler answered: the connection has served its client, and
    /// the stream now waits on its client to take the answer (sheddable
    /// like a body that has not all arrived). When every request in
    /// flight on the connection waits so, the answer has `write` to be
    /// taken (bytes moving push the deadline on, as for any write).
    pub(crate) fn answered(&mut self, write: Duration) {
        self.conn.served.store(true, Ordering::Relaxed);
        if self.answered {
            return;
        }
        self.answered = true;
        self.conn.answers.fetch_add(1, Ordering::SeqCst);
        if self.conn.waits_on_client() && !self.conn.expiring.load(Ordering::Relaxed) {
            let at = self.budget.clock.after(write);
            self.conn.deadline.fetch_min(at, Ordering::Relaxed);
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.answered {
            self.conn.answers.fetch_sub(1, Ordering::SeqCst);
        }
        if let Some(network) = self.conn.peer_streams.get()
            && network.fetch_sub(1, Ordering::Relaxed) == 1
        {
            self.budget.holders.fetch_sub(1, Ordering::Relaxed);
        }
        self.budget.streams.fetch_sub(1, Ordering::Relaxed);
        if self.conn.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Nothing in flight: the connection waits for a request, may
            // be closed to make room, and gets the idle timeout from now
            // (bytes that open no request, such as PINGs, do not extend it).
            self.conn.idle.store(true, Ordering::Relaxed);
            self.conn.waiting(&self.budget.clock, self.idle);
        }
    }
}

/// A clock in milliseconds since the budget was made, advanced by the
/// sweeper: reading it costs a load, where a timer per read cost a timer
/// wheel registration (a lock) on every request.
pub(crate) struct Coarse {
    start: Instant,
    now_ms: AtomicU64,
}

impl Coarse {
    pub(crate) fn now(&self) -> u64 {
        self.now_ms.load(Ordering::Relaxed)
    }

    /// `now` plus `d`, in the clock's milliseconds.
    pub(crate) fn after(&self, d: Duration) -> u64 {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.now().saturating_add(ms)
    }

    fn tick(&self) -> u64 {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.now_ms.store(ms, Ordering::Relaxed);
        ms
    }
}

/// What the accept loop and the sweeper see of a connection.
pub(crate) struct ConnState {
    /// True while waiting for a request (between requests, or while its
    /// head trickles in): such a connection may be closed to make room.
    pub(crate) idle: AtomicBool,
    /// When the current wait (for a head, or a body) expires, in coarse
    /// milliseconds; `u64::MAX` while the connection is not waiting on its
    /// client (a handler runs: it keeps its own time).
    pub(crate) deadline: AtomicU64,
    /// Requests in flight on it, once hyper has it.
    pub(crate) streams: AtomicUsize,
    /// Of `streams`, those whose body has not all arrived: when every
    /// request in flight is one, the connection waits on its client.
    pub(crate) bodies: AtomicUsize,
    /// Of `streams`, those whose handler has answered and whose answer
    /// has not all been sent: each waits on its client to read (an
    /// HTTP/2 client that opens no window, an HTTP/1.1 client that does
    /// not read), like a body that has not all arrived.
    pub(crate) answers: AtomicUsize,
    /// The earliest body deadline of those (coarse milliseconds; may be
    /// earlier than any of them, never later), `u64::MAX` with none.
    pub(crate) body_deadline: AtomicU64,
    /// The tasks reading those bodies, woken at the body deadline to find
    /// it passed. A connection's own lock, taken only when a body read
    /// has to wait.
    body_wakers: parking_lot::Mutex<Vec<Waker>>,
    /// When it was accepted, in coarse milliseconds.
    pub(crate) since: u64,
    /// The client's address.
    pub(crate) peer: IpAddr,
    /// The client's network (see [`Budget::group_by`]): connections and
    /// streams are shared fairly between networks.
    pub(crate) net: IpAddr,
    /// The client has sent something.
    pub(crate) heard: AtomicBool,
    /// An answer has been sent on it: a client that has been served.
    pub(crate) served: AtomicBool,
    /// Its network's requests in flight on hyper connections (set when
    /// its first stream opens).
    pub(crate) peer_streams: std::sync::OnceLock<Arc<AtomicUsize>>,
    /// Hyper serves it: past its deadline it is told to close (GOAWAY)
    /// before it is aborted.
    pub(crate) hyper: AtomicBool,
    /// Told to close.
    pub(crate) expiring: AtomicBool,
    /// Signalled when it is told to close.
    pub(crate) expire: Notify,
}

impl ConnState {
    pub(crate) fn new(budget: &Budget, peer: IpAddr) -> ConnState {
        ConnState {
            idle: AtomicBool::new(true),
            deadline: AtomicU64::new(u64::MAX),
            streams: AtomicUsize::new(0),
            bodies: AtomicUsize::new(0),
            answers: AtomicUsize::new(0),
            body_deadline: AtomicU64::new(u64::MAX),
            body_wakers: parking_lot::Mutex::new(Vec::new()),
            since: budget.clock.now(),
            peer,
            net: budget.network(peer),
            heard: AtomicBool::new(false),
            served: AtomicBool::new(false),
            peer_streams: std::sync::OnceLock::new(),
            hyper: AtomicBool::new(false),
            expiring: AtomicBool::new(false),
            expire: Notify::new(),
        }
    }

    /// In a request and waiting on its client: on the direct path, for
    /// the rest of a body; on hyper, every request in flight waits for
    /// the rest of its body (a request whose body is in may be waiting on
    /// a handler or an upstream: its connection is busy).
    pub(crate) fn waits_on_client(&self) -> bool {
        match self.streams.load(Ordering::SeqCst) {
            0 => {
                !self.idle.load(Ordering::SeqCst)
                    && self.deadline.load(Ordering::Relaxed) != u64::MAX
            }
            n => self.bodies.load(Ordering::SeqCst) + self.answers.load(Ordering::SeqCst) >= n,
        }
    }

    /// Waiting for a request, with none in flight. (A stream's guard may
    /// mark the connection idle on one thread while another opens a
    /// stream: the count settles it.)
    pub(crate) fn is_idle(&self) -> bool {
        self.idle.load(Ordering::SeqCst) && self.streams.load(Ordering::SeqCst) == 0
    }

    /// Sets the connection's deadline `limit` from now, unless it was told
    /// to close: its grace is given once, and nothing moves it after.
    pub(crate) fn waiting(&self, clock: &Coarse, limit: Duration) {
        if self.expiring.load(Ordering::Relaxed) {
            return;
        }
        self.deadline.store(clock.after(limit), Ordering::Relaxed);
    }

    pub(crate) fn busy(&self) {
        self.deadline.store(u64::MAX, Ordering::Relaxed);
    }

    /// A body due at `deadline` begins.
    pub(crate) fn body_begins(&self, deadline: u64) {
        self.bodies.fetch_add(1, Ordering::SeqCst);
        self.body_deadline.fetch_min(deadline, Ordering::Relaxed);
    }

    /// A body due at `deadline` has to wait for its client: `waker` is
    /// woken by the sweeper once the deadline has passed.
    pub(crate) fn body_waits(&self, deadline: u64, waker: &Waker) {
        let mut wakers = self.body_wakers.lock();
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
        self.body_deadline.fetch_min(deadline, Ordering::Relaxed);
    }

    /// A body has all arrived (or failed, or was dropped).
    pub(crate) fn body_ends(&self) {
        if self.bodies.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.body_deadline.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// Wakes every body waiting: each finds whether its own deadline has
    /// passed, and one still due waits again (setting the earliest
    /// deadline anew).
    fn wake_bodies(&self) {
        self.body_deadline.store(u64::MAX, Ordering::Relaxed);
        let wakers = std::mem::take(&mut *self.body_wakers.lock());
        for w in wakers {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests;
