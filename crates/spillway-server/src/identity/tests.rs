use super::*;
use http::{HeaderMap, HeaderValue, header};

/// Headers holding `name: value` alone.
fn one_header(name: impl header::IntoHeaderName, value: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(name, HeaderValue::from_static(value));
    h
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn an_unreadable_keyed_header_is_one_key_never_missing() {
    use spillway_core::Attributes;
    let mut h = HeaderMap::new();
    h.insert("x-raw", HeaderValue::from_bytes(b"a\xffb").unwrap());
    h.append("x-twice", HeaderValue::from_static("a"));
    h.append("x-twice", HeaderValue::from_static("b"));
    h.append("x-same", HeaderValue::from_static("a"));
    h.append("x-same", HeaderValue::from_static("a"));
    let attrs = Attrs {
        user: None,
        ip: "192.0.2.1",
        host: None,
        headers: &h,
    };
    assert_eq!(
        attrs.header("x-raw"),
        Some(spillway_core::UNREADABLE_HEADER)
    );
    assert_eq!(
        attrs.header("x-twice"),
        Some(spillway_core::UNREADABLE_HEADER)
    );
    assert_eq!(attrs.header("x-same"), Some("a"));
    assert_eq!(attrs.header("x-absent"), None);
}

#[test]
fn networks_contain_their_addresses() {
    let n = IpNet::parse("10.0.0.0/8").unwrap();
    assert!(n.contains(ip("10.1.2.3")));
    assert!(!n.contains(ip("11.0.0.1")));
    assert!(n.contains(ip("::ffff:10.0.0.1")));
    assert!(IpNet::parse("::1").unwrap().contains(ip("::1")));
    assert!(IpNet::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
    assert!(IpNet::parse("10.0.0.0/33").is_err());
    assert!(IpNet::parse("nope").is_err());
}

#[test]
fn the_client_cannot_spoof_its_ip_and_proxies_are_peeled_from_the_right() {
    let trusted = [
        IpNet::parse("127.0.0.1/32").unwrap(),
        IpNet::parse("10.0.0.0/8").unwrap(),
    ];
    let ci = |peer: &str, h: &HeaderMap| client_ip(ip(peer), h, &trusted).unwrap();
    let h = one_header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2");
    // From a trusted proxy: rightmost untrusted address.
    assert_eq!(ci("127.0.0.1", &h), ip("203.0.113.9"));
    // From an untrusted peer: the header is ignored.
    assert_eq!(ci("198.51.100.1", &h), ip("198.51.100.1"));
    // Forwarded works too.
    let f = one_header(
        header::FORWARDED,
        "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
    );
    assert_eq!(ci("10.0.0.1", &f), ip("2001:db8::1"));
    // Nothing untrusted: the leftmost.
    let all = one_header("x-forwarded-for", "10.0.0.5");
    assert_eq!(ci("127.0.0.1", &all), ip("10.0.0.5"));
    // A dual-stack listener's IPv4 peer, directly and through a proxy.
    let none = HeaderMap::new();
    assert_eq!(ci("::ffff:198.51.100.1", &none), ip("198.51.100.1"));
    let m = one_header("x-forwarded-for", "::ffff:6.6.6.6");
    assert_eq!(ci("::ffff:127.0.0.1", &m), ip("6.6.6.6"));
}

/// The entry the walk stops at must be an address: a trusted proxy
/// that vouches for `unknown`, an obfuscated `_id`, garbage or bytes
/// that are not text names no client, and the request is refused
/// rather than counted as the proxy (issue 35: unreadable is refused,
/// never reinterpreted). What lies left of the client is not read.
#[test]
fn an_entry_that_is_not_an_address_refuses_the_request() {
    let trusted = [
        IpNet::parse("127.0.0.1/32").unwrap(),
        IpNet::parse("10.0.0.0/8").unwrap(),
    ];
    let xff = |v: &'static str| one_header("x-forwarded-for", v);
    let peer = ip("127.0.0.1");
    assert!(client_ip(peer, &xff("6.6.6.6, unknown"), &trusted).is_err());
    assert!(client_ip(peer, &xff("6.6.6.6, garbage, 10.0.0.2"), &trusted).is_err());
    let raw = {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"1.2.3.4\xff").unwrap(),
        );
        h
    };
    assert!(client_ip(peer, &raw, &trusted).is_err(), "not text");
    // Left of the client, anything: it is not read.
    assert_eq!(
        client_ip(peer, &xff("garbage, 203.0.113.9, 10.0.0.2"), &trusted),
        Ok(ip("203.0.113.9"))
    );
    // Empty entries are no hops.
    assert_eq!(
        client_ip(peer, &xff("203.0.113.9, , 10.0.0.2,"), &trusted),
        Ok(ip("203.0.113.9"))
    );
    let f = one_header(header::FORWARDED, "for=6.6.6.6, for=_hidden;proto=https");
    assert!(client_ip(ip("10.0.0.1"), &f, &trusted).is_err());
    // An element without `for=` is no hop either.
    let g = one_header(
        header::FORWARDED,
        "for=203.0.113.9, proto=https;by=10.0.0.9",
    );
    assert_eq!(
        client_ip(ip("10.0.0.1"), &g, &trusted),
        Ok(ip("203.0.113.9"))
    );
    // An untrusted peer's headers are not read, so never refuse it.
    assert_eq!(
        client_ip(ip("192.0.2.1"), &xff("unknown"), &trusted),
        Ok(ip("192.0.2.1"))
    );
}

/// A gateway's `X-Real-IP`: one address; twice with different values
/// is refused, twice alike is one.
#[test]
fn x_real_ip_is_one_address() {
    let id = Identify {
        user: None,
        trusted: vec![IpNet::parse("10.0.0.0/8").unwrap()],
    };
    let gw = ip("10.0.0.1");
    let mut h = HeaderMap::new();
    h.append("x-real-ip", HeaderValue::from_static("198.51.100.9"));
    assert_eq!(
        id.who(gw, &h, None, true).unwrap().ip.as_str(),
        "198.51.100.9"
    );
    h.append("x-real-ip", HeaderValue::from_static("198.51.100.9"));
    assert!(id.who(gw, &h, None, true).is_ok());
    h.append("x-real-ip", HeaderValue::from_static("6.6.6.6"));
    assert!(id.who(gw, &h, None, true).is_err());
    let bad = one_header("x-real-ip", "nope");
    assert!(id.who(gw, &bad, None, true).is_err());
    // Not read at all by the proxy (real_ip false).
    assert_eq!(
        id.who(gw, &bad, None, false).unwrap().ip.as_str(),
        "10.0.0.1"
    );
}

/// The user: text, once; a query parameter percent-decoded, refused
/// when it is not text rather than replaced (`%FF` and `%FE` would
/// both be U+FFFD, one counter for every unreadable user).
#[test]
fn a_user_that_cannot_be_read_is_refused() {
    let by_header = Identify {
        user: Some(UserSource::Header("x-user".into())),
        trusted: Vec::new(),
    };
    let mut h = HeaderMap::new();
    h.insert("x-user", HeaderValue::from_bytes(b"al\xffce").unwrap());
    assert!(by_header.user(&h, None).is_err());
    h.insert("x-user", HeaderValue::from_static("alice"));
    assert_eq!(by_header.user(&h, None), Ok(Some("alice".into())));
    h.append("x-user", HeaderValue::from_static("alice"));
    assert!(by_header.user(&h, None).is_err(), "twice");
    let by_query = Identify {
        user: Some(UserSource::Query("u".into())),
        trusted: Vec::new(),
    };
    let none = HeaderMap::new();
    assert_eq!(
        by_query.user(&none, Some("u=al%69ce+b&x=1")),
        Ok(Some("alice b".into()))
    );
    assert_eq!(by_query.user(&none, Some("x=1")), Ok(None));
    assert!(by_query.user(&none, Some("u=%FF")).is_err());
    assert!(by_query.user(&none, Some("u=a&u=b")).is_err());
    assert_eq!(
        by_query.user(&none, Some("u=100%")),
        Ok(Some("100%".into()))
    );
}

proptest::proptest! {
    /// Whatever forwarding headers a client or a proxy writes: the
    /// client IP is the peer or an address written in the chain, never
    /// a panic; the chain sent upstream is one header line.
    #[test]
    fn any_forwarding_headers_give_the_peer_or_a_listed_address(
        xff in proptest::collection::vec(
            proptest::sample::select(vec![
                "6.6.6.6", "10.0.0.2", "203.0.113.9", "unknown", "_hidden", "::1",
                "[2001:db8::1]:80", "1.2.3.4:5", "", " ", ",", "999.1.1.1", "[::1",
                "\u{e9}", "for=1.1.1.1",
            ]),
            0..6,
        ),
        fwd in proptest::collection::vec(
            proptest::sample::select(vec![
                "for=192.0.2.60", "for=\"[2001:db8::1]:4711\"", "proto=http", "for=_x",
                "by=10.0.0.9", ";", ",", "for=", "FOR=6.6.6.6", "for=\"", " ",
            ]),
            0..6,
        ),
        peer_trusted: bool,
    ) {
        let trusted = [IpNet::parse("10.0.0.0/8").unwrap()];
        let peer = if peer_trusted { ip("10.0.0.1") } else { ip("198.51.100.1") };
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&xff.join(", ")) {
            h.insert("x-forwarded-for", v);
        }
        if let Ok(v) = HeaderValue::from_str(&fwd.join("")) {
            h.insert(header::FORWARDED, v);
        }
        let listed: Vec<IpAddr> = forwarded_chain(&h).into_iter().flatten().collect();
        match client_ip(peer, &h, &trusted) {
            Ok(got) => {
                proptest::prop_assert!(
                    got == peer || listed.iter().any(|l| l.to_canonical() == got),
                    "{got} from {xff:?} {fwd:?}"
                );
                if !peer_trusted {
                    proptest::prop_assert_eq!(got, peer);
                }
            }
            Err(e) => proptest::prop_assert!(peer_trusted, "untrusted refused: {e}"),
        }
        let chain = forwarded_for(peer, &h, &trusted);
        proptest::prop_assert!(!chain.contains(['\r', '\n']), "{chain:?}");
    }
}
