//! A direct HTTP/1.1 path in front of hyper.
//!
//! Every connection of `spillway serve` and `spillway proxy` starts here.
//! While its requests are plain HTTP/1.1 (no body or a small `Content-Length`
//! one), they are read with `httparse` and answered on the spot:
//!
//! - [`Direct::Decisions`] (`serve`): `POST /v1/check` and `GET /v1/limit`
//!   are decided and their answers written into one buffer: no service
//!   stack, header map or body channel;
//! - [`Direct::Proxy`] (`proxy`): every request is identified (user, client
//!   IP) from the parsed headers and decided; a denial is written at once,
//!   an admitted request (after its queue wait, if any) goes to the
//!   forwarder with its buffered body and the upstream's answer is streamed
//!   back with `Content-Length` or chunked framing.
//!
//! At the first request that is anything else (another endpoint in `serve`,
//! HTTP/1.0, HTTP/2, a chunked or large body, `Expect`, `Upgrade`, an
//! oversized head, a malformed request), the connection and every byte read
//! from it so far go to hyper and the axum router for the rest of its life,
//! so all other behaviour is hyper's own (large bodies stream there). The
//! answers are the router's, the same in meaning: status, JSON and rate limit
//! headers (the tests run against both paths).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::ConnectInfo;
use bytes::{Buf, Bytes, BytesMut};
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

use crate::AppState;
use crate::http::{self as api, MAX_BODY};
use crate::proxy::{self, DirectProxy, Headers};
use crate::upstream::Outgoing;

/// Largest request head read before handing the connection to hyper (which
/// then answers 431).
const MAX_HEAD: usize = 16 * 1024;
/// Headers parsed in place; a request with more goes to hyper.
const MAX_HEADERS: usize = 32;
/// How long a started request may take to arrive in full.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long shutdown waits for requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the direct path answers itself.
#[derive(Debug, Clone)]
pub(crate) enum Direct {
    /// `POST /v1/check` and `GET /v1/limit`, decided in place.
    Decisions,
    /// Every plain request, proxied.
    Proxy(Arc<DirectProxy>),
}

/// Largest request body the direct path buffers (larger ones stream
/// through hyper).
const MAX_DIRECT_BODY: usize = 64 * 1024;

/// Accepts connections on `listener` until `shutdown` completes, then lets
/// requests in flight finish (idle connections close at once).
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    app: Router,
    direct: Direct,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let drain = Arc::new(Drain {
        stopping: AtomicBool::new(false),
        busy: AtomicUsize::new(0),
        hyper: watch::Sender::new(false),
        conns: parking_lot::Mutex::new(HashMap::new()),
    });
    let mut next_id = 0u64;
    let date = tokio::spawn(date_ticker());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors or a connection reset before accept:
                // keep serving the others.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        next_id += 1;
        let idle = Arc::new(AtomicBool::new(true));
        let conn = Conn {
            state: state.clone(),
            app: app.clone(),
            direct: direct.clone(),
            drain: drain.clone(),
            peer,
            id: next_id,
            idle: idle.clone(),
        };
        // Registered under the lock the task's exit also takes, so a
        // connection that ends at once is still removed after this insert.
        let mut conns = drain.conns.lock();
        let task = tokio::spawn(conn.run(tcp));
        conns.insert(next_id, (idle, task.abort_handle()));
    }
    // Answers in flight finish (and close their connections), idle direct
    // connections close now, hyper's shut down gracefully.
    drain.stopping.store(true, Ordering::SeqCst);
    drain.hyper.send_replace(true);
    for (idle, task) in drain.conns.lock().values() {
        if idle.load(Ordering::SeqCst) {
            task.abort();
        }
    }
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    while drain.busy.load(Ordering::SeqCst) > 0 || drain.hyper.receiver_count() > 0 {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("connections still busy after {DRAIN_TIMEOUT:?}; stopping anyway");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (_, task) in drain.conns.lock().values() {
        task.abort();
    }
    date.abort();
    Ok(())
}

/// What connections share with the accept loop, for shutdown. (Idle direct
/// connections wait in a plain read and are aborted at shutdown: watching a
/// shutdown signal there as well cost a registration on a shared list per
/// request.)
struct Drain {
    /// Set when the server stops: answers then close their connections.
    stopping: AtomicBool,
    /// Direct-path requests being answered.
    busy: AtomicUsize,
    /// Connections handed to hyper hold a receiver and shut down gracefully
    /// when it turns true.
    hyper: watch::Sender<bool>,
    /// Every open connection: whether it waits for a new request, and its task.
    conns: parking_lot::Mutex<HashMap<u64, (Arc<AtomicBool>, tokio::task::AbortHandle)>>,
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
struct Conn {
    state: Arc<AppState>,
    app: Router,
    direct: Direct,
    drain: Arc<Drain>,
    peer: SocketAddr,
    id: u64,
    /// True while waiting for the first byte of a request.
    idle: Arc<AtomicBool>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.drain.conns.lock().remove(&self.id);
    }
}

/// A request the direct path answers.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Check,
    /// With its query string.
    Limit(String),
    /// Any request, for the proxy.
    Proxy,
}

/// What the head of the next request says.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// Not all there yet.
    Partial,
    /// For hyper.
    Other,
    /// For the direct path.
    Direct {
        route: Route,
        head_len: usize,
        body_len: usize,
        close: bool,
    },
}

/// `proxy`: the proxy's direct path (every origin-form request) rather
/// than the decision service's (`/v1/check`, `/v1/limit`).
fn parse(buf: &[u8], proxy: bool) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Head::Partial,
        _ => return Head::Other,
    };
    if req.version != Some(1) {
        return Head::Other;
    }
    let route = match (proxy, req.method, req.path) {
        (false, Some("POST"), Some("/v1/check")) => Route::Check,
        (false, Some("GET"), Some(p)) => match p.strip_prefix("/v1/limit") {
            Some("") => Route::Limit(String::new()),
            Some(q) if q.starts_with('?') => Route::Limit(q[1..].to_string()),
            _ => return Head::Other,
        },
        // Origin-form targets only (no CONNECT, no absolute URIs).
        (true, Some(m), Some(p)) if m != "CONNECT" && p.starts_with('/') => Route::Proxy,
        _ => return Head::Other,
    };
    let mut body_len = None;
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let Some(n) = parse_length(h.value) else {
                return Head::Other;
            };
            if body_len.is_some_and(|b| b != n) {
                return Head::Other;
            }
            body_len = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Head::Other;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Head::Other;
                }
            }
        }
    }
    let body_len = body_len.unwrap_or(0);
    let max = if proxy { MAX_DIRECT_BODY } else { MAX_BODY };
    if body_len > max {
        return Head::Other;
    }
    Head::Direct {
        route,
        head_len,
        body_len,
        close,
    }
}

/// A `Content-Length` value: decimal digits only.
fn parse_length(v: &[u8]) -> Option<usize> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 12 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

impl Conn {
    async fn run(mut self, mut tcp: TcpStream) {
        let mut buf = BytesMut::with_capacity(4096);
        let mut out = Vec::with_capacity(1024);
        let mut scratch = String::new();
        loop {
            let (route, head_len, body_len, close) = loop {
                match parse(&buf, matches!(self.direct, Direct::Proxy(_))) {
                    Head::Direct {
                        route,
                        head_len,
                        body_len,
                        close,
                    } => break (route, head_len, body_len, close),
                    Head::Other => return self.hand_off(tcp, buf).await,
                    Head::Partial => {}
                }
                if !self.read_more(&mut tcp, &mut buf).await {
                    return;
                }
            };
            while buf.len() < head_len + body_len {
                if !self.read_more(&mut tcp, &mut buf).await {
                    return;
                }
            }
            out.clear();
            let drain = self.drain.clone();
            let _busy = Busy::new(&drain.busy);
            if let (Route::Proxy, Direct::Proxy(proxy)) = (&route, &self.direct) {
                let message = buf[..head_len + body_len].split_at(head_len);
                let keep = self
                    .proxy_one(proxy, message, close, &mut tcp, &mut out, &mut scratch)
                    .await;
                buf.advance(head_len + body_len);
                if !keep {
                    let _ = tcp.shutdown().await;
                    return;
                }
            } else {
                self.answer(route, &buf[head_len..head_len + body_len], close, &mut out)
                    .await;
                if tcp.write_all(&out).await.is_err() {
                    return;
                }
                buf.advance(head_len + body_len);
            }
            if close || self.drain.stopping.load(Ordering::Relaxed) {
                let _ = tcp.shutdown().await;
                return;
            }
        }
    }

    /// Reads more of the request; false when the connection is done (closed
    /// by the peer, an error, or too slow).
    async fn read_more(&mut self, tcp: &mut TcpStream, buf: &mut BytesMut) -> bool {
        use tokio::io::AsyncReadExt;
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        let read = if buf.is_empty() {
            // Between requests: wait as long as the client likes (shutdown
            // aborts the wait).
            self.idle.store(true, Ordering::Relaxed);
            let r = tcp.read_buf(buf).await;
            self.idle.store(false, Ordering::Relaxed);
            r
        } else {
            match tokio::time::timeout(READ_TIMEOUT, tcp.read_buf(buf)).await {
                Ok(r) => r,
                Err(_) => return false,
            }
        };
        matches!(read, Ok(n) if n > 0)
    }

    async fn answer(&self, route: Route, body: &[u8], close: bool, out: &mut Vec<u8>) {
        let started = Instant::now();
        let result = match route {
            Route::Check => api::check_json(&self.state, body, started).await,
            Route::Limit(q) => api::check_query(&self.state, &q, started).await,
            Route::Proxy => return,
        };
        match result {
            Ok(checked) => {
                let (status, json) = api::decision_json(&checked);
                write_head(out, status, "application/json", json.len(), close);
                write_rate_limit_headers(out, &checked);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&json);
            }
            Err(e) => write_problem(out, &e, close),
        }
    }

    /// Decides one request and answers a denial, or forwards it and
    /// writes the upstream's answer; false when the connection must close
    /// (asked for, or broken).
    async fn proxy_one(
        &self,
        proxy: &DirectProxy,
        (head, body): (&[u8], &[u8]),
        close: bool,
        tcp: &mut TcpStream,
        out: &mut Vec<u8>,
        scratch: &mut String,
    ) -> bool {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut headers);
        if !matches!(parsed.parse(head), Ok(httparse::Status::Complete(_))) {
            return false;
        }
        let (method, target) = (parsed.method.unwrap_or("GET"), parsed.path.unwrap_or("/"));
        let hdrs: &[httparse::Header<'_>] = parsed.headers;
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        let user = proxy.identify.user(hdrs, query);
        let ip = spillway_core::IpText::new(proxy.identify.ip(self.peer.ip(), hdrs));
        let attrs = WireAttrs {
            user: user.as_deref(),
            ip: ip.as_str(),
            headers: hdrs,
        };
        let started = std::time::Instant::now();
        let checked = proxy
            .state
            .limiter
            .check(&spillway_store::Request {
                method: Some(method),
                path: Some(path),
                attrs: &attrs,
                cost: 1,
            })
            .await;
        proxy.state.record(&checked, started.elapsed());
        if !checked.decision.allowed {
            scratch.clear();
            spillway_tower::push_problem_body(&checked, scratch);
            let json = &*scratch;
            write_head(
                out,
                StatusCode::TOO_MANY_REQUESTS,
                "application/problem+json",
                json.len(),
                close,
            );
            write_rate_limit_headers(out, &checked);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(json.as_bytes());
            return tcp.write_all(out).await.is_ok() && !close;
        }
        let outgoing = Outgoing {
            method,
            target,
            headers: hdrs,
            body,
            peer: self.peer,
            trusted: proxy.identify.trusted(),
            ours: checked.decision.deciding.is_some(),
        };
        let wait: Duration = checked.decision.wait.into();
        let send = async {
            if !wait.is_zero() {
                // A shaper queued the request: wait its turn.
                tokio::time::sleep(wait).await;
            }
            proxy.upstream.send(&outgoing).await
        };
        tokio::pin!(send);
        // Watch for the client leaving while the request waits or the
        // upstream thinks: dropping the future leaves the queue.
        let mut probe = [0u8; 1];
        let sent = tokio::select! {
            r = &mut send => r,
            gone = tcp.peek(&mut probe) => match gone {
                Ok(0) | Err(_) => return false,
                // A pipelined request: nothing to watch for any more.
                Ok(_) => send.await,
            },
        };
        let (status, detail) = match sent {
            Ok(resp) => {
                out.extend_from_slice(&resp.head);
                write_rate_limit_headers(out, &checked);
                let close = close || resp.close_client;
                if close {
                    out.extend_from_slice(b"connection: close\r\n");
                }
                out.extend_from_slice(b"\r\n");
                return proxy.upstream.relay(resp, tcp, out).await && !close;
            }
            Err(failure) => proxy.upstream.failure(failure),
        };
        let json = proxy::problem_json(status, &detail);
        write_head(out, status, "application/problem+json", json.len(), close);
        write_rate_limit_headers(out, &checked);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(json.as_bytes());
        tcp.write_all(out).await.is_ok() && !close
    }

    /// Serves the rest of the connection with hyper and the router, starting
    /// with the bytes already read.
    async fn hand_off(self, tcp: TcpStream, buf: BytesMut) {
        let io = TokioIo::new(Rewind {
            pre: buf.freeze(),
            inner: tcp,
        });
        let peer = self.peer;
        let app = self.app.clone();
        let svc =
            hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                app.clone().oneshot(req)
            });
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        let conn = builder.serve_connection_with_upgrades(io, svc);
        tokio::pin!(conn);
        let mut stop = self.drain.hyper.subscribe();
        if *stop.borrow() {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
            return;
        }
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = stop.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}

/// The rate limit headers of a decision, as `name: value` lines.
fn write_rate_limit_headers(out: &mut Vec<u8>, checked: &spillway_store::Checked) {
    spillway_tower::rate_limit_headers(checked, |name, value| {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    });
}

/// A request's identity and headers, for the rules' keys.
struct WireAttrs<'a> {
    user: Option<&'a str>,
    ip: &'a str,
    headers: &'a [httparse::Header<'a>],
}

impl spillway_core::Attributes for WireAttrs<'_> {
    fn user(&self) -> Option<&str> {
        self.user
    }
    fn ip(&self) -> Option<&str> {
        Some(self.ip)
    }
    fn header(&self, name: &str) -> Option<&str> {
        Headers::value(self.headers, name)
    }
    fn descriptor(&self, _name: &str) -> Option<&str> {
        None
    }
}

fn write_problem(out: &mut Vec<u8>, e: &api::ApiError, close: bool) {
    let json = e.body();
    write_head(
        out,
        e.status(),
        "application/problem+json",
        json.len(),
        close,
    );
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&json);
}

/// The status line and the headers every answer has; the caller adds its
/// own and the blank line.
fn write_head(out: &mut Vec<u8>, status: StatusCode, content_type: &str, len: usize, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    http_date(out);
    if close {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n");
}

/// The current second (since the epoch) for `Date` headers, kept by
/// [`date_ticker`] while a server runs; 0 when none does. Reading it costs
/// a load where reading the clock cost a `clock_gettime` per answer.
static DATE_SECS: AtomicU64 = AtomicU64::new(0);

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs())
}

/// Sets [`DATE_SECS`] at every turn of a second. (Several servers in one
/// process each run one; they write the same value.)
async fn date_ticker() {
    loop {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::from_secs(1));
        DATE_SECS.store(now.as_secs(), Ordering::Relaxed);
        let to_next = Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos()));
        tokio::time::sleep(to_next + Duration::from_micros(200)).await;
    }
}

/// The `Date` header's value, formatted once a second per thread.
fn http_date(out: &mut Vec<u8>) {
    use std::cell::RefCell;
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let secs = match DATE_SECS.load(Ordering::Relaxed) {
        0 => epoch_secs(),
        s => s,
    };
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
            *d = (secs, httpdate::fmt_http_date(at));
        }
        out.extend_from_slice(d.1.as_bytes());
    });
}

/// A stream that first yields bytes already read from it.
struct Rewind {
    pre: Bytes,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(route: Route, head_len: usize, body_len: usize, close: bool) -> Head {
        Head::Direct {
            route,
            head_len,
            body_len,
            close,
        }
    }

    #[test]
    fn takes_plain_decision_requests() {
        let r = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse(r, false), direct(Route::Check, r.len() - 2, 2, false));
        let r = b"GET /v1/limit?key=a&api=x HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n";
        assert_eq!(
            parse(r, false),
            direct(Route::Limit("key=a&api=x".into()), r.len(), 0, true)
        );
        let r = b"GET /v1/limit HTTP/1.1\r\n\r\n";
        assert_eq!(
            parse(r, false),
            direct(Route::Limit(String::new()), r.len(), 0, false)
        );
    }

    proptest::proptest! {
        /// Any bytes a client sends: a decision, "not yet" or hyper's
        /// turn, never a panic; a complete head is found the same way
        /// whatever follows it, and every prefix of it waits.
        #[test]
        fn any_request_bytes_parse_without_panicking(
            head in proptest::collection::vec(
                proptest::sample::select(vec![
                    "Content-Length: 2", "Content-Length: 3", "content-length: 99999999999999",
                    "Content-Length: +2", "Content-Length: 2, 2", "Transfer-Encoding: chunked",
                    "Connection: close", "Connection: Upgrade", "Expect: 100-continue",
                    "X-Api-Key: k", "Host: x", "Bad Header", ": empty",
                ]),
                0..6,
            ),
            line in proptest::sample::select(vec![
                "POST /v1/check HTTP/1.1", "GET /v1/limit?key=a HTTP/1.1", "GET /v1/limit HTTP/1.0",
                "CONNECT x:1 HTTP/1.1", "GET http://x/ HTTP/1.1", "GET / HTTP/2", "GET  / HTTP/1.1",
            ]),
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..8),
            proxy: bool,
        ) {
            let mut raw = format!("{line}\r\n{}\r\n", head.iter().map(|h| format!("{h}\r\n")).collect::<String>()).into_bytes();
            let complete = parse(&raw, proxy);
            for cut in 0..raw.len() {
                let got = parse(&raw[..cut], proxy);
                proptest::prop_assert!(matches!(got, Head::Partial | Head::Other), "{got:?} at {cut}");
            }
            raw.extend_from_slice(&tail);
            proptest::prop_assert_eq!(parse(&raw, proxy), complete);
        }
    }

    #[test]
    fn waits_for_the_whole_head() {
        assert_eq!(parse(b"", false), Head::Partial);
        assert_eq!(
            parse(b"POST /v1/check HTTP/1.1\r\nHost", false),
            Head::Partial
        );
    }

    #[test]
    fn leaves_everything_else_to_hyper() {
        for r in [
            &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
            b"POST /v1/check HTTP/1.0\r\n\r\n",
            b"POST /v1/check?x=1 HTTP/1.1\r\n\r\n",
            b"GET /v1/limits HTTP/1.1\r\n\r\n",
            b"PUT /v1/check HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
            b"GET /v1/limit HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n",
            b"\x00\x01garbage\r\n\r\n",
        ] {
            assert_eq!(
                parse(r, false),
                Head::Other,
                "{}",
                String::from_utf8_lossy(r)
            );
        }
        let huge = format!("POST /v1/check HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
        assert_eq!(parse(huge.as_bytes(), false), Head::Other);
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("h{i}: v\r\n"))
            .collect();
        let r = format!("POST /v1/check HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse(r.as_bytes(), false), Head::Other);
    }
}
