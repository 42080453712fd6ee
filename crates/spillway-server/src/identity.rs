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

/// A value that names what is limited (the user, the client's address, a
/// header a rule is keyed by, the request a gateway forwards) could not
/// be read: not text, sent twice with different values, or not what it
/// must be. The request is refused (400) rather than decided without it:
/// a value passed over is a rule skipped, and a rule skipped is a way
/// past the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: the limit could not tell what to count", self.0)
    }
}

/// Who a request comes from, for the rules.
#[derive(Debug, Clone)]
pub struct Who {
    /// The user, if the settings name a source and the request has one.
    pub user: Option<String>,
    /// The client IP, as text.
    pub ip: spillway_core::IpText,
}

/// The proxy's identity extraction, from its settings.
#[derive(Debug, Clone)]
pub struct Identify {
    pub(crate) user: Option<UserSource>,
    pub(crate) trusted: Vec<IpNet>,
}

impl Identify {
    /// Who a request from `peer` comes from: its user and client IP, the
    /// IP walked from `X-Forwarded-For`/`Forwarded` when `peer` is
    /// trusted, and from `X-Real-IP` too when `real_ip` (a gateway's auth
    /// call).
    ///
    /// # Errors
    /// The user or the client IP cannot be read ([`Identify::user`],
    /// [`client_ip`]).
    pub fn who<H: Headers + ?Sized>(
        &self,
        peer: IpAddr,
        headers: &H,
        query: Option<&str>,
        real_ip: bool,
    ) -> Result<Who, Unreadable> {
        let user = self.user(headers, query)?;
        let ip = rightmost_untrusted(peer, headers, &self.trusted, real_ip)?.to_canonical();
        Ok(Who {
            user,
            ip: spillway_core::IpText::new(ip),
        })
    }

    /// The user, from its header or query parameter (an empty one the
    /// limiter takes as none, as on every way in).
    ///
    /// # Errors
    /// The header or parameter is there more than once, or is not text
    /// (once percent-decoded, for a parameter).
    pub fn user<H: Headers + ?Sized>(
        &self,
        headers: &H,
        query: Option<&str>,
    ) -> Result<Option<String>, Unreadable> {
        match &self.user {
            Some(UserSource::Header(h)) => match headers.sole(h) {
                Sole::Missing => Ok(None),
                Sole::One(v) => std::str::from_utf8(v)
                    .map(|v| Some(v.to_string()))
                    .map_err(|_| Unreadable(format!("the {h} header is not text"))),
                Sole::Many => Err(Unreadable(format!("the {h} header is sent more than once"))),
            },
            Some(UserSource::Query(q)) => {
                let Some(query) = query else { return Ok(None) };
                let mut found = query_values(query, q);
                let first = found.next();
                if found.next().is_some() {
                    return Err(Unreadable(format!(
                        "the query parameter {q} is sent more than once"
                    )));
                }
                first
                    .map(|v| {
                        String::from_utf8(v).map_err(|_| {
                            Unreadable(format!(
                                "the query parameter {q} is not text once percent-decoded"
                            ))
                        })
                    })
                    .transpose()
            }
            None => Ok(None),
        }
    }

    /// Whether `peer` is a trusted proxy.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(peer))
    }

    /// The client IP (see [`client_ip`]).
    ///
    /// # Errors
    /// As [`client_ip`].
    pub fn ip<H: Headers + ?Sized>(&self, peer: IpAddr, headers: &H) -> Result<IpAddr, Unreadable> {
        client_ip(peer, headers, &self.trusted)
    }
}

/// The percent-decoded values of parameter `name` in a query
/// (`application/x-www-form-urlencoded`: `+` is a space), as bytes: what
/// is not text is the caller's to refuse, never replaced.
fn query_values<'a>(query: &'a str, name: &'a str) -> impl Iterator<Item = Vec<u8>> + 'a {
    query.split('&').filter_map(move |pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (form_decode(k) == name.as_bytes()).then(|| form_decode(v))
    })
}

/// `s` percent-decoded, `+` as a space; a `%` not followed by two hex
/// digits is itself.
fn form_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// The client's IP: the peer, unless the peer is a trusted proxy; then the
/// rightmost address in `X-Forwarded-For` (or `Forwarded: for=`) that is not
/// itself a trusted proxy. A client talking to us directly cannot choose its
/// IP by sending the header: an untrusted peer's headers are ignored.
/// An IPv4-mapped IPv6 address (a dual-stack listener's IPv4 peer) comes
/// back as its IPv4 address, so it shares a key with the same client
/// named in a header.
///
/// # Errors
/// The hop the walk stops at is not an address (`unknown`, an obfuscated
/// `_id`, garbage, bytes that are not text): a trusted proxy sent a chain
/// that names no client, so the request is refused rather than counted
/// as someone else.
pub fn client_ip<H: Headers + ?Sized>(
    peer: IpAddr,
    headers: &H,
    trusted: &[IpNet],
) -> Result<IpAddr, Unreadable> {
    Ok(rightmost_untrusted(peer, headers, trusted, false)?.to_canonical())
}

fn rightmost_untrusted<H: Headers + ?Sized>(
    peer: IpAddr,
    headers: &H,
    trusted: &[IpNet],
    real_ip: bool,
) -> Result<IpAddr, Unreadable> {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(peer) {
        return Ok(peer);
    }
    let mut chain = forwarded_chain(headers);
    let mut from_real_ip = false;
    if chain.is_empty() && real_ip {
        from_real_ip = true;
        chain = match headers.agreed("x-real-ip") {
            Ok(None) => Vec::new(),
            Ok(Some(v)) => {
                let v = v.trim_ascii();
                if v.is_empty() {
                    Vec::new()
                } else {
                    vec![std::str::from_utf8(v).ok().and_then(parse_ip)]
                }
            }
            Err(_) => {
                return Err(Unreadable(
                    "X-Real-IP is sent more than once with different values".into(),
                ));
            }
        };
    }
    // From the right, each trusted hop vouches for the entry to its left.
    let mut last = peer;
    for hop in chain.into_iter().rev() {
        match hop {
            Some(ip) if is_trusted(ip) => last = ip,
            Some(ip) => return Ok(ip),
            // Not an address ("unknown", an obfuscated `_id`, garbage,
            // bytes that are not text): the trusted hop at its right
            // vouches for a client it does not name.
            None => {
                let source = if from_real_ip {
                    "X-Real-IP"
                } else if headers.all_raw("x-forwarded-for").is_empty() {
                    "Forwarded"
                } else {
                    "X-Forwarded-For"
                };
                return Err(Unreadable(format!(
                    "the {source} entry that names the client (left of {last}) is not an address"
                )));
            }
        }
    }
    // Every hop trusted: the leftmost.
    Ok(last)
}

/// The hops of `X-Forwarded-For` (all occurrences, in order), else of
/// `Forwarded: for=...`; `None` for an entry that is not an address
/// (bytes that are not text included: they are never dropped, so a walk
/// cannot step over them).
pub fn forwarded_chain<H: Headers + ?Sized>(headers: &H) -> Vec<Option<IpAddr>> {
    let xff: Vec<Option<IpAddr>> = headers
        .all_raw("x-forwarded-for")
        .into_iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|s| !s.is_empty())
        .map(|s| std::str::from_utf8(s).ok().and_then(parse_ip))
        .collect();
    if !xff.is_empty() {
        return xff;
    }
    headers
        .all_raw("forwarded")
        .into_iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .filter_map(|element| {
            // One hop per element; one without `for=` names no one.
            element.split(|&b| b == b';').find_map(|kv| {
                let kv = kv.trim_ascii();
                let eq = kv.iter().position(|&b| b == b'=')?;
                let (k, v) = (kv[..eq].trim_ascii(), kv[eq + 1..].trim_ascii());
                k.eq_ignore_ascii_case(b"for").then(|| {
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|v| parse_ip(v.trim_matches('"')))
                })
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

/// Refuses a request whose value of a header some rule is keyed by cannot
/// be read (not text, or sent twice with different values): the rule
/// would otherwise take it as missing and be skipped. Free when no rule
/// is keyed by a header.
///
/// # Errors
/// The first such header.
pub fn readable_key_headers<S: spillway_store::Store, H: Headers + ?Sized>(
    limiter: &spillway_store::Limiter<S>,
    headers: &H,
) -> Result<(), Unreadable> {
    match limiter.unreadable_key_header(|name| match headers.agreed(name) {
        Ok(None) => true,
        Ok(Some(v)) => std::str::from_utf8(v).is_ok(),
        Err(_) => false,
    }) {
        None => Ok(()),
        Some(name) => Err(Unreadable(format!(
            "the {name} header a rule is keyed by is not text, or is sent more than once with \
             different values"
        ))),
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
            // The way in refused an unreadable value of every header the
            // rules were keyed by (`readable_key_headers`). Rules reloaded
            // since may be keyed by another: its unreadable value is
            // counted under one key, never taken as missing (which would
            // skip the rule).
            _ => match self.headers.agreed(name) {
                Ok(None) => None,
                Ok(Some(v)) => {
                    Some(std::str::from_utf8(v).unwrap_or(spillway_core::UNREADABLE_HEADER))
                }
                Err(_) => Some(spillway_core::UNREADABLE_HEADER),
            },
        }
    }
    fn descriptor(&self, _name: &str) -> Option<&str> {
        None
    }
}

#[cfg(test)]
mod tests;
