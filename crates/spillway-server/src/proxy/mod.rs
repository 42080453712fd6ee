//! `spillway proxy`: a reverse proxy that decides for every request and
//! forwards the admitted ones to the upstream.
//!
//! The proxy's policy is written once, as the phases of [`Proxy`], and both
//! transports call them in the same order:
//!
//! 1. [`Proxy::check`]: requests a reverse proxy refuses (CONNECT, a
//!    missing, repeated or invalid `Host`, a target that is not a path, a
//!    user field sent twice) get 400 / 405; an absolute-form target is
//!    first made the origin-form one it stands for ([`absolute_form`]);
//! 2. [`Proxy::admit`]: decide (spillway-tower's transport-neutral
//!    [`admit`](spillway_tower::admit): deny, or wait a shaper's turn);
//! 3. [`Proxy::forwarding`]: the forwarding headers sent upstream, and the
//!    client headers that never go there;
//! 4. response headers: the decision's rate limit headers replace the
//!    upstream's ([`DECISION_HEADERS`](spillway_tower::render::DECISION_HEADERS));
//! 5. [`Proxy::failure`]: an upstream that failed or timed out is a 502 /
//!    504 with a generic detail; the address and OS error go to the log.
//!
//! The transports only move bytes: [`direct`] (plain HTTP/1.1 on
//! spillway-wire's direct path and its pooled client) and [`hyper`]
//! (everything else: HTTP/2, streaming and chunked bodies, upgrades).

pub mod concurrency;
pub mod direct;
pub mod hyper;
pub use crate::identity;
mod settings;
mod target;
pub mod upstream_health;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use spillway_store::{Checked, Request};
use spillway_tower::Admission;
use spillway_tower::render::Problem;
use spillway_wire::{Headers, Sole};

pub use concurrency::{ConcurrencySettings, LimitKind};
pub use identity::{IpNet, UserSource};
pub use settings::{MOST_BUFFERED, Settings, UpstreamUrl, default_upstream_connections};
pub use target::absolute_form;
use target::valid_host;

use crate::Shared;
use crate::health::HealthSettings;
pub use crate::trace::Forward;

/// Request headers a client never passes to the upstream: the proxy
/// writes its own forwarding headers, and only a trusted proxy's
/// `Forwarded` and `X-Real-IP` are believed.
const FROM_ANYONE: [&str; 5] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
];
const FROM_TRUSTED: [&str; 3] = ["x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"];
/// With a traced decision the client's `traceparent` is replaced by one
/// naming spillway's span; its `tracestate` goes on with it, unless the
/// client's `traceparent` could not be read (a new trace: the state
/// belongs to none).
const FROM_ANYONE_TRACED: [&str; 6] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
    "traceparent",
];
const FROM_ANYONE_NEW_TRACE: [&str; 7] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
    "x-real-ip",
    "traceparent",
    "tracestate",
];
const FROM_TRUSTED_TRACED: [&str; 4] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "traceparent",
];
const FROM_TRUSTED_NEW_TRACE: [&str; 5] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "traceparent",
    "tracestate",
];

/// Why the proxy itself answered instead of forwarding.
#[derive(Debug)]
pub enum Refused {
    /// 400, 405: see [`Proxy::check`].
    Invalid(Problem<'static>),
}

pub use crate::identity::Who;

/// The proxy's policy, shared by both transports.
#[derive(Debug)]
pub struct Proxy {
    shared: Shared,
    identify: identity::Identify,
    upstream: UpstreamUrl,
    timeout: Duration,
    /// `proxy.buffer_body`.
    buffer_body: usize,
    upgrades: Vec<String>,
    failures: FailureLog,
    /// The upstream's connections, bounded, shared by both transports.
    connections: Arc<spillway_wire::client::Upstream>,
    /// The in-flight limit to the upstream, if set.
    concurrency: Option<Arc<concurrency::Concurrency>>,
    /// Names a client's network for the in-flight limit's fair share and
    /// the upstream connections' turns.
    clients: concurrency::Clients,
    /// Latency and errors of upstream calls, over `measure.window`.
    stats: upstream_health::UpstreamStats,
    measure: HealthSettings,
    /// Whether anything reads the measurements (health targets or an
    /// in-flight limit): if not, no clock is read per request.
    measuring: bool,
}

/// An admitted request's turn at the upstream: its in-flight slot (when
/// a limit is set) and when it was sent.
#[derive(Debug)]
pub struct Turn {
    permit: Option<concurrency::Permit>,
    /// When it was sent, if the proxy measures its upstream.
    sent: Option<Instant>,
}

impl Turn {
    /// Now, if the proxy measures its upstream (what
    /// [`Proxy::answered`] takes as the answer's time); else nothing, and
    /// no clock is read.
    pub fn mark(&self) -> Option<Instant> {
        self.sent.map(|_| Instant::now())
    }
}

/// An upstream failure, seen by either transport.
#[derive(Debug)]
pub enum Failure {
    /// Could not connect, the connection broke, or the answer could not be
    /// read (502); the text is for the log.
    Bad(String),
    /// No answer within the timeout (504).
    Timeout,
    /// Every one of the upstream's `max_connections` stayed in use for the
    /// timeout (503).
    Busy,
}

impl From<spillway_wire::client::Failure> for Failure {
    fn from(f: spillway_wire::client::Failure) -> Failure {
        match f {
            spillway_wire::client::Failure::Bad(e) => Failure::Bad(e),
            spillway_wire::client::Failure::Timeout => Failure::Timeout,
            spillway_wire::client::Failure::Busy => Failure::Busy,
        }
    }
}
impl Proxy {
    /// The proxy for `settings`, whose upstream is `upstream`, measuring
    /// its upstream's health as `measure` says, its clients served as
    /// `limits` (the `server:` section) says: the upstream connections
    /// default to a quarter of its connection budget, and clients are
    /// grouped by its networks.
    pub fn new(
        shared: Shared,
        settings: &Settings,
        upstream: UpstreamUrl,
        measure: HealthSettings,
        limits: &spillway_wire::Limits,
    ) -> Proxy {
        let concurrency = settings
            .concurrency
            .map(|c| concurrency::Concurrency::new(c, &measure));
        let connections = Arc::new(spillway_wire::client::Upstream::new(
            upstream.authority().to_string(),
            upstream.base().to_string(),
            settings.timeout,
            settings
                .max_connections
                .unwrap_or_else(|| default_upstream_connections(limits.max_connections)),
        ));
        Proxy {
            connections,
            clients: concurrency::Clients::new(limits.ipv4_prefix, limits.ipv6_prefix),
            measuring: concurrency.is_some()
                || measure.latency_target.is_some()
                || measure.errors_max.is_some(),
            concurrency,
            stats: upstream_health::UpstreamStats::new(measure.window),
            measure,
            shared,
            identify: identity::Identify {
                user: settings.user.clone(),
                trusted: settings.trusted_proxies.clone(),
            },
            upstream,
            timeout: settings.timeout,
            buffer_body: settings.buffer_body,
            upgrades: settings
                .upgrades
                .iter()
                .map(|u| u.to_ascii_lowercase())
                .filter(|u| u != "h2c")
                .collect(),
            failures: FailureLog::default(),
        }
    }

    /// The upstream.
    pub fn upstream(&self) -> &UpstreamUrl {
        &self.upstream
    }

    /// The upstream timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Request bodies up to this many bytes are read whole before the
    /// request's turn at the upstream (`proxy.buffer_body`).
    pub fn buffer_body(&self) -> usize {
        self.buffer_body
    }

    /// A request body that did not arrive within the timeout while the
    /// proxy read it: 408, the client's slowness.
    pub fn slow_body(&self) -> Problem<'static> {
        self.shared.events.bad_request();
        Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        )
    }

    /// The upstream's connections, bounded (`proxy.upstream.max_connections`),
    /// for both transports.
    pub fn connections(&self) -> &Arc<spillway_wire::client::Upstream> {
        &self.connections
    }

    /// Phase 1: what a reverse proxy refuses, and who the client is.
    ///
    /// # Errors
    /// CONNECT (405); a missing, repeated or invalid `Host`, a target that
    /// is not a path (400); the user field sent twice (400).
    pub fn check<H: Headers + ?Sized>(
        &self,
        method: &str,
        target: &str,
        headers: &H,
        peer: IpAddr,
    ) -> Result<Who, Refused> {
        let bad = |detail: String| {
            self.shared.events.bad_request();
            Refused::Invalid(Problem::new(StatusCode::BAD_REQUEST, detail))
        };
        if method.eq_ignore_ascii_case("CONNECT") {
            return Err(Refused::Invalid(Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not proxied: this is a reverse proxy",
            )));
        }
        if !target.starts_with('/') {
            return Err(bad("the request target must be a path (origin-form)".into()));
        }
        match headers.sole("host") {
            Sole::One(h) if valid_host(h) => {}
            Sole::One(_) => return Err(bad("the Host header is not a valid host".into())),
            Sole::Missing => return Err(bad("a Host header is required".into())),
            Sole::Many => return Err(bad("the Host header is sent more than once".into())),
        }
        let query = target.split_once('?').map(|(_, q)| q);
        crate::decide::identify(&self.shared, &self.identify, peer, headers, query, false)
            .map_err(|u| Refused::Invalid(Problem::new(StatusCode::BAD_REQUEST, u.to_string())))
    }

    /// Phase 2: decides the request (and waits a shaper's turn), counting
    /// the decision in the metrics; with traces on, the decision's span
    /// continues the client's trace, and the upstream gets it as its
    /// parent (see [`forwarding`](Self::forwarding)).
    pub async fn admit<H: Headers + Sync + ?Sized>(
        &self,
        method: &str,
        path: &str,
        who: &Who,
        headers: &H,
    ) -> (Admission, Option<Forward>) {
        let span = "spillway.proxy";
        crate::decide::decide(&self.shared, span, method, path, who, None, headers, 1).await
    }

    /// Phase 2b: the admitted request's turn at the upstream. With an
    /// in-flight limit it waits for a slot (more important requests
    /// first, then the client address holding the fewest slots, see
    /// [`concurrency`]); a request shed (the queue full, or its wait
    /// over) gets a 503 and the seconds to wait.
    ///
    /// # Errors
    /// The 503 and its `Retry-After` seconds.
    pub async fn turn(
        &self,
        checked: &Checked,
        who: &Who,
    ) -> Result<Turn, (Problem<'static>, u64)> {
        let permit = match &self.concurrency {
            None => None,
            Some(c) => {
                let priority = priority_of(checked);
                let client = self.clients.of(who.ip.as_str());
                // Boxed: only a proxy with a limit pays for the wait's state.
                match Box::pin(c.acquire_for(priority, client)).await {
                    Ok(p) => Some(p),
                    Err(_) => {
                        self.shared.events.shed(priority);
                        let retry = c.retry_after().as_secs().max(1);
                        return Err((
                            Problem::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "the upstream is at capacity: retry later",
                            ),
                            retry,
                        ));
                    }
                }
            }
        };
        Ok(Turn {
            permit,
            sent: self.measuring.then(Instant::now),
        })
    }

    /// The group `who` waits for an upstream connection in: its network,
    /// as the in-flight limit names it.
    pub fn group(&self, who: &Who) -> spillway_wire::client::Group {
        self.clients.of(who.ip.as_str())
    }

    /// Phase 5b: the upstream answered (`ok`: not a 5xx) or failed
    /// (`ok` false), its head (or failure) at `head` ([`Turn::mark`]): a
    /// sample of the upstream's latency for the health and the in-flight
    /// limit, and the slot freed (now: after the body, on the direct
    /// path). Without health targets or an in-flight limit nothing is
    /// measured.
    pub fn answered(&self, turn: Turn, ok: bool, head: Option<Instant>) {
        let (Some(sent), Some(head)) = (turn.sent, head) else {
            return;
        };
        let latency = head.saturating_duration_since(sent);
        self.stats.record(head, latency, !ok);
        if let Some(p) = turn.permit {
            p.done(head, latency, ok);
        }
    }

    /// The upstream's health as measured now: the worse of its latency
    /// over the target and its error share over the maximum; unknown
    /// without calls in the window (or without targets).
    pub fn measured(&self) -> spillway_core::Health {
        let now = Instant::now();
        let latency = self.measure.latency_target.and_then(|t| {
            let at = self
                .stats
                .latency_quantile(now, self.measure.percentile / 100.0)?;
            let t = t.as_secs_f64();
            (t > 0.0).then(|| at.as_secs_f64() / t)
        });
        let errors = self.measure.errors_max.and_then(|max| {
            let share = self.stats.error_share(now)?;
            (max > 0.0).then(|| share / max)
        });
        spillway_core::Health::from_signals(None, latency, errors)
    }

    /// Brings the measured health up to date every
    /// [`MEASURE_EVERY`] until the runtime ends, and renders the
    /// proxy's gauges in the metrics.
    pub fn start_measuring(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(MEASURE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(p) = weak.upgrade() else { return };
                p.shared.measured.set(p.measured());
            }
        });
        let weak = Arc::downgrade(self);
        self.shared
            .events
            .add_gauges(Box::new(move |out: &mut String| {
                if let Some(p) = weak.upgrade() {
                    p.render_gauges(out);
                }
            }));
    }

    /// The proxy's gauges, Prometheus text.
    fn render_gauges(&self, out: &mut String) {
        use std::fmt::Write as _;
        let now = Instant::now();
        if let Some(c) = &self.concurrency {
            let _ = write!(
                out,
                "# HELP spillway_concurrency_limit The in-flight limit to the upstream (adaptive or fixed).\n\
                 # TYPE spillway_concurrency_limit gauge\nspillway_concurrency_limit {}\n\
                 # HELP spillway_concurrency_in_flight Requests in flight to the upstream.\n\
                 # TYPE spillway_concurrency_in_flight gauge\nspillway_concurrency_in_flight {}\n\
                 # HELP spillway_concurrency_queued Requests waiting for an in-flight slot.\n\
                 # TYPE spillway_concurrency_queued gauge\nspillway_concurrency_queued {}\n",
                c.limit(),
                c.in_flight(),
                c.queued()
            );
        }
        let _ = write!(
            out,
            "# HELP spillway_upstream_connections Connections open to the upstream (idle ones included).\n\
             # TYPE spillway_upstream_connections gauge\nspillway_upstream_connections {}\n\
             # HELP spillway_upstream_connections_max The bound on them (proxy.upstream.max_connections).\n\
             # TYPE spillway_upstream_connections_max gauge\nspillway_upstream_connections_max {}\n",
            self.connections.open_connections(),
            self.connections.max_connections()
        );
        let _ = write!(
            out,
            "# HELP spillway_upstream_latency_seconds Upstream latency over the measurement window.\n\
             # TYPE spillway_upstream_latency_seconds gauge\n"
        );
        for q in [0.5, 0.99] {
            if let Some(l) = self.stats.latency_quantile(now, q) {
                let _ = writeln!(
                    out,
                    "spillway_upstream_latency_seconds{{quantile=\"{q}\"}} {}",
                    l.as_secs_f64()
                );
            }
        }
        if let Some(e) = self.stats.error_share(now) {
            let _ = write!(
                out,
                "# HELP spillway_upstream_error_ratio Share of upstream calls that failed (5xx, failures, timeouts) over the window.\n\
                 # TYPE spillway_upstream_error_ratio gauge\nspillway_upstream_error_ratio {e}\n"
            );
        }
    }

    /// Whether a rule in force takes its cost from the answer: such
    /// requests are served on the hyper path, which reads trailers too.
    pub fn reads_costs(&self) -> bool {
        self.shared.limiter.has_response_costs()
    }

    /// Whether the decision involves a rule that takes its cost from the
    /// answer, so the request must be kept for [`settle`](Self::settle).
    pub fn settles(checked: &Checked) -> bool {
        checked.decision.rules.iter().any(|rd| {
            checked
                .rule(rd)
                .is_some_and(|r| r.response_cost().is_some())
        })
    }

    /// Phase 5, for rules that take their cost from the answer: charges
    /// what `read` finds in the answer (a header or trailer's value, by
    /// lower-case name) to those rules, after the fact. A value that is
    /// not a whole number charges the rule's largest limit and is logged
    /// ([`spillway_core::Rule::answered_cost`]). Returns whether
    /// anything was charged.
    pub async fn settle<H: Headers + Sync + ?Sized>(
        &self,
        method: &str,
        path: &str,
        who: &Who,
        headers: &H,
        read: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> bool {
        let attrs = crate::decide::attrs(who, None, headers);
        let request = Request {
            method: Some(method),
            path: Some(path),
            attrs: &attrs,
            cost: 0,
        };
        let cost_of = |rule: &spillway_core::Rule| -> Option<u64> {
            let name = &rule.response_cost()?.header;
            let value = read(name)?;
            match rule.answered_cost(value.as_bytes()) {
                Ok(n) => Some(n),
                Err(most) => {
                    self.failures.warn(format_args!(
                        "rule {:?}: the answer's {name} {value:?} is not a whole number; charged {most}, the rule's largest limit",
                        rule.name()
                    ));
                    Some(most)
                }
            }
        };
        match self.shared.limiter.settle(&request, &cost_of).await {
            Some(checked) => {
                if checked.store_error.is_some() {
                    self.shared.events.store_failed();
                }
                true
            }
            None => false,
        }
    }

    /// Phase 3: the forwarding headers the proxy sends instead of the
    /// client's, each passed to `put` as a name and a value, and with a
    /// traced decision (`trace`) the `traceparent` naming its span;
    /// returns the client headers that never go upstream from `peer`.
    pub fn forwarding<H: Headers + ?Sized>(
        &self,
        peer: IpAddr,
        headers: &H,
        trace: Option<&Forward>,
        mut put: impl FnMut(&'static str, &str),
    ) -> &'static [&'static str] {
        put(
            "x-forwarded-for",
            &identity::forwarded_for(peer, headers, &self.identify.trusted),
        );
        if let Some(host) = headers.value("host") {
            put("x-forwarded-host", host);
        }
        put("x-forwarded-proto", "http");
        let trusted = self.identify.trusts(peer);
        let Some(t) = trace else {
            return if trusted { &FROM_TRUSTED } else { &FROM_ANYONE };
        };
        put("traceparent", t.traceparent());
        match (trusted, t.drops_tracestate()) {
            (true, false) => &FROM_TRUSTED_TRACED,
            (true, true) => &FROM_TRUSTED_NEW_TRACE,
            (false, false) => &FROM_ANYONE_TRACED,
            (false, true) => &FROM_ANYONE_NEW_TRACE,
        }
    }

    /// Whether an upgrade to `protocol` is passed through.
    pub fn upgrade_allowed(&self, protocol: &str) -> bool {
        let name = protocol.split('/').next().unwrap_or("").trim();
        self.upgrades.iter().any(|u| u.eq_ignore_ascii_case(name))
    }

    /// Phase 5: the answer to an upstream failure, counted and logged.
    pub fn failure(&self, f: Failure) -> Problem<'static> {
        self.shared
            .events
            .upstream_failed(matches!(f, Failure::Timeout));
        match f {
            Failure::Bad(e) => {
                self.failures
                    .warn(format_args!("upstream {} failed: {e}", self.upstream));
                Problem::new(StatusCode::BAD_GATEWAY, "the upstream failed to answer")
            }
            Failure::Timeout => {
                self.failures.warn(format_args!(
                    "upstream {} did not answer within {:?}",
                    self.upstream, self.timeout
                ));
                Problem::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the upstream did not answer in time",
                )
            }
            Failure::Busy => {
                self.failures.warn(format_args!(
                    "upstream {}: all {} connections stayed in use for {:?}",
                    self.upstream,
                    self.connections.max_connections(),
                    self.timeout
                ));
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the upstream is at capacity: retry later",
                )
            }
        }
    }

    /// A request target the proxy does not serve (see [`absolute_form`]):
    /// the client's fault, 400, counted as a bad request.
    pub fn bad_target(&self, detail: &'static str) -> Problem<'static> {
        self.shared.events.bad_request();
        Problem::new(StatusCode::BAD_REQUEST, detail)
    }

    /// The client sent a body the proxy could not read (cut short, or
    /// malformed chunked coding): its own fault, 400, not an upstream one.
    pub fn bad_body(&self) -> Problem<'static> {
        self.shared.events.bad_request();
        Problem::new(
            StatusCode::BAD_REQUEST,
            "the request body was malformed or cut short",
        )
    }
}

/// How often the proxy's measured health is brought up to date.
pub const MEASURE_EVERY: Duration = Duration::from_millis(200);

/// A request's priority: the most important one among the rules that
/// decided it that say one; `default` when none says.
pub fn priority_of(checked: &Checked) -> spillway_core::Priority {
    checked
        .decision
        .rules
        .iter()
        .filter_map(|rd| checked.rule(rd).and_then(spillway_core::Rule::priority))
        .max()
        .unwrap_or_default()
}

/// Whether the proxy's own rate limit headers go on the answer (a rule
/// decided), replacing the upstream's of the same names.
pub fn ours(checked: &Checked) -> bool {
    checked.decision.deciding.is_some()
}

/// Upstream failures in the log: at most one warning every
/// [`FailureLog::EVERY`], with the count of those not logged since (a down
/// upstream under load fails every request, and one line per request would
/// flood the log).
#[derive(Debug)]
struct FailureLog {
    start: Instant,
    next_ms: AtomicU64,
    quiet: AtomicU64,
}

impl Default for FailureLog {
    fn default() -> FailureLog {
        FailureLog {
            start: Instant::now(),
            next_ms: AtomicU64::new(0),
            quiet: AtomicU64::new(0),
        }
    }
}

impl FailureLog {
    const EVERY: Duration = Duration::from_secs(10);

    fn warn(&self, detail: std::fmt::Arguments<'_>) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        let every = u64::try_from(Self::EVERY.as_millis()).unwrap_or(u64::MAX);
        if now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            match self.quiet.swap(0, Ordering::Relaxed) {
                0 => tracing::warn!("{detail}"),
                n => tracing::warn!("{detail} ({n} more upstream failures since the last warning)"),
            }
        } else {
            self.quiet.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
