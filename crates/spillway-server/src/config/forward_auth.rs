//! `forward_auth:`: the endpoint gateways ask before passing a request
//! on, who is believed about the request, where the user is, and the
//! status of a denial.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::api::forward_auth::Settings;

/// The paths the decision listener serves besides forward-auth: its path
/// may be none of them, nor above or under one.
const TAKEN: [&str; 12] = [
    "/v1/check",
    "/v1/charge",
    "/v1/limit",
    "/v1/health",
    "/v1/rules",
    "/v1/status",
    "/json",
    "/metrics",
    "/healthz",
    "/readyz",
    "/healthcheck",
    "/admin",
];

pub(super) fn forward_auth(errs: &mut Collector<'_>, f: &Spanned<raw::RawForwardAuth>) -> Settings {
    let raw = &f.value;
    let mut s = Settings::default();
    if let Some(p) = &raw.path {
        match path(&p.value) {
            Ok(()) => s.path = p.value.clone(),
            Err(e) => errs.at(p, format!("forward_auth.path: {e}")),
        }
    }
    if let Some(t) = &raw.trusted_proxies {
        for n in &t.value {
            match IpNet::parse(n) {
                Ok(net) => s.trusted_proxies.push(net),
                Err(e) => errs.at(t, format!("forward_auth.trusted_proxies: {e}")),
            }
        }
    }
    if let Some(u) = &raw.user {
        match UserSource::parse(&u.value) {
            Ok(src) => s.user = Some(src),
            Err(e) => errs.at(u, format!("forward_auth.user: {e}")),
        }
    }
    if let Some(d) = &raw.deny_status {
        match u16::try_from(d.value)
            .ok()
            .filter(|c| (400..500).contains(c))
            .and_then(|c| http::StatusCode::from_u16(c).ok())
        {
            Some(code) => s.deny_status = code,
            None => errs.at(
                d,
                format!(
                    "forward_auth.deny_status: {} is not a 4xx status (429, or 403 or 401 for nginx's auth_request, which passes on only those)",
                    d.value
                ),
            ),
        }
    }
    s
}

/// A path of its own: absolute, no query, fragment or trailing slash, no
/// empty segment, and none of the listener's other endpoints.
fn path(p: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b);
    if !p.starts_with('/') || p.len() < 2 {
        return Err(format!("{p:?} must be a path like /v1/forward-auth"));
    }
    if let Some(c) = p.bytes().find(|&b| !allowed(b)) {
        return Err(format!(
            "{p:?} has {:?}, which a path of its own cannot have",
            char::from(c)
        ));
    }
    if p.ends_with('/') || p.contains("//") {
        return Err(format!(
            "{p:?}: no trailing slash or empty segment (what follows the path is the request's own)"
        ));
    }
    let under = |a: &str, b: &str| a == b || a.strip_prefix(b).is_some_and(|r| r.starts_with('/'));
    if let Some(t) = TAKEN.iter().find(|t| under(p, t) || under(t, p)) {
        return Err(format!("{p:?} would take {t}, which the listener serves"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::path;

    #[test]
    fn paths_of_their_own_only() {
        for good in [
            "/v1/forward-auth",
            "/auth",
            "/spillway/check-request",
            "/a.b~c",
        ] {
            assert!(path(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/",
            "v1/x",
            "/v1/x/",
            "/v1//x",
            "/v1/x?y",
            "/v1/x#y",
            "/v1/{x}",
            "/v1/x y",
            "/v1/limit",
            "/v1/limit/x",
            "/v1",
            "/metrics",
            "/admin/v1/top",
        ] {
            assert!(path(bad).is_err(), "{bad:?}");
        }
    }
}
