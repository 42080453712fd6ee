//! Rate limit response headers: the IETF `RateLimit` / `RateLimit-Policy`
//! fields (draft-ietf-httpapi-ratelimit-headers, structured-field lists) and
//! the widespread `X-RateLimit-*` ones.

use http::{HeaderMap, HeaderName, HeaderValue};
use spillway_core::Nanos;
use spillway_store::Checked;

const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const X_RETRY_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-retry-after");

/// `elastic` or `soft`: the request was admitted above a rule's plain
/// limit, in its elastic or soft zone (the `RateLimit` fields show the
/// plain limit's remaining, 0 there): the warning before delays and 429s.
pub const ZONE: HeaderName = HeaderName::from_static("spillway-zone");

/// The headers [`rate_limit_headers`] gives a decision a rule made (a
/// denial adds `Retry-After` and `X-RateLimit-Retry-After`; `Spillway-Zone`
/// only above a plain limit): a proxy that adds them to an upstream's
/// answer drops the upstream's own first.
pub const DECISION_HEADERS: [HeaderName; 6] =
    [POLICY, RATELIMIT, X_LIMIT, X_REMAINING, X_RESET, ZONE];

/// Adds the headers describing the deciding limit of `checked` (the denying
/// one, or the one closest to denying) to `headers`; nothing when no rule
/// applied. `Retry-After` only on a denial.
pub fn insert_rate_limit_headers(checked: &Checked, headers: &mut HeaderMap) {
    headers.reserve(8);
    rate_limit_headers(checked, |k, s| {
        if let Ok(val) = HeaderValue::from_str(s) {
            headers.insert(k.clone(), val);
        }
    });
}

/// The headers of [`insert_rate_limit_headers`], each passed to `put` as a
/// name and a value (printable ASCII: rule names are escaped), for a writer
/// that does not build a [`HeaderMap`].
pub fn rate_limit_headers(checked: &Checked, mut put: impl FnMut(&HeaderName, &str)) {
    let Some(d) = checked.decision.deciding else {
        return;
    };
    let Some(rule) = checked.rule(&d) else {
        return;
    };
    let v = &d.verdict;
    let window_s = rule
        .enforced_limits()
        .get(d.limit)
        .map_or(0, |l| l.window().as_secs_ceil());
    let reset_s = v.reset.as_secs_ceil();
    // Both structured-field lines in one buffer, numbers through itoa
    // (`write!` and `HeaderValue::from(u64)` showed in profiles).
    let mut num = itoa::Buffer::new();
    let mut line = String::with_capacity(rule.name().len() + 48);
    push_sf_string(&mut line, rule.name());
    let name_len = line.len();
    for (k, n) in [(";q=", v.limit), (";w=", window_s)] {
        line.push_str(k);
        line.push_str(num.format(n));
    }
    put(&POLICY, &line);
    line.truncate(name_len);
    for (k, n) in [(";r=", v.remaining), (";t=", reset_s)] {
        line.push_str(k);
        line.push_str(num.format(n));
    }
    put(&RATELIMIT, &line);
    put(&X_LIMIT, num.format(v.limit));
    put(&X_REMAINING, num.format(v.remaining));
    put(&X_RESET, num.format(reset_s));
    if !checked.decision.allowed {
        let retry = num.format(retry_after_secs(v.retry_after));
        put(&RETRY_AFTER, retry);
        put(&X_RETRY_AFTER, retry);
    } else if let Some(zone) = zone(checked) {
        put(&ZONE, zone);
    }
}

/// `elastic` if an elastic rule admitted the request above its plain
/// limit, else `soft` if a soft rule did; `None` within every limit.
pub fn zone(checked: &Checked) -> Option<&'static str> {
    let mut zone = None;
    for r in &checked.decision.rules {
        match r.outcome {
            spillway_core::Outcome::ElasticAdmitted => return Some("elastic"),
            spillway_core::Outcome::SoftExceeded => zone = Some("soft"),
            _ => {}
        }
    }
    zone
}

/// The headers of [`rate_limit_headers`] appended to `out` as HTTP/1.1
/// `name: value` lines, for a server that writes its answers by hand.
pub fn push_rate_limit_headers(checked: &Checked, out: &mut Vec<u8>) {
    rate_limit_headers(checked, |name, value| {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    });
}

/// Whole seconds to wait, rounded up, at least 1; "never" is shown as one
/// day, since `Retry-After` has no way to say never and a client should not spin.
pub fn retry_after_secs(retry_after: Nanos) -> u64 {
    if retry_after.is_never() {
        86_400
    } else {
        retry_after.as_secs_ceil().max(1)
    }
}

/// Appends a structured-field string: quoted, with `"` and `\` escaped and
/// anything outside printable ASCII replaced, so a rule name cannot break
/// the header.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}
