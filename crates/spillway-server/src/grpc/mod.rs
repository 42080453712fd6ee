//! The Envoy rate limit service (gRPC `ShouldRateLimit`): domains of nested
//! descriptor trees, matched the way envoyproxy/ratelimit matches them, and
//! decided through the same store as the HTTP API.

pub mod proto;
pub mod service;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos, Rule};
use tokio::net::TcpListener;

use self::proto::Unit;
use crate::Shared;

/// What the gRPC service reads.
#[derive(Debug)]
pub struct GrpcState {
    /// Rules, store and metrics.
    pub shared: Shared,
    /// Descriptor trees, replaced on reload.
    pub domains: Arc<arc_swap::ArcSwap<Domains>>,
    /// Whether answers carry RateLimit headers for Envoy to add
    /// (`grpc_response_headers`).
    pub response_headers: bool,
}

/// Serves the Envoy rate limit service and gRPC health on `listener`
/// until `stop` completes.
pub async fn serve(
    state: Arc<GrpcState>,
    listener: TcpListener,
    limits: spillway_wire::Limits,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(proto::SERVICE, tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // The HTTP listeners' bounds, as far as tonic has them: a call must end
    // within the body timeout, an HTTP/2 connection that stops answering
    // pings is closed, and one connection cannot open unbounded streams.
    let result = tonic::transport::Server::builder()
        .timeout(limits.body_timeout)
        .http2_keepalive_interval(Some(limits.idle_timeout / 2))
        .http2_keepalive_timeout(Some(limits.write_timeout))
        .max_concurrent_streams(256)
        .concurrency_limit_per_connection(256)
        .add_service(health)
        .add_service(service::RateLimitService::new(state))
        // No Nagle: answers are small and written when the store replies;
        // behind delayed ACKs they could wait 40 ms.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop,
        )
        .await;
    if let Err(e) = result {
        tracing::error!("gRPC server stopped: {e}");
    }
}

/// One domain's descriptor tree.
#[derive(Debug, Clone)]
pub struct Domain {
    /// The domain name requests carry.
    pub name: String,
    /// The top-level descriptor nodes.
    pub nodes: Vec<Node>,
}

/// A node of a descriptor tree.
#[derive(Debug, Clone)]
pub struct Node {
    /// The entry key this node matches.
    pub key: String,
    /// The entry value it matches; `None` matches any value (each value
    /// counted on its own).
    pub value: Option<String>,
    /// What applies when a descriptor ends here.
    pub action: Action,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Deeper nodes.
    pub children: Vec<Node>,
    /// The limit's `name` as the file gives it, empty if none: what
    /// `current_limit.name` reports (Envoy copies it into client-visible
    /// headers, so an internal path must not show there).
    pub name: String,
    /// `share_threshold`: every value this node's wildcard matches shares
    /// one counter.
    pub share_threshold: bool,
    /// `quota_mode`: over the limit, the request is still allowed and the
    /// answer's dynamic metadata says the quota is spent.
    pub quota_mode: bool,
    /// `detailed_metric`: statistics carry the descriptor's value.
    pub detailed_metric: bool,
}

/// A descriptor matched to the node that decides it.
#[derive(Debug)]
pub struct Match<'a> {
    /// The most specific node matching every entry.
    pub node: &'a Node,
    /// The counter's key: each entry's key and value, except that an entry
    /// matched by a `share_threshold` wildcard gives its pattern, so every
    /// value the wildcard matches shares one counter.
    pub key: String,
}

/// What a matched node does.
#[derive(Debug, Clone)]
pub enum Action {
    /// Nothing here: no limit (only deeper nodes carry limits).
    None,
    /// Never limited.
    Unlimited,
    /// This rule's limit (a spillway rule keyed by the descriptor's values).
    Limit(Box<Rule>),
    /// `requests_per_unit: 0`: always over the limit.
    Ban {
        /// The limit's name.
        name: String,
        /// The unit reported.
        unit: Unit,
        /// Report but do not deny.
        shadow: bool,
    },
}

/// Every domain, by name.
#[derive(Debug, Clone, Default)]
pub struct Domains {
    by_name: HashMap<String, Domain>,
}

impl Domains {
    /// Domains from a list; a later domain of the same name is merged into
    /// the earlier one (its descriptors appended).
    pub fn new(list: Vec<Domain>) -> Domains {
        let mut by_name: HashMap<String, Domain> = HashMap::new();
        for d in list {
            match by_name.get_mut(&d.name) {
                Some(existing) => existing.nodes.extend(d.nodes),
                None => {
                    by_name.insert(d.name.clone(), d);
                }
            }
        }
        Domains { by_name }
    }

    /// The domain called `name`.
    pub fn get(&self, name: &str) -> Option<&Domain> {
        self.by_name.get(name)
    }
}

/// The most specific node for a descriptor's entries: at each level an
/// exact key and value beats a key-only (any value) node; a descriptor
/// matches only if every entry is consumed.
pub fn find<'a>(nodes: &'a [Node], entries: &[(&str, &str)]) -> Option<Match<'a>> {
    let mut level = nodes;
    let mut found = None;
    let mut key = String::new();
    for (k, v) in entries {
        // Exact value, then a `prefix*` value, then key only.
        let node = level
            .iter()
            .find(|n| n.key == *k && n.value.as_deref() == Some(*v))
            .or_else(|| {
                level.iter().find(|n| {
                    n.key == *k
                        && n.value.as_deref().is_some_and(|p| {
                            p.strip_suffix('*')
                                .is_some_and(|prefix| v.starts_with(prefix))
                        })
                })
            })
            .or_else(|| level.iter().find(|n| n.key == *k && n.value.is_none()))?;
        found = Some(node);
        level = &node.children;
        key.push_str(k);
        key.push('\u{1f}');
        key.push_str(v);
        key.push('\u{1e}');
    }
    found.map(|node| Match { node, key })
}

/// A fixed window rule of `requests_per_unit` per `unit`, as Envoy's own
/// format means it.
///
/// # Errors
/// Zero requests or an unknown unit.
pub fn envoy_rule(
    name: &str,
    requests_per_unit: u64,
    unit: Unit,
    shadow: bool,
) -> Result<Rule, String> {
    let secs = unit.seconds();
    if secs == 0 {
        return Err("unknown unit".to_string());
    }
    let limit =
        FixedWindow::new(requests_per_unit, Nanos::from_secs(secs)).map_err(|e| e.to_string())?;
    Rule::new(
        name,
        None,
        KeySpec::from_parts(Vec::new()),
        vec![Limit::FixedWindow(limit)],
        if shadow { Mode::Shadow } else { Mode::Hard },
    )
    .map_err(|e| e.to_string())
}

/// A limit as Envoy reports it: requests per unit. Windows that are a whole
/// unit map directly; others are scaled to the largest unit they span.
pub fn envoy_rate(limit: &Limit) -> (u32, Unit) {
    let w = limit.window().as_u64();
    let size = limit.size();
    for unit in [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ] {
        if w == unit.seconds() * 1_000_000_000 {
            return (u32::try_from(size).unwrap_or(u32::MAX), unit);
        }
    }
    let unit = [Unit::Day, Unit::Hour, Unit::Minute]
        .into_iter()
        .find(|u| w >= u.seconds() * 1_000_000_000)
        .unwrap_or(Unit::Second);
    let per =
        (u128::from(size) * u128::from(unit.seconds()) * 1_000_000_000) / u128::from(w.max(1));
    (u32::try_from(per).unwrap_or(u32::MAX), unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(key: &str, value: Option<&str>, children: Vec<Node>) -> Node {
        Node {
            key: key.into(),
            value: value.map(Into::into),
            action: Action::Unlimited,
            replaces: Vec::new(),
            children,
            name: String::new(),
            share_threshold: false,
            quota_mode: false,
            detailed_metric: false,
        }
    }

    #[test]
    fn specific_values_beat_wildcards_and_all_entries_must_match() {
        let tree = vec![
            node("remote_address", None, vec![]),
            node("path", Some("/login"), vec![node("user", None, vec![])]),
            node("path", None, vec![]),
        ];
        assert_eq!(
            find(&tree, &[("remote_address", "1.2.3.4")])
                .unwrap()
                .node
                .value,
            None
        );
        let n = find(&tree, &[("path", "/login")]).unwrap().node;
        assert_eq!(n.value.as_deref(), Some("/login"));
        assert_eq!(find(&tree, &[("path", "/other")]).unwrap().node.value, None);
        assert_eq!(
            find(&tree, &[("path", "/login"), ("user", "bob")])
                .unwrap()
                .node
                .key,
            "user"
        );
        assert!(find(&tree, &[("path", "/login"), ("nope", "x")]).is_none());
        assert!(find(&tree, &[("unknown", "x")]).is_none());
        let wild = vec![
            node("k", Some("value*"), vec![]),
            node("k", Some("value_9"), vec![]),
        ];
        assert_eq!(
            find(&wild, &[("k", "value_1")])
                .unwrap()
                .node
                .value
                .as_deref(),
            Some("value*")
        );
        assert_eq!(
            find(&wild, &[("k", "value_9")])
                .unwrap()
                .node
                .value
                .as_deref(),
            Some("value_9")
        );
        assert!(find(&wild, &[("k", "other")]).is_none());
    }

    #[test]
    fn rates_map_to_envoy_units() {
        let fw = |n, s| Limit::FixedWindow(FixedWindow::new(n, Nanos::from_secs(s)).unwrap());
        assert_eq!(envoy_rate(&fw(10, 60)), (10, Unit::Minute));
        assert_eq!(envoy_rate(&fw(10, 3600)), (10, Unit::Hour));
        assert_eq!(envoy_rate(&fw(10, 120)), (5, Unit::Minute));
        assert_eq!(envoy_rate(&fw(10, 5)), (2, Unit::Second));
    }
}
