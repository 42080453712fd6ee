//! The direct path's HTTP/1.1 client to the proxy's upstream: pooled
//! keep-alive connections, the request head written from the parsed client
//! request, the response head parsed with `httparse` and the body relayed as
//! it comes (`Content-Length`, chunked or until close), without decoding it.
//!
//! The hyper path (HTTP/2 clients, large or chunked request bodies) keeps
//! using hyper's client (`proxy::Forward`); both send the same forwarding
//! headers and answer failures with the same 502 / 504 problems.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{StatusCode, Uri};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proxy::{HOP_BY_HOP, Headers, IpNet, forwarded_for, upstream_failure};

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 256;

/// Largest response head accepted from the upstream.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Response headers parsed.
const MAX_RESPONSE_HEADERS: usize = 100;
/// Relay buffer size.
const RELAY: usize = 64 * 1024;

/// One upstream and its idle connections.
#[derive(Debug)]
pub(crate) struct Upstream {
    /// As configured, for error messages.
    uri: Uri,
    /// `host:port` to connect to.
    authority: String,
    /// The upstream URL's path, without a trailing `/`, prefixed to every
    /// request's target.
    base: String,
    timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    /// Counts 502 and 504 answers.
    metrics: Arc<crate::metrics::Metrics>,
}

/// A failure before any of the response reached the client.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Could not connect, or the connection broke (502).
    Bad(String),
    /// No response head within the timeout (504).
    Timeout,
}

/// The parts of a client request the upstream request is built from.
pub(crate) struct Outgoing<'a> {
    pub(crate) method: &'a str,
    pub(crate) target: &'a str,
    pub(crate) headers: &'a [httparse::Header<'a>],
    pub(crate) body: &'a [u8],
    pub(crate) peer: SocketAddr,
    pub(crate) trusted: &'a [IpNet],
    /// The proxy adds its own rate limit headers to the answer: the
    /// upstream's of the same names are dropped (one value each, as on
    /// the hyper path).
    pub(crate) ours: bool,
}

/// How the response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// A response head from the upstream, ready for the client.
pub(crate) struct Response {
    conn: TcpStream,
    /// Bytes read past the head (the start of the body).
    rest: Vec<u8>,
    framing: Framing,
    reusable: bool,
    /// Status line and headers (hop-by-hop ones dropped), without the final
    /// blank line, so the caller can add its own headers.
    pub(crate) head: Vec<u8>,
    /// The client connection must close after this response (the body
    /// ends when the upstream closes).
    pub(crate) close_client: bool,
}

impl Upstream {
    pub(crate) fn new(
        upstream: &Uri,
        timeout: Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Upstream {
        let host = upstream.host().unwrap_or("127.0.0.1");
        let port = upstream.port_u16().unwrap_or(80);
        Upstream {
            uri: upstream.clone(),
            authority: format!("{host}:{port}"),
            base: upstream.path().trim_end_matches('/').to_string(),
            timeout,
            idle: Mutex::new(Vec::new()),
            metrics,
        }
    }

    /// The status and problem detail for a failure (the same as the hyper
    /// path's forwarder gives).
    pub(crate) fn failure(&self, f: Failure) -> (StatusCode, String) {
        upstream_failure(&self.metrics, &self.uri, self.timeout, f)
    }

    /// Sends `req` and reads the response head. Idle connections the
    /// upstream has closed are skipped; one that fails anyway (closed in
    /// between) is retried once on a new connection for idempotent methods.
    pub(crate) async fn send(&self, req: &Outgoing<'_>) -> Result<Response, Failure> {
        let head = self.request_head(req);
        let idempotent = matches!(
            req.method,
            "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE"
        );
        if let Some(conn) = self.take_idle() {
            match self.exchange(conn, &head, req).await {
                Err(Failure::Bad(_)) if idempotent => {}
                other => return other,
            }
        }
        let conn = self.connect().await?;
        self.exchange(conn, &head, req).await
    }

    /// An idle connection that still looks open: one with data or an end
    /// of stream waiting (the upstream closed it, or is misbehaving) is
    /// dropped.
    fn take_idle(&self) -> Option<TcpStream> {
        let mut idle = self.idle.lock();
        while let Some(conn) = idle.pop() {
            let mut probe = [0u8; 1];
            if let Err(e) = conn.try_read(&mut probe)
                && e.kind() == io::ErrorKind::WouldBlock
            {
                return Some(conn);
            }
        }
        None
    }

    async fn connect(&self) -> Result<TcpStream, Failure> {
        let connect = TcpStream::connect(self.authority.as_str());
        match tokio::time::timeout(self.timeout.min(Duration::from_secs(10)), connect).await {
            Ok(Ok(c)) => {
                let _ = c.set_nodelay(true);
                Ok(c)
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
        mut conn: TcpStream,
        head: &[u8],
        req: &Outgoing<'_>,
    ) -> Result<Response, Failure> {
        let broken = |e: io::Error| Failure::Bad(e.to_string());
        let _due = spillway_store::due::Awaiting::new();
        if req.body.is_empty() {
            conn.write_all(head).await.map_err(broken)?;
        } else {
            let bufs = [io::IoSlice::new(head), io::IoSlice::new(req.body)];
            let total = head.len() + req.body.len();
            let n = conn.write_vectored(&bufs).await.map_err(broken)?;
            if n < total {
                let mut all = Vec::with_capacity(total);
                all.extend_from_slice(head);
                all.extend_from_slice(req.body);
                conn.write_all(&all[n..]).await.map_err(broken)?;
            }
        }
        let read_head = async {
            let mut buf = Vec::with_capacity(4096);
            // Read only when what is buffered is not a whole head: an
            // interim answer may arrive together with the final one.
            let mut need_more = true;
            loop {
                if buf.len() >= MAX_RESPONSE_HEAD {
                    return Err(Failure::Bad("response head too large".into()));
                }
                if need_more {
                    let n = read_some(&mut conn, &mut buf).await.map_err(broken)?;
                    if n == 0 {
                        return Err(Failure::Bad("connection closed before a response".into()));
                    }
                }
                need_more = true;
                let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&buf) {
                    Ok(httparse::Status::Complete(len)) => {
                        let code = resp.code.unwrap_or(502);
                        if (100..200).contains(&code) && code != 101 {
                            // An interim answer (100 Continue, 103): skip it.
                            buf.drain(..len);
                            need_more = buf.is_empty();
                            continue;
                        }
                        let parsed = parse_head(&resp, req.method == "HEAD", req.ours)?;
                        buf.drain(..len);
                        return Ok((parsed, buf));
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(Failure::Bad(format!("bad response: {e}"))),
                }
            }
        };
        let ((head, framing, reusable), rest) =
            match tokio::time::timeout(self.timeout, read_head).await {
                Ok(r) => r?,
                Err(_) => return Err(Failure::Timeout),
            };
        Ok(Response {
            conn,
            rest,
            framing,
            reusable,
            head,
            close_client: framing == Framing::UntilClose,
        })
    }

    fn request_head(&self, req: &Outgoing<'_>) -> Vec<u8> {
        let mut h = Vec::with_capacity(256 + req.headers.len() * 48);
        h.extend_from_slice(req.method.as_bytes());
        h.push(b' ');
        h.extend_from_slice(self.base.as_bytes());
        h.extend_from_slice(req.target.as_bytes());
        h.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        h.extend_from_slice(self.authority.as_bytes());
        h.extend_from_slice(b"\r\n");
        let listed: Vec<&str> = Headers::all(req.headers, "connection")
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        for hd in req.headers {
            let name = hd.name;
            let dropped = HOP_BY_HOP.iter().any(|n| name.eq_ignore_ascii_case(n))
                || listed.iter().any(|n| name.eq_ignore_ascii_case(n))
                || [
                    "host",
                    "transfer-encoding",
                    "x-forwarded-for",
                    "x-forwarded-proto",
                    "x-forwarded-host",
                ]
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n));
            if dropped {
                continue;
            }
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(b": ");
            h.extend_from_slice(hd.value);
            h.extend_from_slice(b"\r\n");
        }
        if let Some(host) = Headers::value(req.headers, "host") {
            h.extend_from_slice(b"x-forwarded-host: ");
            h.extend_from_slice(host.as_bytes());
            h.extend_from_slice(b"\r\n");
        }
        h.extend_from_slice(b"x-forwarded-for: ");
        h.extend_from_slice(forwarded_for(req.peer.ip(), req.headers, req.trusted).as_bytes());
        h.extend_from_slice(b"\r\nx-forwarded-proto: http\r\n\r\n");
        h
    }

    /// Relays the body of `resp` to the client after `out` (which holds the
    /// finished response head) and puts the connection back in the pool if
    /// it can serve again. False if either side broke midway.
    pub(crate) async fn relay(
        &self,
        mut resp: Response,
        client: &mut TcpStream,
        out: &mut Vec<u8>,
    ) -> bool {
        let mut scanner = Chunks::default();
        let mut remaining = match resp.framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        let mut data = std::mem::take(&mut resp.rest);
        let mut done = resp.framing == Framing::None || (resp.framing == Framing::Length(0));
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
                        Some(end) => {
                            done = true;
                            end
                        }
                        None => data.len(),
                    },
                    Framing::UntilClose => data.len(),
                    Framing::None => 0,
                };
                leftover |= take < data.len();
                out.extend_from_slice(&data[..take]);
                data.clear();
            }
            if done || out.len() >= RELAY {
                if client.write_all(out).await.is_err() {
                    return false;
                }
                out.clear();
            }
            if done {
                break;
            }
            match tokio::time::timeout(self.timeout, read_some(&mut resp.conn, &mut data)).await {
                Ok(Ok(0)) if resp.framing == Framing::UntilClose => {
                    return client.write_all(out).await.is_ok();
                }
                Ok(Ok(n)) if n > 0 => {}
                // Closed early, broken or stalled: the client's framing
                // cannot be finished; the caller closes its connection.
                _ => {
                    let _ = client.write_all(out).await;
                    return false;
                }
            }
        }
        if resp.reusable && !leftover {
            let mut idle = self.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(resp.conn);
            }
        }
        true
    }
}

async fn read_some(conn: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 2048 {
        buf.reserve(RELAY.max(buf.capacity()));
    }
    conn.read_buf(buf).await
}

/// The client-bound head (status line and headers, hop-by-hop ones
/// dropped, no blank line), how the body is framed, and whether the
/// connection can be reused; an error for framing that cannot be trusted
/// (lengths that disagree).
fn parse_head(
    resp: &httparse::Response<'_, '_>,
    head_request: bool,
    ours: bool,
) -> Result<(Vec<u8>, Framing, bool), Failure> {
    let code = resp.code.unwrap_or(502);
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut close = resp.version == Some(0);
    let mut length = None;
    let mut chunked = false;
    let listed: Vec<&str> = Headers::all(&*resp.headers, "connection")
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    for n in &listed {
        if n.eq_ignore_ascii_case("close") {
            close = true;
        } else if n.eq_ignore_ascii_case("keep-alive") && resp.version == Some(0) {
            close = false;
        }
    }
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| Failure::Bad("bad Content-Length".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(Failure::Bad("conflicting Content-Length".into()));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        }
    }
    for h in resp.headers.iter() {
        let name = h.name;
        if chunked && name.eq_ignore_ascii_case("content-length") {
            // Chunked framing wins; passing both on invites smuggling.
            continue;
        }
        // Transfer-Encoding is relayed as is: the client gets the same
        // chunked bytes.
        if HOP_BY_HOP.iter().any(|n| name.eq_ignore_ascii_case(n))
            || listed.iter().any(|n| name.eq_ignore_ascii_case(n))
            || (ours
                && spillway_tower::DECISION_HEADERS
                    .iter()
                    .any(|n| name.eq_ignore_ascii_case(n.as_str())))
        {
            continue;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    let bodiless = head_request || code == 204 || code == 304;
    let framing = if bodiless {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        close = true;
        Framing::UntilClose
    };
    Ok((head, framing, !close))
}

/// Finds where a chunked body ends, fed the bytes as they arrive.
#[derive(Debug, Default)]
struct Chunks {
    state: ChunkState,
    size: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Hex digits of a chunk size.
    #[default]
    Size,
    /// A chunk extension, up to the line's end.
    Extension,
    /// The `\n` after a size line's `\r`.
    SizeLf,
    /// Chunk data.
    Data,
    /// The `\r\n` after chunk data.
    DataCr,
    DataLf,
    /// Trailer lines after the last chunk: at a line start.
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// The `\n` of a trailer line (or of the final blank line when `size`
    /// is 1).
    TrailerLf,
}

impl Chunks {
    /// Consumes `data`; `Some(n)` when the body ends after its first `n`
    /// bytes.
    fn scan(&mut self, data: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match self.state {
                ChunkState::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let d = (b as char).to_digit(16).unwrap_or(0);
                        self.size = self.size.saturating_mul(16).saturating_add(u64::from(d));
                    }
                    b';' | b' ' | b'\t' => self.state = ChunkState::Extension,
                    b'\r' => self.state = ChunkState::SizeLf,
                    _ => self.state = ChunkState::Extension,
                },
                ChunkState::Extension => {
                    if b == b'\r' {
                        self.state = ChunkState::SizeLf;
                    }
                }
                ChunkState::SizeLf => {
                    self.state = if self.size == 0 {
                        ChunkState::TrailerStart
                    } else {
                        ChunkState::Data
                    };
                }
                ChunkState::Data => {
                    let n = (self.size.min((data.len() - i) as u64)) as usize;
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = ChunkState::DataCr;
                    }
                    continue;
                }
                ChunkState::DataCr => self.state = ChunkState::DataLf,
                ChunkState::DataLf => {
                    self.state = ChunkState::Size;
                    self.size = 0;
                }
                ChunkState::TrailerStart => {
                    // `size` 1 marks the blank line that ends the message.
                    self.size = u64::from(b == b'\r');
                    self.state = if b == b'\r' {
                        ChunkState::TrailerLf
                    } else {
                        ChunkState::Trailer
                    };
                }
                ChunkState::Trailer => {
                    if b == b'\r' {
                        self.state = ChunkState::TrailerLf;
                    }
                }
                ChunkState::TrailerLf => {
                    if self.size == 1 {
                        return Some(i + 1);
                    }
                    self.state = ChunkState::TrailerStart;
                }
            }
            i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8], head_request: bool) -> Result<(String, Framing, bool), Failure> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        assert!(resp.parse(raw).unwrap().is_complete());
        parse_head(&resp, head_request, false)
            .map(|(h, f, r)| (String::from_utf8(h).unwrap(), f, r))
    }

    #[test]
    fn response_heads_are_framed_and_cleaned() {
        let (h, f, reuse) = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\nX-A: 1\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(f, Framing::Chunked);
        assert!(reuse);
        assert!(!h.to_ascii_lowercase().contains("content-length"), "{h}");
        assert!(!h.to_ascii_lowercase().contains("keep-alive"), "{h}");
        assert!(
            h.contains("Transfer-Encoding: chunked") && h.contains("X-A: 1"),
            "{h}"
        );
        let (_, f, reuse) = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((f, reuse), (Framing::Length(3), false));
        let (_, f, reuse) = head(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n", false).unwrap();
        assert_eq!((f, reuse), (Framing::Length(3), false));
        let (_, f, reuse) = head(b"HTTP/1.1 200 OK\r\n\r\n", false).unwrap();
        assert_eq!((f, reuse), (Framing::UntilClose, false));
        let (_, f, _) = head(b"HTTP/1.1 204 No Content\r\n\r\n", false).unwrap();
        assert_eq!(f, Framing::None);
        let (_, f, _) = head(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).unwrap();
        assert_eq!(f, Framing::None);
        assert!(
            head(
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                false
            )
            .is_err()
        );
        assert!(head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false).is_err());
    }

    #[test]
    fn upstream_addresses_and_base_paths() {
        let up = |u: &str| {
            let metrics = Arc::new(crate::metrics::Metrics::new(&spillway_store::RuleSet::new(
                vec![],
            )));
            let u = Upstream::new(&u.parse().unwrap(), Duration::from_secs(1), metrics);
            (u.authority, u.base)
        };
        assert_eq!(
            up("http://127.0.0.1:9000"),
            ("127.0.0.1:9000".into(), String::new())
        );
        assert_eq!(
            up("http://example.com/api/"),
            ("example.com:80".into(), "/api".into())
        );
        assert_eq!(
            up("http://[::1]:9000/x"),
            ("[::1]:9000".into(), "/x".into())
        );
    }

    #[test]
    fn finds_the_end_of_a_chunked_body_however_it_is_split() {
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut c = Chunks::default();
            let (a, b) = body.split_at(split);
            let got = match c.scan(a) {
                Some(n) => Some(n),
                None => c.scan(b).map(|n| n + split),
            };
            assert_eq!(got, Some(end), "split at {split}");
        }
        let mut c = Chunks::default();
        assert_eq!(c.scan(b"0\r\n\r\n"), Some(5));
        let mut c = Chunks::default();
        assert_eq!(c.scan(b"3\r\nabc\r\n"), None);
    }

    proptest::proptest! {
        /// Whatever an upstream sends, and however the reads split it,
        /// the scanner finds the same end (or none) and never panics.
        #[test]
        fn any_bytes_scan_the_same_however_split(
            data in proptest::collection::vec(
                proptest::sample::select(b"0123456789abcdefxX;\r\n \t".to_vec()),
                0..200,
            ),
            split in 0usize..200,
        ) {
            let whole = Chunks::default().scan(&data);
            let (a, b) = data.split_at(split.min(data.len()));
            let mut c = Chunks::default();
            let parts = match c.scan(a) {
                Some(n) => Some(n),
                None => c.scan(b).map(|n| n + a.len()),
            };
            proptest::prop_assert_eq!(whole, parts);
        }

        /// Response heads from a misbehaving upstream: framed or refused,
        /// never a panic.
        #[test]
        fn any_response_head_is_framed_or_refused(
            lines in proptest::collection::vec(
                proptest::sample::select(vec![
                    "Content-Length: 5", "Content-Length: 7", "content-length: -1",
                    "Content-Length: 99999999999999999999999", "Transfer-Encoding: chunked",
                    "Transfer-Encoding: gzip, chunked", "Connection: close",
                    "Connection: keep-alive, Upgrade", "Keep-Alive: timeout=5", "X-A: b",
                ]),
                0..6,
            ),
            code in proptest::sample::select(vec!["100", "101", "200", "204", "304", "429", "599"]),
            version in proptest::sample::select(vec!["1.0", "1.1"]),
            head_request: bool,
        ) {
            let raw = format!("HTTP/{version} {code} X\r\n{}\r\n", lines.iter().map(|l| format!("{l}\r\n")).collect::<String>());
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut headers);
            if let Ok(httparse::Status::Complete(_)) = resp.parse(raw.as_bytes()) {
                let _ = parse_head(&resp, head_request, false);
            }
        }
    }
}
