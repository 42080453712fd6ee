//! A pooled HTTP/1.1 client to one upstream, for the direct path: the
//! request is re-framed (the proxy writes its own `Host` and
//! `Content-Length`; the client's framing headers are never copied and
//! `Connection` cannot remove them), the response head is read strictly
//! ([`crate::framing`]) and the body relayed as it arrives, without
//! decoding it.
//!
//! Every connection to the upstream holds one of the upstream's
//! `max_connections` slots for its life, idle ones in the pool too, and
//! [`Upstream::connection`] hands connections to another client (the
//! proxy's hyper transport) under the same bound, so the proxy never
//! opens more than that many, whatever its clients do. A request that
//! waits for a connection waits its group's turn (see `client/pool.rs`): a client
//! that fills the pool cannot make the others wait behind it.

mod pool;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

pub use pool::Group;
use pool::{Pool, Slot, Taken};

use crate::framing::{Chunks, Framing, ResponseHead, response_head};
use crate::headers::{FRAMING, HOP_BY_HOP, connection_tokens, named};
use crate::server::ClientConn;

/// Largest response head accepted from the upstream.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Response headers parsed.
const MAX_RESPONSE_HEADERS: usize = 100;
/// Read buffer size for relaying.
const RELAY: usize = 64 * 1024;

/// One upstream and its idle connections.
#[derive(Debug)]
pub struct Upstream {
    /// `host:port` to connect to, also sent as `Host`.
    authority: String,
    /// The upstream URL's path, without a trailing `/`, prefixed to every
    /// request's target.
    base: String,
    timeout: Duration,
    /// The connections, idle and in use.
    pool: Arc<Pool>,
    /// The bound on connections.
    max_connections: usize,
}

/// A connection to the upstream, holding its slot until it closes.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    slot: Slot,
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A failure before any of the response reached the client.
#[derive(Debug)]
pub enum Failure {
    /// Could not connect, the connection broke, or the answer's framing
    /// cannot be trusted (502). The text is for the log, not the client.
    Bad(String),
    /// No response head within the timeout (504).
    Timeout,
    /// Every one of the upstream's `max_connections` was in use for the
    /// whole timeout (503: the proxy would have had to open more).
    Busy,
}

/// How an exchange on one connection failed: whether the upstream can
/// have seen the request decides whether it may be sent again.
#[derive(Debug)]
enum Exchange {
    /// The connection closed or broke before any byte of the answer: an
    /// idle connection the upstream closed as the request went out.
    Unanswered(String),
    /// The answer began (malformed, cut, too large) or never came in
    /// time: the upstream saw the request.
    Failed(Failure),
}

impl Exchange {
    fn failure(self) -> Failure {
        match self {
            Exchange::Unanswered(e) => Failure::Bad(e),
            Exchange::Failed(f) => f,
        }
    }
}

/// Whether a method may be sent twice with the effect of once (RFC 9110
/// §9.2.2).
fn idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE"
    )
}

/// The parts of a client request the upstream request is built from.
pub struct Outgoing<'a> {
    /// Method, as the client sent it.
    pub method: &'a str,
    /// Origin-form target, as the client sent it.
    pub target: &'a str,
    /// The client's headers: hop-by-hop ones, those its `Connection`
    /// names, framing ones and `drop` are left out.
    pub headers: &'a [httparse::Header<'a>],
    /// More request header names to leave out (the proxy writes its own).
    pub drop: &'a [&'a str],
    /// Header lines the proxy adds, formatted (`name: value\r\n` each).
    pub add: &'a [u8],
    /// The body.
    pub body: &'a [u8],
    /// Response header names to leave out (the proxy adds its own).
    pub drop_response: &'a [&'a str],
    /// Whose turn the request waits for a connection in (the client's
    /// network): connections are handed out in turn by group. Asked only
    /// when the request has to wait (naming a network costs a hash).
    pub group: &'a (dyn Fn() -> Group + Sync),
}

impl std::fmt::Debug for Outgoing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("method", &self.method)
            .field("target", &self.target)
            .field("body", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// A response head from the upstream, ready for the client.
#[derive(Debug)]
pub struct Response {
    conn: Conn,
    /// Bytes read past the head (the start of the body).
    rest: Vec<u8>,
    framing: Framing,
    reusable: bool,
    /// The status code.
    pub code: u16,
    /// Status line and headers (see [`ResponseHead::head`]), without the
    /// final blank line, so the caller can add its own headers.
    pub head: Vec<u8>,
    /// The client connection must close after this response (the body
    /// ends when the upstream closes).
    pub close_client: bool,
}

impl Upstream {
    /// An upstream at `authority` (`host:port`), every target prefixed
    /// with `base` (a path without a trailing `/`, or empty), with at most
    /// `max_connections` connections open to it (at least 1).
    pub fn new(
        authority: String,
        base: String,
        timeout: Duration,
        max_connections: usize,
    ) -> Upstream {
        let max_connections = max_connections.max(1);
        Upstream {
            authority,
            base,
            timeout,
            pool: Pool::new(max_connections),
            max_connections,
        }
    }

    /// The bound on connections open to the upstream.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Connections open to the upstream now (idle ones included).
    pub fn open_connections(&self) -> usize {
        self.pool.open()
    }

    /// A connection for another HTTP/1.1 client of the same upstream (the
    /// proxy's hyper transport), under the same bound: an idle one of the
    /// pool, else a new one once fewer than `max_connections` are open,
    /// waiting at most the timeout, in `group`'s turn. The caller hands
    /// it back by dropping it (it is not returned to this pool).
    ///
    /// # Errors
    /// [`Failure::Busy`] after waiting the timeout; [`Failure::Bad`] if
    /// the connection cannot be made.
    pub async fn connection(&self, group: Group) -> Result<Conn, Failure> {
        self.take(&|| group).await.map(|(c, _)| c)
    }

    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Sends `req` and reads the response head. Idle connections the
    /// upstream has closed are skipped; one that fails anyway is retried
    /// once on a new connection only when the upstream cannot have acted on
    /// the request: the connection closed (or broke) before any byte of
    /// the answer arrived, and the method is idempotent. An answer that
    /// began, even malformed, or a timeout, is never retried: the upstream
    /// saw the request.
    ///
    /// # Errors
    /// See [`Failure`].
    pub async fn send(&self, req: &Outgoing<'_>) -> Result<Response, Failure> {
        let head = self.request_head(req);
        let (conn, reused) = self.take(req.group).await?;
        match self.exchange(conn, &head, req).await {
            Err(Exchange::Unanswered(_)) if reused && idempotent(req.method) => {}
            other => return other.map_err(Exchange::failure),
        }
        // Once more: the idle connection was closed as the request went.
        let (conn, _) = self.take(req.group).await?;
        self.exchange(conn, &head, req)
            .await
            .map_err(Exchange::failure)
    }

    /// A connection in `group`'s turn, and whether it was idle (rather
    /// than opened for this request).
    async fn take(&self, group: &(dyn Fn() -> Group + Sync)) -> Result<(Conn, bool), Failure> {
        match self.pool.take(group, self.timeout).await {
            Some(Taken::Idle(stream, slot)) => Ok((Conn { stream, slot }, true)),
            Some(Taken::Open(slot)) => self.connect(slot).await.map(|c| (c, false)),
            None => Err(Failure::Busy),
        }
    }

    /// A new connection in `slot`.
    async fn connect(&self, slot: Slot) -> Result<Conn, Failure> {
        let connect = TcpStream::connect(self.authority.as_str());
        match tokio::time::timeout(self.timeout.min(Duration::from_secs(10)), connect).await {
            Ok(Ok(c)) => {
                let _ = c.set_nodelay(true);
                Ok(Conn { stream: c, slot })
            }
            Ok(Err(e)) => Err(Failure::Bad(format!("connect {}: {e}", self.authority))),
            Err(_) => Err(Failure::Bad(format!(
                "connect {}: timed out",
                self.authority
            ))),
        }
    }

    /// Writes the request and reads the response head on `conn`.
    async fn exchange(
        &self,
        mut conn: Conn,
        head: &[u8],
        req: &Outgoing<'_>,
    ) -> Result<Response, Exchange> {
        // Before any byte of the answer, a broken connection is one the
        // upstream may have closed before reading the request.
        let broken = |e: io::Error| Exchange::Unanswered(e.to_string());
        // Most requests fit the socket's buffer at once: only a write that
        // has to wait runs under a timer.
        let mut written = 0;
        if req.body.is_empty() {
            match conn.stream.try_write(head) {
                Ok(n) => written = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(broken(e)),
            }
        }
        if written < head.len() {
            let rest = &head[written..];
            let write = async {
                if req.body.is_empty() {
                    conn.write_all(rest).await
                } else {
                    let bufs = [io::IoSlice::new(rest), io::IoSlice::new(req.body)];
                    let total = rest.len() + req.body.len();
                    let n = conn.write_vectored(&bufs).await?;
                    if n < total {
                        let mut all = Vec::with_capacity(total);
                        all.extend_from_slice(rest);
                        all.extend_from_slice(req.body);
                        conn.write_all(&all[n..]).await?;
                    }
                    Ok(())
                }
            };
            match tokio::time::timeout(self.timeout, write).await {
                Ok(r) => r.map_err(broken)?,
                Err(_) => return Err(Exchange::Failed(Failure::Timeout)),
            }
        }
        let bad = |e: String| Exchange::Failed(Failure::Bad(e));
        let read_head = async {
            let mut buf = Vec::with_capacity(4096);
            // Whether any byte of the answer came (an interim one too).
            let mut answered = false;
            // Read only when what is buffered is not a whole head: an
            // interim answer may arrive together with the final one.
            let mut need_more = true;
            loop {
                if buf.len() >= MAX_RESPONSE_HEAD {
                    return Err(bad("response head too large".into()));
                }
                if need_more {
                    let answered = answered || !buf.is_empty();
                    let n = match read_some(&mut conn, &mut buf).await {
                        Ok(n) => n,
                        Err(e) if answered => return Err(bad(e.to_string())),
                        Err(e) => return Err(broken(e)),
                    };
                    if n == 0 {
                        let e = "connection closed before a response".to_string();
                        return Err(if answered {
                            bad(e)
                        } else {
                            Exchange::Unanswered(e)
                        });
                    }
                }
                need_more = true;
                let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&buf) {
                    Ok(httparse::Status::Complete(len)) => {
                        let code = resp.code.unwrap_or(0);
                        if code == 101 {
                            // Nothing was asked to upgrade on this path.
                            return Err(bad("101 to a request without Upgrade".into()));
                        }
                        if (100..200).contains(&code) {
                            // An interim answer (100 Continue, 103): skip it.
                            answered = true;
                            buf.drain(..len);
                            need_more = buf.is_empty();
                            continue;
                        }
                        let parsed = response_head(&resp, req.method == "HEAD", req.drop_response)
                            .map_err(|e| bad(format!("bad response: {e}")))?;
                        buf.drain(..len);
                        return Ok((parsed, buf));
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(bad(format!("bad response: {e}"))),
                }
            }
        };
        let (parsed, rest): (ResponseHead, Vec<u8>) =
            match tokio::time::timeout(self.timeout, read_head).await {
                Ok(r) => r?,
                Err(_) => return Err(Exchange::Failed(Failure::Timeout)),
            };
        Ok(Response {
            conn,
            rest,
            framing: parsed.framing,
            reusable: parsed.reusable,
            code: parsed.code,
            head: parsed.head,
            close_client: parsed.framing == Framing::UntilClose,
        })
    }

    fn request_head(&self, req: &Outgoing<'_>) -> Vec<u8> {
        let mut h = Vec::with_capacity(256 + req.headers.len() * 48 + req.add.len());
        h.extend_from_slice(req.method.as_bytes());
        h.push(b' ');
        h.extend_from_slice(self.base.as_bytes());
        h.extend_from_slice(req.target.as_bytes());
        h.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        h.extend_from_slice(self.authority.as_bytes());
        h.extend_from_slice(b"\r\n");
        let headers: &[httparse::Header<'_>] = req.headers;
        let listed = connection_tokens(headers);
        let mut had_length = false;
        for hd in headers {
            let name = hd.name;
            if named(&FRAMING, name) {
                had_length |= name.eq_ignore_ascii_case("content-length");
                continue;
            }
            if named(&HOP_BY_HOP, name) || named(&listed, name) || named(req.drop, name) {
                continue;
            }
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(b": ");
            h.extend_from_slice(hd.value);
            h.extend_from_slice(b"\r\n");
        }
        h.extend_from_slice(req.add);
        if had_length || !req.body.is_empty() {
            h.extend_from_slice(b"content-length: ");
            h.extend_from_slice(itoa::Buffer::new().format(req.body.len()).as_bytes());
            h.extend_from_slice(b"\r\n");
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    /// Relays the body of `resp` to the client after `out` (which holds the
    /// finished response head), as it arrives, and puts the connection back
    /// in the pool if it can serve again, as soon as the answer is all read
    /// (before its last bytes are written to the client). False if either side broke
    /// midway, the upstream stalled for the timeout, or its chunked coding
    /// was malformed: the client's framing cannot be finished then, so the
    /// caller closes its connection.
    pub async fn relay(
        &self,
        mut resp: Response,
        client: &mut ClientConn<'_>,
        out: &mut Vec<u8>,
    ) -> bool {
        let mut scanner = Chunks::default();
        let mut remaining = match resp.framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        let mut data = std::mem::take(&mut resp.rest);
        let mut done = matches!(resp.framing, Framing::None | Framing::Length(0));
        let mut leftover = false;
        loop {
            if !data.is_empty() {
                let take = match resp.framing {
                    Framing::Length(_) => {
                        let n = (remaining.min(data.len() as u64)) as usize;
                        remaining -= n as u64;
                        done = remaining == 0;
                        n
                    }
                    Framing::Chunked => match scanner.scan(&data) {
                        Ok(Some(end)) => {
                            done = true;
                            end
                        }
                        Ok(None) => data.len(),
                        Err(e) => {
                            tracing::debug!("upstream body: {}", e.0);
                            let _ = client.write_all(out).await;
                            return false;
                        }
                    },
                    Framing::UntilClose => data.len(),
                    Framing::None => 0,
                };
                leftover |= take < data.len();
                out.extend_from_slice(&data[..take]);
                data.clear();
            }
            if done {
                break;
            }
            // Whatever the upstream has ready is gathered first (up to
            // `RELAY`): an answer that is all there is read whole, and its
            // connection goes back before the client has to take it.
            if out.len() < RELAY {
                match read_ready(&mut resp.conn, &mut data) {
                    None => {}
                    Some(Ok(n)) if n > 0 => continue,
                    Some(Ok(0)) if resp.framing == Framing::UntilClose => {
                        return client.write_all(out).await;
                    }
                    // Closed early or broken.
                    Some(_) => return false,
                }
            }
            // What arrived goes out now: a stream (server-sent events, a
            // long poll) reaches the client as the upstream writes it.
            if !out.is_empty() {
                if !client.write_all(out).await {
                    return false;
                }
                out.clear();
            }
            match tokio::time::timeout(self.timeout, read_some(&mut resp.conn, &mut data)).await {
                Ok(Ok(0)) if resp.framing == Framing::UntilClose => return true,
                Ok(Ok(n)) if n > 0 => {}
                // Closed early, broken or stalled.
                _ => return false,
            }
        }
        // The answer is all read: its upstream connection goes back (or
        // closes) before the client takes the last of it, so a client that
        // does not read its answers (for up to the write timeout each)
        // holds no upstream connection meanwhile. Writing first let 50 such
        // clients hold the whole pool, and every other request waited.
        if resp.reusable && !leftover {
            let Conn { stream, slot } = resp.conn;
            slot.give_back(stream);
        } else {
            drop(resp.conn);
        }
        if !out.is_empty() {
            if !client.write_all(out).await {
                return false;
            }
            out.clear();
        }
        true
    }
}

/// What the upstream has sent and not yet been read, without waiting:
/// `None` when there is nothing.
fn read_ready(conn: &mut Conn, buf: &mut Vec<u8>) -> Option<io::Result<usize>> {
    if buf.capacity() - buf.len() < 2048 {
        buf.reserve(RELAY.max(buf.capacity()));
    }
    match conn.stream.try_read_buf(buf) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        r => Some(r),
    }
}

async fn read_some(conn: &mut Conn, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 2048 {
        buf.reserve(RELAY.max(buf.capacity()));
    }
    conn.read_buf(buf).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_for(headers: &[httparse::Header<'_>], body: &[u8]) -> String {
        let up = Upstream::new("up:1".into(), "/base".into(), Duration::from_secs(1), 1);
        let req = Outgoing {
            method: "POST",
            target: "/x?y",
            headers,
            drop: &["x-forwarded-for"],
            add: b"x-forwarded-for: 1.2.3.4\r\n",
            body,
            drop_response: &[],
            group: &|| 0,
        };
        String::from_utf8(up.request_head(&req)).unwrap()
    }

    /// Regression (issue 15): `Connection: Content-Length` removed the
    /// length but the body was still sent, so a strict upstream read it as
    /// further requests.
    #[test]
    fn the_proxy_writes_its_own_framing() {
        let hs = [
            httparse::Header {
                name: "Host",
                value: b"evil",
            },
            httparse::Header {
                name: "Connection",
                value: b"Content-Length, Host, X-Gone",
            },
            httparse::Header {
                name: "Content-Length",
                value: b"5",
            },
            httparse::Header {
                name: "Transfer-Encoding",
                value: b"chunked",
            },
            httparse::Header {
                name: "X-Gone",
                value: b"1",
            },
            httparse::Header {
                name: "X-Forwarded-For",
                value: b"6.6.6.6",
            },
            httparse::Header {
                name: "X-Kept",
                value: b"1",
            },
        ];
        let h = head_for(&hs, b"hello");
        assert!(
            h.starts_with("POST /base/x?y HTTP/1.1\r\nhost: up:1\r\n"),
            "{h}"
        );
        let lower = h.to_ascii_lowercase();
        assert_eq!(lower.matches("content-length: 5\r\n").count(), 1, "{h}");
        assert_eq!(lower.matches("host:").count(), 1, "{h}");
        assert!(
            !lower.contains("transfer-encoding") && !lower.contains("x-gone"),
            "{h}"
        );
        assert!(
            !lower.contains("6.6.6.6") && lower.contains("x-forwarded-for: 1.2.3.4"),
            "{h}"
        );
        assert!(h.contains("X-Kept: 1") && h.ends_with("\r\n\r\n"), "{h}");
        // No body and no length: none is written.
        let h = head_for(&hs[4..], b"");
        assert!(!h.to_ascii_lowercase().contains("content-length"), "{h}");
    }
}
