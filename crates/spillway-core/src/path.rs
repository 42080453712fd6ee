//! One spelling per request path, for matching routes.
//!
//! `/admin`, `/v1/../admin`, `//admin` and `/%61dmin` name the same
//! resource to most servers, so a rule for `/admin` must see them all as
//! `/admin`: otherwise a client could step around a limit by respelling
//! the path its upstream will resolve anyway. Only matching uses this
//! form; a proxy forwards the path as the client sent it.
//!
//! Some respellings are served by one handler on common upstreams but not
//! on all: `/admin/` (Express, Flask and Spring by default), `/admin;x=1`
//! and `/x/..;/admin` (path parameters, stripped by Tomcat and Spring),
//! `/v1%2Fadmin` (decoded before routing by some proxies and frameworks),
//! `HEAD` for `GET` (answered by the `GET` handler in Express, Flask,
//! Go and Spring), and `/Login` for `/login` (Express, Koa and ASP.NET
//! route paths in any case by default). Counting when in doubt, [`PathMatching::default`] treats
//! each of them as the plain path; [`PathMatching`] turns each off for an
//! upstream known to tell them apart.

use std::borrow::Cow;

/// Which respellings of a request count as the path they respell, for
/// matching routes and naming endpoints. Every switch on (the
/// [`Default`], [`PathMatching::LENIENT`]) counts a respelled request
/// against the rule for its plain path; a switch off makes matching
/// stricter, for an upstream that serves the two spellings differently.
///
/// Usable for every rule (the limiter's global setting) and per rule
/// ([`Rule::with_path_matching`](crate::Rule::with_path_matching)).
///
/// ```
/// use spillway_core::{PathMatching, canonical_path_with};
/// let strict = PathMatching { path_params: false, ..PathMatching::default() };
/// assert_eq!(canonical_path_with("/a;x=1/b/", PathMatching::default()), "/a/b");
/// assert_eq!(canonical_path_with("/a;x=1/b/", strict), "/a;x=1/b");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathMatching {
    /// `/a/` is `/a`: the canonical form drops a trailing `/` (but for the
    /// root), and a route written `/a/` matches both.
    pub trailing_slash: bool,
    /// `;` path parameters are cut from every segment (`/a;x=1/b` is
    /// `/a/b`), so `..;` and `.;` are dot segments (`/b/..;/a` is `/a`).
    pub path_params: bool,
    /// `%2F` (either case) is a `/`: decoded, then dot segments resolved
    /// (`/b%2F..%2Fa` is `/a`). Off, it stays `%2F`, inside its segment.
    pub encoded_slash: bool,
    /// A route for `GET` also matches `HEAD`, and a `HEAD` request's
    /// endpoint name (a `route` key) is the `GET` one.
    pub head_as_get: bool,
    /// `/Login` is `/login` (`path_matching: { case: insensitive }`): the
    /// canonical form has its ASCII letters lower-cased (an escape's hex
    /// digits excepted), and routes match their literals in any case. On
    /// by default: Express, Koa and ASP.NET route paths in any case unless
    /// told otherwise (as do IIS and case-insensitive file systems), so a
    /// case-sensitive default made `/LOGIN` a fresh, unlimited route. Off
    /// (`case: sensitive`) for an upstream that serves `/a` and `/A` as
    /// two resources.
    pub case_insensitive: bool,
}

impl PathMatching {
    /// Every respelling counted as its path: the default.
    pub const LENIENT: PathMatching = PathMatching {
        trailing_slash: true,
        path_params: true,
        encoded_slash: true,
        head_as_get: true,
        case_insensitive: true,
    };
    /// No respelling beyond those every server resolves (dot and empty
    /// segments, escaped unreserved characters): the behaviour before
    /// these switches existed.
    pub const STRICT: PathMatching = PathMatching {
        trailing_slash: false,
        path_params: false,
        encoded_slash: false,
        head_as_get: false,
        case_insensitive: false,
    };

    /// The method a request counts as: `GET` for `HEAD` (any case) when
    /// `head_as_get` is on, `method` itself otherwise. For naming an
    /// endpoint (a `route` key) the way routes match it.
    ///
    /// ```
    /// use spillway_core::PathMatching;
    /// assert_eq!(PathMatching::default().method("head"), "GET");
    /// assert_eq!(PathMatching::STRICT.method("HEAD"), "HEAD");
    /// ```
    pub fn method<'a>(&self, method: &'a str) -> &'a str {
        if self.head_as_get && method.eq_ignore_ascii_case("HEAD") {
            "GET"
        } else {
            method
        }
    }

    /// True if `self` and `other` give every path the same canonical form
    /// (they may differ in `head_as_get`, which does not touch paths).
    pub fn same_paths(&self, other: &PathMatching) -> bool {
        self.trailing_slash == other.trailing_slash
            && self.path_params == other.path_params
            && self.encoded_slash == other.encoded_slash
            && self.case_insensitive == other.case_insensitive
    }
}

impl Default for PathMatching {
    fn default() -> PathMatching {
        PathMatching::LENIENT
    }
}

/// A request's path as the client sent it, with its canonical form under
/// the limiter's global [`PathMatching`], made once per request. A rule
/// with its own options gets the path canonicalised for them
/// ([`RequestPath::canonical_for`], see
/// [`Rule::applies_to_path`](crate::Rule::applies_to_path)).
#[derive(Debug, Clone)]
pub struct RequestPath<'a> {
    raw: &'a str,
    canonical: Cow<'a, str>,
    matching: PathMatching,
}

impl<'a> RequestPath<'a> {
    /// `raw` (as sent), canonicalised with `matching`.
    pub fn new(raw: &'a str, matching: PathMatching) -> RequestPath<'a> {
        RequestPath {
            raw,
            canonical: canonical_path_with(raw, matching),
            matching,
        }
    }

    /// The path as sent.
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// The path in its canonical form under [`RequestPath::matching`].
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// The options the canonical form was made with.
    pub fn matching(&self) -> PathMatching {
        self.matching
    }

    /// The path's canonical form under `matching`: the one already made
    /// if it is the same, else made now from the raw path.
    pub fn canonical_for(&self, matching: PathMatching) -> Cow<'_, str> {
        if matching.same_paths(&self.matching) {
            Cow::Borrowed(&self.canonical)
        } else {
            canonical_path_with(self.raw, matching)
        }
    }
}

/// `path` (its query and fragment dropped) in the form routes are matched
/// against, under the default [`PathMatching`] (every switch on):
/// - percent-escapes of unreserved characters (letters, digits, `-._~`)
///   decoded, and `%2F`/`%2f` decoded to `/`; other escapes' hex digits
///   upper-cased, a stray `%` written `%25`;
/// - `;` path parameters cut from every segment (`/a;x=1/b` is `/a/b`),
///   so `..;` and `.;` are dot segments (`/b/..;/a` is `/a`);
/// - dot segments resolved (`/a/./b` is `/a/b`, `/b%2F..%2Fa` is `/a`,
///   and nothing climbs above the root);
/// - empty segments dropped (`//a///b` is `/a/b`), and a trailing `/`
///   too (`/a/` is `/a`; the root stays `/`).
///
/// So `/a`, `/a/`, `/a;x=1`, `/b/..;/a` and `/b%2F..%2Fa` are one path,
/// as Express, Flask, Go or Spring may serve them with one handler; and a
/// route for `GET` matches `HEAD` too ([`Route::matches`](crate::Route::matches)).
/// [`canonical_path_with`] takes stricter options.
///
/// Borrows when nothing needs to change, which is the usual case.
///
/// ```
/// use spillway_core::canonical_path;
/// assert_eq!(canonical_path("/v1/login?next=/x"), "/v1/login");
/// assert_eq!(canonical_path("/v1/../admin"), "/admin");
/// assert_eq!(canonical_path("//%61dmin/"), "/admin");
/// assert_eq!(canonical_path("/b/..;/admin;jsessionid=1"), "/admin");
/// assert_eq!(canonical_path("/v1%2fadmin"), "/v1/admin");
/// ```
pub fn canonical_path(path: &str) -> Cow<'_, str> {
    canonical_path_with(path, PathMatching::LENIENT)
}

/// `path` in the form routes are matched against under `matching`: as
/// [`canonical_path`], but a switch that is off leaves its respelling
/// alone (a trailing `/` kept, `;` kept inside its segment, `%2F` kept
/// encoded with its hex upper-cased). Dot segments, empty segments and
/// escaped unreserved characters are resolved whatever the options.
/// The result is a fixed point: canonicalising it again changes nothing.
///
/// ```
/// use spillway_core::{PathMatching, canonical_path_with};
/// let strict = PathMatching::STRICT;
/// assert_eq!(canonical_path_with("/a%2fb/", strict), "/a%2Fb/");
/// assert_eq!(canonical_path_with("/b/..;/a", strict), "/b/..;/a");
/// assert_eq!(canonical_path_with("/b/../a", strict), "/a");
/// ```
pub fn canonical_path_with(path: &str, matching: PathMatching) -> Cow<'_, str> {
    let path = match path.find(['?', '#']) {
        Some(i) => &path[..i],
        None => path,
    };
    if !path.starts_with('/') || !needs_work(path.as_bytes(), matching) {
        return Cow::Borrowed(path);
    }
    // Escapes first: a decoded `%2F` is a separator like any other, and
    // the segments it makes lose their parameters and dots like any other.
    let decoded = decode_unreserved(path, matching.encoded_slash);
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing = false;
    for seg in decoded[1..].split('/') {
        let seg = match seg.find(';') {
            Some(i) if matching.path_params => &seg[..i],
            _ => seg,
        };
        trailing = false;
        match seg {
            "" => trailing = true,
            "." => trailing = true,
            ".." => {
                segments.pop();
                trailing = true;
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if (trailing && !matching.trailing_slash) || segments.is_empty() {
        out.push('/');
    }
    if matching.case_insensitive {
        lower_case(&mut out);
    }
    Cow::Owned(out)
}

/// ASCII letters lower-cased, but for the two hex digits of each `%`
/// escape (upper-cased, as everywhere in the canonical form).
fn lower_case(p: &mut String) {
    let mut b = std::mem::take(p).into_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            i += 3;
            continue;
        }
        b[i] = b[i].to_ascii_lowercase();
        i += 1;
    }
    // Only ASCII bytes were changed, each to an ASCII byte.
    *p = String::from_utf8(b).unwrap_or_default();
}

/// True if `p` holds a `%`, a `//`, a `.` or `..` segment, or (as
/// `matching` asks) a `;` or a trailing `/`.
fn needs_work(p: &[u8], matching: PathMatching) -> bool {
    if matching.trailing_slash && p.len() > 1 && p.ends_with(b"/") {
        return true;
    }
    if matching.case_insensitive && p.iter().any(u8::is_ascii_uppercase) {
        return true;
    }
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'%' => return true,
            b';' if matching.path_params => return true,
            b'/' => match &p[i + 1..] {
                [b'/', ..] | [b'.'] | [b'.', b'/', ..] | [b'.', b'.'] | [b'.', b'.', b'/', ..] => {
                    return true;
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    false
}

/// Decodes the escapes of unreserved characters (and of `/`, if
/// `slash`) and upper-cases the hex of the others. A `%` not followed by
/// two hex digits becomes `%25`, so that decoding never puts a new escape
/// together (`%%61c` would be `%ac`).
fn decode_unreserved(p: &str, slash: bool) -> String {
    let b = p.as_bytes();
    let mut out = String::with_capacity(p.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| (*c as char).to_digit(16)),
                b.get(i + 2).and_then(|c| (*c as char).to_digit(16)),
            )
        {
            let c = (h * 16 + l) as u8;
            if c.is_ascii_alphanumeric()
                || matches!(c, b'-' | b'.' | b'_' | b'~')
                || (slash && c == b'/')
            {
                out.push(c as char);
            } else {
                out.push('%');
                out.push(char::from_digit(h, 16).unwrap_or('0').to_ascii_uppercase());
                out.push(char::from_digit(l, 16).unwrap_or('0').to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        if b[i] == b'%' {
            out.push_str("%25");
            i += 1;
            continue;
        }
        // Whole characters: the path is text, and only ASCII is decoded.
        let ch = p[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_insensitive_paths_are_lower_case_but_escapes() {
        let m = PathMatching {
            case_insensitive: true,
            ..PathMatching::LENIENT
        };
        assert_eq!(canonical_path_with("/V1/Login", m), "/v1/login");
        assert_eq!(canonical_path_with("/%C3%A9/A", m), "/%C3%A9/a");
        assert_eq!(canonical_path_with("/a%2fB", m), "/a/b");
        assert_eq!(canonical_path_with("/already/lower", m), "/already/lower");
        // The default (issue 35: `/LOGIN` was a fresh route behind
        // Express); off (`case: sensitive`), the case stays.
        assert_eq!(PathMatching::default(), m);
        let sensitive = PathMatching {
            case_insensitive: false,
            ..PathMatching::LENIENT
        };
        assert_eq!(canonical_path_with("/V1/Login", sensitive), "/V1/Login");
        proptest::proptest!(|(p in "/[a-zA-Z%0-9/;.]{0,20}")| {
            let once = canonical_path_with(&p, m).into_owned();
            proptest::prop_assert_eq!(canonical_path_with(&once, m), once.as_str());
        });
    }

    /// The respellings every server resolves, under any options (the
    /// strict ones keep a trailing `/`, `;` and `%2F` as they are).
    #[test]
    fn respellings_of_a_path_are_one_path() {
        for (given, want) in [
            ("/admin", "/admin"),
            ("/admin/", "/admin/"),
            ("/", "/"),
            ("/v1/../admin", "/admin"),
            ("/v1/./../admin", "/admin"),
            ("/../../admin", "/admin"),
            ("//admin", "/admin"),
            ("/a///b//", "/a/b/"),
            ("/%61dmin", "/admin"),
            ("/%2e%2e/admin", "/admin"),
            ("/a/%2E/b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb", "/a%2Fb"),
            ("/a;x=1/b", "/a;x=1/b"),
            ("/b/..;/a", "/b/..;/a"),
            ("/%zz/%4", "/%25zz/%254"),
            ("/%%61c", "/%25ac"),
            ("/.well-known/x", "/.well-known/x"),
            ("/a/..b/c.", "/a/..b/c."),
            ("/café/%C3%A9", "/café/%C3%A9"),
            ("/a?x=/../b", "/a"),
            ("/a#../b", "/a"),
            ("relative/../x", "relative/../x"),
        ] {
            assert_eq!(
                canonical_path_with(given, PathMatching::STRICT),
                want,
                "{given}"
            );
        }
        assert!(matches!(
            canonical_path("/v1/users/42?x=1"),
            Cow::Borrowed(_)
        ));
    }

    /// The defaults: a trailing `/`, path parameters and `%2F` are
    /// respellings too (the issue's bypasses of a limit on `/a`).
    #[test]
    fn by_default_slashes_params_and_encoded_slashes_are_respellings() {
        for (given, want) in [
            ("/a", "/a"),
            ("/a/", "/a"),
            ("/a//", "/a"),
            ("/", "/"),
            ("//", "/"),
            ("/a;x=1", "/a"),
            ("/a;x=1/b;y", "/a/b"),
            ("/a;", "/a"),
            ("/;x/a", "/a"),
            ("/b/..;/a", "/a"),
            ("/b/..;x=1/a", "/a"),
            ("/a/.;/b", "/a/b"),
            ("/a%2F", "/a"),
            ("/b%2f..%2Fa", "/a"),
            ("/v1%2Fadmin", "/v1/admin"),
            ("/a%2F%2E%2E", "/"),
            ("/a%3Bx/b", "/a%3Bx/b"),
            // A literal `F` after an escaped `%`: a letter like any other.
            ("/a%252F", "/a%252f"),
            ("/LOGIN", "/login"),
            ("/a/b/..", "/a"),
            ("/a?x;y/", "/a"),
            ("relative/", "relative/"),
        ] {
            assert_eq!(canonical_path(given), want, "{given}");
        }
        assert!(matches!(canonical_path("/v1/users/42"), Cow::Borrowed(_)));
    }

    /// Each switch off keeps just its own respelling.
    #[test]
    fn each_switch_keeps_its_own_respelling() {
        let off = |f: fn(&mut PathMatching)| {
            let mut m = PathMatching::LENIENT;
            f(&mut m);
            m
        };
        let slash = off(|m| m.trailing_slash = false);
        let params = off(|m| m.path_params = false);
        let encoded = off(|m| m.encoded_slash = false);
        assert_eq!(canonical_path_with("/a;x/b/", slash), "/a/b/");
        assert_eq!(canonical_path_with("/a;x/b/", params), "/a;x/b");
        assert_eq!(canonical_path_with("/b/..;/a", params), "/b/..;/a");
        assert_eq!(canonical_path_with("/a%2fb;x/", encoded), "/a%2Fb");
        assert!(!PathMatching::LENIENT.same_paths(&slash));
        let head = off(|m| m.head_as_get = false);
        assert!(PathMatching::LENIENT.same_paths(&head));
        let req = RequestPath::new("/a/", PathMatching::LENIENT);
        assert_eq!(req.canonical(), "/a");
        assert_eq!(req.canonical_for(head), "/a");
        assert_eq!(req.canonical_for(slash), "/a/");
        assert_eq!(req.raw(), "/a/");
    }

    fn any_matching() -> impl proptest::strategy::Strategy<Value = PathMatching> {
        use proptest::strategy::Strategy;
        proptest::array::uniform5(proptest::bool::ANY).prop_map(|[t, p, e, h, c]| PathMatching {
            trailing_slash: t,
            path_params: p,
            encoded_slash: e,
            head_as_get: h,
            case_insensitive: c,
        })
    }

    proptest::proptest! {
        /// Under every set of options, one more pass changes nothing, and
        /// the result has no dot segments, no empty segments but a
        /// trailing one, no escaped unreserved character, and none of the
        /// respellings its switches resolve.
        #[test]
        fn the_canonical_form_is_a_fixed_point(
            segs in proptest::collection::vec(
                "(\\.|\\.\\.|%2[eE]|%6[1-9]|%2[fF]|%3[bB]|[a-cA-C]{0,2}|%|;|;x|\\.\\.;|\\.;x|a;b)",
                0..8,
            ),
            matching in any_matching(),
        ) {
            let path = format!("/{}", segs.join("/"));
            let once = canonical_path_with(&path, matching).into_owned();
            proptest::prop_assert_eq!(canonical_path_with(&once, matching), once.as_str(), "{}", path);
            let body = once.trim_end_matches('/');
            for seg in body.split('/').skip(1) {
                let dots = if matching.path_params { seg.split(';').next().unwrap_or("") } else { seg };
                proptest::prop_assert!(dots != "." && dots != ".." && !seg.is_empty(), "{} -> {}", path, once);
            }
            for esc in ["%2e", "%2E", "%61", "%2f"] {
                proptest::prop_assert!(!once.contains(esc), "{} -> {}", path, once);
            }
            if matching.trailing_slash {
                proptest::prop_assert!(once == "/" || !once.ends_with('/'), "{} -> {}", path, once);
            }
            if matching.path_params {
                proptest::prop_assert!(!once.contains(';'), "{} -> {}", path, once);
            }
            if matching.encoded_slash {
                proptest::prop_assert!(!once.contains("%2F"), "{} -> {}", path, once);
            }
        }
    }
}
