//! The request target and `Host` checks: what a reverse proxy accepts as
//! the host and path it forwards.

/// An absolute-form target (`http://host[:port]/path?query`, RFC 9112
/// §3.2.2), which a server must accept: the authority it names and the
/// origin-form target it stands for (`/` for an empty path). The request
/// is then served exactly as that origin-form one, its `Host` replaced by
/// the authority, so it is counted under the same route and keys.
///
/// # Errors
/// What a reverse proxy must not guess at, as the 400's detail: a scheme
/// other than `http` / `https`, no authority or an invalid one, userinfo
/// (`http://user@host/`: RFC 9110 §4.2.4 says to treat it as an error; it
/// is also how a target names one host to a reader and another to the
/// next), a path that is not RFC 3986 characters.
pub fn absolute_form<'a>(
    scheme: Option<&str>,
    authority: Option<&'a str>,
    path_and_query: Option<&'a str>,
) -> Result<(&'a str, &'a str), &'static str> {
    let scheme_ok =
        scheme.is_some_and(|s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"));
    if !scheme_ok {
        return Err("the request target must be a path, or an http(s) URL (absolute-form)");
    }
    let Some(authority) = authority.filter(|a| !a.is_empty()) else {
        return Err("an absolute-form target must name a host");
    };
    if authority.contains('@') {
        return Err("an absolute-form target must not carry userinfo");
    }
    if !valid_host(authority.as_bytes()) {
        return Err("the absolute-form target's host is not a valid host");
    }
    let origin = match path_and_query {
        None | Some("") => "/",
        Some(p) if p.starts_with('/') => p,
        // `http://x?q` (a query on an empty path) and anything else.
        Some(_) => return Err("the absolute-form target's path is not a path"),
    };
    if !spillway_wire::head::strict_origin_form(origin) {
        return Err("the absolute-form target's path is not RFC 3986 characters");
    }
    Ok((authority, origin))
}

/// A host as `Host` may carry it: a reg-name or IPv4 address of RFC 3986
/// characters, or a bracketed IPv6 literal, and an optional port.
pub(super) fn valid_host(h: &[u8]) -> bool {
    let (host, port): (&[u8], Option<&[u8]>) = if let Some(rest) = h.strip_prefix(b"[") {
        let Some(close) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let lit = std::str::from_utf8(&rest[..close]).unwrap_or("");
        if lit.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match &rest[close + 1..] {
            [] => (b"x", None),
            [b':', p @ ..] => (b"x", Some(p)),
            _ => return false,
        }
    } else {
        match h.iter().rposition(|&b| b == b':') {
            Some(i) => (&h[..i], Some(&h[i + 1..])),
            None => (h, None),
        }
    };
    let host_ok = !host.is_empty() && host.iter().all(|&b| HOST[usize::from(b)]);
    let port_ok = port.is_none_or(|p| p.len() <= 5 && p.iter().all(u8::is_ascii_digit));
    host_ok && port_ok
}

/// The bytes a reg-name or IPv4 host may hold: RFC 3986's unreserved and
/// sub-delims characters and `%` (escapes).
static HOST: [bool; 256] = spillway_wire::head::rfc3986_bytes(b"%");
