//! The proxy's direct transport: plain HTTP/1.1 requests on
//! spillway-wire's direct path, forwarded on its pooled client. It calls
//! [`Proxy`]'s phases and only moves bytes.

use std::net::SocketAddr;
use std::sync::Arc;

use http::StatusCode;
use spillway_store::Checked;
use spillway_tower::Admission;
use spillway_tower::render::{PROBLEM_JSON, Problem};
use spillway_wire::client::{Outgoing, Upstream};
use spillway_wire::head::RequestHead;
use spillway_wire::{ClientConn, Handler, Message, write};

use super::{Proxy, Refused, ours};
use crate::Routed;

/// Largest request body the direct path buffers (larger ones stream
/// through hyper).
const MAX_DIRECT_BODY: usize = 64 * 1024;

/// The proxy on the direct path, with the hyper path's router for the
/// rest.
#[derive(Debug)]
pub struct DirectProxy {
    proxy: Arc<Proxy>,
    client: Arc<Upstream>,
    router: axum::Router,
}

impl DirectProxy {
    /// The direct transport of `proxy`; `router` serves what it does not take.
    pub fn new(proxy: Arc<Proxy>, router: axum::Router) -> DirectProxy {
        let client = proxy.connections().clone();
        DirectProxy {
            proxy,
            client,
            router,
        }
    }

    /// Writes the proxy's own answer (a refusal, a denial, a failure, a
    /// 503 of the in-flight limit with its `Retry-After` seconds).
    fn own_answer(
        out: &mut Vec<u8>,
        problem: &Problem<'_>,
        checked: Option<&Checked>,
        close: bool,
        head_request: bool,
        retry: Option<u64>,
    ) {
        thread_local! {
            /// The body, rendered once per answer into a reused buffer.
            static JSON: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        JSON.with_borrow_mut(|json| {
            json.clear();
            problem.write_json(json);
            write::answer(
                out,
                problem.status,
                PROBLEM_JSON,
                json.as_bytes(),
                close,
                head_request,
                |o| {
                    if let Some(c) = checked {
                        spillway_tower::render::push_rate_limit_headers(c, o);
                    }
                    if problem.status == StatusCode::METHOD_NOT_ALLOWED {
                        write::header(o, "allow", b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
                    }
                    if let Some(r) = retry {
                        write::header(o, "retry-after", itoa::Buffer::new().format(r).as_bytes());
                    }
                },
            );
        });
    }

    async fn forward(
        &self,
        msg: Message<'_>,
        conn: &mut ClientConn<'_>,
        out: &mut Vec<u8>,
    ) -> bool {
        let head = &msg.head;
        let headers: &[httparse::Header<'_>] = head.headers;
        let close = msg.close;
        let is_head = msg.is_head();
        let who = match self
            .proxy
            .check(head.method, head.target, headers, msg.peer.ip())
        {
            Ok(w) => w,
            Err(Refused::Invalid(p)) => {
                Self::own_answer(out, &p, None, true, is_head, None);
                conn.write_all(out).await;
                return false;
            }
        };
        let decide_and_send = async {
            let (admission, trace) = self
                .proxy
                .admit(head.method, head.path(), &who, headers)
                .await;
            let checked = match admission {
                Admission::Denied(c) => return (c, Step::Denied),
                Admission::Admitted(c) => c,
            };
            let turn = match self.proxy.turn(&checked, &who).await {
                Ok(t) => t,
                Err((problem, retry)) => return (checked, Step::Shed(problem, retry)),
            };
            // Only an admitted request needs its forwarding headers.
            let mut add = Vec::with_capacity(128);
            let dropped =
                self.proxy
                    .forwarding(msg.peer.ip(), headers, trace.as_ref(), |name, value| {
                        write::header(&mut add, name, value.as_bytes());
                    });
            let outgoing = Outgoing {
                method: head.method,
                target: head.target,
                headers,
                drop: dropped,
                add: &add,
                body: msg.body,
                drop_response: if ours(&checked) {
                    &DECISION_HEADER_NAMES
                } else {
                    &[]
                },
                group: &|| self.proxy.group(&who),
            };
            let _due = spillway_store::due::Awaiting::new();
            let sent = self.client.send(&outgoing).await;
            (checked, Step::Sent(sent, turn))
        };
        // Watch for the client leaving while the request waits its turn or
        // the upstream thinks: dropping the future leaves the queue.
        tokio::pin!(decide_and_send);
        // Biased: a decision the store makes at once (every denial on the
        // memory store) is answered without first asking the socket
        // whether the client left.
        let (checked, sent) = tokio::select! {
            biased;
            r = &mut decide_and_send => r,
            gone = conn.gone() => {
                if gone {
                    return false;
                }
                // A pipelined request: nothing to watch for any more.
                decide_and_send.await
            }
        };
        let (sent, turn) = match sent {
            Step::Denied => {
                Self::own_answer(
                    out,
                    &Problem::too_many_requests(&checked),
                    Some(&checked),
                    close,
                    is_head,
                    None,
                );
                return conn.write_all(out).await && !close;
            }
            Step::Shed(problem, retry) => {
                Self::own_answer(out, &problem, Some(&checked), close, is_head, Some(retry));
                return conn.write_all(out).await && !close;
            }
            Step::Sent(sent, turn) => (sent, turn),
        };
        match sent {
            Ok(resp) => {
                let ok = resp.code < 500;
                let head = turn.mark();
                out.extend_from_slice(&resp.head);
                spillway_tower::render::push_rate_limit_headers(&checked, out);
                let close = close || resp.close_client;
                if close {
                    out.extend_from_slice(b"connection: close\r\n");
                }
                out.extend_from_slice(b"\r\n");
                // In flight until the body is relayed; the latency is the
                // upstream's, to the head (a slow client's download is not).
                let kept = self.client.relay(resp, conn, out).await && !close;
                self.proxy.answered(turn, ok, head);
                kept
            }
            Err(f) => {
                let head = turn.mark();
                self.proxy.answered(turn, false, head);
                let problem = self.proxy.failure(f.into());
                // A 503 (every upstream connection busy): try again soon.
                let retry = (problem.status == StatusCode::SERVICE_UNAVAILABLE).then_some(1);
                Self::own_answer(out, &problem, Some(&checked), close, is_head, retry);
                conn.write_all(out).await && !close
            }
        }
    }
}

/// Where an admitted request's trip ended.
enum Step {
    /// A rule denied it.
    Denied,
    /// The in-flight limit shed it: the 503 and its `Retry-After`.
    Shed(Problem<'static>, u64),
    /// Sent upstream, in its turn.
    Sent(
        Result<spillway_wire::client::Response, spillway_wire::client::Failure>,
        super::Turn,
    ),
}

/// The names of the headers a decision adds, which replace the upstream's.
const DECISION_HEADER_NAMES: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "spillway-zone",
];

impl Handler for DirectProxy {
    type Route = ();
    type Body = axum::body::Body;
    type Fallback = Routed;

    fn max_body(&self) -> usize {
        MAX_DIRECT_BODY
    }

    fn route(&self, _head: &RequestHead<'_, '_>) -> Option<()> {
        // A rule that reads its cost from the answer (a header, or a
        // trailer after a streamed body) is served on the hyper path,
        // which settles it.
        (!self.proxy.reads_costs()).then_some(())
    }

    fn serve<'a>(
        &'a self,
        (): (),
        msg: Message<'a>,
        conn: &'a mut ClientConn<'_>,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = bool> + Send + 'a {
        self.forward(msg, conn, out)
    }

    fn refuse(&self, status: StatusCode, detail: &str, out: &mut Vec<u8>) {
        Self::own_answer(out, &Problem::new(status, detail), None, true, false, None);
    }

    fn fallback(&self, peer: SocketAddr) -> Routed {
        Routed::new(self.router.clone(), peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replaced_headers_are_the_ones_a_decision_adds() {
        let headers = spillway_tower::render::DECISION_HEADERS;
        let names: Vec<&str> = headers.iter().map(|n| n.as_str()).collect();
        assert_eq!(names, DECISION_HEADER_NAMES);
    }
}
