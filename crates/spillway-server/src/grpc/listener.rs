//! The gRPC listener: `ShouldRateLimit` answered on a lean path of its
//! own, everything else (gRPC health, unknown methods) by tonic's routes.
//!
//! Envoy calls `ShouldRateLimit` once per request it limits, so its cost
//! is the listener's cost. tonic's generic stack (an axum router cloned
//! and driven per call, a middleware, tonic's routes, its streaming
//! decoder and encoder, a boxed body per answer) cost about as much as the
//! decision itself; the one unary method needs none of it. Here a call is
//! read straight from hyper's body (gRPC's five-byte framing, one message,
//! the same checks and error codes as tonic's unary path), decided by
//! [`should_rate_limit`], and answered as one data frame and the
//! `grpc-status` trailer. The guarantees underneath are the wire's, as
//! for every listener: connection budget, deadlines, stream caps, TLS.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use prost::Message as _;
use tonic::Status;

use super::GrpcState;
use super::proto::{RateLimitRequest, RateLimitResponse, SHOULD_RATE_LIMIT};
use super::service::{MAX_MESSAGE, SPAN, decide_call, should_rate_limit, trace_attributes};
use crate::Routed;

fn grpc_type() -> HeaderValue {
    HeaderValue::from_static("application/grpc")
}

/// A bound gRPC listener.
#[derive(Debug)]
pub enum Bound {
    /// On TCP.
    Tcp(tokio::net::TcpListener),
    /// On a Unix socket, and its path (removed when the listener stops).
    Unix(tokio::net::UnixListener, std::path::PathBuf),
}

impl Bound {
    /// Where it listens, for the log: a URL (`https` with `tls`), or the
    /// socket's `unix:PATH`.
    pub fn describe(&self, tls: bool) -> String {
        match self {
            Bound::Tcp(l) => {
                let scheme = if tls { "https" } else { "http" };
                l.local_addr()
                    .map_or_else(|_| "?".into(), |a| format!("{scheme}://{a}"))
            }
            Bound::Unix(_, p) => format!("unix:{}", p.display()),
        }
    }
}

/// Binds `at` (to be served over TLS with `tls`). A Unix socket's path
/// left by a process that died (nobody answers on it) is replaced; one
/// that is in use, or is not a socket, is an error.
///
/// # Errors
/// What the OS says, with the address; TLS asked for on a Unix socket.
pub async fn bind(at: &GrpcListen, tls: bool) -> std::io::Result<Bound> {
    let fail = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("cannot listen for gRPC on {at}: {e}"))
    };
    if tls && matches!(at, GrpcListen::Unix(_)) {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "TLS is not served on a Unix socket (remove `tls:` / `grpc_tls:`, or listen on an address)",
        )));
    }
    match at {
        GrpcListen::Tcp(a) => tokio::net::TcpListener::bind(*a)
            .await
            .map(Bound::Tcp)
            .map_err(fail),
        GrpcListen::Unix(path) => {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                if !meta.file_type().is_socket() {
                    return Err(fail(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "the path exists and is not a socket",
                    )));
                }
                if tokio::net::UnixStream::connect(path).await.is_ok() {
                    return Err(fail(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        "another process listens on it",
                    )));
                }
                // A stale socket from a process that is gone.
                std::fs::remove_file(path).map_err(fail)?;
            }
            tokio::net::UnixListener::bind(path)
                .map(|l| Bound::Unix(l, path.clone()))
                .map_err(fail)
        }
    }
}

/// Serves the Envoy rate limit service and gRPC health on `listener`
/// until `stop` completes; over TLS with `tls` (the acceptor built from
/// the TLS settings; never on a Unix socket, which the start refuses).
pub async fn serve(
    state: Arc<GrpcState>,
    listener: Bound,
    limits: spillway_wire::Limits,
    budget: Arc<spillway_wire::Budget>,
    stop: impl Future<Output = ()> + Send + 'static,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(super::proto::SERVICE, tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // On the same accept layer as every other listener: the process's
    // connection budget, head and idle deadlines for silent connections,
    // HTTP/2 stream caps per connection and process-wide, TLS handshakes
    // bounded like any connection.
    let router = tonic::service::Routes::new(health)
        .add_service(super::service::RateLimitService)
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            limits.body_timeout,
            deadline,
        ));
    // `ShouldRateLimit` on its own lean path, the rest through the router.
    let handler = Arc::new(GrpcHandler {
        state,
        router,
        most: limits.body_timeout,
    });
    // HTTP/2 only, as tonic's own server was: gRPC has no HTTP/1.1 form.
    let limits = spillway_wire::Limits {
        http2_only: true,
        ..limits
    };
    let served = match listener {
        Bound::Tcp(l) => crate::serve_router(&budget, l, tls, handler, limits, stop).await,
        Bound::Unix(l, path) => {
            let r = spillway_wire::serve_unix(&budget, l, handler, limits, stop).await;
            let _ = std::fs::remove_file(&path);
            r
        }
    };
    if let Err(e) = served {
        tracing::error!("gRPC server stopped: {e}");
    }
}

/// The gRPC listener's way in, for the wire: every connection goes to
/// hyper (gRPC is HTTP/2 only) and [`GrpcConn`].
#[derive(Debug)]
pub(crate) struct GrpcHandler {
    pub(crate) state: Arc<GrpcState>,
    /// tonic's routes (health, and an answer for unknown methods) with the
    /// deadline middleware.
    pub(crate) router: axum::Router,
    /// The listener's body timeout: the longest any call may take.
    pub(crate) most: Duration,
}

impl spillway_wire::Handler for GrpcHandler {
    type Route = Infallible;
    type Body = GrpcBody;
    type Fallback = GrpcConn;

    fn max_body(&self) -> usize {
        0
    }

    fn route(&self, _: &spillway_wire::head::RequestHead<'_, '_>) -> Option<Infallible> {
        None
    }

    async fn serve<'a>(
        &'a self,
        route: Infallible,
        _: spillway_wire::Message<'a>,
        _: &'a mut spillway_wire::ClientConn<'_>,
        _: &'a mut Vec<u8>,
    ) -> bool {
        match route {}
    }

    fn refuse(&self, status: http::StatusCode, detail: &str, out: &mut Vec<u8>) {
        crate::json::refuse_problem(status, detail, out);
    }

    fn fallback(&self, peer: SocketAddr) -> GrpcConn {
        GrpcConn {
            state: self.state.clone(),
            routed: Routed::new(self.router.clone(), peer),
            most: self.most,
        }
    }
}

/// One connection's service.
pub(crate) struct GrpcConn {
    state: Arc<GrpcState>,
    routed: Routed,
    most: Duration,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<GrpcBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<spillway_wire::RequestBody>> for GrpcConn {
    type Response = Response<GrpcBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: Request<spillway_wire::RequestBody>) -> Answer {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            let routed = self.routed.call(req);
            return Box::pin(async move {
                let Ok(res) = routed.await;
                Ok(res.map(GrpcBody::Other))
            });
        }
        let limit = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| grpc_timeout(v.as_bytes()))
            .map_or(self.most, |t| t.min(self.most));
        if let Err(status) = admit(&self.state, &req) {
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        // The call's deadline: `DEADLINE_EXCEEDED` past it. tokio arms
        // the timer only once the call has to wait, and most are read and
        // decided in their first poll.
        let call = tokio::time::timeout(limit, one_call(self.state.clone(), req));
        Box::pin(async move { Ok(call.await.unwrap_or_else(|_| deadline_exceeded())) })
    }
}

/// `api.tokens` close this way in as they close the decision routes: a
/// call charges counters, so an open gRPC port let any caller spend
/// another key's budget. The token comes as `authorization: Bearer TOKEN`
/// metadata (Envoy's `grpc_service.initial_metadata`). Then the message
/// encoding: only `identity` (tonic's answer to any other).
fn admit<B>(state: &GrpcState, req: &Request<B>) -> Result<(), Status> {
    let authorization = req.headers().get(http::header::AUTHORIZATION);
    if let Err(r) = state
        .shared
        .api_tokens
        .admit(authorization.map(HeaderValue::as_bytes), false)
    {
        return Err(if r.status == http::StatusCode::FORBIDDEN {
            Status::permission_denied(r.detail)
        } else {
            Status::unauthenticated(r.detail)
        });
    }
    match req
        .headers()
        .get("grpc-encoding")
        .map(HeaderValue::as_bytes)
    {
        None | Some(b"identity") => Ok(()),
        Some(other) => {
            let mut s = Status::unimplemented(format!(
                "Content is compressed with `{}` which isn't supported",
                String::from_utf8_lossy(other)
            ));
            s.metadata_mut().insert(
                "grpc-accept-encoding",
                tonic::metadata::MetadataValue::from_static("identity"),
            );
            Err(s)
        }
    }
}

/// Reads, decides and answers one call.
async fn one_call(
    state: Arc<GrpcState>,
    req: Request<spillway_wire::RequestBody>,
) -> Response<GrpcBody> {
    // Off: one check of an `Option`, no clock read, nothing allocated.
    // On: a span, child of the caller's `traceparent` metadata.
    let span = match &state.shared.tracer {
        None => None,
        Some(t) => t.span(SPAN, req.headers()),
    };
    let msg = match read_message(req.into_body()).await {
        Ok(m) => m,
        Err(status) => return status.into_http(),
    };
    let started = std::time::Instant::now();
    if let Some(span) = span {
        return traced_call(&state, msg, span, started).await;
    }
    match should_rate_limit(&state, msg).await {
        Ok(resp) => {
            state.shared.events.observe_latency(started.elapsed());
            answer(&resp)
        }
        Err(status) => status.into_http(),
    }
}

/// [`one_call`]'s decision when the call is traced: timed, with the
/// store's share of it, and its span finished with what it decided.
#[inline(never)]
async fn traced_call(
    state: &GrpcState,
    msg: RateLimitRequest,
    span: crate::trace::Span,
    started: std::time::Instant,
) -> Response<GrpcBody> {
    let mut store_took = Duration::ZERO;
    let domain = msg.domain.clone();
    let descriptors = msg.descriptors.len();
    let cost = msg.hits_addend.max(1);
    let resp = decide_call(state, msg, Some(&mut store_took)).await;
    state.shared.events.observe_latency(started.elapsed());
    if let Some(t) = &state.shared.tracer {
        let (attributes, error) = trace_attributes(&domain, descriptors, cost, &resp, store_took);
        t.finish(span, attributes, error.as_deref());
    }
    match resp {
        Ok(resp) => answer(&resp),
        Err(status) => status.into_http(),
    }
}

/// The call's one message, read as tonic's unary path reads it: the first
/// whole message is the request; the rest of the body is read to its end
/// and any further message decoded (and dropped), so a broken one is still
/// an error; bytes left over are a cut message.
///
/// # Errors
/// `INTERNAL` for a compressed flag (no encoding is accepted), a bad flag,
/// a message that does not decode, a cut one or none; `RESOURCE_EXHAUSTED`
/// for one over [`MAX_MESSAGE`]; the body's own error as tonic maps it.
async fn read_message(mut body: spillway_wire::RequestBody) -> Result<RateLimitRequest, Status> {
    let mut buf = BytesMut::new();
    let mut first = None;
    loop {
        while buf.len() >= 5 {
            match buf[0] {
                0 => {}
                1 => {
                    return Err(Status::internal(
                        "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                    ));
                }
                f => {
                    return Err(Status::internal(format!(
                        "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                    )));
                }
            }
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > MAX_MESSAGE {
                return Err(Status::resource_exhausted(format!(
                    "message of {len} bytes, the limit is {MAX_MESSAGE} bytes"
                )));
            }
            if buf.len() < 5 + len {
                break;
            }
            let m = RateLimitRequest::decode(&buf[5..5 + len])
                .map_err(|e| Status::internal(e.to_string()))?;
            first.get_or_insert(m);
            buf.advance(5 + len);
        }
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Err(e)) => return Err(Status::from_error(Box::new(e))),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
    if !buf.is_empty() {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    first.ok_or_else(|| Status::internal("Missing request message."))
}

/// The answer to a decided call: its message, framed, then `grpc-status: 0`.
fn answer(resp: &RateLimitResponse) -> Response<GrpcBody> {
    let len = resp.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // A `BytesMut` grows: encoding into it cannot run out of room.
    let _ = resp.encode(&mut buf);
    let mut res = Response::new(GrpcBody::Message {
        data: Some(buf.freeze()),
        trailers: true,
    });
    res.headers_mut()
        .insert(http::header::CONTENT_TYPE, grpc_type());
    res
}

/// A call's answer body.
#[derive(Default)]
pub(crate) enum GrpcBody {
    /// A trailers-only answer (an error: its status is in the head).
    #[default]
    Empty,
    /// One message, then `grpc-status: 0`.
    Message { data: Option<Bytes>, trailers: bool },
    /// tonic's routes' answer.
    Other(axum::body::Body),
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match self.get_mut() {
            GrpcBody::Empty => Poll::Ready(None),
            GrpcBody::Message { data, trailers } => {
                if let Some(d) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                if std::mem::take(trailers) {
                    let mut t = HeaderMap::with_capacity(1);
                    t.insert("grpc-status", HeaderValue::from_static("0"));
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Poll::Ready(None)
            }
            GrpcBody::Other(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GrpcBody::Empty => true,
            GrpcBody::Message { data, trailers } => data.is_none() && !trailers,
            GrpcBody::Other(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GrpcBody::Empty => SizeHint::with_exact(0),
            GrpcBody::Message { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            GrpcBody::Other(b) => b.size_hint(),
        }
    }
}

/// Ends a call of tonic's routes at its `grpc-timeout` or at `most` (the
/// body timeout), whichever comes first, with `DEADLINE_EXCEEDED`, as the
/// lean path does.
pub(crate) async fn deadline(
    axum::extract::State(most): axum::extract::State<Duration>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let limit = req
        .headers()
        .get("grpc-timeout")
        .and_then(|v| grpc_timeout(v.as_bytes()))
        .map_or(most, |t| t.min(most));
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(res) => res,
        Err(_) => deadline_exceeded(),
    }
}

/// `DEADLINE_EXCEEDED`, as a trailers-only answer.
pub(crate) fn deadline_exceeded<B: Default>() -> Response<B> {
    let mut res = Response::new(B::default());
    let h = res.headers_mut();
    h.insert(http::header::CONTENT_TYPE, grpc_type());
    h.insert("grpc-status", HeaderValue::from_static("4"));
    h.insert(
        "grpc-message",
        HeaderValue::from_static("deadline%20exceeded"),
    );
    res
}

/// A `grpc-timeout` value: at most 8 digits and a unit (`H`, `M`, `S`,
/// `m`, `u`, `n`); `None` when malformed (the call then gets the server's
/// own bound).
pub(crate) fn grpc_timeout(v: &[u8]) -> Option<Duration> {
    let (unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Where the gRPC listener listens: a TCP address, or a Unix socket's
/// path (`unix:/path/to.sock`: a sidecar's, envoyproxy/ratelimit's
/// `GRPC_UDS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcListen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket's path.
    Unix(std::path::PathBuf),
}

impl std::str::FromStr for GrpcListen {
    type Err = String;

    /// `unix:PATH` (a non-empty path), or an address like `127.0.0.1:8081`.
    fn from_str(s: &str) -> Result<GrpcListen, String> {
        match s.strip_prefix("unix:") {
            Some("") => Err("unix: needs a socket path, like unix:/run/spillway/grpc.sock".into()),
            Some(path) => Ok(GrpcListen::Unix(path.into())),
            None => s.parse().map(GrpcListen::Tcp).map_err(|_| {
                format!("{s:?} is not an address like 127.0.0.1:8081 nor unix:/path/to.sock")
            }),
        }
    }
}

impl std::fmt::Display for GrpcListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrpcListen::Tcp(a) => a.fmt(f),
            GrpcListen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_and_unix_paths() {
        assert_eq!(
            "127.0.0.1:8081".parse::<GrpcListen>(),
            Ok(GrpcListen::Tcp(SocketAddr::from(([127, 0, 0, 1], 8081))))
        );
        let unix: GrpcListen = "unix:/run/rl.sock".parse().unwrap();
        assert_eq!(unix, GrpcListen::Unix("/run/rl.sock".into()));
        assert_eq!(unix.to_string(), "unix:/run/rl.sock");
        for bad in ["unix:", "localhost", "/run/rl.sock", ""] {
            assert!(bad.parse::<GrpcListen>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn grpc_timeouts_are_read_strictly() {
        assert_eq!(grpc_timeout(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            grpc_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"10x",
            b"-1S",
            b"1.5S",
            b"\xff",
        ] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
