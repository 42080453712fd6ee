//! The accept loop every listener runs, and its helpers: the listen
//! backlog, and accept failures logged once per change of state.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Drain, Limits, finish};
use crate::budget::{Budget, ConnState};

/// Sets `listener`'s accept queue to `backlog` connections (Linux takes a
/// second `listen` on a listening socket as a new size; the kernel caps
/// it at `net.core.somaxconn`). Tokio binds with 128, as the standard
/// library does: a flood that reconnects as fast as it is shed fills that,
/// and a legitimate client's SYN is then dropped and retried a second
/// later. A listener that cannot be resized keeps serving as it is.
pub(super) fn size_backlog(listener: &TcpListener, backlog: u32) {
    let n = i32::try_from(backlog).unwrap_or(i32::MAX);
    if let Err(e) = socket2::SockRef::from(listener).listen(n) {
        tracing::warn!(error = %e, backlog, "cannot size the listen backlog; keeping the system's");
    }
}

pub(super) fn is_out_of_descriptors(e: &io::Error) -> bool {
    // EMFILE (24) and ENFILE (23) on Linux and the BSDs.
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// Accept failures, logged once per change of state rather than once per
/// attempt, with a growing pause while descriptors are out.
#[derive(Debug, Default)]
pub(super) struct AcceptState {
    /// Consecutive failures.
    failures: u32,
    /// Connections shed for room since the last log line.
    shed: u64,
    /// Connections closed on arrival, their network holding its share.
    refused: u64,
}

impl AcceptState {
    pub(super) fn ok(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                failures = self.failures,
                "accepting connections again after {} failures",
                self.failures
            );
        }
        self.failures = 0;
    }

    pub(super) fn note_shed(&mut self) {
        self.shed += 1;
        if self.shed.is_power_of_two() {
            tracing::warn!(
                shed = self.shed,
                "connection cap reached: closing connections that wait for a request"
            );
        }
    }

    pub(super) fn note_refused(&mut self) {
        self.refused += 1;
        if self.refused.is_power_of_two() {
            tracing::warn!(
                refused = self.refused,
                "connection cap reached: closing new connections from networks holding their share"
            );
        }
    }

    /// How long to pause before the next attempt.
    pub(super) fn failed(&mut self, e: &io::Error) -> Duration {
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(error = %e, "accept failing; backing off until it works again");
        }
        if is_out_of_descriptors(e) {
            let ms = 10u64 << self.failures.min(7);
            Duration::from_millis(ms.min(1000))
        } else {
            // A connection reset before it was accepted: nothing to wait for.
            Duration::ZERO
        }
    }
}

/// Where connections come from: a TCP listener, or a Unix socket's.
pub(crate) trait Incoming {
    /// A connection.
    type Io: Send + 'static;
    /// The next connection and its peer (for a Unix socket, `UNIX_PEER`).
    fn next(&self) -> impl Future<Output = io::Result<(Self::Io, SocketAddr)>> + Send;
}

impl Incoming for TcpListener {
    type Io = TcpStream;
    async fn next(&self) -> io::Result<(TcpStream, SocketAddr)> {
        self.accept().await
    }
}

/// The accept loop every listener runs: connections counted against
/// `budget` and made room for at its cap, each started by `start` (with
/// its peer, number, state and the listener's drain), until `shutdown`;
/// then the drain (see [`finish`]).
pub(super) async fn accept_loop<L: Incoming>(
    budget: &Arc<Budget>,
    listener: L,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    mut start: impl FnMut(
        L::Io,
        SocketAddr,
        u64,
        Arc<ConnState>,
        Arc<Drain>,
    ) -> tokio::task::AbortHandle,
) -> io::Result<()> {
    budget.group_by(limits.ipv4_prefix, limits.ipv6_prefix);
    budget.start_sweeping();
    let drain = Arc::new(Drain {
        stopping: AtomicBool::new(false),
        busy: AtomicUsize::new(0),
        hyper: watch::Sender::new(false),
        budget: budget.clone(),
        listener: budget.next_id(),
    });
    let date = tokio::spawn(crate::write::date_ticker());
    let mut accept = AcceptState::default();
    tokio::pin!(shutdown);
    loop {
        // Over the cap (connections closed to make room whose tasks have
        // not ended yet): wait for them. At the cap, one more is accepted
        // to learn whose it is.
        while budget.over_full() {
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    return finish(drain, date, limits).await;
                }
                () = budget.ended.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.next() => a,
        };
        let (io, peer) = match accepted {
            Ok(a) => {
                accept.ok();
                a
            }
            Err(e) => {
                let pause = accept.failed(&e);
                if is_out_of_descriptors(&e) {
                    budget.shed_idle();
                }
                if !pause.is_zero() {
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
                continue;
            }
        };
        if budget.full() {
            if budget.refuses(peer.ip()) {
                // Its network holds its share: closed at once.
                drop(io);
                accept.note_refused();
                continue;
            }
            // Room is made by closing the connection that has waited
            // longest for a request, or it waits for one to end. The
            // descriptor of a connection closed to make room is free only
            // once its task has ended: wait for that, rather than close
            // another in its place.
            while budget.full() {
                if budget.needs_room() && budget.shed_idle() {
                    accept.note_shed();
                }
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        return finish(drain, date, limits).await;
                    }
                    () = budget.ended.notified() => {}
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
        }
        let id = budget.next_id();
        let state = Arc::new(ConnState::new(budget, peer.ip()));
        // Nothing sent yet: the first request's head (or the handshake)
        // must arrive within the head timeout.
        state.waiting(&budget.clock, limits.head_timeout);
        let drain = drain.clone();
        budget.register(id, drain.listener, state.clone(), || {
            start(io, peer, id, state, drain)
        });
    }
    finish(drain, date, limits).await
}
