//! The decision step of the ways in that see the client's own request
//! (the reverse proxy and forward-auth), written once: who the request
//! comes from, refused when what names it cannot be read, then the
//! limiter's answer under every rule. Each way in only reads its request
//! (a proxied one, or the one a gateway forwards) and renders the answer.

use std::net::IpAddr;

use spillway_store::Request;
use spillway_tower::Admission;
use spillway_wire::Headers;

use crate::Shared;
use crate::identity::{Attrs, Identify, Unreadable, Who, readable_key_headers};
use crate::trace::Forward;

/// Who a request from `peer` comes from (see [`Identify::who`]), with
/// every header a rule is keyed by readable.
///
/// # Errors
/// The user, the client's address or a keyed header cannot be read; the
/// request counts as a bad one in the metrics and must be refused.
pub fn identify<H: Headers + ?Sized>(
    shared: &Shared,
    identify: &Identify,
    peer: IpAddr,
    headers: &H,
    query: Option<&str>,
    real_ip: bool,
) -> Result<Who, Unreadable> {
    let who = identify
        .who(peer, headers, query, real_ip)
        .and_then(|who| readable_key_headers(&shared.limiter, headers).map(|()| who));
    if who.is_err() {
        shared.events.bad_request();
    }
    who
}

/// Decides `method` `path` from `who` at `cost`, counting the decision in
/// the metrics (and waiting a shaper's turn). `host`, when given, is what
/// `by: header:host` reads (forward-auth's original host). With traces
/// on, the decision is a span named `span` (a child of the caller's, from
/// its `traceparent` in `headers`), and what the proxy sends upstream to
/// continue the trace comes back with the admission.
#[allow(clippy::too_many_arguments)]
pub async fn decide<H: Headers + Sync + ?Sized>(
    shared: &Shared,
    span: &'static str,
    method: &str,
    path: &str,
    who: &Who,
    host: Option<&str>,
    headers: &H,
    cost: u64,
) -> (Admission, Option<Forward>) {
    // Off: one check of an `Option`; the decision is the untraced one,
    // and the traced one's state is behind a pointer.
    if let Some(t) = &shared.tracer {
        let traced = traced(t, shared, span, method, path, who, host, headers, cost);
        return Box::pin(traced).await;
    }
    let attrs = attrs(who, host, headers);
    let request = Request {
        method: Some(method),
        path: Some(path),
        attrs: &attrs,
        cost,
    };
    let events = &shared.events;
    let admission = spillway_tower::admit(&shared.limiter, &request, |c, took| {
        events.decided(c, took);
    })
    .await;
    (admission, None)
}

/// [`decide`] with traces on: the decision a span, when sampled.
#[allow(clippy::too_many_arguments)]
async fn traced<H: Headers + Sync + ?Sized>(
    tracer: &crate::trace::Tracer,
    shared: &Shared,
    span: &'static str,
    method: &str,
    path: &str,
    who: &Who,
    host: Option<&str>,
    headers: &H,
    cost: u64,
) -> (Admission, Option<Forward>) {
    let attrs = attrs(who, host, headers);
    let request = Request {
        method: Some(method),
        path: Some(path),
        attrs: &attrs,
        cost,
    };
    let events = &shared.events;
    let span = tracer.span(span, headers);
    let mut store_took = std::time::Duration::ZERO;
    let admission = spillway_tower::admit(&shared.limiter, &request, |c, took| {
        events.decided(c, took);
        store_took = took;
    })
    .await;
    let forward = span.map(|span| {
        let forward = span.forward();
        let (Admission::Admitted(c) | Admission::Denied(c)) = &admission;
        tracer.finish_checked(span, c, cost, store_took);
        forward
    });
    (admission, forward)
}

/// `who`, `host` and `headers` as the rules read them.
pub(crate) fn attrs<'a, H: ?Sized>(
    who: &'a Who,
    host: Option<&'a str>,
    headers: &'a H,
) -> Attrs<'a, H> {
    Attrs {
        user: who.user.as_deref(),
        ip: who.ip.as_str(),
        host,
        headers,
    }
}
