//! Rate limit response headers: the IETF `RateLimit` / `RateLimit-Policy`
//! fields (draft-ietf-httpapi-ratelimit-headers, structured-field lists) and
//! the widespread `X-RateLimit-*` ones.

use spillway_core::{Limit, Nanos, Rule, Verdict};
use spillway_store::Checked;

use axum::http::HeaderName;

/// Header name/value pairs for a decision, in order.
pub type HeaderList = Vec<(HeaderName, String)>;

const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const X_RETRY_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-retry-after");

/// The headers describing the deciding limit of `checked` (the denying one,
/// or the one closest to denying); none when no rule applied.
pub fn rate_limit_headers(checked: &Checked) -> HeaderList {
    let mut out = Vec::with_capacity(7);
    let Some(d) = checked.decision.deciding else {
        return out;
    };
    let Some(rule) = checked.rule(&d) else {
        return out;
    };
    let limit = rule
        .enforced_limits()
        .get(d.limit)
        .or(rule.limits().get(d.limit));
    push(&mut out, rule, limit, &d.verdict, checked.decision.allowed);
    out
}

fn push(out: &mut HeaderList, rule: &Rule, limit: Option<&Limit>, v: &Verdict, allowed: bool) {
    let window_s = limit.map_or(0, |l| l.window().as_secs_ceil());
    let reset_s = v.reset.as_secs_ceil();
    let name = sf_string(rule.name());
    out.push((POLICY, format!("{name};q={};w={window_s}", v.limit)));
    out.push((RATELIMIT, format!("{name};r={};t={reset_s}", v.remaining)));
    out.push((X_LIMIT, v.limit.to_string()));
    out.push((X_REMAINING, v.remaining.to_string()));
    out.push((X_RESET, reset_s.to_string()));
    if !allowed {
        let retry = retry_secs(v.retry_after);
        out.push((RETRY_AFTER, retry.to_string()));
        out.push((X_RETRY_AFTER, retry.to_string()));
    }
}

/// Whole seconds to wait, rounded up; "never" is shown as one day, since
/// `Retry-After` has no way to say never and a client should not spin.
pub fn retry_secs(retry_after: Nanos) -> u64 {
    if retry_after.is_never() {
        86_400
    } else {
        retry_after.as_secs_ceil().max(1)
    }
}

/// A structured-field string: quoted, with `"` and `\` escaped and anything
/// outside printable ASCII replaced, so a rule name cannot break the header.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
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
    out
}
