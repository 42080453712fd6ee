//! A listener on a Unix socket (a sidecar's gRPC, `GRPC_UDS`): the same
//! accept loop, budget, deadlines and stream caps as a TCP listener. Its
//! connections have no peer address: all of them stand for one peer,
//! [`UNIX_PEER`], so the per-network fair shares at the connection cap and
//! the stream bound treat every local caller as one network, apart from
//! any TCP client. There is no direct HTTP/1.1 path on it: every
//! connection goes to hyper from its first byte (HTTP/2 only when the
//! limits say so).

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use bytes::BytesMut;
use tokio::net::{UnixListener, UnixStream};

use super::{Conn, Handler, Incoming, Limits, accept_loop};
use crate::budget::Budget;
use crate::stream::PlainTcp;

/// The peer every Unix socket connection stands for: `0.0.0.0`, which no
/// TCP client has, so local callers share their own fair share.
pub const UNIX_PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

impl Incoming for UnixListener {
    type Io = UnixStream;
    async fn next(&self) -> io::Result<(UnixStream, SocketAddr)> {
        let (s, _) = self.accept().await?;
        Ok((s, UNIX_PEER))
    }
}

/// As [`serve_in`](super::serve_in), on a Unix socket: connections
/// counted against `budget`, each served by hyper and `handler`'s fallback
/// (with [`UNIX_PEER`] as its peer) under `limits`, until `shutdown`.
///
/// # Errors
/// None today: accept errors are backed off and logged.
pub async fn serve_unix<H: Handler>(
    budget: &Arc<Budget>,
    listener: UnixListener,
    handler: Arc<H>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let plain = Arc::new(PlainTcp);
    accept_loop(
        budget,
        listener,
        limits,
        shutdown,
        |io, peer, id, state, drain| {
            let conn = Conn {
                handler: handler.clone(),
                accept: plain.clone(),
                drain,
                limits,
                peer,
                id,
                state,
            };
            tokio::spawn(conn.hand_off(io, BytesMut::new())).abort_handle()
        },
    )
    .await
}
