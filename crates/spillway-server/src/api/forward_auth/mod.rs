//! Forward-auth: the way in of the gateways teams already run (nginx
//! `auth_request`, Traefik `forwardAuth`, Caddy `forward_auth`, HAProxy,
//! Envoy `ext_authz`). Before passing a request on, the gateway asks
//! `forward_auth.path` (any method); the request decided is the
//! gateway's client request ([`original`]), under every rule as the
//! reverse proxy applies them, at a cost of 1. The answer is one a
//! gateway uses as it is: `200` and an empty body when admitted, with the
//! `RateLimit` headers to copy; `deny_status` with `Retry-After`, the same
//! headers and a problem document when not.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use spillway_store::Checked;
use spillway_tower::Admission;
use spillway_tower::render::{PROBLEM_JSON, Problem, insert_rate_limit_headers};
use spillway_wire::{Headers, Sole};

use crate::Shared;
use crate::credentials::Refusal;
use crate::identity::{IpNet, UserSource};

pub mod original;

/// The default `forward_auth.path`.
pub const DEFAULT_PATH: &str = "/v1/forward-auth";

/// The header a gateway's auth call carries `api.tokens`' token in (the
/// client's own `Authorization` is the upstream's business, and gateways
/// copy it onto the call).
pub const TOKEN_HEADER: &str = "spillway-authorization";

/// `forward_auth:` of the rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The endpoint; what follows it in a call's target is the request's
    /// path (Envoy's `path_prefix`).
    pub path: String,
    /// Gateways whose forwarded headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Where the user is read: a header of the call, or a query parameter
    /// of the original request.
    pub user: Option<UserSource>,
    /// The status of a denial (and of a request refused as malformed when
    /// it is 401 or 403, which is all nginx's `auth_request` passes on).
    pub deny_status: StatusCode,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            path: DEFAULT_PATH.to_string(),
            trusted_proxies: Vec::new(),
            user: None,
            deny_status: StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

/// The endpoint, with what it decides with.
#[derive(Debug)]
pub struct ForwardAuth {
    shared: Shared,
    settings: Settings,
    /// The user's source, as the proxy reads it.
    identify: crate::identity::Identify,
    /// When an untrusted peer's forwarding headers were last logged, in
    /// seconds since `started` (at most one line a minute).
    warned: AtomicU64,
    started: Instant,
}

/// What a call is answered.
#[derive(Debug)]
pub enum Answer {
    /// Admitted: `200`, the decision's headers.
    Admitted(Checked),
    /// Denied: `deny_status`, `Retry-After`, the decision's headers.
    Denied(Checked),
    /// Not decided: the call's token, or a value that names what is
    /// limited and cannot be read; written as every credential refusal is
    /// ([`crate::credentials::refusal_answer`]).
    Refused(Refusal),
}

impl ForwardAuth {
    /// The endpoint deciding with `shared` under `settings`.
    pub fn new(shared: Shared, settings: Settings) -> ForwardAuth {
        ForwardAuth {
            shared,
            identify: crate::identity::Identify {
                user: settings.user.clone(),
                trusted: settings.trusted_proxies.clone(),
            },
            settings,
            warned: AtomicU64::new(u64::MAX),
            started: Instant::now(),
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Whether a call to `target` (a path, with or without its query) is
    /// one for this endpoint: its path, or its path and more (`/`, a query).
    pub fn matches(&self, target: &str) -> bool {
        target
            .strip_prefix(self.settings.path.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?']))
    }

    /// Decides the request a call of `method` to `target` from `peer` asks
    /// about.
    pub async fn decide<H: Headers + Sync + ?Sized>(
        &self,
        method: &str,
        target: &str,
        headers: &H,
        peer: IpAddr,
    ) -> Answer {
        if self.shared.api_tokens.any() {
            let token = match headers.sole(TOKEN_HEADER) {
                Sole::One(v) => Some(v),
                Sole::Missing | Sole::Many => None,
            };
            if let Err(r) = self.shared.api_tokens.admit(token, false) {
                return Answer::Refused(Refusal {
                    detail: format!("{} (forward-auth reads it from {TOKEN_HEADER})", r.detail),
                    ..r
                });
            }
        }
        let s = &self.settings;
        if !s.trusted_proxies.iter().any(|n| n.contains(peer)) {
            self.warn_untrusted(peer, headers);
        }
        let refuse = |u: crate::identity::Unreadable| {
            let status = match s.deny_status.as_u16() {
                401 | 403 => s.deny_status,
                _ => StatusCode::BAD_REQUEST,
            };
            Answer::Refused(Refusal {
                status,
                detail: u.to_string(),
                challenge: None,
            })
        };
        let o = match original::read(method, target, &s.path, headers, peer, &s.trusted_proxies) {
            Ok(o) => o,
            Err(u) => {
                self.shared.events.bad_request();
                return refuse(u);
            }
        };
        let who = match crate::decide::identify(
            &self.shared,
            &self.identify,
            peer,
            headers,
            o.query(),
            true,
        ) {
            Ok(who) => who,
            Err(u) => return refuse(u),
        };
        let span = "spillway.forward_auth";
        let (admission, _) = crate::decide::decide(
            &self.shared,
            span,
            o.method,
            o.path(),
            &who,
            o.host,
            headers,
            1,
        )
        .await;
        match admission {
            Admission::Admitted(c) => Answer::Admitted(c),
            Admission::Denied(c) => Answer::Denied(c),
        }
    }

    /// Logs, at most once a minute, a call from a peer outside
    /// `trusted_proxies` that carries forwarding headers: they were not
    /// read, which is the safe reading and a likely misconfiguration.
    fn warn_untrusted<H: Headers + ?Sized>(&self, peer: IpAddr, headers: &H) {
        const FORWARDING: [&str; 6] = [
            "x-forwarded-uri",
            "x-original-uri",
            "x-original-url",
            "x-forwarded-method",
            "x-forwarded-for",
            "forwarded",
        ];
        if !FORWARDING.iter().any(|n| headers.value(n).is_some()) {
            return;
        }
        let now = self.started.elapsed().as_secs();
        let last = self.warned.load(Ordering::Relaxed);
        if (last == u64::MAX || now >= last.saturating_add(60))
            && self
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                %peer,
                "forward-auth: a call from {peer}, which is not in forward_auth.trusted_proxies, \
                 carries forwarding headers; they are not read (the call is decided as its own \
                 request from {peer})"
            );
        }
    }

    /// The answer's status and problem (none when admitted).
    pub fn status(&self, answer: &Answer) -> StatusCode {
        match answer {
            Answer::Admitted(_) => StatusCode::OK,
            Answer::Denied(_) => self.settings.deny_status,
            Answer::Refused(r) => r.status,
        }
    }

    /// What a decided `answer` carries, for either writer: the status,
    /// the body (none when admitted) and the decision's headers; a
    /// refusal is written as every credential refusal is.
    fn render<'a>(&self, answer: &'a Answer) -> Result<Rendered<'a>, &'a Refusal> {
        let status = self.status(answer);
        match answer {
            Answer::Admitted(c) => Ok(Rendered {
                status,
                body: String::new(),
                checked: c,
            }),
            Answer::Denied(c) => {
                let mut p = Problem::too_many_requests(c);
                p.status = status;
                Ok(Rendered {
                    status,
                    body: p.to_json(),
                    checked: c,
                })
            }
            Answer::Refused(r) => Err(r),
        }
    }

    /// `answer` written as HTTP/1.1 for the direct path.
    pub fn write(&self, answer: &Answer, out: &mut Vec<u8>, close: bool, head_request: bool) {
        use spillway_wire::write;
        let r = match self.render(answer) {
            Ok(r) => r,
            Err(refusal) => return refusal.write_http1(out, close, head_request),
        };
        let content_type = if r.body.is_empty() {
            "text/plain"
        } else {
            PROBLEM_JSON
        };
        write::answer(
            out,
            r.status,
            content_type,
            r.body.as_bytes(),
            close,
            head_request,
            |o| spillway_tower::render::push_rate_limit_headers(r.checked, o),
        );
    }

    /// `answer` as a response for the axum routes (HTTP/2, TLS).
    pub fn response(&self, answer: &Answer, head_request: bool) -> Response {
        let r = match self.render(answer) {
            Ok(r) => r,
            Err(refusal) => return crate::credentials::refusal_answer(refusal).into_response(),
        };
        let problem = !r.body.is_empty();
        let len = r.body.len();
        let mut resp = if head_request {
            (r.status, Body::empty()).into_response()
        } else {
            (r.status, r.body).into_response()
        };
        let h = resp.headers_mut();
        if problem {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        } else {
            h.remove(header::CONTENT_TYPE);
        }
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        insert_rate_limit_headers(r.checked, h);
        resp
    }
}

/// A decided answer as both writers put it on the wire.
struct Rendered<'a> {
    status: StatusCode,
    /// A problem document; empty when admitted.
    body: String,
    checked: &'a Checked,
}

/// The endpoint on the axum side of the decision listener (HTTP/2, TLS),
/// as a layer ahead of the routes: a call to it is answered here, any
/// other request goes on (its path compared, nothing copied).
pub async fn ahead(
    axum::extract::State(fa): axum::extract::State<std::sync::Arc<ForwardAuth>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    if !fa.matches(req.uri().path()) {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let (parts, _body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let answer = fa
        .decide(parts.method.as_str(), target, &parts.headers, peer)
        .await;
    fa.response(&answer, parts.method == http::Method::HEAD)
}
