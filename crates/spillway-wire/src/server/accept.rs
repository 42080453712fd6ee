//! The accept loop's helpers: the listen backlog, and accept failures
//! logged once per change of state.

use std::io;
use std::time::Duration;

use tokio::net::TcpListener;

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
