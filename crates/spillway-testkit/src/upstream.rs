//! Fake upstreams for proxy tests, on free loopback ports, serving until
//! the test's runtime ends.
//!
//! [`HttpUpstream`] is a real HTTP/1.1 server (hyper's, a strict reference)
//! that records every request head it receives and answers by the last
//! segment of the path, so a test can put any behaviour under any route of
//! its rules (`/ip/stall`, `/free/ratelimit-headers`):
//!
//! | last segment | answer |
//! |---|---|
//! | `hello` | `hello` |
//! | `echo` | the request body, streamed back as it arrives |
//! | `no-content` | 204 |
//! | `slow` | `late`, after [`SLOW`] |
//! | `stream` | `one,two,three` in three pieces, no length (chunked) |
//! | `events` | server-sent events: `data: first`, then, once the test calls [`HttpUpstream::release`], `data: second`, then the end |
//! | `stall` | the head and `first,`, then nothing while the connection lasts |
//! | a number under `/tokens/` | `tokens`, with `x-tokens-used: N` (what the answer cost) |
//! | a number under `/trailer-tokens/` | `streamed tokens`, chunked, then `x-tokens-used: N` as a trailer |
//! | a number under `/late-trailer-tokens/` | the same, the trailer [`LATE`] after the body (a client may leave in between) |
//! | `ratelimit-headers` | `own`, with the upstream's own `x-ratelimit-limit: 999` and `ratelimit: "upstream";r=5;t=9` |
//! | anything else | `ok` |
//!
//! [`raw_upstream`] writes its answers by hand, for what a framework would
//! not send.
//!
//! Chosen for compile time: hyper's HTTP/1.1 server and tokio only (no
//! router, no JSON); both are already built for the server crate.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};

/// How long a `slow` answer takes.
pub const SLOW: Duration = Duration::from_secs(3);

/// How long after its body a `/late-trailer-tokens/N` answer sends its
/// trailer.
pub const LATE: Duration = Duration::from_millis(300);

/// One request head as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// Every header line in order, names in lower case.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The first value of header `name`, if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }

    /// Every value of header `name`, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

#[derive(Debug)]
struct State {
    /// Every request head, in arrival order: what the proxy let through.
    seen: Mutex<Vec<Seen>>,
    /// Permits for `events` answers to send their second event.
    gate: Semaphore,
}

/// An HTTP/1.1 upstream that records what it is sent (see the module docs
/// for its answers).
#[derive(Debug, Clone)]
pub struct HttpUpstream {
    addr: SocketAddr,
    state: Arc<State>,
}

impl HttpUpstream {
    /// Starts one on a free port of 127.0.0.1, on the current runtime.
    ///
    /// # Panics
    /// No free port.
    pub async fn start() -> HttpUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(State {
            seen: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
        });
        serve_http1(listener, state.clone(), answer);
        HttpUpstream { addr, state }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request head received so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("not poisoned").clone()
    }

    /// The request heads received for `path` (the query aside).
    pub fn requests_to(&self, path: &str) -> Vec<Seen> {
        let mut all = self.requests();
        all.retain(|s| s.path() == path);
        all
    }

    /// How many requests reached `path` (the query aside).
    pub fn count(&self, path: &str) -> usize {
        self.requests_to(path).len()
    }

    /// Lets one `events` answer, now or later, send its second event and
    /// end.
    pub fn release(&self) {
        self.state.gate.add_permits(1);
    }
}

/// Serves HTTP/1.1 on `listener` until the runtime ends (no delay on
/// small writes), each request answered by `answer(state, request)`.
pub(crate) fn serve_http1<S, F, Fut, B>(listener: TcpListener, state: Arc<S>, answer: F)
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let _ = conn.set_nodelay(true);
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(state.clone(), req));
                // A client that goes away midway is not an error here.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(conn), service)
                    .await;
            });
        }
    });
}

async fn answer(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().to_string(), |p| p.as_str().to_string());
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    state.seen.lock().expect("not poisoned").push(Seen {
        method: req.method().to_string(),
        target,
        headers,
    });
    let last = req
        .uri()
        .path()
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string();
    let text =
        |s: &'static str| Response::new(Reply::Whole(Some(Bytes::from_static(s.as_bytes()))));
    let resp = match last.as_str() {
        "hello" => text("hello"),
        "echo" => Response::new(Reply::Echo(req.into_body())),
        "no-content" => {
            let mut r = Response::new(Reply::Whole(None));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        "slow" => {
            tokio::time::sleep(SLOW).await;
            text("late")
        }
        "stream" => {
            let (tx, rx) = mpsc::channel(3);
            for part in ["one,", "two,", "three"] {
                let _ = tx.try_send(Bytes::from_static(part.as_bytes()));
            }
            Response::new(Reply::Pieces(rx))
        }
        "events" => {
            let (tx, rx) = mpsc::channel(2);
            let _ = tx.try_send(Bytes::from_static(b"data: first\n\n"));
            tokio::spawn(async move {
                tokio::select! {
                    permit = state.gate.acquire() => {
                        permit.expect("the gate is never closed").forget();
                        let _ = tx.send(Bytes::from_static(b"data: second\n\n")).await;
                    }
                    () = tx.closed() => {}
                }
            });
            let mut r = Response::new(Reply::Pieces(rx));
            let h = r.headers_mut();
            h.insert("content-type", "text/event-stream".parse().expect("valid"));
            h.insert("cache-control", "no-cache".parse().expect("valid"));
            r
        }
        "stall" => {
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(Bytes::from_static(b"first,"));
            // Held, silent, until the reader goes.
            tokio::spawn(async move { tx.closed().await });
            Response::new(Reply::Pieces(rx))
        }
        // `/tokens/N`: an answer that says it cost N in `x-tokens-used`;
        // `/trailer-tokens/N`: the same in a trailer after a streamed body.
        n if req.uri().path().starts_with("/tokens/") => {
            let mut r = text("tokens");
            r.headers_mut().insert(
                "x-tokens-used",
                n.parse().expect("a path segment is a value"),
            );
            r
        }
        n if req.uri().path().starts_with("/trailer-tokens/") => {
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert(
                "x-tokens-used",
                n.parse().expect("a path segment is a value"),
            );
            let mut r = Response::new(Reply::Trailed(
                Some(Bytes::from_static(b"streamed tokens")),
                Some(trailers),
            ));
            r.headers_mut()
                .insert("trailer", "x-tokens-used".parse().expect("valid"));
            r
        }
        n if req.uri().path().starts_with("/late-trailer-tokens/") => {
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert(
                "x-tokens-used",
                n.parse().expect("a path segment is a value"),
            );
            let mut r = Response::new(Reply::Late(
                Some(Bytes::from_static(b"streamed tokens")),
                Box::pin(tokio::time::sleep(LATE)),
                Some(trailers),
            ));
            r.headers_mut()
                .insert("trailer", "x-tokens-used".parse().expect("valid"));
            r
        }
        "ratelimit-headers" => {
            let mut r = text("own");
            let h = r.headers_mut();
            h.insert("x-ratelimit-limit", "999".parse().expect("valid"));
            h.insert("ratelimit", "\"upstream\";r=5;t=9".parse().expect("valid"));
            r
        }
        _ => text("ok"),
    };
    Ok(resp)
}

/// An answer's body: whole, in pieces from a channel (no length), or the
/// request's own body streamed back.
#[derive(Debug)]
enum Reply {
    Whole(Option<Bytes>),
    /// A body, then trailers (sent chunked, to a request that asked for
    /// trailers with `TE: trailers`).
    Trailed(Option<Bytes>, Option<hyper::HeaderMap>),
    /// The same, the trailers once the timer ends.
    Late(
        Option<Bytes>,
        Pin<Box<tokio::time::Sleep>>,
        Option<hyper::HeaderMap>,
    ),
    Pieces(mpsc::Receiver<Bytes>),
    Echo(Incoming),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Reply::Whole(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Reply::Trailed(b, t) => Poll::Ready(match b.take() {
                Some(b) => Some(Ok(Frame::data(b))),
                None => t.take().map(|t| Ok(Frame::trailers(t))),
            }),
            Reply::Late(b, later, t) => match b.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => later
                    .as_mut()
                    .poll(cx)
                    .map(|()| t.take().map(|t| Ok(Frame::trailers(t)))),
            },
            Reply::Pieces(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
            Reply::Echo(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Reply::Whole(b) => b.is_none(),
            Reply::Trailed(b, t) | Reply::Late(b, _, t) => b.is_none() && t.is_none(),
            Reply::Pieces(_) => false,
            Reply::Echo(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Reply::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Reply::Pieces(_) | Reply::Trailed(..) | Reply::Late(..) => SizeHint::default(),
            Reply::Echo(body) => body.size_hint(),
        }
    }
}

/// An upstream written by hand on a free port, for what a framework would
/// not send; it reads request heads only (no bodies):
///
/// - `GET /until-close`: a body that ends when the connection closes;
/// - `GET /interim`: an interim 103 before the final answer (`final`);
/// - `GET /upgrade`: 101 to the protocol the request's `Upgrade` names,
///   then every byte comes back (an echo protocol);
/// - anything else: `ok`, with a length;
///
/// and it closes a keep-alive connection after 50 ms idle.
///
/// # Panics
/// No free port.
pub async fn raw_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the upstream");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request head, giving up after 50 ms idle: the
                    // connection is closed.
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 1024];
                        match tokio::time::timeout(Duration::from_millis(50), conn.read(&mut chunk))
                            .await
                        {
                            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end);
                    if head.starts_with("GET /upgrade") {
                        let protocol = head
                            .lines()
                            .filter_map(|l| l.split_once(':'))
                            .find(|(n, _)| n.trim().eq_ignore_ascii_case("upgrade"))
                            .map_or("echo", |(_, v)| v.trim());
                        let switched = format!(
                            "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: {protocol}\r\n\r\n"
                        );
                        if conn.write_all(switched.as_bytes()).await.is_err() {
                            return;
                        }
                        // Bytes already read after the head come back first.
                        if !buf.is_empty() && conn.write_all(&buf).await.is_err() {
                            return;
                        }
                        let mut chunk = [0u8; 1024];
                        while let Ok(n) = conn.read(&mut chunk).await {
                            if n == 0 || conn.write_all(&chunk[..n]).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    let until_close = head.starts_with("GET /until-close");
                    let answer: &[u8] = if until_close {
                        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close"
                    } else if head.starts_with("GET /interim") {
                        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    };
                    if conn.write_all(answer).await.is_err() {
                        return;
                    }
                    if until_close {
                        let _ = conn.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    addr
}
