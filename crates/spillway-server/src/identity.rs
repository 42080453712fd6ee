//! Who a request comes from, for the ways in that see the client's own
//! request (the reverse proxy, forward-auth): the user (a header or a
//! query parameter) and the client IP (the peer, or what trusted proxies
//! in front of it say).

use std::fmt;
use std::net::IpAddr;

use spillway_wire::{Headers, Sole};

/// An IP network (`10.0.0.0/8`, `::1/128`, or a bare address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parses CIDR notation or a bare address.
    ///
    /// # Errors
    /// Not an address, or a prefix longer than the address.
    pub fn parse(s: &str) -> Result<IpNet, String> {
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IP network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: prefix must be 0 to {max}"))?,
        };
        Ok(IpNet { addr, prefix })
    }

    /// True if `ip` is inside the network (IPv4-mapped IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Where a proxied request's user comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserSource {
    /// A header, by lower-case name.
    Header(String),
    /// A query parameter.
    Query(String),
}

impl UserSource {
    /// Parses `header:<Name>` or `query:<name>`.
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(s: &str) -> Result<UserSource, String> {
        match s.split_once(':') {
            Some(("header", h)) if !h.trim().is_empty() => {
                Ok(UserSource::Header(h.trim().to_ascii_lowercase()))
            }
            Some(("query", q)) if !q.trim().is_empty() => {
                Ok(UserSource::Query(q.trim().to_string()))
            }
            _ => Err(format!("{s:?}: expected header:<Name> or query:<name>")),
        }
    }
}

impl fmt::Display for UserSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserSource::Header(h) => write!(f, "header {h}"),
            UserSource::Query(q) => write!(f, "query parameter {q}"),
        }
    }
}

/// The user field appears more than once: the rules would count one value
/// while the upstream may read another, so the request is refused (400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ambiguous(pub String);

/// The proxy's identity extraction, from its settings.
#[derive(Debug, Clone)]
pub struct Identify {
    pub(crate) user: Option<UserSource>,
    pub(crate) trusted: Vec<IpNet>,
}

impl Identify {
    /// The user, from its header or query parameter (an empty one the
    /// limiter takes as none, as on every way in).
    ///
    /// # Errors
    /// The header or parameter is there more than once.
    pub fn user<H: Headers + ?Sized>(
        &self,
        headers: &H,
        query: Option<&str>,
    ) -> Result<Option<String>, Ambiguous> {
        match &self.user {
            Some(UserSource::Header(h)) => match headers.sole(h) {
                Sole::Missing => Ok(None),
                // A value that is not text names no user (as before).
                Sole::One(v) => Ok(std::str::from_utf8(v).ok().map(str::to_string)),
                Sole::Many => Err(Ambiguous(format!("the {h} header is sent more than once"))),
            },
            Some(UserSource::Query(q)) => {
                let Some(query) = query else { return Ok(None) };
                let mut found = form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k == q);
                let first = found.next().map(|(_, v)| v.into_owned());
                if found.next().is_some() {
                    return Err(Ambiguous(format!(
                        "the query parameter {q} is sent more than once"
                    )));
                }
                Ok(first)
            }
            None => Ok(None),
        }
    }

    /// Whether `peer` is a trusted proxy.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(peer))
    }

    /// The client IP (see [`client_ip`]).
    pub fn ip<H: Headers + ?Sized>(&self, peer: IpAddr, headers: &H) -> IpAddr {
        client_ip(peer, headers, &self.trusted)
    }
}

/// The client's IP: the peer, unless the peer is a trusted proxy; then the
/// rightmost address in `X-Forwarded-For` (or `Forwarded: for=`) that is not
/// itself a trusted proxy. A client talking to us directly cannot choose its
/// IP by sending the header: an untrusted peer's headers are ignored.
/// An IPv4-mapped IPv6 address (a dual-stack listener's IPv4 peer) comes
/// back as its IPv4 address, so it shares a key with the same client
/// named in a header.
pub fn client_ip<H: Headers + ?Sized>(peer: IpAddr, headers: &H, trusted: &[IpNet]) -> IpAddr {
    rightmost_untrusted(peer, headers, trusted, false).to_canonical()
}

/// As [`client_ip`], for a gateway's auth call: when the trusted peer
/// sends neither `X-Forwarded-For` nor `Forwarded`, its `X-Real-IP` (one
/// address) is the chain. (nginx's `auth_request` examples set it alone.)
pub fn client_ip_or_real<H: Headers + ?Sized>(
    peer: IpAddr,
    headers: &H,
    trusted: &[IpNet],
) -> IpAddr {
    rightmost_untrusted(peer, headers, trusted, true).to_canonical()
}

fn rightmost_untrusted<H: Headers + ?Sized>(
    peer: IpAddr,
    headers: &H,
    trusted: &[IpNet],
    real_ip: bool,
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut chain = forwarded_chain(headers);
    if chain.is_empty() && real_ip {
        chain = headers
            .all("x-real-ip")
            .into_iter()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(parse_ip)
            .collect();
    }
    // From the right, each trusted hop vouches for the entry to its left.
    let mut last = peer;
    for hop in chain.into_iter().rev() {
        match hop {
            Some(ip) if is_trusted(ip) => last = ip,
            Some(ip) => return ip,
            // Not an address ("unknown", an obfuscated `_id`, garbage):
            // nothing to its left can be believed, so the last trusted hop
            // stands for the client rather than whatever the client wrote
            // further left.
            None => return last,
        }
    }
    // Every hop trusted: the leftmost.
    last
}

/// The hops of `X-Forwarded-For` (all occurrences, in order), else of
/// `Forwarded: for=...`; `None` for an entry that is not an address.
pub fn forwarded_chain<H: Headers + ?Sized>(headers: &H) -> Vec<Option<IpAddr>> {
    let xff: Vec<Option<IpAddr>> = headers
        .all("x-forwarded-for")
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_ip)
        .collect();
    if !xff.is_empty() {
        return xff;
    }
    headers
        .all("forwarded")
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            // One hop per element; one without `for=` names no one.
            element.split(';').find_map(|kv| {
                let (k, v) = kv.trim().split_once('=')?;
                k.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_ip(v.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`,
/// `[::1]`, `[::1]:80`, `::1`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    s.rsplit_once(':').and_then(|(a, _)| a.parse().ok())
}

/// The `X-Forwarded-For` to send upstream: from a trusted proxy, its chain
/// and the peer; from anyone else the peer alone (a direct client's own
/// header is dropped, not passed on). A hop that was not an address is
/// passed on as `unknown`, so the upstream sees where the chain broke.
pub fn forwarded_for<H: Headers + ?Sized>(peer: IpAddr, headers: &H, trusted: &[IpNet]) -> String {
    if trusted.iter().any(|n| n.contains(peer)) {
        forwarded_chain(headers)
            .iter()
            .map(|hop| hop.map_or_else(|| "unknown".to_string(), |ip| ip.to_string()))
            .chain([peer.to_string()])
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        peer.to_string()
    }
}

/// A request's identity and headers, for the rules' keys: the proxy's
/// and forward-auth's. `host`, when given, is what `by: header:host`
/// reads (forward-auth's original host); else every header is the
/// request's own.
pub(crate) struct Attrs<'a, H: ?Sized> {
    pub(crate) user: Option<&'a str>,
    pub(crate) ip: &'a str,
    pub(crate) host: Option<&'a str>,
    pub(crate) headers: &'a H,
}

impl<H: Headers + ?Sized> spillway_core::Attributes for Attrs<'_, H> {
    fn user(&self) -> Option<&str> {
        self.user
    }
    fn ip(&self) -> Option<&str> {
        Some(self.ip)
    }
    fn header(&self, name: &str) -> Option<&str> {
        match self.host {
            Some(host) if name.eq_ignore_ascii_case("host") => Some(host),
            _ => self.headers.value(name),
        }
    }
    fn descriptor(&self, _name: &str) -> Option<&str> {
        None
    }
}

#[cfg(test)]
mod tests {
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
        let h = one_header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2");
        // From a trusted proxy: rightmost untrusted address.
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &trusted), ip("203.0.113.9"));
        // From an untrusted peer: the header is ignored.
        assert_eq!(
            client_ip(ip("198.51.100.1"), &h, &trusted),
            ip("198.51.100.1")
        );
        // Forwarded works too.
        let f = one_header(
            header::FORWARDED,
            "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &f, &trusted), ip("2001:db8::1"));
        // Nothing untrusted: the leftmost.
        let all = one_header("x-forwarded-for", "10.0.0.5");
        assert_eq!(client_ip(ip("127.0.0.1"), &all, &trusted), ip("10.0.0.5"));
        // A dual-stack listener's IPv4 peer, directly and through a proxy.
        let none = HeaderMap::new();
        let mapped = ip("::ffff:198.51.100.1");
        assert_eq!(client_ip(mapped, &none, &trusted), ip("198.51.100.1"));
        let m = one_header("x-forwarded-for", "::ffff:6.6.6.6");
        assert_eq!(
            client_ip(ip("::ffff:127.0.0.1"), &m, &trusted),
            ip("6.6.6.6")
        );
    }

    /// An entry that is not an address stops the walk: what the client
    /// wrote to its left is not believed; the last trusted hop stands in.
    #[test]
    fn an_entry_that_is_not_an_address_is_not_skipped_over() {
        let trusted = [
            IpNet::parse("127.0.0.1/32").unwrap(),
            IpNet::parse("10.0.0.0/8").unwrap(),
        ];
        let xff = |v: &'static str| one_header("x-forwarded-for", v);
        let peer = ip("127.0.0.1");
        assert_eq!(client_ip(peer, &xff("6.6.6.6, unknown"), &trusted), peer);
        assert_eq!(
            client_ip(peer, &xff("6.6.6.6, garbage, 10.0.0.2"), &trusted),
            ip("10.0.0.2")
        );
        // Empty entries are no hops.
        assert_eq!(
            client_ip(peer, &xff("203.0.113.9, , 10.0.0.2,"), &trusted),
            ip("203.0.113.9")
        );
        let f = one_header(header::FORWARDED, "for=6.6.6.6, for=_hidden;proto=https");
        assert_eq!(client_ip(ip("10.0.0.1"), &f, &trusted), ip("10.0.0.1"));
        // An element without `for=` is no hop either.
        let g = one_header(
            header::FORWARDED,
            "for=203.0.113.9, proto=https;by=10.0.0.9",
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &g, &trusted), ip("203.0.113.9"));
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
            let got = client_ip(peer, &h, &trusted);
            let listed: Vec<IpAddr> = forwarded_chain(&h).into_iter().flatten().collect();
            proptest::prop_assert!(
                got == peer || listed.iter().any(|l| l.to_canonical() == got),
                "{got} from {xff:?} {fwd:?}"
            );
            if !peer_trusted {
                proptest::prop_assert_eq!(got, peer);
            }
            let chain = forwarded_for(peer, &h, &trusted);
            proptest::prop_assert!(!chain.contains(['\r', '\n']), "{chain:?}");
        }
    }
}
