//! The accept loop and the direct HTTP/1.1 path in front of hyper.
//!
//! Every connection starts here. While its requests are in the direct
//! path's strict subset (see [`crate::head`]) and the [`Handler`] takes
//! them, they are read in place and answered by the handler into one
//! buffer: no service stack, header map or body channel. At the first
//! request that is anything else, the connection and every byte read from
//! it so far go to hyper and the handler's fallback service for the rest of
//! its life.
//!
//! Every connection is bounded in time ([`Limits`]): a whole request head
//! must arrive within `head_timeout`, a keep-alive connection may wait
//! `idle_timeout` for its next request, a whole body must arrive within
//! `body_timeout` of its head (on the direct path and on hyper's alike:
//! bytes arriving do not extend it) and an answer must be taken by the
//! client (`write_timeout` per write). The number of connections is capped, for
//! every listener of a process at once ([`Budget`]): at the cap, the
//! connection that has waited longest for a request is closed to make
//! room, and when the process runs out of descriptors, accepting backs off
//! and idle connections are shed, so a flood of idle sockets cannot stop
//! new clients from being answered. A request whose body has not all
//! arrived waits on its client, on either path: its connection is shed
//! like an idle one. A connection handed to hyper keeps the
//! same deadlines, HTTP/2 streams are capped per connection
//! (`max_streams`) and process-wide (the budget), and a connection with no
//! request in flight gets no more time for bytes that open none.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::budget::{Budget, ConnState};
use crate::head::{self, Head, RequestHead};
use crate::io::Rewind;
use crate::stream::{Accept, PlainTcp, Stream, Writer, WriterKind};

mod accept;
mod deadlines;
mod limits;
#[cfg(unix)]
mod unix;

pub(crate) use accept::Incoming;
use accept::{accept_loop, size_backlog};

use deadlines::{Gathered, Timed, age_timer, read_more, write_buffered};
pub use limits::Limits;
#[cfg(unix)]
pub use unix::{UNIX_PEER, serve_unix};

/// A request the direct path read in full.
#[derive(Debug)]
pub struct Message<'a> {
    /// Request line and headers.
    pub head: RequestHead<'a, 'a>,
    /// The body (its `Content-Length` bytes).
    pub body: &'a [u8],
    /// The client asked to close after this answer.
    pub close: bool,
    /// Who sent it.
    pub peer: SocketAddr,
}

impl Message<'_> {
    /// A HEAD request: its answer has no body.
    pub fn is_head(&self) -> bool {
        self.head.method == "HEAD"
    }
}

/// The client side of a direct-path connection, for a handler's answer.
#[derive(Debug)]
pub struct ClientConn<'c> {
    io: Writer<'c>,
    write_timeout: Duration,
}

impl ClientConn<'_> {
    /// Writes all of `bytes` within the write timeout; false if the client
    /// is gone or does not read.
    pub async fn write_all(&mut self, bytes: &[u8]) -> bool {
        let tcp = match &mut self.io.0 {
            WriterKind::Tcp(tcp) => tcp,
            WriterKind::Buffered(s) => {
                return write_buffered(&mut **s, bytes, self.write_timeout).await;
            }
        };
        // Most answers fit the socket's buffer at once: only a write that
        // has to wait needs a timer.
        let rest = match tcp.try_write(bytes) {
            Ok(n) if n == bytes.len() => return true,
            Ok(n) => &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => bytes,
            Err(_) => return false,
        };
        matches!(
            tokio::time::timeout(self.write_timeout, tcp.write_all(rest)).await,
            Ok(Ok(()))
        )
    }

    /// Completes when the client closes its side (or the connection
    /// breaks): true then; false when it sent more bytes (a pipelined
    /// request), which leaves nothing to watch for. On TLS, the socket
    /// under the session is watched: a client that says goodbye with a
    /// TLS alert before closing has sent bytes, and is not seen leaving.
    pub async fn gone(&mut self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.io.socket().peek(&mut probe).await, Ok(0) | Err(_))
    }

    /// The write timeout, for a handler that streams.
    pub fn write_timeout(&self) -> Duration {
        self.write_timeout
    }
}

/// A way in, as the wire sees it: which plain requests it answers on the
/// direct path, how, and the hyper service for everything else.
pub trait Handler: Send + Sync + 'static {
    /// What [`Handler::route`] found, for [`Handler::serve`].
    type Route: Send;
    /// The body of the fallback service's answers.
    type Body: hyper::body::Body<
            Data = bytes::Bytes,
            Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        > + Send
        + Unpin
        + 'static;
    /// The hyper service for requests the direct path does not take.
    type Fallback: hyper::service::Service<
            http::Request<crate::RequestBody>,
            Response = http::Response<Self::Body>,
            Error = Infallible,
            Future: Send + Unpin + 'static,
        > + Send
        + 'static;

    /// Largest body the direct path buffers for this handler.
    fn max_body(&self) -> usize;

    /// Whether the direct path answers this request (`Some`), or hyper.
    fn route(&self, head: &RequestHead<'_, '_>) -> Option<Self::Route>;

    /// Answers `msg`, writing to `conn` (`out` is a scratch buffer);
    /// false when the connection must close.
    fn serve<'a>(
        &'a self,
        route: Self::Route,
        msg: Message<'a>,
        conn: &'a mut ClientConn<'_>,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = bool> + Send + 'a;

    /// The whole answer (head and body) refusing a request with `status`
    /// before any handler saw it; the connection closes after it.
    fn refuse(&self, status: StatusCode, detail: &str, out: &mut Vec<u8>);

    /// The service for a connection handed to hyper.
    fn fallback(&self, peer: SocketAddr) -> Self::Fallback;
}

/// Accepts connections on `listener` until `shutdown` completes, then lets
/// requests in flight finish (idle connections close at once). Plain TCP:
/// [`serve_on`] with [`PlainTcp`].
///
/// # Errors
/// None today: accept errors are backed off and logged.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    serve_on(listener, PlainTcp, handler, limits, shutdown).await
}

/// As [`serve`], each connection's stream made by `accept` (TLS, say),
/// with a budget of its own (`limits.max_connections` connections).
///
/// # Errors
/// None today: accept errors are backed off and logged.
pub async fn serve_on<A: Accept, H: Handler>(
    listener: TcpListener,
    accept: A,
    handler: Arc<H>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let budget = Budget::new(limits.max_connections, limits.max_streams_total);
    serve_in(&budget, listener, accept, handler, limits, shutdown).await
}

/// As [`serve_on`], counting connections and streams against `budget`,
/// which every listener of the process shares: one cap for all of them,
/// and at the cap the connection that has waited longest for a request,
/// on any listener, makes room. A handshake is bounded by the head
/// timeout and counts against the cap from the moment its socket is
/// accepted: while it waits for its client it is an idle connection,
/// closed first to make room.
///
/// # Errors
/// None today: accept errors are backed off and logged.
pub async fn serve_in<A: Accept, H: Handler>(
    budget: &Arc<Budget>,
    listener: TcpListener,
    accept: A,
    handler: Arc<H>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let acceptor = Arc::new(accept);
    size_backlog(&listener, limits.listen_backlog);
    accept_loop(
        budget,
        listener,
        limits,
        shutdown,
        |tcp, peer, id, state, drain| {
            let _ = tcp.set_nodelay(true);
            let conn = Conn {
                handler: handler.clone(),
                accept: acceptor.clone(),
                drain,
                limits,
                peer,
                id,
                state,
            };
            tokio::spawn(conn.run(tcp)).abort_handle()
        },
    )
    .await
}

async fn finish(
    drain: Arc<Drain>,
    date: tokio::task::JoinHandle<()>,
    limits: Limits,
) -> io::Result<()> {
    // Answers in flight finish (and close their connections), idle direct
    // connections close now, hyper's shut down gracefully.
    drain.stopping.store(true, Ordering::SeqCst);
    drain.hyper.send_replace(true);
    drain.budget.abort_listener(drain.listener, true);
    let deadline = Instant::now() + limits.drain_timeout;
    while drain.busy.load(Ordering::SeqCst) > 0 || drain.hyper.receiver_count() > 0 {
        if Instant::now() >= deadline {
            tracing::warn!(
                "connections still busy after {:?}; stopping anyway",
                limits.drain_timeout
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drain.budget.abort_listener(drain.listener, false);
    date.abort();
    Ok(())
}

/// What a listener's connections share with its accept loop, for
/// shutdown. (Idle direct connections wait in a plain read and are aborted
/// at shutdown: watching a shutdown signal there as well cost a
/// registration on a shared list per request.)
struct Drain {
    /// Set when the server stops: answers then close their connections.
    stopping: AtomicBool,
    /// Direct-path requests being answered.
    busy: AtomicUsize,
    /// Connections handed to hyper hold a receiver and shut down gracefully
    /// when it turns true.
    hyper: watch::Sender<bool>,
    /// The process's connections, streams and deadlines.
    budget: Arc<Budget>,
    /// This listener's number in the budget.
    listener: u64,
}

/// Counts one request as busy while alive.
struct Busy<'a>(&'a AtomicUsize);

impl<'a> Busy<'a> {
    fn new(n: &'a AtomicUsize) -> Busy<'a> {
        n.fetch_add(1, Ordering::SeqCst);
        Busy(n)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection.
struct Conn<H, A> {
    handler: Arc<H>,
    /// What makes its stream.
    accept: Arc<A>,
    drain: Arc<Drain>,
    limits: Limits,
    peer: SocketAddr,
    id: u64,
    /// What the accept loop and the sweeper see.
    state: Arc<ConnState>,
}

impl<H, A> Drop for Conn<H, A> {
    fn drop(&mut self) {
        self.drain.budget.remove(self.id, &self.state);
    }
}

/// What a connection waits for from its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The first byte of a request.
    Idle,
    /// The rest of a request head.
    Head,
    /// The rest of a request body.
    Body,
}

/// What one look at the buffer did.
enum Step {
    /// A request was answered; `consumed` bytes of the buffer were it.
    Served { consumed: usize, keep: bool },
    /// The head is not all there.
    NeedHead,
    /// The head is, the body is not.
    NeedBody,
    /// The connection goes to hyper.
    Hyper,
    /// A refusal was written: close.
    Refused,
    /// Nothing more to do.
    Closed,
}

/// How a read went.
enum Read {
    More,
    /// Closed, broken or too slow: end the connection quietly.
    Done,
}

impl<H: Handler, A: Accept> Conn<H, A> {
    async fn run(self, tcp: TcpStream) {
        if A::HANDSHAKE {
            // The handshake's first bytes: a client that sent them is shed
            // after every silent connection.
            if tcp.readable().await.is_err() {
                return;
            }
            self.state.heard.store(true, Ordering::Relaxed);
        }
        let mut tcp = match self.accept.accept(tcp).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(peer = %self.peer, error = %e, "handshake failed");
                return;
            }
        };
        if A::HANDSHAKE {
            self.state
                .waiting(&self.drain.budget.clock, self.limits.head_timeout);
        }
        let mut buf = BytesMut::with_capacity(4096);
        let mut out = Vec::with_capacity(1024);
        let max_body = self.handler.max_body();
        if !self.limits.direct_path {
            return self.hand_off(tcp, buf).await;
        }
        // What the connection waits for: the first byte of a request (idle),
        // the rest of its head, or the rest of its body.
        let mut waiting_for = Wait::Idle;
        self.state.idle.store(true, Ordering::Relaxed);
        loop {
            let step = self.step(&buf, max_body, &mut tcp, &mut out).await;
            match step {
                Step::Served { consumed, keep } => {
                    self.state.served.store(true, Ordering::Relaxed);
                    buf.advance(consumed);
                    if !keep || self.drain.stopping.load(Ordering::Relaxed) {
                        let _ =
                            tokio::time::timeout(self.limits.write_timeout, tcp.shutdown()).await;
                        return;
                    }
                    waiting_for = Wait::Idle;
                    self.state.idle.store(true, Ordering::Relaxed);
                    if buf.is_empty() {
                        self.state
                            .waiting(&self.drain.budget.clock, self.limits.idle_timeout);
                    } else {
                        // A pipelined request has started. The task
                        // yields before it: answering a whole pipeline in
                        // one poll kept every other connection (and the
                        // accept loop) waiting for all of it.
                        waiting_for = Wait::Head;
                        self.state
                            .waiting(&self.drain.budget.clock, self.limits.head_timeout);
                        tokio::task::yield_now().await;
                    }
                    continue;
                }
                Step::Hyper => return self.hand_off(tcp, buf).await,
                Step::Refused => {
                    let _ = tokio::time::timeout(self.limits.write_timeout, tcp.shutdown()).await;
                    return;
                }
                Step::Closed => return,
                Step::NeedHead => {
                    if waiting_for == Wait::Idle && !buf.is_empty() {
                        waiting_for = Wait::Head;
                        self.state
                            .waiting(&self.drain.budget.clock, self.limits.head_timeout);
                    }
                }
                Step::NeedBody => {
                    self.state.idle.store(false, Ordering::Relaxed);
                    // The whole body has its time from the end of the
                    // head: a read does not extend it (a byte every few
                    // seconds would hold the connection forever).
                    if waiting_for != Wait::Body {
                        waiting_for = Wait::Body;
                        self.state
                            .waiting(&self.drain.budget.clock, self.limits.body_timeout);
                    }
                }
            }
            if let Read::Done = read_more(&mut tcp, &mut buf).await {
                return;
            }
            self.state.heard.store(true, Ordering::Relaxed);
            if waiting_for == Wait::Idle {
                waiting_for = Wait::Head;
                self.state
                    .waiting(&self.drain.budget.clock, self.limits.head_timeout);
            }
        }
    }

    /// Parses what `buf` holds (once) and, when a whole direct-path
    /// request is there, serves it.
    async fn step(
        &self,
        buf: &[u8],
        max_body: usize,
        tcp: &mut A::Stream,
        out: &mut Vec<u8>,
    ) -> Step {
        if self.limits.http2_only {
            return self.h2_only(buf, tcp, out).await;
        }
        let mut headers = head::uninit_headers();
        let (head, parsed) = head::read(buf, &mut headers, max_body);
        let (head_len, body_len, close) = match head {
            Head::Direct {
                head_len,
                body_len,
                close,
            } => (head_len, body_len, close),
            Head::Partial => return Step::NeedHead,
            Head::Hyper => return Step::Hyper,
            Head::Refuse(r) => {
                self.state.busy();
                out.clear();
                self.handler.refuse(r.status(), r.detail(), out);
                let mut conn = self.client(tcp);
                conn.write_all(out).await;
                return Step::Refused;
            }
        };
        let Some(parsed) = parsed else {
            return Step::Closed;
        };
        if buf.len() < head_len + body_len {
            return Step::NeedBody;
        }
        let Some(route) = self.handler.route(&parsed) else {
            return Step::Hyper;
        };
        self.state.idle.store(false, Ordering::Relaxed);
        self.state.busy();
        out.clear();
        let _busy = Busy::new(&self.drain.busy);
        let msg = Message {
            head: parsed,
            body: &buf[head_len..head_len + body_len],
            close,
            peer: self.peer,
        };
        let mut conn = self.client(tcp);
        let keep = self.handler.serve(route, msg, &mut conn, out).await;
        Step::Served {
            consumed: head_len + body_len,
            keep: keep && !close,
        }
    }

    /// On an HTTP/2-only listener: hyper once the connection preface is
    /// there, a plain refusal for anything else (an HTTP/1.1 request).
    async fn h2_only(&self, buf: &[u8], tcp: &mut A::Stream, out: &mut Vec<u8>) -> Step {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let n = buf.len().min(PREFACE.len());
        if buf[..n] != PREFACE[..n] {
            self.state.busy();
            out.clear();
            self.handler.refuse(
                StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                "this port speaks HTTP/2 only",
                out,
            );
            self.client(tcp).write_all(out).await;
            return Step::Refused;
        }
        if n < PREFACE.len() {
            Step::NeedHead
        } else {
            Step::Hyper
        }
    }

    fn client<'c>(&self, tcp: &'c mut A::Stream) -> ClientConn<'c> {
        ClientConn {
            io: tcp.writer(),
            write_timeout: self.limits.write_timeout,
        }
    }

    /// Serves the rest of the connection with hyper and the handler's
    /// fallback, starting with the bytes already read.
    async fn hand_off<S>(self, tcp: S, buf: BytesMut)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // No request in flight yet: one must open within the head timeout
        // (an HTTP/2 connection's preface and SETTINGS open none), and
        // until one does the connection may be closed to make room.
        self.state.idle.store(true, Ordering::Relaxed);
        self.state.hyper.store(true, Ordering::Relaxed);
        if !buf.is_empty() {
            self.state.heard.store(true, Ordering::Relaxed);
        }
        let io = Rewind {
            pre: buf.freeze(),
            inner: tcp,
        };
        self.state
            .waiting(&self.drain.budget.clock, self.limits.head_timeout);
        let io = TokioIo::new(Timed {
            inner: io,
            state: self.state.clone(),
            drain: self.drain.clone(),
            idle: self.limits.idle_timeout,
            write: self.limits.write_timeout,
            write_blocked: false,
        });
        let svc = crate::streams::Counted {
            inner: self.handler.fallback(self.peer),
            budget: self.drain.budget.clone(),
            conn: self.state.clone(),
            idle: self.limits.idle_timeout,
            body: self.limits.body_timeout,
            write: self.limits.write_timeout,
        };
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        if self.limits.http2_only {
            builder = builder.http2_only();
        }
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.head_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.limits.max_streams)
            // gRPC answers need no Date header (grpc-go sends none), and
            // one costs a header to encode per call.
            .auto_date_header(!self.limits.http2_only);
        let conn = builder.serve_connection_with_upgrades(io, svc);
        tokio::pin!(conn);
        let mut stop = self.drain.hyper.subscribe();
        if *stop.borrow() {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
            return;
        }
        let old = age_timer(self.limits.max_connection_age, self.id);
        tokio::pin!(old);
        let gathered = Gathered {
            inner: conn.as_mut(),
            on: self.limits.http2_only,
            yielded: false,
        };
        tokio::select! {
            _ = gathered => {}
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            () = self.state.expire.notified() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            () = &mut old => {
                // GOAWAY: no new streams; those in flight have the grace.
                conn.as_mut().graceful_shutdown();
                let grace = self.limits.max_connection_age_grace;
                if tokio::time::timeout(grace, conn.as_mut()).await.is_err() {
                    tracing::debug!(peer = %self.peer, "closed at its maximum age plus grace");
                }
            }
        }
    }
}
