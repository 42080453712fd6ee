//! The decision API on spillway-wire's direct path: `POST /v1/check`,
//! `POST /v1/charge` and `GET /v1/limit`, decided and answered into one buffer; everything else
//! goes to the axum router.

use std::net::SocketAddr;
use std::time::Instant;

use http::StatusCode;
use spillway_tower::render::{PROBLEM_JSON, Problem};
use spillway_wire::head::RequestHead;
use spillway_wire::{ClientConn, Handler, Message, write};

use super::{ApiError, Ask, MAX_BODY, check_json, check_query, decision_json};
use crate::{Routed, Shared};

/// A request the direct path answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/check`.
    Check,
    /// `POST /v1/charge`.
    Charge,
    /// `GET /v1/limit`, with its query string.
    Limit(String),
    /// `forward_auth.path` (any method, and anything under it).
    ForwardAuth,
}

/// The decision API's direct path, with the router for the rest.
#[derive(Debug)]
pub struct DirectApi {
    shared: Shared,
    router: axum::Router,
    forward_auth: std::sync::Arc<super::forward_auth::ForwardAuth>,
}

impl DirectApi {
    /// The direct path of the API deciding with `shared`, and of
    /// `forward_auth`; `router` serves every other request.
    pub fn new(
        shared: Shared,
        router: axum::Router,
        forward_auth: std::sync::Arc<super::forward_auth::ForwardAuth>,
    ) -> DirectApi {
        DirectApi {
            shared,
            router,
            forward_auth,
        }
    }

    async fn answer(
        &self,
        route: Route,
        msg: Message<'_>,
        conn: &mut ClientConn<'_>,
        out: &mut Vec<u8>,
    ) -> bool {
        let started = Instant::now();
        let ask = if route == Route::Charge {
            Ask::Charge
        } else {
            Ask::Check
        };
        let query = match route {
            Route::ForwardAuth => {
                let head = &msg.head;
                let headers: &[httparse::Header<'_>] = head.headers;
                let answer = self
                    .forward_auth
                    .decide(head.method, head.target, headers, msg.peer.ip())
                    .await;
                self.forward_auth
                    .write(&answer, out, msg.close, msg.is_head());
                return conn.write_all(out).await;
            }
            Route::Check | Route::Charge => None,
            Route::Limit(q) => Some(q),
        };
        // `api.tokens`: the same check as the axum routes' layer (one
        // atomic load while none is set).
        let refused = self.shared.api_tokens.any().then(|| {
            let auth = msg
                .head
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                .map(|h| h.value);
            self.shared.api_tokens.admit(auth, ask == Ask::Charge)
        });
        if let Some(Err(r)) = refused {
            r.write_http1(out, msg.close, false);
            return conn.write_all(out).await;
        }
        // Off: one check of an `Option`, no clock read, nothing allocated.
        let span = match &self.shared.tracer {
            None => None,
            Some(t) => {
                let headers: &[httparse::Header<'_>] = msg.head.headers;
                let name = match (&query, ask) {
                    (Some(_), _) => super::SPAN_LIMIT,
                    (None, Ask::Charge) => super::SPAN_CHARGE,
                    (None, Ask::Check) => super::SPAN_CHECK,
                };
                t.span(name, headers)
            }
        };
        let result = match query {
            None => check_json(&self.shared, msg.body, started, ask, span).await,
            Some(q) => check_query(&self.shared, &q, started, span).await,
        };
        let close = msg.close;
        match result {
            Ok(checked) => {
                let (status, json) = decision_json(&checked, ask);
                write::answer(out, status, "application/json", &json, close, false, |o| {
                    spillway_tower::render::push_rate_limit_headers(&checked, o);
                });
            }
            Err(e) => write_problem(out, &e, close),
        }
        conn.write_all(out).await
    }
}

fn write_problem(out: &mut Vec<u8>, e: &ApiError, close: bool) {
    let p: Problem<'_> = e.problem();
    let json = p.to_json();
    write::answer(
        out,
        p.status,
        PROBLEM_JSON,
        json.as_bytes(),
        close,
        false,
        |_| {},
    );
}

impl Handler for DirectApi {
    type Route = Route;
    type Body = axum::body::Body;
    type Fallback = Routed;

    fn max_body(&self) -> usize {
        MAX_BODY
    }

    fn route(&self, head: &RequestHead<'_, '_>) -> Option<Route> {
        if self.forward_auth.matches(head.target) {
            return Some(Route::ForwardAuth);
        }
        match (head.method, head.target) {
            ("POST", "/v1/check") => Some(Route::Check),
            ("POST", "/v1/charge") => Some(Route::Charge),
            ("GET", t) => match t.strip_prefix("/v1/limit") {
                Some("") => Some(Route::Limit(String::new())),
                Some(q) if q.starts_with('?') => Some(Route::Limit(q[1..].to_string())),
                _ => None,
            },
            _ => None,
        }
    }

    fn serve<'a>(
        &'a self,
        route: Route,
        msg: Message<'a>,
        conn: &'a mut ClientConn<'_>,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = bool> + Send + 'a {
        self.answer(route, msg, conn, out)
    }

    fn refuse(&self, status: StatusCode, detail: &str, out: &mut Vec<u8>) {
        write_problem(out, &ApiError::new(status, detail), true);
    }

    fn fallback(&self, peer: SocketAddr) -> Routed {
        Routed::new(self.router.clone(), peer)
    }
}
