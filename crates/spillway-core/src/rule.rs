//! Rules: which requests a limit applies to, how clients are told apart, and
//! what happens when a limit is exceeded.

use std::fmt;

use crate::algo::Limit;
use crate::error::{Error, ErrorKind};
use crate::path::{PathMatching, RequestPath};

/// What happens when a rule's limits are exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Deny (the default).
    #[default]
    Hard,
    /// Admit up to `percent` % above every limit, and say so.
    Soft {
        /// How far above each limit requests are still admitted.
        percent: u32,
    },
    /// Never deny; report what a hard rule would have done.
    Shadow,
    /// Admit up to the reach (N % of every limit) while the service has
    /// room, shrinking smoothly to the plain limit as its health degrades
    /// or becomes unknown; say when a request was admitted above the
    /// plain limit (see [`Rule::with_health`]).
    Elastic(crate::Elastic),
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Hard => f.write_str("hard"),
            Mode::Soft { percent } => write!(f, "soft {percent}%"),
            Mode::Shadow => f.write_str("shadow"),
            Mode::Elastic(e) => write!(f, "elastic {}%", e.percent()),
        }
    }
}

/// How much a rule's traffic matters when the service behind it is
/// overloaded: under overload `Sheddable` traffic is refused first and
/// `Critical` last. Ordered from least to most important.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Refused first (batch jobs, prefetches, retries).
    Sheddable,
    /// Neither (the default).
    #[default]
    Default,
    /// Refused last (logins, payments, health of the business).
    Critical,
}

impl Priority {
    /// Every priority, least important first.
    pub const ALL: [Priority; 3] = [Priority::Sheddable, Priority::Default, Priority::Critical];

    /// The name the configuration and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Sheddable => "sheddable",
            Priority::Default => "default",
            Priority::Critical => "critical",
        }
    }

    /// Reads a name as written in the configuration.
    pub fn parse(s: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailPolicy {
    /// Admit (fail open).
    #[default]
    Allow,
    /// Deny (fail closed).
    Deny,
    /// Each instance enforces its share of the limit, `limit / N`, N being
    /// the live instances it last saw through the store (see
    /// [`Rule::shared`]). A store that keeps no share admits, as `Allow`.
    Share,
}

/// One part of a client's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// The authenticated user (or API key) the caller names.
    User,
    /// The client's IP address.
    Ip,
    /// A request header, by lower-case name.
    Header(String),
    /// The request's API, `METHOD /path` (the path in its one spelling, see
    /// [`canonical_path`](crate::canonical_path)): one counter per endpoint,
    /// e.g. `user+route` under a prefix rule. A descriptor named `route`,
    /// if the request carries one, is used instead.
    Route,
    /// Any other named value (an Envoy descriptor entry, a tenant id, ...).
    Descriptor(String),
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::User => f.write_str("user"),
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Descriptor(d) => f.write_str(d),
        }
    }
}

/// How a rule tells clients apart: one or more [`KeyPart`]s, joined by `+`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeySpec {
    parts: Vec<KeyPart>,
}

/// A byte of an RFC 9110 token (a header name).
fn header_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl KeySpec {
    /// Parses `user`, `ip`, `user+ip`, `header:<Name>`, `route` or any
    /// descriptor name, and combinations joined with `+`.
    ///
    /// # Errors
    /// An empty part, or a header part with no name.
    pub fn parse(s: &str) -> Result<KeySpec, Error> {
        let mut parts = Vec::new();
        for raw in s.split('+') {
            let p = raw.trim();
            if p.is_empty() {
                return Err(ErrorKind::BadKey(format!("empty part in {s:?}")).into());
            }
            let part = match p {
                "user" => KeyPart::User,
                "ip" => KeyPart::Ip,
                "route" => KeyPart::Route,
                _ => match p.strip_prefix("header:") {
                    // A name no request can carry would key nothing.
                    Some(h) if !h.trim().is_empty() && !h.trim().bytes().all(header_byte) => {
                        return Err(ErrorKind::BadKey(format!(
                            "the header name in {s:?} is not a token (RFC 9110: letters, digits and !#$%&'*+-.^_`|~)"
                        ))
                        .into());
                    }
                    Some(h) if !h.trim().is_empty() => {
                        KeyPart::Header(h.trim().to_ascii_lowercase())
                    }
                    Some(_) => {
                        return Err(ErrorKind::BadKey(format!("no header name in {s:?}")).into());
                    }
                    None => KeyPart::Descriptor(p.to_string()),
                },
            };
            if parts.contains(&part) {
                return Err(ErrorKind::BadKey(format!("{part} appears twice in {s:?}")).into());
            }
            parts.push(part);
        }
        Ok(KeySpec { parts })
    }

    /// A spec from parts; an empty list keys every request to one shared counter.
    pub fn from_parts(parts: Vec<KeyPart>) -> KeySpec {
        KeySpec { parts }
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[KeyPart] {
        &self.parts
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// A route pattern: an optional method and a path of literal segments,
/// `{param}` segments (match any one segment) and an optional trailing `*`
/// (matches the rest of the path, including nothing).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// The route as written (trimmed); the method and the literal
    /// segments are read from it, not copied: a million routes cost two
    /// allocations each, not six.
    text: Box<str>,
    /// The method's length at the start of `text` (0: any method).
    method: u8,
    segments: Box<[Segment]>,
    prefix: bool,
}

/// A segment of a route's path: a literal (where it is in the route's
/// text) or a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Segment {
    Literal { start: u32, len: u32 },
    Param,
}

impl Route {
    /// Parses `"METHOD /path"` or `"/path"`.
    ///
    /// # Errors
    /// A path that does not start with `/`, an empty method, `*` anywhere but the end.
    pub fn parse(s: &str) -> Result<Route, Error> {
        let text = s.trim();
        let (method, path) = match text.split_once(char::is_whitespace) {
            Some((m, p)) => (Some(m), p.trim()),
            None => (None, text),
        };
        if let Some(m) = method
            && (!m.bytes().all(|b| b.is_ascii_alphabetic()) || m.len() > 64)
        {
            let m = m.to_ascii_uppercase();
            return Err(ErrorKind::BadRoute(format!("{m:?} is not an HTTP method")).into());
        }
        if text.len() > u32::MAX as usize {
            return Err(ErrorKind::BadRoute("route longer than 4 GiB".to_string()).into());
        }
        // The method upper-case, then the path as written.
        let text: String = match method {
            Some(m) => format!("{} {path}", m.to_ascii_uppercase()),
            None => path.to_string(),
        };
        let path_at = text.len() - path.len();
        let path = &text[path_at..];
        let Some(rest) = path.strip_prefix('/') else {
            return Err(ErrorKind::BadRoute(format!("path {path:?} must start with /")).into());
        };
        let mut segments = Vec::new();
        let mut prefix = false;
        let raw: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        for (i, seg) in raw.iter().enumerate() {
            if *seg == "*" {
                if i + 1 != raw.len() {
                    return Err(ErrorKind::BadRoute(format!("* must be last in {path:?}")).into());
                }
                prefix = true;
            } else if seg.starts_with('{') && seg.ends_with('}') && seg.len() > 2 {
                segments.push(Segment::Param);
            } else if seg.contains(['{', '}', '*']) {
                return Err(ErrorKind::BadRoute(format!("bad segment {seg:?} in {path:?}")).into());
            } else {
                // `seg` is a slice of `text`: where it is.
                let start = seg.as_ptr() as usize - text.as_ptr() as usize;
                segments.push(Segment::Literal {
                    start: start as u32,
                    len: seg.len() as u32,
                });
            }
        }
        Ok(Route {
            method: method.map_or(0, |m| m.len() as u8),
            segments: segments.into_boxed_slice(),
            prefix,
            text: text.into_boxed_str(),
        })
    }

    /// True if a request with `method` (may be absent) and `path` (in its
    /// [canonical form](crate::canonical_path)) matches, under the default
    /// [`PathMatching`]: a route for `GET` matches `HEAD` too, and a
    /// trailing `/` on the route or the path is ignored. A route with a
    /// method never matches a request without one.
    ///
    /// ```
    /// use spillway_core::{Route, canonical_path};
    /// let r = Route::parse("GET /a")?;
    /// for path in ["/a", "/a/", "/a;x=1", "/b/..;/a", "/b%2F..%2Fa"] {
    ///     assert!(r.matches(Some("HEAD"), &canonical_path(path)), "{path}");
    /// }
    /// # Ok::<(), spillway_core::Error>(())
    /// ```
    pub fn matches(&self, method: Option<&str>, path: &str) -> bool {
        self.matches_with(method, path, PathMatching::default())
    }

    /// [`Route::matches`] under `matching`: `path` should be in its
    /// canonical form under the same options
    /// ([`canonical_path_with`](crate::canonical_path_with)); here
    /// `matching` decides whether `HEAD` counts as `GET` and whether a
    /// trailing `/` is ignored.
    pub fn matches_with(&self, method: Option<&str>, path: &str, matching: PathMatching) -> bool {
        if let Some(m) = self.method() {
            match method {
                Some(rm) if rm.eq_ignore_ascii_case(m) => {}
                Some(rm)
                    if matching.head_as_get && m == "GET" && rm.eq_ignore_ascii_case("HEAD") => {}
                _ => return false,
            }
        }
        let path = path.split(['?', '#']).next().unwrap_or("");
        let (path, want) = if matching.trailing_slash {
            let path = match path.strip_suffix('/') {
                Some(p) if !p.is_empty() => p,
                _ => path,
            };
            (path, self.segments_but_trailing())
        } else {
            (path, &self.segments[..])
        };
        let literal = |start: u32, len: u32| &self.text[start as usize..(start + len) as usize];
        let Some(mut segs) = Route::segments_of(path) else {
            return false;
        };
        for want in want {
            match (want, segs.next()) {
                (&Segment::Literal { start, len }, Some(got))
                    if literal(start, len) == got
                        || (matching.case_insensitive
                            && literal(start, len).eq_ignore_ascii_case(got)) => {}
                (Segment::Param, Some(got)) if !got.is_empty() => {}
                _ => return false,
            }
        }
        self.prefix || segs.next().is_none()
    }

    /// The route as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The method, upper-case, if the route names one.
    fn method(&self) -> Option<&str> {
        (self.method > 0).then(|| &self.text[..usize::from(self.method)])
    }

    /// The segments without the empty one a trailing `/` leaves.
    fn segments_but_trailing(&self) -> &[Segment] {
        match self.segments.split_last() {
            Some((Segment::Literal { len: 0, .. }, rest)) => rest,
            _ => &self.segments,
        }
    }

    /// The literal segments the route starts with, up to its first
    /// parameter, leaving out the empty segment of a trailing `/`: every
    /// path it matches (under any [`PathMatching`]) starts with them (for
    /// an index of many routes).
    pub fn literal_prefix(&self) -> impl Iterator<Item = &str> {
        self.segments_but_trailing().iter().map_while(|s| match *s {
            Segment::Literal { start, len } => {
                Some(&self.text[start as usize..(start + len) as usize])
            }
            Segment::Param => None,
        })
    }

    /// A request path's segments as routes see them (query and fragment
    /// dropped; `/` has none); `None` for a path that does not start with
    /// `/`, which no route matches.
    pub fn segments_of(path: &str) -> Option<impl Iterator<Item = &str>> {
        let path = path.split(['?', '#']).next().unwrap_or("");
        let rest = path.strip_prefix('/')?;
        Some(
            (!rest.is_empty())
                .then(|| rest.split('/'))
                .into_iter()
                .flatten(),
        )
    }
}

/// What [`Attributes::header`] gives for a value that is there but cannot
/// be read (not text, or sent twice with different values): one key for
/// every such value, so a rule keyed by the header limits them together.
/// `None` would say the header is missing, and skip the rule.
pub const UNREADABLE_HEADER: &str = "\u{fffd}unreadable";

/// Where a request's identity values come from.
pub trait Attributes {
    /// The user, if the caller knows one.
    fn user(&self) -> Option<&str>;
    /// The client IP, if known.
    fn ip(&self) -> Option<&str>;
    /// A header by lower-case name: `None` only when it is not sent, and
    /// [`UNREADABLE_HEADER`] when it is but cannot be read (a way in
    /// should refuse such a request before it asks; this is for rules
    /// reloaded in between).
    fn header(&self, name: &str) -> Option<&str>;
    /// Any other named value.
    fn descriptor(&self, name: &str) -> Option<&str>;

    /// The value of one key part.
    fn part(&self, part: &KeyPart) -> Option<&str> {
        match part {
            KeyPart::User => self.user(),
            KeyPart::Ip => self.ip(),
            KeyPart::Header(h) => self.header(h),
            KeyPart::Route => self.descriptor("route"),
            KeyPart::Descriptor(d) => self.descriptor(d),
        }
    }
}

/// A rule: a route, a key, limits that must all admit, and a mode.
///
/// Cheap to clone: what the rule says is behind one `Arc`, so the copies a
/// server keeps (the rule set in force, the file's set the admin API's
/// rules are composed with, a rule set being built beside it on reload)
/// share it instead of holding a million rules two or three times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    body: std::sync::Arc<RuleBody>,
    /// Where an elastic rule reads the service's health (none: its plain
    /// limits). Beside the body: each server sets its own gauge on rules
    /// it shares with its configuration.
    health: Option<std::sync::Arc<crate::HealthGauge>>,
}

/// The limits a soft or an elastic rule enforces beside its own.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Extra {
    /// `limits` raised by the soft percentage; empty unless the mode is soft.
    soft_limits: Vec<Limit>,
    /// An elastic rule's limits at each step of its reach (step `k` at
    /// `k - 1`, for 1 to [`LEVELS`](crate::elastic::LEVELS)); empty
    /// unless the mode is elastic.
    elastic_limits: Vec<Vec<Limit>>,
}

/// Shares what rules share: rules of the same key, or of the same limits,
/// point at one copy of them ([`Rule::interned`]). A file of a million
/// rules has a few dozen distinct keys and limit sets.
#[derive(Debug, Default)]
pub struct RuleInterner {
    keys: std::collections::HashMap<KeySpec, std::sync::Arc<KeySpec>>,
    /// By their `Debug` text (limits are not `Hash`), which names every
    /// parameter.
    limits: std::collections::HashMap<String, std::sync::Arc<[Limit]>>,
}

/// What a [`Rule`] says, shared by its clones.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RuleBody {
    name: Box<str>,
    route: Option<Route>,
    /// Shared with every rule of the same key (see [`RuleInterner`]).
    by: std::sync::Arc<KeySpec>,
    /// Shared with every rule of the same limits (see [`RuleInterner`]).
    limits: std::sync::Arc<[Limit]>,
    /// What soft and elastic rules add; `None` for the others (most), so
    /// they do not carry two empty lists.
    extra: Option<Box<Extra>>,
    mode: Mode,
    on_store_error: Option<FailPolicy>,
    /// The rule's own path matching, if it sets one (else the limiter's).
    path_matching: Option<PathMatching>,
    /// Where the cost comes from when it is known only after the answer.
    response_cost: Option<ResponseCost>,
    /// Every request is refused, whatever the state (an operator's block).
    blocked: bool,
    /// How much its traffic matters under overload, if the rule says.
    priority: Option<Priority>,
    fingerprint: u64,
}

/// A cost known only once the request was served, read from the answer:
/// the request is checked (or charged `estimate`) before it is served,
/// and charged the rest once the answer says what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    /// The response header (or trailer) that carries the cost, lower-case.
    pub header: String,
    /// What the request is charged before it is served (0: only checked).
    /// The answer's cost beyond it is charged afterwards; an answer that
    /// cost less is not refunded (a refund has no inverse in a window that
    /// turned over, and could race a concurrent admission). Charged with
    /// the check, atomically, it is what bounds a key's requests in flight
    /// at once: with 0, every concurrent request passes before the first
    /// answer's charge lands.
    pub estimate: u64,
}

impl Rule {
    /// A rule named `name` (unique within a rule set).
    ///
    /// # Errors
    /// No limits.
    pub fn new(
        name: impl Into<String>,
        route: Option<Route>,
        by: KeySpec,
        limits: Vec<Limit>,
        mode: Mode,
    ) -> Result<Rule, Error> {
        if limits.is_empty() {
            return Err(ErrorKind::NoLimits.into());
        }
        let soft_limits = match mode {
            Mode::Soft { percent } => limits.iter().map(|l| l.scaled(percent)).collect(),
            _ => Vec::new(),
        };
        let elastic_limits = match mode {
            Mode::Elastic(e) => (1..=crate::elastic::LEVELS)
                .map(|k| {
                    let extra = e.extra_percent_at(k);
                    limits.iter().map(|l| l.scaled(extra)).collect()
                })
                .collect(),
            _ => Vec::new(),
        };
        let name = name.into();
        // The fingerprint names the rule's counters: a rule whose key or
        // limits change gets fresh counters, an unchanged one keeps its own
        // across reloads (the mode and route do not enter it).
        let fingerprint = fnv1a(format!("{name}\u{0}{by:?}\u{0}{limits:?}").as_bytes());
        let extra = (!soft_limits.is_empty() || !elastic_limits.is_empty()).then(|| {
            Box::new(Extra {
                soft_limits,
                elastic_limits,
            })
        });
        Ok(Rule {
            body: std::sync::Arc::new(RuleBody {
                name: name.into_boxed_str(),
                route,
                by: std::sync::Arc::new(by),
                limits: limits.into(),
                extra,
                mode,
                on_store_error: None,
                path_matching: None,
                response_cost: None,
                blocked: false,
                priority: None,
                fingerprint,
            }),
            health: None,
        })
    }

    /// This rule with other limits (a key's plan or an operator's
    /// override): same name, route, key, mode and policies; counters of
    /// their own (the fingerprint covers the limits), so a key moved to
    /// other limits starts fresh under them, and back again finds its old
    /// counters if they have not expired.
    ///
    /// # Errors
    /// No limits.
    pub fn with_limits(&self, limits: Vec<Limit>) -> Result<Rule, Error> {
        let mut rule = Rule::new(
            self.body.name.to_string(),
            self.body.route.clone(),
            KeySpec::clone(&self.body.by),
            limits,
            self.body.mode,
        )?;
        rule.body_mut().on_store_error = self.body.on_store_error;
        rule.body_mut().path_matching = self.body.path_matching;
        rule.body_mut().response_cost = self.body.response_cost.clone();
        rule.body_mut().priority = self.body.priority;
        rule.health = self.health.clone();
        Ok(rule)
    }

    /// This rule refusing every request whatever its counters (an
    /// operator's block of one key); a shadow rule reports the refusal
    /// and admits. Same counters as the rule.
    pub fn blocked(&self) -> Rule {
        let mut rule = self.clone();
        rule.body_mut().blocked = true;
        rule
    }

    /// This rule with its key and limits shared with the rules of `pool`
    /// that have the same (and added to it): the same rule, in fewer
    /// bytes. Builders of many rules (a rules file) call it on each.
    pub fn interned(mut self, pool: &mut RuleInterner) -> Rule {
        let by = pool
            .keys
            .entry(KeySpec::clone(&self.body.by))
            .or_insert_with(|| self.body.by.clone())
            .clone();
        let text = format!("{:?}", self.body.limits);
        let limits = pool
            .limits
            .entry(text)
            .or_insert_with(|| self.body.limits.clone())
            .clone();
        let body = self.body_mut();
        body.by = by;
        body.limits = limits;
        self
    }

    /// The body to change (copied first if another clone shares it).
    fn body_mut(&mut self) -> &mut RuleBody {
        std::sync::Arc::make_mut(&mut self.body)
    }

    /// Sets how much this rule's traffic matters under overload. Does not
    /// change the rule's counters.
    pub fn with_priority(mut self, priority: Priority) -> Rule {
        self.body_mut().priority = Some(priority);
        self
    }

    /// How much this rule's traffic matters under overload, if it says.
    pub fn priority(&self) -> Option<Priority> {
        self.body.priority
    }

    /// Whether every request is refused (see [`Rule::blocked`]).
    pub fn is_blocked(&self) -> bool {
        self.body.blocked
    }

    /// Takes this rule's cost from the answer (see [`ResponseCost`]).
    /// Does not change the rule's counters.
    pub fn with_response_cost(mut self, cost: ResponseCost) -> Rule {
        self.body_mut().response_cost = Some(ResponseCost {
            header: cost.header.to_ascii_lowercase(),
            ..cost
        });
        self
    }

    /// Where the cost comes from if it is known only after the answer.
    pub fn response_cost(&self) -> Option<&ResponseCost> {
        self.body.response_cost.as_ref()
    }

    /// What an answer whose cost header (or trailer) reads `value` cost:
    /// the whole number it writes (surrounding spaces aside). A value that
    /// is not one (a word, a fraction, a negative, past `u64`, not text)
    /// is `Err` with what it is charged instead: the size of the rule's
    /// largest limit, the most one request can be worth (count when in
    /// doubt; charging nothing let an answer that could not be read pass
    /// uncounted). The caller logs it.
    ///
    /// # Errors
    /// The charge for an unreadable value, as above.
    pub fn answered_cost(&self, value: &[u8]) -> Result<u64, u64> {
        std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| self.limits().iter().map(Limit::size).max().unwrap_or(0))
    }

    /// Sets this rule's own store-failure policy.
    pub fn with_fail_policy(mut self, policy: FailPolicy) -> Rule {
        self.body_mut().on_store_error = Some(policy);
        self
    }

    /// Sets which respellings of a path this rule counts as the path
    /// (instead of the limiter's global [`PathMatching`]): e.g. a rule for
    /// an upstream that serves `/a` and `/a/` differently turns
    /// `trailing_slash` off. Does not change the rule's counters.
    pub fn with_path_matching(mut self, matching: PathMatching) -> Rule {
        self.body_mut().path_matching = Some(matching);
        self
    }

    /// The rule's own path matching, if it sets one.
    pub fn path_matching(&self) -> Option<PathMatching> {
        self.body.path_matching
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.body.name
    }

    /// The route, if the rule is limited to one.
    pub fn route(&self) -> Option<&Route> {
        self.body.route.as_ref()
    }

    /// How clients are keyed.
    pub fn by(&self) -> &KeySpec {
        &self.body.by
    }

    /// The limits, all of which must admit.
    pub fn limits(&self) -> &[Limit] {
        &self.body.limits
    }

    /// The limits the soft mode enforces (the raised ones), those an
    /// elastic rule enforces at the health in force (the plain ones when
    /// the health is unknown or gone); `limits()` otherwise.
    pub fn enforced_limits(&self) -> &[Limit] {
        let Some(extra) = &self.body.extra else {
            return &self.body.limits;
        };
        if !extra.soft_limits.is_empty() {
            return &extra.soft_limits;
        }
        if let Some(g) = &self.health {
            let level = g.level();
            if level > 0
                && let Some(l) = extra.elastic_limits.get(level - 1)
            {
                return l;
            }
        }
        &self.body.limits
    }

    /// Has an elastic rule read the service's health from `gauge` (other
    /// modes ignore it). Does not change the rule's counters.
    pub fn with_health(mut self, gauge: std::sync::Arc<crate::HealthGauge>) -> Rule {
        if matches!(self.body.mode, Mode::Elastic(_)) {
            self.health = Some(gauge);
        }
        self
    }

    /// Where an elastic rule reads the service's health, if anywhere.
    pub fn health(&self) -> Option<&std::sync::Arc<crate::HealthGauge>> {
        self.health.as_ref()
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.body.mode
    }

    /// This rule with every limit cut to one instance's share of `n`
    /// (see [`Limit::shared`]): what an instance enforces alone while the
    /// store that shares the counts is unreachable. Same name, key, mode
    /// and policies; a fingerprint of its own (its counters are not the
    /// whole limit's). `n` of 0 or 1 is the rule itself.
    pub fn shared(&self, n: u64) -> Rule {
        if n <= 1 {
            return self.clone();
        }
        let limits = self.body.limits.iter().map(|l| l.shared(n)).collect();
        match self.with_limits(limits) {
            Ok(mut rule) => {
                rule.body_mut().blocked = self.body.blocked;
                rule
            }
            Err(_) => self.clone(),
        }
    }

    /// The rule's own store-failure policy, if it sets one.
    pub fn fail_policy(&self) -> Option<FailPolicy> {
        self.body.on_store_error
    }

    /// A stable hash of the name, key and limits (see [`Rule::new`]).
    pub fn fingerprint(&self) -> u64 {
        self.body.fingerprint
    }

    /// True if the rule applies to a request for `method` and `path`
    /// (in its [canonical form](crate::canonical_path)), matched with the
    /// rule's own [`PathMatching`] or the default one. A rule without a
    /// route applies to every request.
    ///
    /// `path` has been canonicalised already, so a rule whose own options
    /// are stricter about the path than those it was canonicalised with
    /// can only be strict about `HEAD` and a trailing `/` here: for the
    /// full effect use [`Rule::applies_to_path`].
    pub fn applies_to(&self, method: Option<&str>, path: Option<&str>) -> bool {
        match (&self.body.route, path) {
            (None, _) => true,
            (Some(r), Some(p)) => {
                r.matches_with(method, p, self.body.path_matching.unwrap_or_default())
            }
            (Some(_), None) => false,
        }
    }

    /// True if the rule applies to a request for `method` and `path`,
    /// matched with the rule's own [`PathMatching`] if it sets one, else
    /// with the options `path` was canonicalised with (the limiter's
    /// global ones). Canonicalises again only for a rule whose options
    /// treat paths differently.
    ///
    /// ```
    /// use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos, PathMatching, RequestPath, Route, Rule};
    /// let limit = Limit::FixedWindow(FixedWindow::new(1, Nanos::from_secs(1))?);
    /// let rule = Rule::new("r", Some(Route::parse("GET /a")?), KeySpec::parse("ip")?, vec![limit], Mode::Hard)?;
    /// let path = RequestPath::new("/a;x=1/", PathMatching::default());
    /// assert!(rule.applies_to_path(Some("GET"), Some(&path)));
    /// let strict = rule.with_path_matching(PathMatching::STRICT);
    /// assert!(!strict.applies_to_path(Some("GET"), Some(&path)));
    /// # Ok::<(), spillway_core::Error>(())
    /// ```
    pub fn applies_to_path(&self, method: Option<&str>, path: Option<&RequestPath<'_>>) -> bool {
        match (&self.body.route, path) {
            (None, _) => true,
            (Some(r), Some(p)) => {
                let matching = self.body.path_matching.unwrap_or(p.matching());
                r.matches_with(method, &p.canonical_for(matching), matching)
            }
            (Some(_), None) => false,
        }
    }
}

/// Splits an API name as callers write it, `"METHOD /path"` or `"/path"`,
/// into its method (if any) and path, trimmed. The path should start with
/// `/`; routes match nothing else.
///
/// ```
/// use spillway_core::rule::split_api;
/// assert_eq!(split_api(" POST  /v1/login "), (Some("POST"), "/v1/login"));
/// assert_eq!(split_api("/v1/login"), (None, "/v1/login"));
/// ```
pub fn split_api(api: &str) -> (Option<&str>, &str) {
    let api = api.trim();
    match api.split_once(char::is_whitespace) {
        Some((m, p)) => (Some(m), p.trim()),
        None => (None, api),
    }
}

/// 64-bit FNV-1a: stable across processes and versions, unlike std's hasher.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_exact_param_and_prefix() {
        let r = Route::parse("POST /v1/login").unwrap();
        assert!(r.matches(Some("POST"), "/v1/login"));
        assert!(r.matches(Some("post"), "/v1/login?x=1"));
        assert!(!r.matches(Some("GET"), "/v1/login"));
        assert!(!r.matches(None, "/v1/login"));
        assert!(!r.matches(Some("POST"), "/v1/login/x"));
        let p = Route::parse("/users/{id}").unwrap();
        assert!(p.matches(Some("GET"), "/users/42"));
        assert!(p.matches(None, "/users/42"));
        assert!(!p.matches(None, "/users/"));
        assert!(!p.matches(None, "/users/42/x"));
        let w = Route::parse("GET /v1/*").unwrap();
        assert!(w.matches(Some("GET"), "/v1/a/b"));
        assert!(w.matches(Some("GET"), "/v1"));
        assert!(!w.matches(Some("GET"), "/v2/a"));
        let root = Route::parse("/").unwrap();
        assert!(root.matches(None, "/"));
        assert!(!root.matches(None, "/a"));
    }

    /// The issue "No way past a limit": after `GET /a` is used up, `HEAD
    /// /a`, `/a/`, `/a;x=1`, `/b/..;/a` and `/a%2F` met no rule. Through
    /// the calls the limiter makes (`canonical_path`, then `applies_to`),
    /// each now meets the rule for `GET /a`; a rule with the strict
    /// options (through `applies_to_path`) sees none of them.
    #[test]
    fn no_way_past_a_limit_by_respelling_get_a() {
        let limit = Limit::FixedWindow(crate::FixedWindow::new(1, crate::Nanos(1)).unwrap());
        let rule = Rule::new(
            "r",
            Some(Route::parse("GET /a").unwrap()),
            KeySpec::parse("ip").unwrap(),
            vec![limit],
            Mode::Hard,
        )
        .unwrap();
        let strict = rule.clone().with_path_matching(PathMatching::STRICT);
        let respelled = [
            ("HEAD", "/a"),
            ("GET", "/a/"),
            ("GET", "/a;x=1"),
            ("GET", "/b/..;/a"),
            ("GET", "/a%2F"),
            ("head", "/b%2f..%2Fa;x/"),
        ];
        for (method, path) in respelled {
            let canonical = crate::canonical_path(path);
            assert!(
                rule.applies_to(Some(method), Some(&canonical)),
                "{method} {path}"
            );
            let req = RequestPath::new(path, PathMatching::default());
            assert!(
                rule.applies_to_path(Some(method), Some(&req)),
                "{method} {path}"
            );
            assert!(
                !strict.applies_to_path(Some(method), Some(&req)),
                "{method} {path}"
            );
        }
        let plain = RequestPath::new("/a", PathMatching::default());
        assert!(strict.applies_to_path(Some("GET"), Some(&plain)));
        assert!(!rule.applies_to(Some("POST"), Some("/a")));
        assert!(!rule.applies_to(Some("GET"), Some("/a/b")));
    }

    #[test]
    fn a_route_with_a_trailing_slash_matches_without_one() {
        let r = Route::parse("/a/").unwrap();
        assert!(r.matches(None, "/a"));
        assert!(r.matches(None, "/a/"));
        assert_eq!(r.literal_prefix().collect::<Vec<_>>(), ["a"]);
        assert!(!r.matches_with(None, "/a", PathMatching::STRICT));
        assert!(r.matches_with(None, "/a/", PathMatching::STRICT));
        let head = Route::parse("HEAD /a").unwrap();
        assert!(!head.matches(Some("GET"), "/a"));
        let post = Route::parse("POST /a").unwrap();
        assert!(!post.matches(Some("HEAD"), "/a"));
    }

    #[test]
    fn bad_routes_and_keys_are_errors() {
        assert!(Route::parse("v1/login").is_err());
        assert!(Route::parse("/a/*/b").is_err());
        assert!(Route::parse("P0ST /a").is_err());
        assert!(KeySpec::parse("user+").is_err());
        assert!(KeySpec::parse("header:").is_err());
        assert!(KeySpec::parse("header:x y").is_err());
        assert!(KeySpec::parse("header:x\ny").is_err());
        assert!(KeySpec::parse("ip+ip").is_err());
        let k = KeySpec::parse("user+header:X-Api-Key").unwrap();
        assert_eq!(k.to_string(), "user+header:x-api-key");
    }

    proptest::proptest! {
        /// What an elastic rule enforces, every algorithm: each limit's
        /// size between the plain one and `percent` % of it, never larger
        /// at a higher load, the plain limits themselves while health is
        /// unknown or without a gauge; derived rules read the same gauge.
        #[test]
        fn elastic_rules_enforce_between_the_limit_and_the_reach(
            size in 1u64..100_000,
            percent in 100u32..=crate::elastic::MAX_PERCENT,
            a in -1.0f64..3.0,
            b in -1.0f64..3.0,
        ) {
            use crate::{Elastic, FixedWindow, Gcra, Health, HealthGauge, Nanos, Rate, SlidingLog, TokenBucket};
            use std::sync::Arc;
            let hour = Nanos::from_secs(3600);
            let rate = Rate::new(1, hour).unwrap();
            let limits = vec![
                Limit::TokenBucket(TokenBucket::new(size, rate).unwrap()),
                Limit::FixedWindow(FixedWindow::new(size, hour).unwrap()),
                Limit::SlidingLog(SlidingLog::new(size, hour).unwrap()),
                Limit::Gcra(Gcra::new(rate, size).unwrap()),
            ];
            let rule = Rule::new("e", None, KeySpec::parse("user").unwrap(), limits,
                Mode::Elastic(Elastic::new(percent).unwrap())).unwrap();
            proptest::prop_assert!(std::ptr::eq(rule.enforced_limits(), rule.limits()));
            let g = Arc::new(HealthGauge::new());
            let rule = rule.with_health(g.clone());
            let derived = rule.shared(1).with_limits(rule.limits().to_vec()).unwrap();
            proptest::prop_assert!(std::ptr::eq(rule.enforced_limits(), rule.limits()));
            let sizes = |r: &Rule| -> Vec<u64> { r.enforced_limits().iter().map(Limit::size).collect() };
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            g.set(Health::Load(lo));
            let at_lo = sizes(&rule);
            proptest::prop_assert_eq!(&at_lo, &sizes(&derived));
            g.set(Health::Load(hi));
            let at_hi = sizes(&rule);
            for (l, (x, y)) in rule.limits().iter().zip(at_lo.iter().zip(&at_hi)) {
                let plain = l.size();
                proptest::prop_assert!(*y <= *x);
                proptest::prop_assert!(*y >= plain);
                proptest::prop_assert!(u128::from(*x) * 100 <= u128::from(plain) * u128::from(percent));
            }
            g.set(Health::Unknown);
            proptest::prop_assert!(std::ptr::eq(rule.enforced_limits(), rule.limits()));
        }
    }
}
