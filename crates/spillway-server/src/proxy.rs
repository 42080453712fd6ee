//! `spillway proxy`: a reverse proxy that decides for every request and
//! forwards the admitted ones to the upstream.
//!
//! The rate limiting is `spillway-tower`'s layer, the same as in a Rust
//! service; this module adds what a proxy needs around it: who the client is
//! (user from a header or query parameter; IP from the peer, or from
//! `X-Forwarded-For` / `Forwarded` only when the peer is a trusted proxy) and
//! a forwarding service with streaming bodies, pooled upstream connections,
//! forwarding headers and a timeout (502 / 504 problem documents).

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spillway_tower::{Identity, RateLimitLayer};
use tower::Layer;

use crate::AppState;
use crate::config::UserSource;
use crate::upstream::Failure;

/// An IP network (`10.0.0.0/8`, `::1/128`, or a bare address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parses CIDR notation or a bare address.
    ///
    /// # Errors
    /// Not an address, or a prefix longer than the address.
    pub fn parse(s: &str) -> Result<IpNet, String> {
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IP network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: prefix must be 0 to {max}"))?,
        };
        Ok(IpNet { addr, prefix })
    }

    /// True if `ip` is inside the network (IPv4-mapped IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Checks an upstream URL: `http://host[:port][/base]`.
///
/// # Errors
/// Not an http URL with a host.
pub fn parse_upstream(s: &str) -> Result<Uri, String> {
    let uri: Uri = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("{s:?}: expected http://host[:port][/path]"));
    }
    Ok(uri)
}

/// The client's IP: the peer, unless the peer is a trusted proxy; then the
/// rightmost address in `X-Forwarded-For` (or `Forwarded: for=`) that is not
/// itself a trusted proxy. A client talking to us directly cannot choose its
/// IP by sending the header: an untrusted peer's headers are ignored.
/// An IPv4-mapped IPv6 address (a dual-stack listener's IPv4 peer) comes
/// back as its IPv4 address, so it shares a key with the same client
/// named in a header.
pub fn client_ip<H: Headers + ?Sized>(peer: IpAddr, headers: &H, trusted: &[IpNet]) -> IpAddr {
    rightmost_untrusted(peer, headers, trusted).to_canonical()
}

fn rightmost_untrusted<H: Headers + ?Sized>(
    peer: IpAddr,
    headers: &H,
    trusted: &[IpNet],
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    // From the right, each trusted hop vouches for the entry to its left.
    let mut last = peer;
    for hop in forwarded_chain(headers).into_iter().rev() {
        match hop {
            Some(ip) if is_trusted(ip) => last = ip,
            Some(ip) => return ip,
            // Not an address ("unknown", an obfuscated `_id`, garbage):
            // nothing to its left can be believed, so the last trusted hop
            // stands for the client rather than whatever the client wrote
            // further left.
            None => return last,
        }
    }
    // Every hop trusted: the leftmost.
    last
}

/// The hops of `X-Forwarded-For` (all occurrences, in order), else of
/// `Forwarded: for=...`; `None` for an entry that is not an address.
fn forwarded_chain<H: Headers + ?Sized>(headers: &H) -> Vec<Option<IpAddr>> {
    let xff: Vec<Option<IpAddr>> = headers
        .all("x-forwarded-for")
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_ip)
        .collect();
    if !xff.is_empty() {
        return xff;
    }
    headers
        .all("forwarded")
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            // One hop per element; one without `for=` names no one.
            element.split(';').find_map(|kv| {
                let (k, v) = kv.trim().split_once('=')?;
                k.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_ip(v.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// Request headers by name (case-insensitive), as text: a `HeaderMap`, or
/// the headers the direct HTTP/1.1 path parsed in place.
pub trait Headers {
    /// Every value of `name` that is valid text, in order.
    fn all(&self, name: &str) -> Vec<&str>;
    /// The first value of `name`.
    fn value(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }
}

impl Headers for HeaderMap {
    fn all(&self, name: &str) -> Vec<&str> {
        self.get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Headers for [httparse::Header<'_>] {
    fn all(&self, name: &str) -> Vec<&str> {
        self.iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
            .collect()
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    }
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`,
/// `[::1]`, `[::1]:80`, `::1`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    s.rsplit_once(':').and_then(|(a, _)| a.parse().ok())
}

/// The proxy's identity extraction, from its configuration.
#[derive(Debug, Clone)]
pub struct ProxyIdentify {
    user: Option<UserSource>,
    trusted: Arc<[IpNet]>,
}

impl ProxyIdentify {
    /// The user, from its header or query parameter (an empty one the
    /// limiter takes as none, as on every way in).
    pub fn user<H: Headers + ?Sized>(&self, headers: &H, query: Option<&str>) -> Option<String> {
        match &self.user {
            Some(UserSource::Header(h)) => headers.value(h.as_str()).map(str::to_string),
            Some(UserSource::Query(q)) => query.and_then(|query| {
                form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| k == q)
                    .map(|(_, v)| v.into_owned())
            }),
            None => None,
        }
    }

    /// The trusted proxies.
    pub fn trusted(&self) -> &[IpNet] {
        &self.trusted
    }

    /// The client IP (see [`client_ip`]).
    pub fn ip<H: Headers + ?Sized>(&self, peer: IpAddr, headers: &H) -> IpAddr {
        client_ip(peer, headers, &self.trusted)
    }
}

impl spillway_tower::Identify<Body> for ProxyIdentify {
    fn identify(&self, req: &Request<Body>) -> Identity {
        let ip = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| self.ip(c.0.ip(), req.headers()).to_string());
        Identity {
            user: self.user(req.headers(), req.uri().query()),
            ip,
            ..Identity::default()
        }
    }
}

/// Forwards a request to the upstream and streams the answer back.
#[derive(Clone)]
pub struct Forward {
    client: Client<HttpConnector, Body>,
    upstream: Uri,
    timeout: Duration,
    trusted: Arc<[IpNet]>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl fmt::Debug for Forward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Forward")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

/// Headers that describe one connection, not the message: never forwarded.
pub(crate) const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove(header::TRANSFER_ENCODING);
}

/// The `X-Forwarded-For` to send upstream: from a trusted proxy, its chain
/// and the peer; from anyone else the peer alone (a direct client's own
/// header is dropped, not passed on). A hop that was not an address is
/// passed on as `unknown`, so the upstream sees where the chain broke.
pub(crate) fn forwarded_for<H: Headers + ?Sized>(
    peer: IpAddr,
    headers: &H,
    trusted: &[IpNet],
) -> String {
    if trusted.iter().any(|n| n.contains(peer)) {
        forwarded_chain(headers)
            .iter()
            .map(|hop| hop.map_or_else(|| "unknown".to_string(), |ip| ip.to_string()))
            .chain([peer.to_string()])
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        peer.to_string()
    }
}

/// The problem document of a proxy failure (502, 504).
pub(crate) fn problem_json(status: StatusCode, detail: &str) -> String {
    serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string()
}

/// The status and problem detail for an upstream that failed (502) or did
/// not answer within `timeout` (504), counted in `metrics` and logged (see
/// [`logged`]): one answer to a failure for both of the proxy's paths.
pub(crate) fn upstream_failure(
    metrics: &crate::metrics::Metrics,
    upstream: &Uri,
    timeout: Duration,
    failure: Failure,
) -> (StatusCode, String) {
    metrics.upstream_failed(matches!(failure, Failure::Timeout));
    match failure {
        Failure::Bad(e) => (
            StatusCode::BAD_GATEWAY,
            logged(format!("upstream {upstream} failed: {e}")),
        ),
        Failure::Timeout => (
            StatusCode::GATEWAY_TIMEOUT,
            logged(format!(
                "upstream {upstream} did not answer within {timeout:?}"
            )),
        ),
    }
}

/// Logs an upstream failure as a warning, at most one every
/// [`UPSTREAM_WARN_EVERY`] with the count of those not logged since: a
/// down upstream under load fails every request, and one line per request
/// would flood the log.
fn logged(detail: String) -> String {
    use std::sync::LazyLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);
    static NEXT_MS: AtomicU64 = AtomicU64::new(0);
    static QUIET: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(START.elapsed().as_millis()).unwrap_or(u64::MAX);
    let next = NEXT_MS.load(Ordering::Relaxed);
    let every = u64::try_from(UPSTREAM_WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
    if now >= next
        && NEXT_MS
            .compare_exchange(
                next,
                now.saturating_add(every),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    {
        match QUIET.swap(0, Ordering::Relaxed) {
            0 => tracing::warn!("{detail}"),
            n => tracing::warn!("{detail} ({n} more upstream failures since the last warning)"),
        }
    } else {
        QUIET.fetch_add(1, Ordering::Relaxed);
    }
    detail
}

/// At most one upstream-failure warning this often.
const UPSTREAM_WARN_EVERY: Duration = Duration::from_secs(10);

fn problem(status: StatusCode, detail: String) -> Response<Body> {
    let mut resp = Response::new(Body::from(problem_json(status, &detail)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

impl Forward {
    /// A forwarder to `upstream` (checked by [`parse_upstream`]), counting
    /// its 502 and 504 answers in `metrics`.
    pub fn new(
        upstream: Uri,
        timeout: Duration,
        trusted: Arc<[IpNet]>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Forward {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(10))));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Forward {
            client,
            upstream,
            timeout,
            trusted,
            metrics,
        }
    }

    fn target(&self, uri: &Uri) -> Result<Uri, String> {
        let base = self.upstream.path().trim_end_matches('/');
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut parts = self.upstream.clone().into_parts();
        parts.path_and_query = Some(
            format!("{base}{path_and_query}")
                .parse()
                .map_err(|e| format!("bad path: {e}"))?,
        );
        Uri::from_parts(parts).map_err(|e| e.to_string())
    }

    /// Forwards `req` (with its peer in a `ConnectInfo` extension) and
    /// returns the upstream's answer, or a 502 / 504 problem.
    pub(crate) async fn forward(self, mut req: Request<Body>) -> Response<Body> {
        // A reverse proxy forwards requests; it does not open tunnels.
        if req.method() == axum::http::Method::CONNECT {
            let mut resp = problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not proxied: this is a reverse proxy".to_string(),
            );
            resp.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
            return resp;
        }
        let target = match self.target(req.uri()) {
            Ok(t) => t,
            Err(e) => return problem(StatusCode::BAD_REQUEST, e),
        };
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        // An upgrade (a WebSocket, say) is asked for with hop-by-hop
        // headers, which are passed on for it; on a 101 the two sides are
        // joined (see `join_upgraded`).
        let upgrade = upgrade_asked(req.headers());
        let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
        let headers = req.headers_mut();
        strip_hop_by_hop(headers);
        keep_upgrade(headers, upgrade);
        if let Some(host) = headers.remove(header::HOST) {
            headers.insert("x-forwarded-host", host);
        }
        if let Some(peer) = peer {
            let chain = forwarded_for(peer, &*headers, &self.trusted);
            if let Ok(v) = HeaderValue::from_str(&chain) {
                headers.insert("x-forwarded-for", v);
            }
        }
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
        *req.uri_mut() = target;
        *req.version_mut() = axum::http::Version::HTTP_11;
        let failure = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(mut resp)) => {
                if let (StatusCode::SWITCHING_PROTOCOLS, Some(client_side)) =
                    (resp.status(), client_side)
                {
                    let upstream_side = hyper::upgrade::on(&mut resp);
                    tokio::spawn(join_upgraded(client_side, upstream_side));
                    let (mut parts, _) = resp.into_parts();
                    let switched = upgrade_asked(&parts.headers);
                    strip_hop_by_hop(&mut parts.headers);
                    keep_upgrade(&mut parts.headers, switched);
                    return Response::from_parts(parts, Body::empty());
                }
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                return Response::from_parts(
                    parts,
                    Body::new(IdleTimeout::new(body, self.timeout)),
                );
            }
            Ok(Err(e)) => Failure::Bad(e.to_string()),
            Err(_) => Failure::Timeout,
        };
        let (status, detail) =
            upstream_failure(&self.metrics, &self.upstream, self.timeout, failure);
        problem(status, detail)
    }
}

/// The `Upgrade` value of a message that asks for one (`Connection:
/// upgrade` and an `Upgrade` header).
fn upgrade_asked(h: &HeaderMap) -> Option<HeaderValue> {
    let asked = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
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

/// An upstream's response body that must keep coming: no wait for its next
/// frame may last longer than `timeout`, else the body ends in an error
/// and the client's connection is cut (its framing cannot be finished), as
/// the direct path's relay does. Without it, an upstream that sent its head
/// and then stalled would hold the client forever. Only waits count: a
/// slow client that leaves frames unread for a while is not the upstream's
/// stall.
struct IdleTimeout<B> {
    inner: B,
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// A wait for the next frame is under way (the deadline is set).
    waiting: bool,
}

impl<B> IdleTimeout<B> {
    fn new(inner: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
        }
    }
}

impl<B> hyper::body::Body for IdleTimeout<B>
where
    B: hyper::body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                if !this.waiting {
                    this.waiting = true;
                    let deadline = tokio::time::Instant::now() + this.timeout;
                    this.sleep.as_mut().reset(deadline);
                }
                this.poll_stall(cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl<B> IdleTimeout<B> {
    /// Pending until the wait's deadline, then the stall as an error.
    fn poll_stall(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::BoxError>>> {
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the upstream's body stalled for {:?}",
                self.timeout
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl tower::Service<Request<Body>> for Forward {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// Everything `serve_proxy` needs.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// The upstream.
    pub upstream: Uri,
    /// Where the user comes from.
    pub user: Option<UserSource>,
    /// Trusted proxies.
    pub trusted: Vec<IpNet>,
    /// Upstream timeout.
    pub timeout: Duration,
    /// Where to serve the HTTP API (metrics, health, status), if anywhere.
    pub admin: Option<SocketAddr>,
}

/// The proxy's router: every request goes through the rate limit layer to
/// the forwarder.
pub fn router(state: &Arc<AppState>, opts: &ProxyOptions) -> axum::Router {
    DirectProxy::new(state, opts).router()
}

/// The same proxy for the direct HTTP/1.1 path, which decides and answers
/// denials itself and hands admitted requests to the forwarder (what the
/// router's layer does, without building a request for a denial).
#[derive(Debug, Clone)]
pub(crate) struct DirectProxy {
    /// Rules, store (its limiter) and metrics.
    pub(crate) state: Arc<AppState>,
    pub(crate) identify: ProxyIdentify,
    /// For the router (the hyper path).
    pub(crate) forward: Forward,
    /// For the direct path.
    pub(crate) upstream: Arc<crate::upstream::Upstream>,
}

impl DirectProxy {
    pub(crate) fn new(state: &Arc<AppState>, opts: &ProxyOptions) -> DirectProxy {
        let trusted: Arc<[IpNet]> = opts.trusted.clone().into();
        DirectProxy {
            identify: ProxyIdentify {
                user: opts.user.clone(),
                trusted: trusted.clone(),
            },
            forward: Forward::new(
                opts.upstream.clone(),
                opts.timeout,
                trusted,
                state.metrics.clone(),
            ),
            upstream: Arc::new(crate::upstream::Upstream::new(
                &opts.upstream,
                opts.timeout,
                state.metrics.clone(),
            )),
            state: state.clone(),
        }
    }

    /// The router for the hyper path: the rate limit layer in front of the
    /// forwarder, sharing this proxy's identity rules and limiter.
    pub(crate) fn router(&self) -> axum::Router {
        let state = self.state.clone();
        let service = RateLimitLayer::new(self.state.limiter.clone(), self.identify.clone())
            .observe(move |checked, took| state.record(checked, took))
            .layer(self.forward.clone());
        axum::Router::new().fallback_service(service)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Headers holding `name: value` alone.
    fn one_header(name: impl header::IntoHeaderName, value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_static(value));
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses() {
        let n = IpNet::parse("10.0.0.0/8").unwrap();
        assert!(n.contains(ip("10.1.2.3")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.1")));
        assert!(IpNet::parse("::1").unwrap().contains(ip("::1")));
        assert!(IpNet::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(IpNet::parse("10.0.0.0/33").is_err());
        assert!(IpNet::parse("nope").is_err());
    }

    #[test]
    fn the_client_cannot_spoof_its_ip_and_proxies_are_peeled_from_the_right() {
        let trusted = [
            IpNet::parse("127.0.0.1/32").unwrap(),
            IpNet::parse("10.0.0.0/8").unwrap(),
        ];
        let h = one_header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2");
        // From a trusted proxy: rightmost untrusted address.
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &trusted), ip("203.0.113.9"));
        // From an untrusted peer: the header is ignored.
        assert_eq!(
            client_ip(ip("198.51.100.1"), &h, &trusted),
            ip("198.51.100.1")
        );
        // Forwarded works too.
        let f = one_header(
            header::FORWARDED,
            "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &f, &trusted), ip("2001:db8::1"));
        // Nothing untrusted: the leftmost.
        let all = one_header("x-forwarded-for", "10.0.0.5");
        assert_eq!(client_ip(ip("127.0.0.1"), &all, &trusted), ip("10.0.0.5"));
        // A dual-stack listener's IPv4 peer, directly and through a proxy.
        let none = HeaderMap::new();
        let mapped = ip("::ffff:198.51.100.1");
        assert_eq!(client_ip(mapped, &none, &trusted), ip("198.51.100.1"));
        let m = one_header("x-forwarded-for", "::ffff:6.6.6.6");
        assert_eq!(
            client_ip(ip("::ffff:127.0.0.1"), &m, &trusted),
            ip("6.6.6.6")
        );
    }

    /// An entry that is not an address stops the walk: what the client
    /// wrote to its left is not believed; the last trusted hop stands in.
    #[test]
    fn an_entry_that_is_not_an_address_is_not_skipped_over() {
        let trusted = [
            IpNet::parse("127.0.0.1/32").unwrap(),
            IpNet::parse("10.0.0.0/8").unwrap(),
        ];
        let xff = |v: &'static str| one_header("x-forwarded-for", v);
        let peer = ip("127.0.0.1");
        assert_eq!(client_ip(peer, &xff("6.6.6.6, unknown"), &trusted), peer);
        assert_eq!(
            client_ip(peer, &xff("6.6.6.6, garbage, 10.0.0.2"), &trusted),
            ip("10.0.0.2")
        );
        // Empty entries are no hops.
        assert_eq!(
            client_ip(peer, &xff("203.0.113.9, , 10.0.0.2,"), &trusted),
            ip("203.0.113.9")
        );
        let f = one_header(header::FORWARDED, "for=6.6.6.6, for=_hidden;proto=https");
        assert_eq!(client_ip(ip("10.0.0.1"), &f, &trusted), ip("10.0.0.1"));
        // An element without `for=` is no hop either.
        let g = one_header(
            header::FORWARDED,
            "for=203.0.113.9, proto=https;by=10.0.0.9",
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &g, &trusted), ip("203.0.113.9"));
    }
}
