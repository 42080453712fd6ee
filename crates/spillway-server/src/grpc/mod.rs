//! The Envoy rate limit service (gRPC `ShouldRateLimit`): domains of nested
//! descriptor trees, matched the way envoyproxy/ratelimit matches them, and
//! decided through the same store as the HTTP API.

mod listener;
pub mod proto;
pub mod service;

pub use listener::{Bound, GrpcListen, bind, serve};

use std::collections::HashMap;
use std::sync::Arc;

use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos, Rule};

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
    /// `/healthcheck` fails while no domain is in force
    /// (envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub healthy_needs_domains: bool,
}

/// One domain's descriptor tree.
#[derive(Debug, Clone)]
pub struct Domain {
    /// The domain name requests carry.
    pub name: String,
    /// The top-level descriptor nodes, in file order (the order wildcard
    /// values are tried in).
    pub nodes: Vec<Node>,
}

/// A node of a descriptor tree.
#[derive(Debug, Clone)]
pub struct Node {
    /// The entry key this node matches (exactly: a `*` in a key is a
    /// character like any other).
    pub key: String,
    /// The entry value it matches; `None` matches any value (each value
    /// counted on its own). A value with `*` in it is a wildcard: each `*`
    /// matches any run of characters, the empty one included (see
    /// [`wildcard_match`]).
    pub value: Option<String>,
    /// What applies when a descriptor ends here.
    pub action: Action,
    /// The limits this one replaces when both match one request. As a
    /// file is read: the names written in `replaces:`. In a [`Domains`]:
    /// the internal names ([`Rule::name`], [`Action::Ban`]'s `name`) of
    /// every limit of the domain whose written `name` is one of them, so a
    /// matched node's list compares directly with the rule names.
    pub replaces: Vec<String>,
    /// Deeper nodes, in file order.
    pub children: Vec<Node>,
    /// The limit's `name` as the file gives it, empty if none: what
    /// `current_limit.name` reports (Envoy copies it into client-visible
    /// headers, so an internal path must not show there). The rule's own
    /// name ([`Rule::name`]) is the node's path (`domain.key_value.key`),
    /// which keys its counters and metrics.
    pub name: String,
    /// `share_threshold`: every value this node's wildcard matches shares
    /// one counter.
    pub share_threshold: bool,
    /// `quota_mode`: over the limit, the request is still allowed and the
    /// answer's dynamic metadata says the quota is spent.
    pub quota_mode: bool,
    /// `detailed_metric`: statistics carry the descriptor's value.
    pub detailed_metric: bool,
    /// `metadata`: what envoyproxy/ratelimit adds to the answer's dynamic
    /// metadata for a descriptor decided here and not over its limit.
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
}

/// A descriptor matched to the node that decides it.
#[derive(Debug)]
pub struct Match<'a> {
    /// The most specific node matching every entry.
    pub node: &'a Node,
    /// The counter's key: each entry's key and value, except that an entry
    /// matched by a `share_threshold` wildcard gives its pattern, so every
    /// value the wildcard matches shares one counter. Each key and value
    /// is length-prefixed (`3:abc`), so no choice of values makes two
    /// descriptors' keys meet.
    pub key: String,
}

/// What a matched node does.
#[derive(Debug, Clone)]
pub enum Action {
    /// Nothing here: no limit (only deeper nodes carry limits).
    None,
    /// Never limited.
    Unlimited,
    /// This rule's limits (a spillway rule keyed by the descriptor's
    /// values): one fixed window for `rate_limit:`, one limit of any
    /// algorithm for `limit:`, several for `limits:` (all-or-none: a
    /// request is counted by every one or by none).
    Limit(Box<Rule>),
    /// `requests_per_unit: 0` (or none given): always over the limit.
    Ban {
        /// The limit's internal name (the node's path).
        name: String,
        /// The unit reported.
        unit: Unit,
        /// Report but do not deny.
        shadow: bool,
    },
}

impl Action {
    /// The internal name of the limit here, if there is one.
    pub fn rule_name(&self) -> Option<&str> {
        match self {
            Action::Limit(rule) => Some(rule.name()),
            Action::Ban { name, .. } => Some(name),
            Action::None | Action::Unlimited => None,
        }
    }
}

/// Every domain, by name.
#[derive(Debug, Clone, Default)]
pub struct Domains {
    by_name: HashMap<String, Domain>,
}

impl Domains {
    /// Domains from a list; a later domain of the same name is merged into
    /// the earlier one (its descriptors appended: the loader allows that
    /// only with `--merge-domains`). Each node's `replaces` is resolved
    /// from written names to internal ones.
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
        for d in by_name.values_mut() {
            let mut named: HashMap<String, Vec<String>> = HashMap::new();
            collect_names(&d.nodes, &mut named);
            resolve_replaces(&mut d.nodes, &named);
        }
        Domains { by_name }
    }

    /// The domain called `name`.
    pub fn get(&self, name: &str) -> Option<&Domain> {
        self.by_name.get(name)
    }

    /// The domains' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
}

/// Written name → internal names of the limits carrying it.
fn collect_names(nodes: &[Node], named: &mut HashMap<String, Vec<String>>) {
    for n in nodes {
        if !n.name.is_empty()
            && let Some(internal) = n.action.rule_name()
        {
            named
                .entry(n.name.clone())
                .or_default()
                .push(internal.to_string());
        }
        collect_names(&n.children, named);
    }
}

fn resolve_replaces(nodes: &mut [Node], named: &HashMap<String, Vec<String>>) {
    for n in nodes {
        let written = std::mem::take(&mut n.replaces);
        for w in &written {
            for internal in named.get(w).into_iter().flatten() {
                if !n.replaces.contains(internal) {
                    n.replaces.push(internal.clone());
                }
            }
        }
        resolve_replaces(&mut n.children, named);
    }
}

/// Whether `value` matches `pattern`, where each `*` matches any run of
/// characters (the empty one included) and everything else matches
/// itself: envoyproxy/ratelimit's wildcards (`foo*`, `bar*b`,
/// `/api/*/action`, `foo*bar*baz`). No allocation; linear in the value's
/// length for each literal piece.
pub fn wildcard_match(pattern: &str, value: &str) -> bool {
    let Some((head, last)) = pattern.rsplit_once('*') else {
        return pattern == value;
    };
    let (first, middle) = head.split_once('*').unwrap_or((head, ""));
    if value.len() < first.len() + last.len() || !value.starts_with(first) || !value.ends_with(last)
    {
        return false;
    }
    // The part the stars cover: the middle pieces must appear in it, in
    // order; the leftmost place for each leaves the most room for the rest.
    let mut rest = &value[first.len()..value.len() - last.len()];
    for piece in middle.split('*').filter(|p| !p.is_empty()) {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// The node at one level for an entry: an exact value first, then the
/// first wildcard value (in file order) that matches, then a key-only
/// node, as envoyproxy/ratelimit looks them up. The flag says the entry
/// was matched by a wildcard.
fn pick<'a>(level: &'a [Node], k: &str, v: &str) -> Option<(&'a Node, bool)> {
    let mut wildcard = None;
    let mut key_only = None;
    for n in level.iter().filter(|n| n.key == k) {
        match n.value.as_deref() {
            Some(p) if p == v => return Some((n, false)),
            Some(p) => {
                if wildcard.is_none() && p.contains('*') && wildcard_match(p, v) {
                    wildcard = Some(n);
                }
            }
            None => {
                if key_only.is_none() {
                    key_only = Some(n);
                }
            }
        }
    }
    wildcard
        .map(|n| (n, true))
        .or_else(|| key_only.map(|n| (n, false)))
}

fn push_part(key: &mut String, s: &str) {
    key.push_str(itoa::Buffer::new().format(s.len()));
    key.push(':');
    key.push_str(s);
}

/// The most specific node for a descriptor's entries: at each level an
/// exact key and value, then a wildcard value, then a key-only (any value)
/// node; a descriptor matches only if every entry is consumed, level by
/// level, without going back.
pub fn find<'a>(nodes: &'a [Node], entries: &[(&str, &str)]) -> Option<Match<'a>> {
    let mut level = nodes;
    let mut found = None;
    let mut key = String::new();
    for (k, v) in entries {
        let (node, by_wildcard) = pick(level, k, v)?;
        // An entry a share_threshold wildcard matched counts as its
        // pattern: every value it matches, one counter.
        let counted = match &node.value {
            Some(pattern) if by_wildcard && node.share_threshold => pattern.as_str(),
            _ => v,
        };
        push_part(&mut key, k);
        push_part(&mut key, counted);
        found = Some(node);
        level = &node.children;
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
            metadata: None,
        }
    }

    fn shared(mut n: Node) -> Node {
        n.share_threshold = true;
        n
    }

    fn value_of<'a>(tree: &'a [Node], entries: &[(&str, &str)]) -> Option<&'a str> {
        find(tree, entries).and_then(|m| m.node.value.as_deref())
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
        assert!(find(&tree, &[]).is_none());
        let wild = vec![
            node("k", Some("value*"), vec![]),
            node("k", Some("value_9"), vec![]),
        ];
        assert_eq!(value_of(&wild, &[("k", "value_1")]), Some("value*"));
        assert_eq!(value_of(&wild, &[("k", "value_9")]), Some("value_9"));
        assert!(find(&wild, &[("k", "other")]).is_none());
    }

    /// envoyproxy/ratelimit's order at one level: the exact value, then
    /// the first wildcard in file order, then the key alone; no going back
    /// to another branch when a deeper entry fails.
    #[test]
    fn precedence_is_exact_then_first_wildcard_then_key_only_without_backtracking() {
        let tree = vec![
            node("k", None, vec![node("deep", None, vec![])]),
            node("k", Some("a*"), vec![]),
            node("k", Some("ab*"), vec![node("deep", None, vec![])]),
            node("k", Some("abc"), vec![]),
            node("other", Some("abc"), vec![]),
        ];
        assert_eq!(value_of(&tree, &[("k", "abc")]), Some("abc"));
        // Both wildcards match: the first one written wins.
        assert_eq!(value_of(&tree, &[("k", "abd")]), Some("a*"));
        assert_eq!(value_of(&tree, &[("k", "zzz")]), None);
        assert_eq!(find(&tree, &[("k", "zzz")]).unwrap().node.key, "k");
        // `a*` took `abd` and has no children: the key-only branch, which
        // has, is not tried.
        assert!(find(&tree, &[("k", "abd"), ("deep", "x")]).is_none());
        assert!(find(&tree, &[("k", "zzz"), ("deep", "x")]).is_some());
        // A value written with a star is also matched exactly.
        assert_eq!(value_of(&tree, &[("k", "a*")]), Some("a*"));
        // Keys match exactly, whatever the value.
        assert!(find(&tree, &[("K", "abc")]).is_none());
        assert!(find(&tree, &[("other", "abd")]).is_none());
    }

    #[test]
    fn stars_anywhere_match_any_run_of_characters() {
        for (pattern, yes, no) in [
            ("foo*", &["foo", "foo1", "foo/bar"][..], &["fo", "xfoo"][..]),
            (
                "bar*b",
                &["barb", "barab", "bar123b", "barbb"],
                &["bara", "xbarb", "bar"],
            ),
            (
                "foo*bar*baz",
                &["foobarbaz", "foo123bar456baz", "foobarbarbaz"],
                &["foo123baz", "bar456baz", "foobazbar", "foobarba"],
            ),
            (
                "/api/*/action",
                &["/api/123/action", "/api//action", "/api/a/b/action"],
                &["/api/123/other", "/api/action", "api/1/action"],
            ),
            ("*", &["", "x", "anything at all"], &[]),
            ("*.pdf", &[".pdf", "a.pdf"], &["a.pdfx", "pdf"]),
            ("a**b", &["ab", "axxb"], &["a", "ba"]),
            ("a*a", &["aa", "aba"], &["a"]),
            ("t*prod", &["tprod", "t-eu-prod"], &["prodt", "t-prod-x"]),
            ("é*ü", &["éü", "é-ü"], &["e-u"]),
            ("no star", &["no star"], &["no sta", "no stars"]),
        ] {
            for v in yes {
                assert!(wildcard_match(pattern, v), "{pattern:?} should match {v:?}");
            }
            for v in no {
                assert!(
                    !wildcard_match(pattern, v),
                    "{pattern:?} should not match {v:?}"
                );
            }
        }
    }

    #[test]
    fn share_threshold_entries_count_as_their_pattern() {
        let tree = vec![
            shared(node("files", Some("files/*"), vec![])),
            node("own", Some("own/*"), vec![]),
            node("files", Some("files/special"), vec![]),
            shared(node(
                "user",
                Some("user/*"),
                vec![node(
                    "res",
                    Some("res/*"),
                    vec![node("action", None, vec![])],
                )],
            )),
        ];
        let key = |e: &[(&str, &str)]| find(&tree, e).unwrap().key;
        assert_eq!(key(&[("files", "files/a")]), key(&[("files", "files/b")]));
        assert_eq!(key(&[("files", "files/a")]), "5:files7:files/*");
        // An exact value is its own counter; a wildcard without the flag
        // counts each value.
        assert_ne!(
            key(&[("files", "files/special")]),
            key(&[("files", "files/a")])
        );
        assert_ne!(key(&[("own", "own/a")]), key(&[("own", "own/b")]));
        // Deeper: the shared entry counts as its pattern, the others as
        // their values.
        let a = key(&[("user", "user/ann"), ("res", "res/1"), ("action", "get")]);
        let b = key(&[("user", "user/bob"), ("res", "res/1"), ("action", "get")]);
        let c = key(&[("user", "user/bob"), ("res", "res/2"), ("action", "get")]);
        assert_eq!(a, b);
        assert_ne!(b, c);
    }

    #[test]
    fn counter_keys_are_unambiguous() {
        let tree = vec![node("a", None, vec![node("b", None, vec![])])];
        let k1 = find(&tree, &[("a", "x:1b"), ("b", "y")]).unwrap().key;
        let k2 = find(&tree, &[("a", "x"), ("b", "1b:y")]).unwrap().key;
        assert_ne!(k1, k2);
    }

    #[test]
    fn replaces_resolve_to_every_limit_so_named() {
        let mut a = node("a", None, vec![]);
        a.name = "shared".into();
        a.action = Action::Ban {
            name: "d.a".into(),
            unit: Unit::Minute,
            shadow: false,
        };
        let mut b = node("b", None, vec![]);
        b.name = "shared".into();
        b.action = Action::Ban {
            name: "d.b".into(),
            unit: Unit::Minute,
            shadow: false,
        };
        let mut c = node("c", None, vec![]);
        c.replaces = vec!["shared".into(), "nobody".into()];
        let domains = Domains::new(vec![Domain {
            name: "d".into(),
            nodes: vec![a, node("x", None, vec![b]), c],
        }]);
        let d = domains.get("d").unwrap();
        assert_eq!(d.nodes[2].replaces, ["d.a", "d.b"]);
        assert_eq!(domains.names(), ["d"]);
    }

    /// A reference for the wildcard matcher: the textbook dynamic program.
    fn glob(p: &[char], v: &[char]) -> bool {
        let mut m = vec![vec![false; v.len() + 1]; p.len() + 1];
        m[0][0] = true;
        for i in 1..=p.len() {
            m[i][0] = m[i - 1][0] && p[i - 1] == '*';
            for j in 1..=v.len() {
                m[i][j] = if p[i - 1] == '*' {
                    m[i - 1][j] || m[i][j - 1]
                } else {
                    m[i - 1][j - 1] && p[i - 1] == v[j - 1]
                };
            }
        }
        m[p.len()][v.len()]
    }

    proptest::proptest! {
        /// The matcher agrees with the reference on every pattern and value
        /// (small alphabets, so matches are frequent).
        #[test]
        fn wildcard_match_agrees_with_the_reference(
            pattern in "[ab*é]{0,8}",
            value in "[abé]{0,10}",
        ) {
            let p: Vec<char> = pattern.chars().collect();
            let v: Vec<char> = value.chars().collect();
            proptest::prop_assert_eq!(wildcard_match(&pattern, &value), glob(&p, &v));
        }

        /// `find` never panics, whatever the tree and the entries, and a
        /// match consumed every entry: its node is as deep as the entries.
        #[test]
        fn find_never_panics_and_matches_consume_every_entry(
            values in proptest::collection::vec(proptest::option::of("[ab*]{0,4}"), 0..6),
            entries in proptest::collection::vec(("[kj]", "[ab*\u{0}:é]{0,5}"), 0..5),
            shared_flags in proptest::collection::vec(proptest::bool::ANY, 6),
        ) {
            // A three-level tree of the same nodes at each level.
            let level = |children: Vec<Node>| -> Vec<Node> {
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let mut n = node(if i % 2 == 0 { "k" } else { "j" }, v.as_deref(), children.clone());
                        n.share_threshold = shared_flags[i];
                        n
                    })
                    .collect()
            };
            let tree = level(level(level(Vec::new())));
            let e: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            if let Some(m) = find(&tree, &e) {
                proptest::prop_assert!(!e.is_empty() && e.len() <= 3);
                let (k, v) = e[e.len() - 1];
                proptest::prop_assert_eq!(&m.node.key, k);
                proptest::prop_assert!(m.node.value.as_deref().is_none_or(|p| wildcard_match(p, v)));
            }
        }
    }
}
