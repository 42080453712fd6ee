//! The upstream's connections, handed out fairly.
//!
//! At most `max` connections are open (idle, in use, or being opened).
//! A request that finds none idle and none to open waits in its group's
//! queue; a connection given back, or a slot freed by one closing, goes
//! to the next waiting group in turn (round robin), to the oldest waiter
//! of that group. So a client whose requests fill the pool (many
//! connections, pipelined requests it never reads the answers to) waits
//! its turn with the others, and a newcomer waits for at most one
//! connection per group ahead of it, not for the whole queue.
//!
//! Before this, a connection given back went to the idle list, where the
//! next request to arrive took it, while requests already waiting for a
//! slot waited for a connection to close: under steady load they waited
//! the whole timeout.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 256;

/// A group of requests that share a turn (the caller names it: the
/// client's network, hashed).
pub type Group = u64;

/// The pool's state, shared with every slot.
#[derive(Debug)]
pub(super) struct Pool {
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Connections open, being opened or promised to a waiter.
    open: usize,
    idle: Vec<TcpStream>,
    /// Waiters by group.
    waiting: HashMap<Group, VecDeque<oneshot::Sender<Grant>>>,
    /// Groups with waiters, in turn order.
    turns: VecDeque<Group>,
}

/// What a waiter is handed.
#[derive(Debug)]
enum Grant {
    /// An idle connection, with its slot.
    Conn(TcpStream),
    /// A slot to open a connection in.
    Open,
}

/// A connection slot: held by a connection for its life (idle ones in
/// the pool too); dropping it frees the slot for the next waiter.
#[derive(Debug)]
pub(super) struct Slot {
    pool: Arc<Pool>,
    /// False once the slot has moved on with its connection.
    held: bool,
}

impl Slot {
    fn new(pool: &Arc<Pool>) -> Slot {
        Slot {
            pool: pool.clone(),
            held: true,
        }
    }

    /// Gives back a connection that can serve again, with this slot.
    pub(super) fn give_back(mut self, conn: TcpStream) {
        self.held = false;
        self.pool.release(Grant::Conn(conn));
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.held {
            self.pool.release(Grant::Open);
        }
    }
}

/// What [`Pool::take`] gives.
#[derive(Debug)]
pub(super) enum Taken {
    /// A connection that was idle.
    Idle(TcpStream, Slot),
    /// A slot: open a connection in it.
    Open(Slot),
}

/// Waiting for a grant; a grant that arrives as the waiter gives up is
/// handed on, never lost.
struct Waiting<'a> {
    pool: &'a Arc<Pool>,
    rx: Option<oneshot::Receiver<Grant>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let Ok(grant) = rx.try_recv() {
                self.pool.release(grant);
            }
        }
    }
}

impl Pool {
    pub(super) fn new(max: usize) -> Arc<Pool> {
        Arc::new(Pool {
            max: max.max(1),
            state: Mutex::new(State::default()),
        })
    }

    /// Connections open now (idle ones included).
    pub(super) fn open(&self) -> usize {
        self.state.lock().open
    }

    /// An idle connection that still looks open, or a slot to open one,
    /// without waiting: `None` when every slot is taken.
    pub(super) fn try_take(self: &Arc<Self>) -> Option<Taken> {
        let mut st = self.state.lock();
        while let Some(c) = st.idle.pop() {
            if still_open(&c) {
                return Some(Taken::Idle(c, Slot::new(self)));
            }
            // Closed by the upstream: its slot is free again.
            st.open -= 1;
        }
        if st.open < self.max {
            st.open += 1;
            return Some(Taken::Open(Slot::new(self)));
        }
        None
    }

    /// [`Pool::try_take`], else waits (at most `timeout`) for the turn of
    /// the group `group` names (asked only then). `None`: every slot
    /// stayed taken for the timeout.
    pub(super) async fn take(
        self: &Arc<Self>,
        group: &(dyn Fn() -> Group + Sync),
        timeout: Duration,
    ) -> Option<Taken> {
        if let Some(t) = self.try_take() {
            return Some(t);
        }
        let group = group();
        let rx = {
            let mut st = self.state.lock();
            // Taken again under the lock: a slot may have been freed since.
            if st.open < self.max {
                st.open += 1;
                return Some(Taken::Open(Slot::new(self)));
            }
            let (tx, rx) = oneshot::channel();
            let queue = st.waiting.entry(group).or_default();
            // Waiters that gave up are not kept.
            queue.retain(|w| !w.is_closed());
            let first = queue.is_empty();
            queue.push_back(tx);
            if first {
                st.turns.push_back(group);
            }
            rx
        };
        let mut waiting = Waiting {
            pool: self,
            rx: Some(rx),
        };
        let rx = waiting.rx.as_mut()?;
        let grant = tokio::time::timeout(timeout, rx).await.ok()?.ok()?;
        waiting.rx = None;
        Some(match grant {
            Grant::Conn(c) => Taken::Idle(c, Slot::new(self)),
            Grant::Open => Taken::Open(Slot::new(self)),
        })
    }

    /// Hands `grant` to the next waiting group's oldest waiter, or, with
    /// none, keeps the connection idle (or frees the slot).
    fn release(&self, mut grant: Grant) {
        let mut st = self.state.lock();
        while let Some(&group) = st.turns.front() {
            let Some(tx) = st.waiting.get_mut(&group).and_then(VecDeque::pop_front) else {
                // The group has no one left waiting.
                st.turns.pop_front();
                st.waiting.remove(&group);
                continue;
            };
            match tx.send(grant) {
                Ok(()) => {
                    // Its turn is over: to the back if it waits for more.
                    st.turns.pop_front();
                    if st.waiting.get(&group).is_some_and(|q| !q.is_empty()) {
                        st.turns.push_back(group);
                    } else {
                        st.waiting.remove(&group);
                    }
                    return;
                }
                // That waiter gave up: the group's next one.
                Err(g) => grant = g,
            }
        }
        match grant {
            Grant::Conn(c) if st.idle.len() < MAX_IDLE => st.idle.push(c),
            // Dropped after the lock: closing a socket can take a moment.
            Grant::Conn(c) => {
                st.open -= 1;
                drop(st);
                drop(c);
            }
            Grant::Open => st.open -= 1,
        }
    }
}

/// Whether an idle connection still looks open: one with data or an end
/// of stream waiting (the upstream closed it, or is misbehaving) is not.
fn still_open(conn: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(conn.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected socket to give back as an idle connection.
    async fn socket() -> TcpStream {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        // The server side is kept open (leaked) so the client looks open.
        let (s, _) = l.accept().await.unwrap();
        std::mem::forget(s);
        c
    }

    const LONG: Duration = Duration::from_secs(30);

    fn slot(t: Option<Taken>) -> Slot {
        match t.expect("taken") {
            Taken::Idle(_, s) | Taken::Open(s) => s,
        }
    }

    /// Regression: a connection given back went to the idle list, and a
    /// request already waiting waited for one to close (the timeout,
    /// under load): now it is handed the connection.
    #[tokio::test]
    async fn a_connection_given_back_goes_to_a_waiter() {
        let pool = Pool::new(1);
        let held = slot(pool.try_take());
        assert!(pool.try_take().is_none(), "one slot");
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.take(&|| 7, LONG).await });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.give_back(socket().await);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        let Ok(Ok(Some(Taken::Idle(_, s)))) = got else {
            panic!("the waiter did not get the connection: {got:?}");
        };
        assert_eq!(pool.open(), 1);
        drop(s);
        assert_eq!(pool.open(), 0);
    }

    /// Turns go round the groups: a group with many waiters ahead does
    /// not make a newcomer's group wait behind all of them.
    #[tokio::test]
    async fn turns_go_round_the_groups() {
        let pool = Pool::new(1);
        let mut held = slot(pool.try_take());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let mut wait = |group: Group, name: &'static str| {
            let (p, order) = (pool.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let s = slot(p.take(&move || group, LONG).await);
                order.lock().push(name);
                // Held until the test frees it.
                s
            }));
        };
        for name in ["a1", "a2", "a3"] {
            wait(1, name);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        wait(2, "b1");
        tokio::time::sleep(Duration::from_millis(5)).await;
        for _ in 0..4 {
            drop(held);
            // The next one's turn: wait until it has it.
            let before = order.lock().len();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while order.lock().len() == before {
                assert!(std::time::Instant::now() < deadline, "no one was served");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let done = tasks.iter().position(tokio::task::JoinHandle::is_finished);
            held = tasks.remove(done.unwrap()).await.unwrap();
        }
        assert_eq!(*order.lock(), ["a1", "b1", "a2", "a3"]);
        drop(held);
        assert_eq!(pool.open(), 0);
    }

    /// A waiter that gives up leaves no slot behind: the slot it would
    /// have been handed goes to the next, or back to the pool.
    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_slot() {
        let pool = Pool::new(2);
        let a = slot(pool.try_take());
        let b = slot(pool.try_take());
        for _ in 0..3 {
            assert!(pool.take(&|| 1, Duration::from_millis(5)).await.is_none());
        }
        drop(a);
        b.give_back(socket().await);
        assert_eq!(pool.open(), 1, "the idle connection");
        let c = slot(pool.try_take());
        let d = slot(pool.try_take());
        assert!(pool.try_take().is_none());
        drop((c, d));
        assert_eq!(pool.open(), 0);
    }
}
