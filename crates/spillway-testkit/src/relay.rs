//! A TCP relay between a client and a server on loopback, for failure tests
//! of a link (the Redis store's connection above all): it adds latency,
//! cuts the link or stalls it, then heals it, while both ends stay real.
//!
//! Why a relay rather than signals to the server: `SIGSTOP` stalls every
//! client of a `redis-server` at once and `SIGKILL` loses its data, while a
//! relay breaks one link and leaves the server as it was, so a test can
//! check what the client does on a slow, dead or silent link and that it
//! recovers once the link heals.
//!
//! Plain std threads, no runtime: the relay serves tests of any runtime,
//! and a test's current-thread Tokio runtime blocked in a call cannot
//! starve it. Per connection and direction, one thread reads chunks and
//! queues them with a due time, and another writes each chunk when it is
//! due, so a delay is latency, not a cap on throughput.
//!
//! # Examples
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::time::Duration;
//!
//! use spillway_testkit::Relay;
//!
//! let server = TcpListener::bind("127.0.0.1:0").unwrap();
//! let relay = Relay::start(server.local_addr().unwrap());
//! relay.set_delay(Duration::from_millis(5));
//!
//! let mut client = TcpStream::connect(relay.addr()).unwrap();
//! client.write_all(b"ping").unwrap();
//! let (mut upstream, _) = server.accept().unwrap();
//! let mut got = [0; 4];
//! upstream.read_exact(&mut got).unwrap();
//! assert_eq!(&got, b"ping");
//! assert_eq!(relay.connections(), 1);
//! ```

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The most a reader takes from a socket at once.
const CHUNK: usize = 16 * 1024;

/// How long the relay tries to reach its target for one connection: a
/// refused loopback port answers at once, and a drop must not wait long on
/// a target that never answers.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest delay kept (`set_delay` clamps to it), so a due time never
/// overflows an `Instant`.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Both sockets of one relayed connection: `[client side, target side]`.
type Pair = Arc<[TcpStream; 2]>;

/// A chunk on its way from a reader to its writer: when it may be written,
/// and the bytes, or `None` for the end of the stream (passed on as a
/// half-close, in order after the bytes before it).
type Chunk = (Instant, Option<Vec<u8>>);

/// What the link does with bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Forwarded after the delay.
    Open,
    /// Connections closed, new ones closed as soon as accepted.
    Cut,
    /// Held by the writers, connections left open.
    Stalled,
}

#[derive(Debug)]
struct State {
    /// Latency added to each chunk read from now on.
    delay: Duration,
    /// What the link does now.
    mode: Mode,
    /// Bumped by every `cut`: a connection registered under an older epoch
    /// was closed, and its writers drop what they still hold instead of
    /// writing it after a heal.
    epoch: u64,
    /// Set by drop: every thread ends.
    stopping: bool,
    /// The sockets of every live connection, so `cut` and drop can shut
    /// them down, which also wakes the threads blocked on them.
    conns: HashMap<u64, Pair>,
    /// The key of the next connection in `conns`.
    next_id: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes writers waiting for a due time or a heal when the link changes.
    changed: Condvar,
    /// Connections accepted, for `Relay::connections`.
    accepted: AtomicUsize,
}

impl Shared {
    /// The state, even after a relay thread panicked: the state is a few
    /// plain fields that a panic cannot leave half-written.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A TCP relay on a free port of 127.0.0.1 that forwards every connection
/// to one target, and that a test can slow down ([`Relay::set_delay`]),
/// cut ([`Relay::cut`]), stall ([`Relay::stall`]) and heal
/// ([`Relay::heal`]) to see how a client survives a bad link.
///
/// Dropping it closes every connection and stops its threads.
#[derive(Debug)]
pub struct Relay {
    /// Where clients connect.
    addr: SocketAddr,
    /// The state shared with the relay's threads.
    shared: Arc<Shared>,
    /// The accept thread, which joins the connections' threads as it ends,
    /// so drop returns only once every thread is gone.
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on 127.0.0.1 (a free port, so tests can run in parallel)
    /// and forwards every connection to `target`.
    ///
    /// A connection whose target cannot be reached is closed, as a proxy
    /// would close it.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound or no thread can be started.
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay on 127.0.0.1");
        let addr = listener.local_addr().expect("the relay's address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                delay: Duration::ZERO,
                mode: Mode::Open,
                epoch: 0,
                stopping: false,
                conns: HashMap::new(),
                next_id: 0,
            }),
            changed: Condvar::new(),
            accepted: AtomicUsize::new(0),
        });
        let s = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name(format!("relay-{}", addr.port()))
            .spawn(move || accept_loop(&listener, target, &s))
            .expect("start the relay's accept thread");
        Relay {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Where clients connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>/0`: the URL a Redis client is given when
    /// the target is a Redis server.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.addr.port())
    }

    /// Adds `d` of latency to every chunk in each direction, so a request
    /// and its answer gain about `2 * d`, as on a distant link.
    ///
    /// Bytes keep their order. It applies to the chunks read from now on,
    /// on existing and new connections; it is clamped to a day.
    pub fn set_delay(&self, d: Duration) {
        self.shared.lock().delay = d.min(MAX_DELAY);
    }

    /// Cuts the link, as when the server or the network resets: existing
    /// connections are closed (both sides shut down, bytes still held are
    /// dropped) and new ones are accepted and closed at once, until
    /// [`Relay::heal`].
    pub fn cut(&self) {
        let mut st = self.shared.lock();
        st.mode = Mode::Cut;
        st.epoch += 1;
        for pair in st.conns.values() {
            shut(pair);
        }
        drop(st);
        self.shared.changed.notify_all();
    }

    /// Stalls the link instead, like a partition where packets are dropped
    /// silently: bytes are held (not forwarded, connections stay open) until
    /// [`Relay::heal`], so a client sees no error, only silence.
    ///
    /// New connections are accepted and held too. The relay keeps reading
    /// what the ends send, so their writes succeed and memory grows with
    /// what is held.
    pub fn stall(&self) {
        self.shared.lock().mode = Mode::Stalled;
        self.shared.changed.notify_all();
    }

    /// Ends a cut or a stall: held bytes are forwarded (once their delay
    /// has passed) and new connections go through. A delay stays.
    pub fn heal(&self) {
        self.shared.lock().mode = Mode::Open;
        self.shared.changed.notify_all();
    }

    /// Connections accepted so far, including those a cut closed at once:
    /// how a test sees that a client reconnected.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    /// Closes every connection and stops the threads, so a test's relay
    /// leaves nothing behind.
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.stopping = true;
        for pair in st.conns.values() {
            shut(pair);
        }
        drop(st);
        self.shared.changed.notify_all();
        // The accept thread is blocked in accept(): a connection wakes it,
        // and it sees `stopping`. If even that fails (no descriptors left),
        // leave the thread behind rather than hang the test.
        if TcpStream::connect(self.addr).is_ok()
            && let Some(accept) = self.accept.take()
        {
            let _ = accept.join();
        }
    }
}

/// Shuts down both sockets of a connection: the ends see it closed and the
/// relay's threads blocked on them wake up.
fn shut(pair: &[TcpStream; 2]) {
    for s in pair {
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// Accepts connections until the relay is dropped, then waits for every
/// connection's threads.
fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let accepted = listener.accept();
        let mode = {
            let st = shared.lock();
            if st.stopping {
                break;
            }
            st.mode
        };
        let Ok((client, _)) = accepted else {
            // Out of descriptors, or a connection reset before it was
            // accepted: the next accept may work.
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if mode == Mode::Cut {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        conns.retain(|c| !c.is_finished());
        let s = Arc::clone(shared);
        // If no thread can be started, the closure and the client in it are
        // dropped: the client sees its connection closed.
        if let Ok(c) = thread::Builder::new().spawn(move || connection(client, target, &s)) {
            conns.push(c);
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

/// Relays one connection until both directions end.
fn connection(client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    let Ok(server) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    // Chunks go out as soon as they are due: Nagle's algorithm would add
    // its own delay to small requests, on top of the one the test asked for.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let pair: Pair = Arc::new([client, server]);
    let (id, epoch) = {
        let mut st = shared.lock();
        // A cut or a drop while the target was being reached closes this
        // connection like the others.
        if st.stopping || st.mode == Mode::Cut {
            drop(st);
            shut(&pair);
            return;
        }
        let id = st.next_id;
        st.next_id += 1;
        st.conns.insert(id, Arc::clone(&pair));
        (id, st.epoch)
    };
    let mut threads = Vec::with_capacity(4);
    for (from, to) in [(0, 1), (1, 0)] {
        let (tx, rx) = mpsc::channel();
        let (p, s) = (Arc::clone(&pair), Arc::clone(shared));
        threads.push(thread::Builder::new().spawn(move || read_side(&p, from, &s, &tx)));
        let (p, s) = (Arc::clone(&pair), Arc::clone(shared));
        threads.push(thread::Builder::new().spawn(move || write_side(&p, to, &s, epoch, &rx)));
    }
    // A thread that could not start dropped its end of the channel, which
    // ends its partner; the other direction needs the sockets shut down.
    if threads.iter().any(Result::is_err) {
        shut(&pair);
    }
    for t in threads.into_iter().flatten() {
        let _ = t.join();
    }
    shared.lock().conns.remove(&id);
}

/// Reads chunks from `pair[from]` and queues each with its due time, until
/// the end of the stream or an error.
fn read_side(pair: &[TcpStream; 2], from: usize, shared: &Shared, tx: &Sender<Chunk>) {
    let mut buf = vec![0; CHUNK];
    loop {
        match (&pair[from]).read(&mut buf) {
            Ok(n) => {
                let due = Instant::now() + shared.lock().delay;
                let bytes = (n > 0).then(|| buf[..n].to_vec());
                // A failed send means the writer is gone: it already shut
                // the sockets down.
                if tx.send((due, bytes)).is_err() || n == 0 {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                // A reset: the whole connection is gone, both ways.
                shut(pair);
                return;
            }
        }
    }
}

/// Writes each queued chunk to `pair[to]` when it is due and the link is
/// not stalled; passes the end of the stream on as a half-close.
fn write_side(pair: &[TcpStream; 2], to: usize, shared: &Shared, epoch: u64, rx: &Receiver<Chunk>) {
    for (due, bytes) in rx {
        if !wait_until(shared, epoch, due) {
            return;
        }
        match bytes {
            Some(bytes) => {
                if (&pair[to]).write_all(&bytes).is_err() {
                    shut(pair);
                    return;
                }
            }
            None => {
                let _ = pair[to].shutdown(Shutdown::Write);
                return;
            }
        }
    }
    // The reader ended without an end of stream: it failed and already shut
    // the sockets down.
}

/// Waits until `due` has passed and the link is not stalled; `false` if the
/// connection was cut or the relay dropped meanwhile (its sockets are then
/// already shut down).
fn wait_until(shared: &Shared, epoch: u64, due: Instant) -> bool {
    let mut st = shared.lock();
    loop {
        if st.stopping || st.epoch != epoch {
            return false;
        }
        let now = Instant::now();
        st = if st.mode == Mode::Stalled {
            shared
                .changed
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner)
        } else if now >= due {
            return true;
        } else {
            shared
                .changed
                .wait_timeout(st, due - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long enough that only a broken relay reaches it: a read that waits
    /// this long failed the test.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// An echo server on a free port, serving until the test process ends.
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the echo server");
        let addr = listener.local_addr().expect("echo server address");
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                thread::spawn(move || {
                    let mut buf = [0; 4096];
                    while let Ok(n @ 1..) = conn.read(&mut buf) {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn client(relay: &Relay) -> TcpStream {
        let s = TcpStream::connect(relay.addr()).expect("connect to the relay");
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        s.read_exact(&mut buf).expect("read the echo");
        buf
    }

    fn round_trip(s: &mut TcpStream, msg: &[u8]) {
        s.write_all(msg).expect("write through the relay");
        assert_eq!(read_n(s, msg.len()), msg);
    }

    fn assert_closed(s: &mut TcpStream) {
        let mut buf = [0; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("expected a closed connection, read {n} bytes"),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("connection still open after {PATIENCE:?}")
            }
            Err(_) => {}
        }
    }

    /// Asserts that nothing arrives for a while: a lower bound on silence,
    /// which a busy machine cannot break.
    fn assert_silent(s: &mut TcpStream, for_: Duration) {
        s.set_read_timeout(Some(for_)).unwrap();
        let mut buf = [0; 64];
        match s.read(&mut buf) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected silence, got {other:?}"),
        }
        s.set_read_timeout(Some(PATIENCE)).unwrap();
    }

    #[test]
    fn echoes_through_the_relay() {
        let relay = Relay::start(echo_server());
        let mut c = client(&relay);
        round_trip(&mut c, b"hello");
        round_trip(&mut c, b"again");
        assert_eq!(relay.connections(), 1);
        assert_eq!(
            relay.redis_url(),
            format!("redis://127.0.0.1:{}/0", relay.addr().port())
        );
    }

    #[test]
    fn delay_applies_each_way_to_existing_connections_and_keeps_order() {
        let relay = Relay::start(echo_server());
        let mut c = client(&relay);
        round_trip(&mut c, b"fast");

        relay.set_delay(Duration::from_millis(30));
        let start = Instant::now();
        round_trip(&mut c, b"slow");
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(60),
            "round trip took {took:?}"
        );

        // Many small writes in a row come back whole and in order.
        let msgs: Vec<Vec<u8>> = (0..50).map(|i| format!("<{i}>").into_bytes()).collect();
        for m in &msgs {
            c.write_all(m).unwrap();
        }
        let all = msgs.concat();
        assert_eq!(read_n(&mut c, all.len()), all);
    }

    #[test]
    fn cut_closes_existing_and_new_connections_until_heal() {
        let relay = Relay::start(echo_server());
        let mut before = client(&relay);
        round_trip(&mut before, b"hello");

        relay.cut();
        assert_closed(&mut before);
        let mut during = client(&relay);
        assert_closed(&mut during);

        relay.heal();
        let mut after = client(&relay);
        round_trip(&mut after, b"healed");
        assert_eq!(relay.connections(), 3);
    }

    #[test]
    fn cut_drops_bytes_held_by_a_stall() {
        let relay = Relay::start(echo_server());
        let mut c = client(&relay);
        round_trip(&mut c, b"hello");
        relay.stall();
        c.write_all(b"lost").unwrap();
        relay.cut();
        assert_closed(&mut c);
        relay.heal();
        round_trip(&mut client(&relay), b"fresh");
    }

    #[test]
    fn stall_holds_bytes_until_heal() {
        let relay = Relay::start(echo_server());
        let mut before = client(&relay);
        round_trip(&mut before, b"hello");

        relay.stall();
        before.write_all(b"held").unwrap();
        let mut during = client(&relay);
        during.write_all(b"new").unwrap();
        assert_silent(&mut before, Duration::from_millis(300));
        assert_silent(&mut during, Duration::from_millis(50));

        relay.heal();
        assert_eq!(read_n(&mut before, 4), b"held");
        assert_eq!(read_n(&mut during, 3), b"new");
        round_trip(&mut before, b"flowing");
    }

    #[test]
    fn unreachable_target_closes_the_client() {
        let relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], crate::free_port())));
        assert_closed(&mut client(&relay));
    }

    #[test]
    fn drop_closes_connections_with_bytes_in_flight() {
        let relay = Relay::start(echo_server());
        let mut delayed = client(&relay);
        round_trip(&mut delayed, b"hello");
        relay.set_delay(Duration::from_secs(3600));
        delayed.write_all(b"late").unwrap();

        let relay2 = Relay::start(echo_server());
        let mut stalled = client(&relay2);
        round_trip(&mut stalled, b"hello");
        relay2.stall();
        stalled.write_all(b"held").unwrap();

        // Neither writer's wait may keep drop from returning.
        drop(relay);
        drop(relay2);
        assert_closed(&mut delayed);
        assert_closed(&mut stalled);
    }
}
