//! The request a gateway asks about, read from its auth call.
//!
//! Every value is read, first found wins, from headers only a trusted
//! gateway is believed about; from anyone else the call is the request
//! (its method, what follows the endpoint's path in its target, its own
//! address). Nothing here fails: a value that cannot be read is passed
//! over for the next source, down to the call's own, so a malformed
//! header never becomes an error that skips limiting.

use std::borrow::Cow;
use std::net::IpAddr;

use spillway_wire::Headers;

use crate::identity::{IpNet, client_ip_or_real};

/// The gateway's client request, as the rules see it, borrowed from the
/// call where it can be (a decision on every request: no copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original<'a> {
    /// Its method (`X-Forwarded-Method`, `X-Original-Method`, the call's).
    pub method: &'a str,
    /// Its path and query, in origin form (always starts with `/`).
    pub target: Cow<'a, str>,
    /// Its host (`X-Forwarded-Host`, else the call's `Host`), if any.
    pub host: Option<&'a str>,
    /// The client's address.
    pub ip: IpAddr,
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

/// Reads the request a call from `peer` asks about: `method` and `target`
/// are the call's own, `prefix` the endpoint's path (what follows it in
/// the target is the request's path and query, Envoy's `path_prefix`).
/// A peer outside `trusted` is its own client: none of its forwarding
/// headers is read.
pub fn read<'a, H: Headers + ?Sized>(
    method: &'a str,
    target: &'a str,
    prefix: &str,
    headers: &'a H,
    peer: IpAddr,
    trusted: &[IpNet],
) -> Original<'a> {
    let believed = trusted.iter().any(|n| n.contains(peer));
    let first = |names: &[&str]| -> Option<&'a str> {
        if !believed {
            return None;
        }
        names.iter().find_map(|n| present(headers, n))
    };
    let method = first(&["x-forwarded-method", "x-original-method"])
        .filter(|m| is_token(m))
        .unwrap_or(method);
    let target = first(&["x-forwarded-uri", "x-original-uri", "x-original-url"])
        .map_or_else(|| after_prefix(target, prefix), origin_form);
    let host = first(&["x-forwarded-host"]).or_else(|| present(headers, "host"));
    Original {
        method,
        target,
        host,
        ip: client_ip_or_real(peer, headers, trusted),
    }
}

/// The first value of `name`, unless absent or empty (Caddy's
/// `header_up Name ""` sends the header empty; it means none).
fn present<'a, H: Headers + ?Sized>(headers: &'a H, name: &str) -> Option<&'a str> {
    headers.value(name).map(str::trim).filter(|v| !v.is_empty())
}

/// A method is an HTTP token: anything else is not one, and the next
/// source is read.
fn is_token(m: &str) -> bool {
    m.len() <= 32
        && m.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A URI as the request's path and query: an absolute URL's path and
/// query (`X-Original-URL: https://h/a?b` is `/a?b`, with `/` for none), a
/// path as it is, anything else under `/`. A fragment is not sent in a
/// request and is dropped.
fn origin_form(uri: &str) -> Cow<'_, str> {
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

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
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
    fn from_gateway(pairs: &[(&str, &str)]) -> Original<'static> {
        let h: &'static HeaderMap = Box::leak(Box::new(headers(pairs)));
        read("GET", PREFIX, PREFIX, h, gateway(), &trusted())
    }

    #[test]
    fn the_first_source_found_wins() {
        let o = from_gateway(&[
            ("x-original-method", "PUT"),
            ("x-forwarded-method", "POST"),
            ("x-original-uri", "/second?b=2"),
            ("x-forwarded-uri", "/first?a=1"),
            ("x-original-url", "https://example.com/third"),
            ("x-forwarded-host", "api.example.com"),
            ("host", "spillway"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        assert_eq!(o.method, "POST");
        assert_eq!(o.target, "/first?a=1");
        assert_eq!(o.path(), "/first");
        assert_eq!(o.query(), Some("a=1"));
        assert_eq!(o.host, Some("api.example.com"));
        assert_eq!(o.ip.to_string(), "203.0.113.7");

        let o = from_gateway(&[
            ("x-original-method", "PUT"),
            ("x-original-uri", "/second"),
            ("x-original-url", "https://example.com/third"),
        ]);
        assert_eq!((o.method, &*o.target), ("PUT", "/second"));
        let o = from_gateway(&[("x-original-url", "https://example.com/third?x=1#frag")]);
        assert_eq!(o.target, "/third?x=1");
        let o = from_gateway(&[("x-original-url", "https://example.com")]);
        assert_eq!(o.target, "/");
        let o = from_gateway(&[("x-original-url", "https://example.com?q=1")]);
        assert_eq!(o.target, "/?q=1");
    }

    /// Envoy's ext_authz: the request's path follows the endpoint's; the
    /// call's method is the request's.
    #[test]
    fn without_headers_the_call_is_the_request() {
        let none = headers(&[]);
        let o = read(
            "DELETE",
            "/v1/forward-auth/users/7?force=1",
            PREFIX,
            &none,
            gateway(),
            &trusted(),
        );
        assert_eq!(o.method, "DELETE");
        assert_eq!(o.target, "/users/7?force=1");
        assert_eq!(o.ip, gateway());
        // Caddy appends the client's query to the endpoint's path.
        let o = read(
            "GET",
            "/v1/forward-auth?x=1",
            PREFIX,
            &none,
            gateway(),
            &trusted(),
        );
        assert_eq!(o.target, "/?x=1");
        let o = from_gateway(&[]);
        assert_eq!(o.target, "/");
    }

    /// A peer outside `trusted_proxies` is the client: whatever it says
    /// it forwards is not read.
    #[test]
    fn an_untrusted_peer_cannot_choose_what_it_is_counted_as() {
        let h = headers(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/elsewhere"),
            ("x-original-uri", "/elsewhere"),
            ("x-original-url", "http://e/elsewhere"),
            ("x-forwarded-host", "other"),
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("host", "spillway"),
        ]);
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let o = read("GET", "/v1/forward-auth/mine", PREFIX, &h, peer, &trusted());
        assert_eq!(o.method, "GET");
        assert_eq!(o.target, "/mine");
        assert_eq!(o.host, Some("spillway"));
        assert_eq!(o.ip, peer);
    }

    /// Empty and malformed values are passed over for the next source.
    #[test]
    fn empty_or_malformed_values_fall_through() {
        let o = from_gateway(&[
            ("x-forwarded-method", ""),
            ("x-original-method", "G E T"),
            ("x-forwarded-uri", "  "),
            ("x-original-uri", "relative/path"),
            ("x-forwarded-for", "not-an-address"),
        ]);
        assert_eq!(o.method, "GET");
        assert_eq!(o.target, "/relative/path");
        // A hop that is not an address: the gateway stands for the client.
        assert_eq!(o.ip, gateway());
    }

    #[test]
    fn the_client_ip_is_walked_as_the_proxy_walks_it_with_x_real_ip_last() {
        let o = from_gateway(&[("x-forwarded-for", "6.6.6.6, 198.51.100.2")]);
        assert_eq!(o.ip.to_string(), "198.51.100.2", "rightmost untrusted");
        let o = from_gateway(&[("x-forwarded-for", "6.6.6.6, 198.51.100.2, 10.1.1.1")]);
        assert_eq!(o.ip.to_string(), "198.51.100.2", "trusted hops peeled");
        let o = from_gateway(&[("forwarded", "for=\"[2001:db8::1]:443\"")]);
        assert_eq!(o.ip.to_string(), "2001:db8::1");
        let o = from_gateway(&[("x-real-ip", "198.51.100.9")]);
        assert_eq!(o.ip.to_string(), "198.51.100.9");
        let o = from_gateway(&[
            ("x-forwarded-for", "198.51.100.2"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
        ]);
        assert_eq!(o.ip.to_string(), "198.51.100.2", "X-Forwarded-For first");
    }

    proptest! {
        /// Whatever the headers say, reading never fails, the target is
        /// in origin form, and the IP is the peer or one the headers name.
        #[test]
        fn any_headers_give_a_request(
            values in proptest::collection::vec(
                (0usize..9, "[ -~]{0,40}"), 0..12),
            trusted_peer in any::<bool>(),
            call in "[ -~]{0,40}",
        ) {
            const NAMES: [&str; 9] = [
                "x-forwarded-method", "x-original-method", "x-forwarded-uri",
                "x-original-uri", "x-original-url", "x-forwarded-host",
                "x-forwarded-for", "forwarded", "x-real-ip",
            ];
            let mut h = HeaderMap::new();
            for (i, v) in &values {
                if let Ok(v) = HeaderValue::from_str(v) {
                    h.append(NAMES[*i], v);
                }
            }
            let peer: IpAddr = if trusted_peer { gateway() } else { "192.0.2.1".parse().unwrap() };
            let target = format!("{PREFIX}{call}");
            let o = read("GET", &target, PREFIX, &h, peer, &trusted());
            prop_assert!(o.target.starts_with('/'), "{:?}", o.target);
            prop_assert!(is_token(o.method));
            if !trusted_peer {
                prop_assert_eq!(o.ip, peer);
                prop_assert_eq!(o.method, "GET");
            } else if o.ip != peer {
                let named = values.iter().any(|(_, v)| v.contains(&o.ip.to_string()));
                prop_assert!(named, "{} named by no header", o.ip);
            }
        }
    }
}
