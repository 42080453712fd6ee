//! The request a gateway asks about, read from its auth call.
//!
//! Every value is read, as bytes, from headers only a trusted gateway is
//! believed about; from anyone else the call is the request (its method,
//! what follows the endpoint's path in its target). Unreadable is
//! refused, never reinterpreted: a forwarding header that is present but
//! unusable (a method that is not a token, a host that is not text), sent
//! twice with different values, or contradicted by another source refuses
//! the call, so the gateway refuses the request. A request target's bytes
//! that are not URI characters (`\xff`, `é`, a space) are percent-encoded
//! before the target is read, as the app's router reads them: the path
//! of `/login?\xff` is `/login`, never `/`. An empty header is absent
//! (Caddy's `header_up Name ""`).

use std::borrow::Cow;
use std::net::IpAddr;

use spillway_wire::Headers;

use crate::identity::{IpNet, Unreadable};

/// The gateway's client request, as the rules see it, borrowed from the
/// call where it can be (a decision on every request: no copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original<'a> {
    /// Its method (`X-Forwarded-Method`, `X-Original-Method`, the call's).
    pub method: &'a str,
    /// Its path and query, in origin form (always starts with `/`), every
    /// byte a URI character.
    pub target: Cow<'a, str>,
    /// Its host (`X-Forwarded-Host`, else the call's `Host`), if any.
    pub host: Option<&'a str>,
}

impl Original<'_> {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(p, _)| p)
    }

    /// The query, if any.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, q)| q)
    }
}

/// The headers that name the request's method, first found first.
const METHOD: [&str; 2] = ["x-forwarded-method", "x-original-method"];
/// The headers that name its target, first found first.
const TARGET: [&str; 3] = ["x-forwarded-uri", "x-original-uri", "x-original-url"];

/// Reads the request a call from `peer` asks about: `method` and `target`
/// are the call's own, `prefix` the endpoint's path (what follows it in
/// the target is the request's path and query, Envoy's `path_prefix`).
/// A peer outside `trusted` is its own client: none of its forwarding
/// headers is read.
///
/// # Errors
/// From a trusted peer: a forwarding header sent twice with different
/// values, two sources that name different requests, a method that is
/// not a token; from anyone: a host that is not text.
pub fn read<'a, H: Headers + ?Sized>(
    method: &'a str,
    target: &'a str,
    prefix: &str,
    headers: &'a H,
    peer: IpAddr,
    trusted: &[IpNet],
) -> Result<Original<'a>, Unreadable> {
    let host = |name: &str| -> Result<Option<&'a str>, Unreadable> {
        present(headers, name)?
            .map(|v| std::str::from_utf8(v).map_err(|_| not_text(name)))
            .transpose()
    };
    if !trusted.iter().any(|n| n.contains(peer)) {
        return Ok(Original {
            method,
            target: after_prefix(target, prefix),
            host: host("host")?,
        });
    }
    let method = match one_of(headers, &METHOD, Some)? {
        None => method,
        Some(m) => std::str::from_utf8(m)
            .ok()
            .filter(|m| is_token(m))
            .ok_or_else(|| Unreadable("the forwarded method is not an HTTP method".into()))?,
    };
    let target = match one_of(headers, &TARGET, |v| Some(origin_form(encoded(v))))? {
        None => after_prefix(target, prefix),
        Some(t) => t,
    };
    let host = match host("x-forwarded-host")? {
        Some(h) => Some(h),
        None => host("host")?,
    };
    Ok(Original {
        method,
        target,
        host,
    })
}

/// The value the sources in `names` agree on, each read with `read`:
/// none when none is present; refused when one is sent twice with
/// different values, or two name different things.
fn one_of<'a, H: Headers + ?Sized, T: PartialEq>(
    headers: &'a H,
    names: &[&str],
    read: impl Fn(&'a [u8]) -> Option<T>,
) -> Result<Option<T>, Unreadable> {
    let mut found: Option<(&str, T)> = None;
    for name in names {
        let Some(v) = present(headers, name)? else {
            continue;
        };
        let Some(v) = read(v) else {
            return Err(not_text(name));
        };
        match &found {
            None => found = Some((name, v)),
            Some((first, w)) if *w != v => {
                return Err(Unreadable(format!(
                    "{first} and {name} name different requests"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(found.map(|(_, v)| v))
}

/// `name`'s value, trimmed, unless absent or empty (Caddy's
/// `header_up Name ""` sends the header empty; it means none).
fn present<'a, H: Headers + ?Sized>(
    headers: &'a H,
    name: &str,
) -> Result<Option<&'a [u8]>, Unreadable> {
    match headers.agreed(name) {
        Ok(v) => Ok(v.map(<[u8]>::trim_ascii).filter(|v| !v.is_empty())),
        Err(_) => Err(Unreadable(format!(
            "{name} is sent more than once with different values"
        ))),
    }
}

fn not_text(name: &str) -> Unreadable {
    Unreadable(format!("{name} is not text"))
}

/// A method is an HTTP token.
fn is_token(m: &str) -> bool {
    m.len() <= 32
        && !m.is_empty()
        && m.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether `b` may stand in a URI as it is (RFC 3986's unreserved,
/// sub-delims, `:@/?#[]`, and `%`, whose escapes the rules' canonical
/// path reads).
fn uri_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?#[]%".contains(&b)
}

/// `uri` with every byte that is not a URI character percent-encoded
/// (`/login?\xff` is `/login?%FF`, `/café` is `/caf%C3%A9`): what a
/// gateway passed on raw is read as the app's router reads it, never
/// passed over.
fn encoded(uri: &[u8]) -> Cow<'_, str> {
    if uri.iter().all(|&b| uri_byte(b)) {
        // Every byte ASCII: the conversion cannot fail.
        if let Ok(s) = std::str::from_utf8(uri) {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(uri.len() + 16);
    for &b in uri {
        if uri_byte(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Cow::Owned(out)
}

/// A URI as the request's path and query: an absolute URL's path and
/// query (`X-Original-URL: https://h/a?b` is `/a?b`, with `/` for none), a
/// path as it is, anything else under `/`. A fragment is not sent in a
/// request and is dropped.
fn origin_form(uri: Cow<'_, str>) -> Cow<'_, str> {
    match uri {
        Cow::Borrowed(u) => origin_form_of(u),
        Cow::Owned(u) => Cow::Owned(origin_form_of(&u).into_owned()),
    }
}

fn origin_form_of(uri: &str) -> Cow<'_, str> {
    let uri = uri.split_once('#').map_or(uri, |(u, _)| u);
    if uri.starts_with('/') {
        return Cow::Borrowed(uri);
    }
    if let Some((scheme, rest)) = uri.split_once("://")
        && !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => Cow::Borrowed(&rest[i..]),
            Some(i) => Cow::Owned(format!("/{}", &rest[i..])),
            None => Cow::Borrowed("/"),
        };
    }
    Cow::Owned(format!("/{uri}"))
}

/// What follows `prefix` in the call's own target: Envoy's ext_authz
/// sends `path_prefix` and then the request's path and query. A target
/// with nothing after the prefix, or only a query (Caddy appends the
/// client's query to its `uri`), is `/` and that query.
fn after_prefix<'a>(target: &'a str, prefix: &str) -> Cow<'a, str> {
    let rest = target.strip_prefix(prefix).unwrap_or("");
    if rest.starts_with('/') {
        Cow::Borrowed(rest)
    } else {
        Cow::Owned(format!("/{rest}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;

    const PREFIX: &str = "/v1/forward-auth";

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    fn gateway() -> IpAddr {
        "10.0.0.5".parse().unwrap()
    }

    fn trusted() -> Vec<IpNet> {
        vec![IpNet::parse("10.0.0.0/8").unwrap()]
    }

    /// A call from the gateway with these headers (kept for the test's
    /// life: what is read borrows from them).
    fn from_gateway(pairs: &[(&str, &str)]) -> Result<Original<'static>, Unreadable> {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        from_gateway_raw(&pairs)
    }

    fn from_gateway_raw(pairs: &[(&str, &[u8])]) -> Result<Original<'static>, Unreadable> {
        let h: &'static HeaderMap = Box::leak(Box::new(headers(pairs)));
        read("GET", PREFIX, PREFIX, h, gateway(), &trusted())
    }

    #[test]
    fn the_first_source_found_wins_when_all_agree() {
        let o = from_gateway(&[
            ("x-forwarded-method", "POST"),
            ("x-original-method", "POST"),
            ("x-forwarded-uri", "/first?a=1"),
            ("x-original-uri", "/first?a=1"),
            ("x-original-url", "https://example.com/first?a=1"),
            ("x-forwarded-host", "api.example.com"),
            ("host", "spillway"),
        ])
        .unwrap();
        assert_eq!(o.method, "POST");
        assert_eq!(o.target, "/first?a=1");
        assert_eq!(o.path(), "/first");
        assert_eq!(o.query(), Some("a=1"));
        assert_eq!(o.host, Some("api.example.com"));

        let o =
            from_gateway(&[("x-original-method", "PUT"), ("x-original-uri", "/second")]).unwrap();
        assert_eq!((o.method, &*o.target), ("PUT", "/second"));
        let o = from_gateway(&[("x-original-url", "https://example.com/third?x=1#frag")]).unwrap();
        assert_eq!(o.target, "/third?x=1");
        let o = from_gateway(&[("x-original-url", "https://example.com")]).unwrap();
        assert_eq!(o.target, "/");
        let o = from_gateway(&[("x-original-url", "https://example.com?q=1")]).unwrap();
        assert_eq!(o.target, "/?q=1");
    }

    /// Two sources that name different requests, or one header sent
    /// twice with different values: which one the app saw is a guess, so
    /// the call is refused (a gateway that appends lets the client's copy
    /// win otherwise).
    #[test]
    fn sources_that_disagree_refuse_the_call() {
        for pairs in [
            &[
                ("x-forwarded-uri", "/login"),
                ("x-forwarded-uri", "/harmless"),
            ][..],
            &[
                ("x-forwarded-uri", "/login"),
                ("x-original-uri", "/harmless"),
            ],
            &[
                ("x-forwarded-method", "POST"),
                ("x-forwarded-method", "GET"),
            ],
            &[("x-forwarded-method", "POST"), ("x-original-method", "GET")],
            &[("x-forwarded-host", "a"), ("x-forwarded-host", "b")],
            &[("x-original-url", "https://h/a"), ("x-original-uri", "/b")],
        ] {
            let e = from_gateway(pairs).unwrap_err();
            assert!(e.0.contains("different"), "{pairs:?}: {e}");
        }
        // The same value twice is one value.
        let o =
            from_gateway(&[("x-forwarded-uri", "/login"), ("x-forwarded-uri", "/login")]).unwrap();
        assert_eq!(o.target, "/login");
        let o = from_gateway(&[
            ("x-original-url", "https://h/a?b"),
            ("x-original-uri", "/a?b"),
        ])
        .unwrap();
        assert_eq!(o.target, "/a?b");
    }

    /// Envoy's ext_authz: the request's path follows the endpoint's; the
    /// call's method is the request's.
    #[test]
    fn without_headers_the_call_is_the_request() {
        let none = HeaderMap::new();
        let o = read(
            "DELETE",
            "/v1/forward-auth/users/7?force=1",
            PREFIX,
            &none,
            gateway(),
            &trusted(),
        )
        .unwrap();
        assert_eq!(o.method, "DELETE");
        assert_eq!(o.target, "/users/7?force=1");
        // Caddy appends the client's query to the endpoint's path.
        let o = read(
            "GET",
            "/v1/forward-auth?x=1",
            PREFIX,
            &none,
            gateway(),
            &trusted(),
        )
        .unwrap();
        assert_eq!(o.target, "/?x=1");
        assert_eq!(from_gateway(&[]).unwrap().target, "/");
    }

    /// A peer outside `trusted_proxies` is the client: whatever it says
    /// it forwards is not read, and cannot make the call refused either.
    #[test]
    fn an_untrusted_peer_cannot_choose_what_it_is_counted_as() {
        let h = headers(&[
            ("x-forwarded-method", b"P O S T"),
            ("x-forwarded-uri", b"/elsewhere"),
            ("x-forwarded-uri", b"/another\xff"),
            ("x-original-uri", b"/elsewhere"),
            ("x-original-url", b"http://e/elsewhere"),
            ("x-forwarded-host", b"other"),
            ("host", b"spillway"),
        ]);
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let o = read("GET", "/v1/forward-auth/mine", PREFIX, &h, peer, &trusted()).unwrap();
        assert_eq!(o.method, "GET");
        assert_eq!(o.target, "/mine");
        assert_eq!(o.host, Some("spillway"));
    }

    /// Empty values are absent; a present value that cannot be used
    /// refuses the call, never falls through to the next source.
    #[test]
    fn empty_values_are_absent_and_malformed_ones_refuse() {
        let o = from_gateway(&[
            ("x-forwarded-method", ""),
            ("x-forwarded-uri", "  "),
            ("x-original-uri", "relative/path"),
        ])
        .unwrap();
        assert_eq!(o.method, "GET");
        assert_eq!(o.target, "/relative/path");
        for pairs in [
            &[("x-forwarded-method", &b"G E T"[..])][..],
            &[("x-original-method", b"GET\xff")],
            &[("x-forwarded-host", b"h\xffst")],
        ] {
            assert!(from_gateway_raw(pairs).is_err(), "{pairs:?}");
        }
    }

    /// Bytes that are not URI characters are percent-encoded before the
    /// target is read: `/login?\xff` is `/login`, never `/` (the finding
    /// of issue 35: forward-auth decided `POST /` for it).
    #[test]
    fn bytes_that_are_not_text_are_encoded_never_passed_over() {
        let o = from_gateway_raw(&[("x-forwarded-uri", b"/login?\xff")]).unwrap();
        assert_eq!((o.path(), o.query()), ("/login", Some("%FF")));
        let o = from_gateway_raw(&[("x-forwarded-uri", "/login?\u{e9}".as_bytes())]).unwrap();
        assert_eq!((o.path(), o.query()), ("/login", Some("%C3%A9")));
        let o = from_gateway_raw(&[("x-original-url", b"https://h/caf\xc3\xa9 x?q")]).unwrap();
        assert_eq!(o.target, "/caf%C3%A9%20x?q");
        let o = from_gateway_raw(&[("x-forwarded-uri", b"/a\tb")]).unwrap();
        assert_eq!(o.target, "/a%09b");
    }

    /// Every byte, in the query and in a path segment, through the two
    /// header readers (hyper's map and the direct path's parsed headers):
    /// the path stays the one the app routes, never `/`.
    #[test]
    fn every_byte_keeps_the_path() {
        for b in 0u8..=255 {
            for (uri, path) in [
                ([&b"/login?a="[..], &[b]].concat(), "/login"),
                ([&b"/users/a"[..], &[b], b"b"].concat(), ""),
            ] {
                // What hyper and httparse accept as a value at all.
                let Ok(v) = HeaderValue::from_bytes(&uri) else {
                    continue;
                };
                let map = {
                    let mut h = HeaderMap::new();
                    h.insert("x-forwarded-uri", v);
                    h
                };
                let parsed = [httparse::Header {
                    name: "X-Forwarded-Uri",
                    value: &uri,
                }];
                let a = read("POST", PREFIX, PREFIX, &map, gateway(), &trusted()).unwrap();
                let c = read("POST", PREFIX, PREFIX, &parsed[..], gateway(), &trusted()).unwrap();
                assert_eq!(a, c, "byte {b:#04x}");
                assert!(a.target.bytes().all(uri_byte), "{b:#04x}: {:?}", a.target);
                if path.is_empty() {
                    // In a segment: one of `/users/…` unless the byte
                    // itself ends the path (`?`, `#`) or splits it (`/`).
                    assert!(a.path().starts_with("/users/a"), "{b:#04x}: {:?}", a.target);
                } else {
                    assert_eq!(a.path(), path, "byte {b:#04x}");
                }
            }
        }
    }

    proptest! {
        /// Whatever bytes the headers hold, reading never panics, the
        /// target is in origin form of URI characters, and an untrusted
        /// peer is never refused for headers it is not believed about.
        #[test]
        fn any_headers_give_a_request_or_a_refusal(
            values in proptest::collection::vec(
                (0usize..6, proptest::collection::vec(any::<u8>(), 0..40)), 0..12),
            trusted_peer in any::<bool>(),
            call in "[!-~]{0,40}",
        ) {
            const NAMES: [&str; 6] = [
                "x-forwarded-method", "x-original-method", "x-forwarded-uri",
                "x-original-uri", "x-original-url", "x-forwarded-host",
            ];
            let mut h = HeaderMap::new();
            for (i, v) in &values {
                if let Ok(v) = HeaderValue::from_bytes(v) {
                    h.append(NAMES[*i], v);
                }
            }
            let peer: IpAddr = if trusted_peer { gateway() } else { "192.0.2.1".parse().unwrap() };
            let target = format!("{PREFIX}{call}");
            match read("GET", &target, PREFIX, &h, peer, &trusted()) {
                Ok(o) => {
                    prop_assert!(o.target.starts_with('/'), "{:?}", o.target);
                    prop_assert!(is_token(o.method));
                    if !trusted_peer {
                        prop_assert_eq!(o.method, "GET");
                    }
                }
                Err(e) => prop_assert!(trusted_peer, "untrusted refused: {}", e),
            }
        }
    }
}
