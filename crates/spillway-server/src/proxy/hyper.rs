//! The proxy's hyper transport: everything the direct path does not take
//! (HTTP/2, chunked and large bodies, upgrades), forwarded with hyper's
//! client. It calls [`Proxy`]'s phases in the same order as the direct
//! transport and only moves messages.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, capture_connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use spillway_store::Checked;
use spillway_tower::Admission;
use spillway_tower::render::{PROBLEM_JSON, Problem, insert_rate_limit_headers};
use spillway_wire::HOP_BY_HOP;
use spillway_wire::client::{Conn, Upstream};
use spillway_wire::headers::{FRAMING, connection_tokens, named};

use super::{Failure, Proxy, Refused};

mod bodies;
use bodies::{IdleTimeout, Settle, call_settled};

/// How long the hyper client keeps an idle upstream connection.
const HYPER_IDLE: Duration = Duration::from_secs(5);

/// The hyper transport, as a tower service for axum's fallback.
#[derive(Clone)]
pub struct HyperProxy {
    proxy: Arc<Proxy>,
    client: Client<Bounded, Body>,
}

impl std::fmt::Debug for HyperProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HyperProxy").finish_non_exhaustive()
    }
}

impl HyperProxy {
    /// The hyper transport of `proxy`.
    pub fn new(proxy: Arc<Proxy>) -> HyperProxy {
        // Connections come from the direct transport's bounded pool: the
        // two transports together open at most
        // `proxy.upstream.max_connections`. hyper's own idle connections
        // hold their permits too, and the direct transport cannot take
        // them: they close after a short idle time, so that a burst on
        // this transport does not keep the other waiting for long.
        let connector = Bounded(proxy.connections().clone());
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(HYPER_IDLE)
            .build(connector);
        HyperProxy { proxy, client }
    }

    /// The router for the hyper path: every request goes to this service.
    pub fn router(self) -> axum::Router {
        axum::Router::new().fallback_service(self)
    }

    fn target(&self, uri: &Uri) -> Result<Uri, String> {
        let up = self.proxy.upstream();
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut parts = up.uri().clone().into_parts();
        parts.path_and_query = Some(
            format!("{}{path_and_query}", up.base())
                .parse()
                .map_err(|e| format!("bad path: {e}"))?,
        );
        Uri::from_parts(parts).map_err(|e| e.to_string())
    }

    async fn forward(self, mut req: Request<Body>) -> Response<Body> {
        let Some(peer) = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
        else {
            return problem(
                &Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "no peer"),
                None,
            );
        };
        // HTTP/2 names the host in :authority, which hyper keeps in the URI.
        if req.version() == http::Version::HTTP_2
            && !req.headers().contains_key(header::HOST)
            && let Some(a) = req
                .uri()
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, a);
        }
        // Absolute-form on HTTP/1 (`GET http://x/a`): served as the
        // origin-form request it stands for, its authority in place of a
        // `Host` that is sent once and valid (else `check` refuses the
        // client's), so it is counted as `GET /a` with `Host: x`. Anything
        // else with no path (authority-form `GET x:80`, an odd scheme,
        // userinfo) is 400: the target checked is the path the rules will
        // see, never a default.
        if req.version() != http::Version::HTTP_2
            && req.method() != http::Method::CONNECT
            && (req.uri().scheme().is_some() || req.uri().authority().is_some())
        {
            let uri = req.uri();
            let (authority, origin) = match super::absolute_form(
                uri.scheme_str(),
                uri.authority().map(http::uri::Authority::as_str),
                uri.path_and_query().map(http::uri::PathAndQuery::as_str),
            ) {
                Ok((a, o)) => (HeaderValue::from_str(a), o.parse::<Uri>()),
                Err(detail) => return problem(&self.proxy.bad_target(detail), None),
            };
            let (Ok(authority), Ok(origin)) = (authority, origin) else {
                let detail = "the absolute-form target is not a valid URL";
                return problem(&self.proxy.bad_target(detail), None);
            };
            let mut hosts = req.headers().get_all(header::HOST).iter();
            if let (Some(host), None) = (hosts.next(), hosts.next())
                && super::valid_host(host.as_bytes())
            {
                req.headers_mut().insert(header::HOST, authority);
            }
            *req.uri_mut() = origin;
        }
        // CONNECT's authority-form has no path: `check` refuses it (405).
        let target = req.uri().path_and_query().map_or("", |p| p.as_str());
        let who = match self
            .proxy
            .check(req.method().as_str(), target, req.headers(), peer)
        {
            Ok(w) => w,
            Err(Refused::Invalid(p)) => return problem(&p, None),
        };
        // A body up to `proxy.buffer_body` is read whole first (as nginx's
        // request buffering does, and as the direct transport reads its
        // bodies): a client that trickles it holds no in-flight slot and
        // no upstream connection meanwhile, and one that never finishes
        // it is not counted.
        let (parts, body) = req.into_parts();
        let body = match buffer(body, self.proxy.buffer_body(), self.proxy.timeout()).await {
            Ok(b) => b,
            Err(BodyFailed::Broken) => return problem(&self.proxy.bad_body(), None),
            Err(BodyFailed::Slow) => return problem(&self.proxy.slow_body(), None),
        };
        let mut req = Request::from_parts(parts, body);
        let (admission, trace) = self
            .proxy
            .admit(req.method().as_str(), req.uri().path(), &who, req.headers())
            .await;
        let checked = match admission {
            Admission::Denied(c) => return problem(&Problem::too_many_requests(&c), Some(&c)),
            Admission::Admitted(c) => c,
        };
        let turn = match self.proxy.turn(&checked, &who).await {
            Ok(t) => t,
            Err((p, retry)) => {
                let mut resp = problem(&p, Some(&checked));
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry));
                return resp;
            }
        };
        // A rule that reads its cost from the answer: keep what its key
        // needs, to charge once the answer says (see `Settle`).
        let settle = Proxy::settles(&checked).then(|| {
            Arc::new(Settle {
                proxy: self.proxy.clone(),
                method: req.method().as_str().to_string(),
                path: req.uri().path().to_string(),
                who: who.clone(),
                headers: req.headers().clone(),
            })
        });
        let target = match self.target(req.uri()) {
            Ok(t) => t,
            Err(e) => return problem(&Problem::new(StatusCode::BAD_REQUEST, e), Some(&checked)),
        };
        // An upgrade (a WebSocket, say) on the allow-list is asked for with
        // hop-by-hop headers, which are passed on for it; on a 101 the two
        // sides are joined (see `join_upgraded`). Any other upgrade (h2c
        // among them) is served as a plain request.
        let upgrade = upgrade_asked(req.headers()).filter(|u| {
            u.to_str()
                .is_ok_and(|u| u.split(',').all(|p| self.proxy.upgrade_allowed(p)))
        });
        let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        let mut added = Vec::with_capacity(3);
        let dropped = self
            .proxy
            .forwarding(peer, req.headers(), trace.as_ref(), |name, value| {
                if let Ok(v) = HeaderValue::from_str(value) {
                    added.push((HeaderName::from_static(name), v));
                }
            });
        let headers = req.headers_mut();
        strip_hop_by_hop(headers);
        keep_upgrade(headers, upgrade);
        if settle.is_some() {
            // A cost may come as a trailer: an HTTP/1.1 upstream sends
            // trailers only to a request that says it takes them.
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        headers.remove(header::HOST);
        for name in dropped {
            headers.remove(*name);
        }
        for (name, value) in added {
            headers.insert(name, value);
        }
        *req.uri_mut() = target;
        *req.version_mut() = http::Version::HTTP_11;
        let timeout = self.proxy.timeout();
        // Whether the request got a connection: one that timed out
        // without one waited for the bounded connections (503, not 504).
        let captured = capture_connection(&mut req);
        let called = match settle {
            None => tokio::time::timeout(timeout, self.client.request(req))
                .await
                .map(|r| r.map(|resp| resp.map(|b| Body::new(IdleTimeout::new(b, timeout))))),
            // A cost from the answer must be read even if the client leaves
            // (an HTTP/1.1 close or an HTTP/2 reset drops this future): the
            // call runs in a task of its own, which charges what the head
            // says and hands back a body that reads on to the trailer.
            Some(settle) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let call = call_settled(self.client.clone(), req, timeout, settle, tx);
                tokio::spawn(call);
                match rx.await {
                    Ok(called) => called,
                    // The task ended without an answer (it panicked).
                    Err(_) => {
                        let head = turn.mark();
                        self.proxy.answered(turn, false, head);
                        let f = Failure::Bad("the upstream call was lost".into());
                        return problem(&self.proxy.failure(f), Some(&checked));
                    }
                }
            }
        };
        let failure = match called {
            Ok(Ok(mut resp)) => {
                // In flight until the answer's head (a body streams on
                // its own time; an upgraded connection is no call).
                let head = turn.mark();
                self.proxy
                    .answered(turn, resp.status().as_u16() < 500, head);
                if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                    let Some(client_side) = client_side else {
                        return problem(
                            &self
                                .proxy
                                .failure(Failure::Bad("101 to a request without Upgrade".into())),
                            Some(&checked),
                        );
                    };
                    let upstream_side = hyper::upgrade::on(&mut resp);
                    tokio::spawn(join_upgraded(client_side, upstream_side));
                    let (mut parts, _) = resp.into_parts();
                    let switched = upgrade_asked(&parts.headers);
                    strip_hop_by_hop(&mut parts.headers);
                    keep_upgrade(&mut parts.headers, switched);
                    if super::ours(&checked) {
                        // Set only above a plain limit: never the upstream's.
                        parts.headers.remove(spillway_tower::render::ZONE);
                    }
                    insert_rate_limit_headers(&checked, &mut parts.headers);
                    return Response::from_parts(parts, Body::empty());
                }
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                if super::ours(&checked) {
                    // Set only above a plain limit: never the upstream's.
                    parts.headers.remove(spillway_tower::render::ZONE);
                }
                insert_rate_limit_headers(&checked, &mut parts.headers);
                return Response::from_parts(parts, body);
            }
            // A body the client broke (cut short, bad chunked coding)
            // fails the upstream request too: it is the client's 400, not
            // a 502. hyper calls a failing request body a user error.
            Ok(Err(e)) if client_body_failed(&e) => {
                // The client's fault: its slot is freed, no sample.
                drop(turn);
                let p = if spillway_wire::BodyError::timed_out_in(&e) {
                    self.proxy.slow_body()
                } else {
                    self.proxy.bad_body()
                };
                return problem(&p, Some(&checked));
            }
            Ok(Err(e)) if at_capacity(&e) => {
                drop(turn);
                Failure::Busy
            }
            Ok(Err(e)) => {
                let head = turn.mark();
                self.proxy.answered(turn, false, head);
                Failure::Bad(e.to_string())
            }
            Err(_) if captured.connection_metadata().is_none() => {
                drop(turn);
                Failure::Busy
            }
            Err(_) => {
                let head = turn.mark();
                self.proxy.answered(turn, false, head);
                Failure::Timeout
            }
        };
        let busy = matches!(failure, Failure::Busy);
        let mut resp = problem(&self.proxy.failure(failure), Some(&checked));
        if busy {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// The hyper client's connector: connections from the upstream's bounded
/// pool ([`Upstream::connection`]), never more than
/// `proxy.upstream.max_connections` with the direct transport's.
#[derive(Clone)]
struct Bounded(Arc<Upstream>);

/// Every upstream connection stayed in use for the timeout.
#[derive(Debug)]
struct AtCapacity;

impl std::fmt::Display for AtCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("every upstream connection is in use")
    }
}

impl std::error::Error for AtCapacity {}

impl tower::Service<Uri> for Bounded {
    type Response = UpstreamConn;
    type Error = axum::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamConn, axum::BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), axum::BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let up = self.0.clone();
        Box::pin(async move {
            // hyper's pool queues its requests itself: they reach this
            // bound in one group.
            match up.connection(0).await {
                Ok(c) => Ok(UpstreamConn(TokioIo::new(c))),
                Err(spillway_wire::client::Failure::Busy) => Err(AtCapacity.into()),
                Err(spillway_wire::client::Failure::Bad(e)) => Err(e.into()),
                Err(spillway_wire::client::Failure::Timeout) => Err("connect timed out".into()),
            }
        })
    }
}

/// Whether the upstream request failed for want of a connection.
fn at_capacity(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if err.is::<AtCapacity>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// A bounded upstream connection, as hyper's client reads and writes it.
struct UpstreamConn(TokioIo<Conn>);

impl hyper::rt::Read for UpstreamConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for UpstreamConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}

impl Connection for UpstreamConn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Why a request body could not be buffered.
enum BodyFailed {
    /// The client broke it (cut short, bad chunked coding): 400.
    Broken,
    /// It did not arrive within the timeout: 408.
    Slow,
}

/// Reads `body` whole if it is at most `cap` bytes (within `timeout`),
/// else the first `cap` and more bytes of it, the rest streaming after
/// them. An empty body, or one whose length says it is larger, is left as
/// it is.
async fn buffer(body: Body, cap: usize, timeout: Duration) -> Result<Body, BodyFailed> {
    use hyper::body::Body as _;
    let cap64 = u64::try_from(cap).unwrap_or(u64::MAX);
    if cap == 0 || body.is_end_stream() || body.size_hint().lower() > cap64 {
        return Ok(body);
    }
    let mut body = body;
    let mut read = std::collections::VecDeque::new();
    let mut trailers = None;
    let mut len = 0usize;
    let fill = async {
        loop {
            let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
            else {
                return Ok(true);
            };
            // Past `server.body_timeout` in all (the wire's deadline for
            // a whole body): 408, as a buffer that waited too long.
            let frame = frame.map_err(|e| {
                if spillway_wire::BodyError::timed_out_in(&e) {
                    BodyFailed::Slow
                } else {
                    BodyFailed::Broken
                }
            })?;
            match frame.into_data() {
                Ok(data) => {
                    len = len.saturating_add(data.len());
                    read.push_back(data);
                    if len > cap {
                        return Ok(false);
                    }
                }
                Err(frame) => {
                    trailers = frame.into_trailers().ok();
                    return Ok(true);
                }
            }
        }
    };
    // Most bodies are in when the head is: then no timer (a timer wheel
    // registration per request) is needed.
    let ended = {
        let mut fill = std::pin::pin!(fill);
        let first = std::future::poll_fn(|cx| Poll::Ready(fill.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(r) => r?,
            Poll::Pending => match tokio::time::timeout(timeout, fill).await {
                Ok(r) => r?,
                Err(_) => return Err(BodyFailed::Slow),
            },
        }
    };
    if ended && len == 0 && trailers.is_none() {
        // An empty body (a chunked one's last chunk alone, say).
        return Ok(Body::empty());
    }
    Ok(Body::new(Buffered {
        read,
        len: ended.then_some(len as u64),
        trailers,
        rest: (!ended).then_some(body),
    }))
}

/// A request body read before the upstream call: the chunks read, then
/// the trailers, or the rest as it comes.
struct Buffered {
    read: std::collections::VecDeque<Bytes>,
    /// The length still to send, when all of it was read.
    len: Option<u64>,
    trailers: Option<HeaderMap>,
    rest: Option<Body>,
}

impl hyper::body::Body for Buffered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if let Some(data) = this.read.pop_front() {
            if let Some(n) = this.len.as_mut() {
                *n = n.saturating_sub(data.len() as u64);
            }
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(data))));
        }
        if let Some(rest) = this.rest.as_mut() {
            return Pin::new(rest).poll_frame(cx);
        }
        Poll::Ready(
            this.trailers
                .take()
                .map(|t| Ok(hyper::body::Frame::trailers(t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self.trailers.is_none()
            && self
                .rest
                .as_ref()
                .is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.len {
            Some(n) => hyper::body::SizeHint::with_exact(n),
            None => hyper::body::SizeHint::default(),
        }
    }
}

/// The proxy's own answer, with the decision's headers when one was made.
fn problem(p: &Problem<'_>, checked: Option<&Checked>) -> Response<Body> {
    let mut resp = Response::new(Body::from(p.to_json()));
    *resp.status_mut() = p.status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if p.status == StatusCode::METHOD_NOT_ALLOWED {
        h.insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
    }
    if let Some(c) = checked {
        insert_rate_limit_headers(c, h);
    }
    resp
}

/// Removes hop-by-hop headers and those `Connection` names (never the
/// framing ones: hyper writes its own framing, and a listed `Host` or
/// length must not change what is forwarded).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = connection_tokens(&*h)
        .into_iter()
        .filter(|n| !named(&FRAMING, n))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove(header::TRANSFER_ENCODING);
}

/// The `Upgrade` value of a message that asks for one (`Connection:
/// upgrade` and an `Upgrade` header).
fn upgrade_asked(h: &HeaderMap) -> Option<HeaderValue> {
    let asked = connection_tokens(h)
        .iter()
        .any(|t| t.eq_ignore_ascii_case("upgrade"));
    asked.then(|| h.get(header::UPGRADE).cloned()).flatten()
}

/// Puts back the upgrade headers that `strip_hop_by_hop` removed.
fn keep_upgrade(h: &mut HeaderMap, upgrade: Option<HeaderValue>) {
    if let Some(u) = upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u);
    }
}

/// Once both sides have switched protocols, copies bytes both ways until
/// either closes. The upgrade request was decided like any other; what
/// flows afterwards is the client's and the upstream's.
async fn join_upgraded(client: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    match tokio::try_join!(client, upstream) {
        Ok((client, upstream)) => {
            let mut client = hyper_util::rt::TokioIo::new(client);
            let mut upstream = hyper_util::rt::TokioIo::new(upstream);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
        Err(e) => tracing::debug!("upgrade not completed: {e}"),
    }
}

/// Whether the upstream request failed because the client's body did.
fn client_body_failed(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && h.is_user()
        {
            return true;
        }
        if err.downcast_ref::<axum::Error>().is_some() {
            return true;
        }
        source = err.source();
    }
    false
}

impl tower::Service<Request<Body>> for HyperProxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}
