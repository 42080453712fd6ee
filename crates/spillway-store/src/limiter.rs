//! Matching requests to rules and asking the store.

use std::sync::Arc;

use arc_swap::ArcSwap;
use spillway_core::{
    Attributes, Decision, FailPolicy, KeyPart, Mode, Nanos, Outcome, PathMatching, RequestPath,
    Rule, RuleDecision, RuleDecisions, canonical_ip,
};

use crate::keyrules::{KeyRules, SharedWatch};
use crate::{Charge, Key, Store};

/// The rules in force, replaced whole on reload.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
    /// Built for many rules: which rules a path may match.
    /// Built on first use ([`RuleSet::prepare`]): a set kept aside and
    /// never decided with (the file's rules an API-rules composition is
    /// made from) costs no index. The limiter prepares a set before it
    /// swaps it in, so no decision builds one.
    index: std::sync::OnceLock<RouteIndex>,
    /// Which respellings of a path (and `HEAD` for `GET`) count as the
    /// path, for rules that set none of their own: request paths are
    /// canonicalised once with it. Lenient by default ("count when in
    /// doubt"); set with [`RuleSet::with_path_matching`], which files the
    /// rules in the index again.
    path_matching: PathMatching,
    /// Whether a rule takes its cost from the answer (see
    /// [`Limiter::settle`]): requests are then decided with each rule's
    /// own request-time cost.
    response_costs: bool,
    /// The headers some rule is keyed by (`by: header:NAME`), lower-case,
    /// each once: a way in refuses a request whose value of one of them it
    /// cannot read, rather than let the rule be skipped as if it were
    /// missing.
    key_headers: Vec<String>,
    /// Policy for rules that set none, when the store fails.
    pub on_store_error: FailPolicy,
    /// Increases with every reload; shown on the status endpoint.
    pub version: u64,
}

/// The distinct headers `rules` are keyed by.
fn key_headers(rules: &[Rule]) -> Vec<String> {
    let mut names: Vec<String> = rules
        .iter()
        .flat_map(|r| r.by().parts())
        .filter_map(|p| match p {
            KeyPart::Header(h) => Some(h.clone()),
            _ => None,
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// From how many rules a request looks its candidates up in a
/// [`RouteIndex`] instead of trying every rule: below, a scan of a few
/// route comparisons is cheaper than the lookup.
const INDEX_FROM: usize = 16;

/// The rules by their routes' literal prefixes, in a tree of path
/// segments: a rule whose route starts `/v1/users/{id}` sits at the node
/// `v1` -> `users`. A path's candidates are the rules met walking down the
/// tree along its segments (the path canonicalised with the rule set's
/// [`PathMatching`]), plus the rules without a route and those whose own
/// path matching canonicalises paths differently (their literal prefix
/// need not start the path as canonicalised for everyone): every rule
/// that matches is among them, and `Rule::applies_to_path` then decides
/// as for a scan. With a thousand routes a scan cost about 4 µs a request.
#[derive(Debug, Clone, Default)]
struct RouteIndex {
    /// Node 0 is the root.
    nodes: Vec<IndexNode>,
    /// The rules of every node, node after node (file order within one):
    /// a node's are a range of it, not a list of its own.
    node_rules: Vec<u32>,
    /// Rules without a route (they apply to every request), and rules
    /// whose own path matching differs from the global one in how it
    /// spells paths (tried on every request).
    everywhere: Vec<usize>,
}

/// A node of the tree, compact: a million routes make a million nodes.
#[derive(Debug, Clone, Default)]
struct IndexNode {
    /// The children by segment, sorted (found by binary search).
    children: Box<[(Box<str>, u32)]>,
    /// This node's rules: `node_rules[rules.0..rules.1]`.
    rules: (u32, u32),
}

impl RouteIndex {
    fn new(rules: &[Rule], global: PathMatching) -> RouteIndex {
        // Built with maps, then frozen into sorted slices.
        let mut children: Vec<std::collections::HashMap<Box<str>, u32>> = vec![Default::default()];
        let mut at_node: Vec<(u32, u32)> = Vec::with_capacity(rules.len());
        let mut everywhere = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let own_paths = rule.path_matching().is_some_and(|m| !m.same_paths(&global));
            let Some(route) = rule.route().filter(|_| !own_paths) else {
                everywhere.push(i);
                continue;
            };
            let mut at = 0usize;
            for seg in route.literal_prefix() {
                // Paths are canonicalised lower-case then: so are the
                // literals they are looked up by.
                let seg = if global.case_insensitive {
                    std::borrow::Cow::Owned(seg.to_ascii_lowercase())
                } else {
                    std::borrow::Cow::Borrowed(seg)
                };
                at = match children[at].get(seg.as_ref()) {
                    Some(&next) => next as usize,
                    None => {
                        let next = children.len();
                        children.push(Default::default());
                        children[at].insert(seg.into_owned().into_boxed_str(), next as u32);
                        next
                    }
                };
            }
            at_node.push((at as u32, i as u32));
        }
        // Rules node by node, file order kept within a node (stable sort).
        at_node.sort_by_key(|&(node, _)| node);
        let mut nodes: Vec<IndexNode> = children
            .into_iter()
            .map(|map| {
                let mut list: Vec<(Box<str>, u32)> = map.into_iter().collect();
                list.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                IndexNode {
                    children: list.into_boxed_slice(),
                    rules: (0, 0),
                }
            })
            .collect();
        let node_rules: Vec<u32> = at_node.iter().map(|&(_, r)| r).collect();
        let mut start = 0;
        while start < at_node.len() {
            let node = at_node[start].0;
            let end = start
                + at_node[start..]
                    .iter()
                    .take_while(|(n, _)| *n == node)
                    .count();
            nodes[node as usize].rules = (start as u32, end as u32);
            start = end;
        }
        RouteIndex {
            nodes,
            node_rules,
            everywhere,
        }
    }

    /// The rules filed at node `at`.
    fn rules_at(&self, at: usize) -> impl Iterator<Item = usize> + '_ {
        let (from, to) = self.nodes[at].rules;
        self.node_rules[from as usize..to as usize]
            .iter()
            .map(|&r| r as usize)
    }

    /// The rules a request for `path` may match, in file order.
    fn candidates(&self, path: Option<&str>) -> Vec<usize> {
        let mut out = self.everywhere.clone();
        if let Some(segs) = path.and_then(spillway_core::Route::segments_of) {
            let mut at = 0;
            out.extend(self.rules_at(at));
            for seg in segs {
                let node = &self.nodes[at];
                let Ok(i) = node.children.binary_search_by(|(k, _)| k.as_ref().cmp(seg)) else {
                    break;
                };
                at = node.children[i].1 as usize;
                out.extend(self.rules_at(at));
            }
        }
        out.sort_unstable();
        out
    }
}

impl RuleSet {
    /// A rule set with the default (lenient) [`PathMatching`]; names are
    /// expected to be unique (the config layer checks).
    pub fn new(rules: Vec<Rule>) -> RuleSet {
        RuleSet::with_path_matching(rules, PathMatching::default())
    }

    /// A rule set whose rules that set no [`PathMatching`] of their own
    /// use `global`.
    ///
    /// ```
    /// use spillway_core::PathMatching;
    /// use spillway_store::RuleSet;
    /// let strict = RuleSet::with_path_matching(Vec::new(), PathMatching::STRICT);
    /// assert_eq!(strict.path_matching(), PathMatching::STRICT);
    /// assert_eq!(RuleSet::new(Vec::new()).path_matching(), PathMatching::default());
    /// ```
    pub fn with_path_matching(rules: Vec<Rule>, global: PathMatching) -> RuleSet {
        RuleSet {
            index: std::sync::OnceLock::new(),
            response_costs: rules.iter().any(|r| r.response_cost().is_some()),
            key_headers: key_headers(&rules),
            rules,
            path_matching: global,
            on_store_error: FailPolicy::Allow,
            version: 1,
        }
    }

    /// The route index, for many rules (built now if it was not).
    fn index(&self) -> Option<&RouteIndex> {
        (self.rules.len() >= INDEX_FROM).then(|| {
            self.index
                .get_or_init(|| RouteIndex::new(&self.rules, self.path_matching))
        })
    }

    /// Builds what deciding with this set needs (its route index) now,
    /// rather than on its first decision: [`Limiter::new`] and
    /// [`Limiter::replace_rules`] call it before the set is in force.
    pub fn prepare(&self) {
        let _ = self.index();
    }

    /// The path matching of rules that set none.
    pub fn path_matching(&self) -> PathMatching {
        self.path_matching
    }

    /// Whether some rule takes its cost from the answer.
    pub fn has_response_costs(&self) -> bool {
        self.response_costs
    }

    /// The headers some rule is keyed by, lower-case, each once.
    pub fn key_headers(&self) -> &[String] {
        &self.key_headers
    }

    /// The rules, in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule at `index`.
    pub fn get(&self, index: usize) -> Option<&Rule> {
        self.rules.get(index)
    }
}

/// A request to decide.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    /// HTTP method, if any.
    pub method: Option<&'a str>,
    /// Path (the API), if any; rules with a route need it.
    pub path: Option<&'a str>,
    /// Identity values.
    pub attrs: &'a (dyn Attributes + Sync),
    /// What the request costs (1 for a plain request).
    pub cost: u64,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

/// Attributes from plain values: what an HTTP check body or a test has.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimpleAttributes<'a> {
    /// The user.
    pub user: Option<&'a str>,
    /// The client IP.
    pub ip: Option<&'a str>,
    /// Headers as `(lower-case name, value)`.
    pub headers: &'a [(&'a str, &'a str)],
    /// Other named values.
    pub descriptors: &'a [(&'a str, &'a str)],
}

impl Attributes for SimpleAttributes<'_> {
    fn user(&self) -> Option<&str> {
        self.user
    }
    fn ip(&self) -> Option<&str> {
        self.ip
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
    fn descriptor(&self, name: &str) -> Option<&str> {
        self.descriptors
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    }
}

/// A decision, with the rules it refers to.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The decision; `RuleDecision::rule` indexes `rules`.
    pub decision: Decision,
    /// The rule set the decision was made under.
    pub rules: Arc<RuleSet>,
    /// Rules that matched the route but were skipped because the request
    /// lacked a part of their key (indexes into `rules`).
    pub skipped: Vec<usize>,
    /// Set when the store failed and the failure policy decided.
    pub store_error: Option<crate::StoreError>,
}

impl Checked {
    /// The rule behind a rule decision.
    pub fn rule(&self, d: &RuleDecision) -> Option<&Rule> {
        self.rules.get(d.rule)
    }
}

/// Matches requests to rules and decides them through a store. Cheap to share
/// behind an `Arc`; rules can be replaced while it serves.
#[derive(Debug)]
pub struct Limiter<S> {
    rules: ArcSwap<RuleSet>,
    store: S,
    /// Keys that decide under a rule of their own (overrides, plans).
    key_rules: ArcSwap<KeyRules>,
    /// Whether `key_rules` has any: the common case reads one flag.
    has_key_rules: std::sync::atomic::AtomicBool,
    /// Sees every decision with its key, if set.
    watch: std::sync::OnceLock<SharedWatch>,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store` with `rules`.
    pub fn new(store: S, rules: RuleSet) -> Limiter<S> {
        rules.prepare();
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            store,
            key_rules: ArcSwap::from_pointee(KeyRules::new()),
            has_key_rules: std::sync::atomic::AtomicBool::new(false),
            watch: std::sync::OnceLock::new(),
        }
    }

    /// Replaces the keys that decide under a rule of their own (see
    /// [`KeyRules`]). Applies to [`check`](Self::check),
    /// [`charge`](Self::charge), [`settle`](Self::settle) and
    /// [`decide`](Self::decide).
    pub fn set_key_rules(&self, key_rules: KeyRules) {
        let any = !key_rules.is_empty();
        self.key_rules.store(Arc::new(key_rules));
        self.has_key_rules
            .store(any, std::sync::atomic::Ordering::Release);
    }

    /// The rule `key` decides under when it matches `rule`: its own if it
    /// has one (see [`set_key_rules`](Self::set_key_rules)), else `rule`.
    pub fn rule_for(&self, rule: &Rule, key: &Key<'_>) -> Option<Arc<Rule>> {
        if !self
            .has_key_rules
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return None;
        }
        self.key_rules.load().get(rule, key).cloned()
    }

    /// Sets the watcher that sees every decision of
    /// [`check`](Self::check) with its key; once (later calls are
    /// ignored and return false).
    pub fn set_watch(&self, watch: SharedWatch) -> bool {
        self.watch.set(watch).is_ok()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// The first header a rule in force is keyed by whose value
    /// `readable` refuses (see [`RuleSet::key_headers`]); cheaper than
    /// [`rules`](Self::rules), and free when no rule is keyed by a header.
    pub fn unreadable_key_header(&self, mut readable: impl FnMut(&str) -> bool) -> Option<String> {
        self.rules
            .load()
            .key_headers
            .iter()
            .find(|h| !readable(h))
            .cloned()
    }

    /// Whether a rule in force takes its cost from the answer (see
    /// [`settle`](Self::settle)); cheaper than [`rules`](Self::rules).
    pub fn has_response_costs(&self) -> bool {
        self.rules.load().response_costs
    }

    /// Replaces the rules. Counters of rules whose name, key and limits are
    /// unchanged carry over (they are keyed by [`Rule::fingerprint`]).
    ///
    /// The swap is one pointer store: no decision waits for it. The old
    /// set is freed by the caller (a reload's blocking thread), not by the
    /// last decision still holding it: freeing a million rules takes a
    /// while, and no request should pay for it. A decision holds a set for
    /// microseconds, so the caller waits (up to a few milliseconds) for
    /// those in flight to let go.
    pub fn replace_rules(&self, rules: RuleSet) {
        rules.prepare();
        let old = self.rules.swap(Arc::new(rules));
        for _ in 0..1_000 {
            if Arc::strong_count(&old) == 1 {
                break;
            }
            std::thread::yield_now();
        }
        drop(old);
    }

    /// Decides `req` against every rule whose route matches it and whose key
    /// parts it has.
    ///
    /// A cost above what a matched rule's limit can ever admit (its
    /// capacity, burst or window limit; the raised one in soft mode) is
    /// denied by that rule before the store is asked: `retry_after` is
    /// [`Nanos::MAX`] ("never"), nothing is charged, `store_error` is
    /// `None`, whatever the store. Only the refusing rules are listed then.
    /// A shadow rule reports such a cost as `ShadowDenied` and lets the
    /// other rules decide.
    ///
    /// A cost of 0 is a check only: it is denied if a rule's key is over
    /// its limit (say, in debt after [`charge`](Self::charge)), and charges
    /// nothing.
    ///
    /// A rule that takes its cost from the answer ([`Rule::response_cost`])
    /// is decided with its `estimate` (0: checked only) instead of
    /// `req.cost`, before the request's other rules; see
    /// [`settle`](Self::settle) for the rest.
    pub async fn check(&self, req: &Request<'_>) -> Checked {
        self.run(req, Ask::Check).await
    }

    /// Charges `req.cost` after the fact (a cost known only once the
    /// request was served, such as the tokens an answer used) to every rule
    /// that applies to `req`, matched as [`check`](Self::check) matches
    /// them. A charge is never refused: one past a limit puts the key in
    /// debt, and later checks are denied until the algorithm has paid it
    /// back. The decision says whether the keys are now over.
    pub async fn charge(&self, req: &Request<'_>) -> Checked {
        self.run(req, Ask::Charge).await
    }

    /// Charges what the answer to `req` cost to the rules that take their
    /// cost from the answer ([`Rule::response_cost`]), after the fact (see
    /// [`charge`](Self::charge)): `cost_of` reads a rule's cost from the
    /// answer (`None`: the answer does not say, and nothing more is
    /// charged), and each rule is charged what exceeds its `estimate`.
    /// Rules are matched to `req` as [`check`](Self::check) matched them.
    /// `None` if nothing was charged.
    pub async fn settle(
        &self,
        req: &Request<'_>,
        cost_of: &(dyn Fn(&Rule) -> Option<u64> + Sync),
    ) -> Option<Checked> {
        let checked = self.run(req, Ask::Settle(cost_of)).await;
        (!checked.decision.rules.is_empty()).then_some(checked)
    }

    async fn run(&self, req: &Request<'_>, ask: Ask<'_>) -> Checked {
        let rules = self.rules.load_full();
        // The rules that apply, with their keys: the first one inline, the
        // others (rare) in a Vec, so the common single-rule request
        // allocates nothing here. (A SmallVec for both measured 5-8 % more
        // user cycles per denied proxy request.)
        let mut first: Option<(usize, Key<'_>)> = None;
        let mut more: Vec<(usize, Key<'_>)> = Vec::new();
        let mut skipped = Vec::new();
        // Routes match the path in its one spelling (`/v1/../admin` is
        // `/admin`; `/admin/` and `/admin;x=1` too unless the global path
        // matching says otherwise), so a respelled path does not step
        // around a rule. Made once; a rule with its own path matching
        // gets it respelled for itself (`applies_to_path`).
        let global = rules.path_matching;
        let path = req.path.map(|p| RequestPath::new(p, global));
        let canonical = path.as_ref().map(RequestPath::canonical);
        // The client IP in its one spelling, and the request's API, for the
        // rules keyed by them (each made at most once, only if needed).
        let ip = std::cell::OnceCell::new();
        // The API's name under each path matching a rule may use (one
        // cell per combination of the four switches; most requests fill
        // only the global one's).
        let routes: [std::cell::OnceCell<Option<String>>; 16] =
            [const { std::cell::OnceCell::new() }; 16];
        // In a block: the closures borrow the cells, and must not be
        // held across the store's await (the future would not be Send).
        {
            // An empty value is no value: `"user": ""`, `?key=` or an empty
            // header skip the rule as a missing one does, on every way in,
            // rather than putting every such caller on one shared counter.
            let given = |p: &KeyPart| req.attrs.part(p).filter(|v| !v.is_empty());
            let value = |p: &KeyPart, matching: PathMatching| -> Option<&str> {
                match p {
                    KeyPart::Ip => ip.get_or_init(|| given(p).map(canonical_ip)).as_deref(),
                    // Named as the rule matches paths: with `head_as_get`,
                    // `HEAD /a/` is `GET /a`, sharing the counter of the
                    // requests it respells.
                    KeyPart::Route => given(p).or_else(|| {
                        routes[matching_bits(matching)]
                            .get_or_init(|| {
                                path.as_ref().map(|path| {
                                    let method = req.method.map(|m| matching.method(m));
                                    api_name(method, &path.canonical_for(matching))
                                })
                            })
                            .as_deref()
                    }),
                    _ => given(p),
                }
            };
            // Every rule in turn, or with many rules those the index offers
            // (the same ones that apply, found without trying each).
            let indexed = rules.index().map(|ix| ix.candidates(canonical));
            let every = indexed.is_none().then(|| 0..rules.rules().len());
            for i in indexed
                .iter()
                .flatten()
                .copied()
                .chain(every.into_iter().flatten())
            {
                let rule = &rules.rules()[i];
                if !rule.applies_to_path(req.method, path.as_ref()) {
                    continue;
                }
                let matching = rule.path_matching().unwrap_or(global);
                let parts = rule.by().parts().iter().map(|p| value(p, matching));
                match Key::try_from_parts(parts) {
                    Some(key) if first.is_none() => first = Some((i, key)),
                    Some(key) => more.push((i, key)),
                    None => skipped.push(i),
                }
            }
        }
        let matched = |j: usize| -> usize {
            match (j, &first) {
                (0, Some((i, _))) => *i,
                _ => more[j - 1].0,
            }
        };
        let key_of = |j: usize| -> Option<&Key<'_>> {
            match (j, &first) {
                (0, Some((_, k))) => Some(k),
                _ => more.get(j.wrapping_sub(1)).map(|(_, k)| k),
            }
        };
        // Keys with a rule of their own (an override, a plan): one flag
        // read when there are none.
        let key_rules = self
            .has_key_rules
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| self.key_rules.load_full());
        let one;
        let many: Vec<Charge<'_>>;
        let charges: &[Charge<'_>] = match &first {
            None => &[],
            Some((i, key)) if more.is_empty() => {
                one = [Charge {
                    rule: pick(&rules, key_rules.as_deref(), *i, key),
                    key,
                }];
                &one
            }
            Some(f) => {
                many = std::iter::once(f)
                    .chain(&more)
                    .map(|(i, key)| Charge {
                        rule: pick(&rules, key_rules.as_deref(), *i, key),
                        key,
                    })
                    .collect();
                &many
            }
        };
        let default = rules.on_store_error;
        let (mut decision, store_error) = match ask {
            Ask::Charge => self.ask(default, charges, req.cost, true).await,
            Ask::Check if !rules.response_costs => {
                self.decide_with(default, charges, req.cost).await
            }
            // Each rule with its own cost, in groups.
            Ask::Check => {
                let cost_of = |r: &Rule| Some(r.response_cost().map_or(req.cost, |c| c.estimate));
                let first = |r: &Rule| r.response_cost().is_some();
                self.in_groups(default, charges, &cost_of, &first, false)
                    .await
            }
            Ask::Settle(read) => {
                let cost_of = |r: &Rule| {
                    let estimate = r.response_cost()?.estimate;
                    read(r)
                        .map(|c| c.saturating_sub(estimate))
                        .filter(|&c| c > 0)
                };
                self.in_groups(default, charges, &cost_of, &|_| false, true)
                    .await
            }
        };
        if let (Some(w), Ask::Check) = (self.watch.get(), &ask) {
            for d in &decision.rules {
                if let Some(key) = key_of(d.rule) {
                    let i = matched(d.rule);
                    w.decided(rules.version, i, &rules.rules()[i], key, d.outcome);
                }
            }
        }
        for d in decision.rules.iter_mut() {
            d.rule = matched(d.rule);
        }
        if let Some(d) = decision.deciding.as_mut() {
            d.rule = matched(d.rule);
        }
        Checked {
            decision,
            rules,
            skipped,
            store_error,
        }
    }
}

/// The rule at `i` of `rules`, or the one `key` has of its own.
fn pick<'r>(rules: &'r RuleSet, own: Option<&'r KeyRules>, i: usize, key: &Key<'_>) -> &'r Rule {
    let rule = &rules.rules()[i];
    own.and_then(|kr| kr.find(rule, key)).unwrap_or(rule)
}

impl<S: Store> Limiter<S> {
    /// Decides `charges` built by the caller (for ways in that match rules
    /// themselves, like the Envoy gRPC API), with the failure policy applied
    /// when the store fails: the decision, and the store's error if any.
    pub async fn decide(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> (Decision, Option<crate::StoreError>) {
        let default = self.rules.load().on_store_error;
        if self
            .has_key_rules
            .load(std::sync::atomic::Ordering::Acquire)
        {
            let kr = self.key_rules.load_full();
            if charges.iter().any(|c| kr.find(c.rule, c.key).is_some()) {
                let own: Vec<Charge<'_>> = charges
                    .iter()
                    .map(|c| Charge {
                        rule: kr.find(c.rule, c.key).unwrap_or(c.rule),
                        key: c.key,
                    })
                    .collect();
                return self.decide_with(default, &own, cost).await;
            }
        }
        self.decide_with(default, charges, cost).await
    }

    /// Charges `charges` built by the caller after the fact (see
    /// [`charge`](Self::charge)): the decision after the charge, and the
    /// store's error if any (the charge is then lost, and the failure
    /// policy answers).
    pub async fn charge_charges(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> (Decision, Option<crate::StoreError>) {
        if charges.is_empty() {
            return (Decision::unlimited(), None);
        }
        let default = self.rules.load().on_store_error;
        self.ask(default, charges, cost, true).await
    }

    /// Decides `charges` through the store, except what no state could
    /// ever admit: a rule with a limit smaller than `cost` denies without
    /// the store (see [`over_cost`]), so the answer is the same whatever
    /// the store, and a cost a store cannot represent (Redis takes 32 bits)
    /// never becomes a store error that a fail-open policy would admit.
    async fn decide_with(
        &self,
        default: FailPolicy,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> (Decision, Option<crate::StoreError>) {
        if charges.is_empty() {
            return (Decision::unlimited(), None);
        }
        // The common case: every rule can admit the cost. One comparison
        // per limit, no allocation.
        if !charges.iter().any(|c| over_cost(c.rule, cost).is_some()) {
            return self.ask(default, charges, cost, false).await;
        }
        let mut refused = RuleDecisions::new();
        let mut rest = Vec::with_capacity(charges.len());
        let mut rest_at = Vec::with_capacity(charges.len());
        for (j, c) in charges.iter().enumerate() {
            match over_cost(c.rule, cost) {
                Some(rd) => refused.push(RuleDecision { rule: j, ..rd }),
                None => {
                    rest.push(*c);
                    rest_at.push(j);
                }
            }
        }
        if refused.iter().any(|d| d.outcome == Outcome::Denied) {
            // Denied whatever the other rules' states: they are not asked
            // (nor charged), and not listed.
            let deciding = refused
                .iter()
                .find(|d| d.outcome == Outcome::Denied)
                .copied();
            let decision = Decision {
                allowed: false,
                wait: Nanos::ZERO,
                deciding,
                rules: refused,
            };
            return (decision, None);
        }
        // Only shadow rules refuse: they report it, and the others decide.
        let (mut decision, error) = if rest.is_empty() {
            (Decision::unlimited(), None)
        } else {
            self.ask(default, &rest, cost, false).await
        };
        for d in decision.rules.iter_mut() {
            d.rule = rest_at[d.rule];
        }
        if let Some(d) = decision.deciding.as_mut() {
            d.rule = rest_at[d.rule];
        }
        if decision.deciding.is_none() {
            decision.deciding = refused.first().copied();
        }
        decision.rules.extend(refused);
        decision.rules.sort_by_key(|d| d.rule);
        (decision, error)
    }

    /// The store's decision (or its charge after the fact, if `after`),
    /// or the failure policy's if it fails.
    async fn ask(
        &self,
        default: FailPolicy,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
    ) -> (Decision, Option<crate::StoreError>) {
        let answer = if after {
            self.store.charge(charges, cost).await
        } else {
            self.store.decide(charges, cost).await
        };
        match answer {
            Ok(d) => (d, None),
            Err(e) => (self.failed(default, charges, cost, after, &e), Some(e)),
        }
    }

    /// The decision when the store failed: each rule's policy, and for
    /// the rules that share, the store's share of their limits.
    fn failed(
        &self,
        default: FailPolicy,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        error: &crate::StoreError,
    ) -> Decision {
        let shares = |c: &Charge<'_>| c.rule.fail_policy().unwrap_or(default) == FailPolicy::Share;
        let mut decision = by_policy(default, charges.iter().map(|c| c.rule));
        if !charges.iter().any(shares) {
            return decision;
        }
        let at: Vec<usize> = (0..charges.len())
            .filter(|&j| shares(&charges[j]))
            .collect();
        let part: Vec<Charge<'_>> = at.iter().map(|&j| charges[j]).collect();
        let Some(mut shared) = self.store.decide_share(&part, cost, after, error) else {
            return decision;
        };
        for rd in shared.rules.iter_mut().chain(shared.deciding.as_mut()) {
            rd.rule = at[rd.rule];
        }
        // The sharing rules' verdicts replace their policy's admission.
        decision.rules.retain(|rd| !at.contains(&rd.rule));
        if decision.deciding.is_some_and(|d| at.contains(&d.rule)) {
            decision.deciding = None;
        }
        let mut out = Decision {
            allowed: decision.allowed,
            wait: Nanos::ZERO,
            deciding: decision.deciding,
            rules: decision.rules,
        };
        merge(&mut out, shared);
        if out.deciding.is_none() {
            out.deciding = out.rules.first().copied();
        }
        out
    }
}

/// What [`Limiter::run`] is asked to do.
#[derive(Clone, Copy)]
enum Ask<'a> {
    /// Decide the request.
    Check,
    /// Charge its cost after the fact.
    Charge,
    /// Charge what the answer says it cost, to the rules that say how.
    Settle(&'a (dyn Fn(&Rule) -> Option<u64> + Sync)),
}

impl<S: Store> Limiter<S> {
    /// Decides (or, if `after`, charges) `charges` in groups of the same
    /// cost, `cost_of` each rule (`None`: leave the rule out): the groups
    /// whose rules are `first` go first, and deciding stops at the first
    /// denial, so nothing is charged to a later group of a denied request.
    /// One store call per group: all-or-none holds within a group; across
    /// groups a request a later group denies keeps what earlier groups
    /// charged (with a checked-only first group, the usual case, nothing).
    async fn in_groups(
        &self,
        default: FailPolicy,
        charges: &[Charge<'_>],
        cost_of: &(dyn Fn(&Rule) -> Option<u64> + Sync),
        first: &(dyn Fn(&Rule) -> bool + Sync),
        after: bool,
    ) -> (Decision, Option<crate::StoreError>) {
        // (not first, cost) -> the charges' indexes, in order.
        let mut groups: Vec<((bool, u64), Vec<usize>)> = Vec::new();
        for (j, c) in charges.iter().enumerate() {
            let Some(cost) = cost_of(c.rule) else {
                continue;
            };
            let at = (!first(c.rule), cost);
            match groups.iter_mut().find(|(k, _)| *k == at) {
                Some((_, v)) => v.push(j),
                None => groups.push((at, vec![j])),
            }
        }
        groups.sort_by_key(|(k, _)| k.0);
        let mut out = Decision::unlimited();
        let mut error = None;
        for ((_, cost), group) in groups {
            let part: Vec<Charge<'_>> = group.iter().map(|&j| charges[j]).collect();
            let (mut d, e) = if after {
                self.ask(default, &part, cost, true).await
            } else {
                self.decide_with(default, &part, cost).await
            };
            error = error.or(e);
            for rd in d.rules.iter_mut().chain(d.deciding.as_mut()) {
                rd.rule = group[rd.rule];
            }
            merge(&mut out, d);
            if !out.allowed && !after {
                break;
            }
        }
        (out, error)
    }
}

/// Folds the decision of one group of rules into that of the others.
fn merge(into: &mut Decision, d: Decision) {
    let deciding = match (into.deciding, d.deciding) {
        (None, x) | (x, None) => x,
        // The first denial decides; among admissions, the one with less left.
        (Some(a), Some(b)) => Some(if !into.allowed {
            a
        } else if !d.allowed || b.verdict.remaining < a.verdict.remaining {
            b
        } else {
            a
        }),
    };
    into.allowed &= d.allowed;
    into.wait = if into.allowed {
        into.wait.max(d.wait)
    } else {
        Nanos::ZERO
    };
    into.deciding = deciding;
    into.rules.extend(d.rules);
    into.rules.sort_by_key(|r| r.rule);
}

/// How `rule` answers a request of `cost` that one of its limits can never
/// admit, whatever the client's state: `None` if every limit can.
///
/// A limit's [`size`](spillway_core::Limit::size) (capacity, burst or
/// window limit) is the most that a fresh state admits at once, and no
/// state admits more; in soft mode the raised limits count. The answer is
/// a denial that never clears (`retry_after` is [`Nanos::MAX`], as core
/// says "never"), reporting the limit that refused; a shadow rule reports
/// it as `ShadowDenied` and lets the request through. `remaining` is 0:
/// the state was not read. The rule index is 0 (the caller sets it).
fn over_cost(rule: &Rule, cost: u64) -> Option<RuleDecision> {
    if rule.is_blocked() {
        return Some(RuleDecision {
            rule: 0,
            limit: 0,
            verdict: spillway_core::Verdict::never(rule.limits().first().map_or(0, |l| l.size())),
            outcome: if rule.mode() == Mode::Shadow {
                Outcome::ShadowDenied
            } else {
                Outcome::Denied
            },
        });
    }
    let (li, limit) = rule
        .enforced_limits()
        .iter()
        .enumerate()
        .find(|(_, l)| cost > l.size())?;
    let shadow = rule.mode() == Mode::Shadow;
    Some(RuleDecision {
        rule: 0,
        limit: li,
        verdict: spillway_core::Verdict::never(limit.size()),
        outcome: if shadow {
            Outcome::ShadowDenied
        } else {
            Outcome::Denied
        },
    })
}

/// The decision when the store is unavailable: each rule's own failure
/// policy, or the rule set's; a shadow rule never denies. A rule that
/// shares admits here: [`Limiter::failed`] puts the store's share in its
/// place when the store keeps one.
fn by_policy<'a>(default: FailPolicy, rules: impl Iterator<Item = &'a Rule>) -> Decision {
    let mut out = Decision::unlimited();
    for (ri, rule) in rules.enumerate() {
        let policy = rule.fail_policy().unwrap_or(default);
        let deny = policy == FailPolicy::Deny && rule.mode() != Mode::Shadow;
        let size = rule.limits().first().map_or(0, |l| l.size());
        let verdict = spillway_core::Verdict {
            allowed: !deny,
            limit: size,
            remaining: 0,
            reset: Nanos::ZERO,
            retry_after: if deny {
                Nanos::from_secs(1)
            } else {
                Nanos::ZERO
            },
            wait: Nanos::ZERO,
        };
        let rd = RuleDecision {
            rule: ri,
            limit: 0,
            verdict,
            outcome: if deny {
                Outcome::Denied
            } else {
                Outcome::Allowed
            },
        };
        if deny && out.allowed {
            out.allowed = false;
            out.deciding = Some(rd);
        }
        out.rules.push(rd);
    }
    if out.allowed {
        out.deciding = out.rules.first().copied();
    }
    out
}

/// The four switches of `m` as a number below 16.
fn matching_bits(m: PathMatching) -> usize {
    usize::from(m.trailing_slash)
        | usize::from(m.path_params) << 1
        | usize::from(m.encoded_slash) << 2
        | usize::from(m.head_as_get) << 3
}

/// A request's API as a `route` key sees it: `METHOD /path`, the method
/// upper-cased, in one allocation.
fn api_name(method: Option<&str>, path: &str) -> String {
    let mut s = String::with_capacity(method.map_or(0, |m| m.len() + 1) + path.len());
    if let Some(m) = method {
        s.extend(m.chars().map(|c| c.to_ascii_uppercase()));
        s.push(' ');
    }
    s.push_str(path);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, SimpleAttributes, block_on};
    use spillway_core::{FixedWindow, KeySpec, Limit, ManualClock};

    /// A limiter over `rules` on the memory store.
    fn limiter(rules: Vec<Rule>) -> Limiter<MemoryStore<ManualClock>> {
        let store = MemoryStore::new(ManualClock::new(Nanos::from_secs(1)), Default::default());
        Limiter::new(store, RuleSet::new(rules))
    }

    /// Decides one request of cost 1.
    fn decide(
        limiter: &Limiter<MemoryStore<ManualClock>>,
        method: Option<&str>,
        path: Option<&str>,
        attrs: SimpleAttributes<'_>,
    ) -> Checked {
        let req = Request {
            method,
            path,
            attrs: &attrs,
            cost: 1,
        };
        block_on(limiter.check(&req))
    }

    /// The names of the rules that decided a request of user `u`.
    fn deciding(
        limiter: &Limiter<MemoryStore<ManualClock>>,
        method: Option<&str>,
        path: &str,
    ) -> Vec<String> {
        let user = SimpleAttributes {
            user: Some("u"),
            ..Default::default()
        };
        let checked = decide(limiter, method, Some(path), user);
        checked
            .decision
            .rules
            .iter()
            .map(|d| checked.rule(d).unwrap().name().to_string())
            .collect()
    }

    fn routed(i: usize, route: Option<&str>) -> Rule {
        let limit = Limit::FixedWindow(FixedWindow::new(2, Nanos::from_secs(60)).unwrap());
        let route = route.map(|r| spillway_core::Route::parse(r).unwrap());
        Rule::new(
            format!("r{i}"),
            route,
            KeySpec::parse("user").unwrap(),
            vec![limit],
            Mode::Hard,
        )
        .unwrap()
    }

    /// Path matchings for rules and rule sets: the extremes and one switch off each.
    fn matchings() -> Vec<PathMatching> {
        let l = PathMatching::LENIENT;
        vec![
            l,
            PathMatching::STRICT,
            PathMatching {
                trailing_slash: false,
                ..l
            },
            PathMatching {
                path_params: false,
                ..l
            },
            PathMatching {
                encoded_slash: false,
                ..l
            },
            PathMatching {
                head_as_get: false,
                ..l
            },
            PathMatching {
                case_insensitive: true,
                ..l
            },
        ]
    }

    proptest::proptest! {
        /// With many rules the index offers exactly the rules a scan finds,
        /// whatever the global path matching and the rules' own.
        #[test]
        fn the_route_index_finds_what_a_scan_finds(
            routes in proptest::collection::vec(
                (
                    proptest::option::weighted(0.9, (
                        proptest::sample::select(vec!["", "GET ", "POST "]),
                        proptest::collection::vec(
                            proptest::sample::select(vec!["v1", "v2", "users", "{id}", "x", "a;b"]),
                            0..4,
                        ),
                        proptest::bool::ANY,
                    )),
                    proptest::option::weighted(0.3, proptest::sample::select(matchings())),
                ),
                INDEX_FROM..40,
            ),
            global in proptest::sample::select(matchings()),
            paths in proptest::collection::vec(
                (
                    proptest::option::of(proptest::sample::select(vec!["GET", "post", "PUT", "HEAD"])),
                    proptest::collection::vec(
                        proptest::sample::select(vec![
                            "v1", "v2", "users", "7", "x", "", "v1;p=1", "..;", "v1%2Fusers", "a;b",
                        ]),
                        0..5,
                    ),
                    proptest::sample::select(vec!["", "?q=1", "#f", "/"]),
                    proptest::bool::ANY,
                ),
                1..20,
            ),
        ) {
            let rules: Vec<Rule> = routes
                .iter()
                .enumerate()
                .map(|(i, (r, own))| {
                    let text = r.as_ref().map(|(m, segs, prefix)| {
                        let mut t = format!("{m}/{}", segs.join("/"));
                        if *prefix {
                            t.push_str(if segs.is_empty() { "*" } else { "/*" });
                        }
                        t
                    });
                    let rule = routed(i, text.as_deref());
                    match own {
                        Some(m) => rule.with_path_matching(*m),
                        None => rule,
                    }
                })
                .collect();
            let index = RouteIndex::new(&rules, global);
            for (method, segs, tail, rooted) in &paths {
                let path = format!("{}{}{tail}", if *rooted { "/" } else { "" }, segs.join("/"));
                for path in [Some(path.as_str()), None] {
                    let m = method.as_deref();
                    let path = path.map(|p| RequestPath::new(p, global));
                    let applies = |i: &usize| rules[*i].applies_to_path(m, path.as_ref());
                    let scan: Vec<usize> = (0..rules.len()).filter(applies).collect();
                    let found: Vec<usize> = index
                        .candidates(path.as_ref().map(RequestPath::canonical))
                        .into_iter()
                        .filter(applies)
                        .collect();
                    proptest::prop_assert_eq!(&found, &scan, "{:?} {:?}", m, path);
                }
            }
        }
    }

    /// Through `check`: with enough rules for the index, a request is
    /// decided by exactly the rules whose routes match it, in file order.
    #[test]
    fn many_rules_decide_by_the_matching_ones() {
        let mut rules: Vec<Rule> = (0..20)
            .map(|i| routed(i, Some(&format!("GET /v1/r{}/{{id}}", i % 10))))
            .collect();
        rules.push(routed(20, None));
        rules.push(routed(21, Some("/v1/*")));
        assert!(rules.len() >= INDEX_FROM);
        let limiter = limiter(rules);
        let names = |method: Option<&str>, path: &str| deciding(&limiter, method, path);
        assert_eq!(
            names(Some("GET"), "/v1/r7/abc"),
            ["r7", "r17", "r20", "r21"]
        );
        assert_eq!(names(Some("POST"), "/v1/r7/abc"), ["r20", "r21"]);
        assert_eq!(names(Some("GET"), "/v2/r7/abc"), ["r20"]);
    }

    /// An empty value skips the rule as a missing one does: callers that
    /// send `"user": ""` do not all share one counter.
    #[test]
    fn an_empty_value_is_a_missing_one() {
        let limit = Limit::FixedWindow(FixedWindow::new(1, Nanos::from_secs(60)).unwrap());
        let rules = ["user", "ip", "header:x-api-key", "tenant"]
            .iter()
            .map(|by| {
                Rule::new(
                    *by,
                    None,
                    KeySpec::parse(by).unwrap(),
                    vec![limit.clone()],
                    Mode::Hard,
                )
                .unwrap()
            })
            .collect();
        let limiter = limiter(rules);
        let attrs = SimpleAttributes {
            user: Some(""),
            ip: Some(""),
            headers: &[("x-api-key", "")],
            descriptors: &[("tenant", "")],
        };
        for _ in 0..3 {
            let checked = decide(&limiter, None, None, attrs);
            assert!(checked.decision.allowed);
            assert!(checked.decision.rules.is_empty());
            assert_eq!(checked.skipped, [0, 1, 2, 3]);
        }
        // A value, however short, is a key.
        let attrs = SimpleAttributes {
            user: Some("a"),
            ..Default::default()
        };
        assert!(decide(&limiter, None, None, attrs).decision.allowed);
        assert!(!decide(&limiter, None, None, attrs).decision.allowed);
    }

    /// A path spelled another way (dot segments, doubled slashes, escaped
    /// letters) meets the rule for the path it resolves to, with or
    /// without the route index.
    #[test]
    fn a_respelled_path_meets_the_rule_for_its_path() {
        for extra in [0, INDEX_FROM] {
            let mut rules = vec![routed(0, Some("GET /admin"))];
            rules.extend((1..=extra).map(|i| routed(i, Some(&format!("/other{i}")))));
            let limiter = limiter(rules);
            let decided_by = |path: &str| deciding(&limiter, Some("GET"), path);
            for path in ["/v1/../admin", "//admin", "/%61dmin", "/./admin?x=1"] {
                assert_eq!(decided_by(path), ["r0"], "{path} with {extra} more rules");
            }
            assert!(decided_by("/admin/x").is_empty());
        }
    }

    /// `by: user+route` under a prefix rule: one counter per user and
    /// endpoint (method and path, in the path's one spelling).
    #[test]
    fn a_route_key_counts_each_endpoint_apart() {
        let limit = Limit::FixedWindow(FixedWindow::new(1, Nanos::from_secs(60)).unwrap());
        let rule = Rule::new(
            "per-endpoint",
            Some(spillway_core::Route::parse("/v1/*").unwrap()),
            KeySpec::parse("user+route").unwrap(),
            vec![limit],
            Mode::Hard,
        )
        .unwrap();
        assert_eq!(rule.by().to_string(), "user+route");
        let limiter = limiter(vec![rule]);
        let check = |method: &str, path: &str, user: &str| {
            let attrs = SimpleAttributes {
                user: Some(user),
                ..Default::default()
            };
            decide(&limiter, Some(method), Some(path), attrs)
                .decision
                .allowed
        };
        assert!(check("GET", "/v1/a", "u"));
        assert!(check("GET", "/v1/b", "u"), "another endpoint");
        assert!(check("POST", "/v1/a", "u"), "another method");
        assert!(check("GET", "/v1/a", "w"), "another user");
        assert!(!check("get", "/v1/a", "u"));
        assert!(
            !check("GET", "/v1/x/../a?q=1", "u"),
            "the same endpoint respelled"
        );
    }

    /// Every way in (HTTP body, tower identity, gRPC descriptor) hands the
    /// limiter an IP as text: one address however spelled is one client.
    #[test]
    fn an_ipv6_address_spelled_two_ways_is_one_client() {
        let limit = Limit::FixedWindow(FixedWindow::new(2, Nanos::from_secs(60)).unwrap());
        let rule = Rule::new(
            "r",
            None,
            KeySpec::parse("ip").unwrap(),
            vec![limit],
            Mode::Hard,
        )
        .unwrap();
        let limiter = limiter(vec![rule]);
        let check = |ip: &str| {
            let attrs = SimpleAttributes {
                ip: Some(ip),
                ..Default::default()
            };
            decide(&limiter, None, None, attrs).decision.allowed
        };
        assert!(check("2001:db8::7"));
        assert!(check("2001:DB8:0:0::7"));
        assert!(
            !check("2001:0db8::0007"),
            "a third spelling is the same client"
        );
        assert!(check("::ffff:192.0.2.1"));
        assert!(check("192.0.2.1"));
        assert!(!check("::FFFF:192.0.2.1"));
    }
}
