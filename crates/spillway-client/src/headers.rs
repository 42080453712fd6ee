//! What a server says about its limits, read from an answer's headers.
//!
//! Four forms are understood, all read into one [`Advice`]:
//!
//! - `Retry-After` (RFC 9110: delay-seconds or an HTTP date), and
//!   `X-RateLimit-Retry-After` (seconds or a date too) when `Retry-After` is
//!   absent or unreadable;
//! - `RateLimit` (draft-ietf-httpapi-ratelimit-headers): a structured-field
//!   list (RFC 9651) of policy names with `r` (remaining), `t` (seconds to
//!   reset) and `pk` (partition key, a byte sequence);
//! - `RateLimit-Policy`: a structured-field list of policy names with `q`
//!   (quota), `w` (window seconds), `qu` (quota unit) and `pk`;
//! - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`, the
//!   widespread unstandardised trio, used only when `RateLimit` gives
//!   nothing (see [`Advice::from_headers`]).
//!
//! Servers are not trusted: a malformed field is ignored, never an error and
//! never a panic, and every delay is capped at [`MAX_DELAY`], so a buggy or
//! hostile server cannot park a client for years.
//!
//! # Examples
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use http::{HeaderMap, HeaderValue};
//! use spillway_client::headers::Advice;
//!
//! let mut h = HeaderMap::new();
//! h.insert("ratelimit-policy", HeaderValue::from_static(r#""api";q=100;w=60"#));
//! h.insert("ratelimit", HeaderValue::from_static(r#""api";r=0;t=41"#));
//! let advice = Advice::from_headers(&h, SystemTime::now());
//! assert_eq!(advice.limits[0].remaining, 0);
//! assert_eq!(advice.policies[0].quota, 100);
//! assert_eq!(advice.wait(), Some(Duration::from_secs(41)));
//! ```

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};
use sfv::visitor::{
    EntryVisitor, Ignored, InnerListVisitor, ItemVisitor, ListVisitor, ParameterVisitor,
};
use sfv::{BareItemFromInput, KeyRef};

/// The longest delay any header can impose: one day.
///
/// A `Retry-After`, an `X-RateLimit-Reset` or a `RateLimit` `t` beyond it is
/// read as this. One day is also what spillway's own server sends for a
/// limit that never refills, so such an answer reads back unchanged; a
/// quota whose window really is longer (a monthly quota) is simply asked
/// again after a day.
pub const MAX_DELAY: Duration = Duration::from_secs(86_400);

/// An `X-RateLimit-Reset` at or above this many seconds is a Unix timestamp
/// (2001-09-09 or later), not a delay: no server means a delay of 31 years,
/// and servers that send timestamps (GitHub's, among others) send values
/// far above it.
pub const RESET_EPOCH_SECS: u64 = 1_000_000_000;

/// An `X-RateLimit-Reset` at or above this is a Unix timestamp in
/// milliseconds (as some servers send), not in seconds: read as seconds it
/// would be past the year 33000.
pub const RESET_EPOCH_MILLIS: u64 = 1_000_000_000_000;

/// The policy name given to the [`Quota`] and [`Policy`] built from
/// `X-RateLimit-*`, which names none: the empty string.
pub const UNNAMED_POLICY: &str = "";

const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const X_RETRY_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-retry-after");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// What an answer's headers say about the caller's limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Advice {
    /// Retry-After (or X-RateLimit-Retry-After), as a delay from `now`.
    pub retry_after: Option<Duration>,
    /// The RateLimit items (one per policy/partition), or one built from
    /// X-RateLimit-* when there is no RateLimit field.
    pub limits: Vec<Quota>,
    /// The RateLimit-Policy items, or one built from `X-RateLimit-Limit`
    /// when there is no RateLimit-Policy field.
    pub policies: Vec<Policy>,
}

/// One item of the `RateLimit` field: where the caller stands now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// The policy's name (the item's string or token); [`UNNAMED_POLICY`]
    /// when built from `X-RateLimit-*`.
    pub policy: String,
    /// Quota units left (`r`).
    pub remaining: u64,
    /// Time until the quota is restored (`t`), at most [`MAX_DELAY`];
    /// [`Duration::ZERO`] when the server did not say.
    pub reset: Duration,
    /// The partition key (`pk`, a byte sequence) when the server keeps one
    /// quota per partition and says which this is.
    pub partition: Option<Vec<u8>>,
}

/// One item of the `RateLimit-Policy` field: a limit the server applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The policy's name (the item's string or token); [`UNNAMED_POLICY`]
    /// when built from `X-RateLimit-Limit`.
    pub name: String,
    /// Quota units allowed per window (`q`).
    pub quota: u64,
    /// The window (`w`), not capped: a window is a description, not a wait.
    pub window: Option<Duration>,
    /// What a unit is (`qu`, e.g. `requests`, `content-bytes`); `None` means
    /// the draft's default, requests.
    pub unit: Option<String>,
    /// The partition key (`pk`), as in [`Quota::partition`].
    pub partition: Option<Vec<u8>>,
}

impl Advice {
    /// Reads every header form from `headers` at `now` (for HTTP dates).
    /// Malformed fields are ignored (never an error, never a panic); a field
    /// given several times (several header lines) is one list, as RFC 9651
    /// says.
    ///
    /// - `retry_after`: the longest valid `Retry-After` line; if there is
    ///   none, the longest valid `X-RateLimit-Retry-After` line.
    /// - `limits`: the `RateLimit` items; if that field is absent, malformed
    ///   or has no valid item, one quota from `X-RateLimit-Remaining` (the
    ///   smallest if several) and `X-RateLimit-Reset` (the latest if
    ///   several; see [`RESET_EPOCH_SECS`]), named [`UNNAMED_POLICY`].
    /// - `policies`: the `RateLimit-Policy` items; if none, one policy from
    ///   `X-RateLimit-Limit` (the smallest if several), with no window.
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Advice {
        let retry_after = longest_delay(headers, &RETRY_AFTER, now)
            .or_else(|| longest_delay(headers, &X_RETRY_AFTER, now));
        let mut limits = joined(headers, &RATELIMIT)
            .and_then(|v| parse_ratelimit_bytes(&v))
            .unwrap_or_default();
        if limits.is_empty()
            && let Some(remaining) =
                x_numbers(headers, &X_REMAINING).and_then(|v| v.into_iter().min())
        {
            let reset = x_numbers(headers, &X_RESET)
                .and_then(|v| v.into_iter().map(|n| x_reset(n, now)).max())
                .unwrap_or(Duration::ZERO);
            limits.push(Quota {
                policy: UNNAMED_POLICY.to_owned(),
                remaining,
                reset,
                partition: None,
            });
        }
        let mut policies = joined(headers, &POLICY)
            .and_then(|v| parse_policy_bytes(&v))
            .unwrap_or_default();
        if policies.is_empty()
            && let Some(quota) = x_numbers(headers, &X_LIMIT).and_then(|v| v.into_iter().min())
        {
            policies.push(Policy {
                name: UNNAMED_POLICY.to_owned(),
                quota,
                window: None,
                unit: None,
                partition: None,
            });
        }
        Advice {
            retry_after,
            limits,
            policies,
        }
    }

    /// How long the quotas say to wait: the longest reset among those with
    /// nothing remaining, `None` if none is spent. Unlike [`Advice::wait`],
    /// without `Retry-After`, which only a refusal's answer speaks for.
    pub fn quota_wait(&self) -> Option<Duration> {
        self.limits
            .iter()
            .filter(|q| q.remaining == 0)
            .map(|q| q.reset)
            .max()
            .filter(|w| !w.is_zero())
    }

    /// How long to wait before the next request to this server: the longest
    /// of retry_after and, for every quota with remaining == 0, its reset.
    /// None if nothing says to wait (a wait of zero is `None` too).
    pub fn wait(&self) -> Option<Duration> {
        let spent = self
            .limits
            .iter()
            .filter(|q| q.remaining == 0)
            .map(|q| q.reset);
        self.retry_after
            .into_iter()
            .chain(spent)
            .max()
            .filter(|d| !d.is_zero())
    }
}

/// Reads a `Retry-After` value: delay-seconds, or an HTTP date (IMF-fixdate,
/// or the obsolete RFC 850 and asctime forms) taken relative to `now`.
///
/// A date in the past is [`Duration::ZERO`]; anything longer than
/// [`MAX_DELAY`] (including a number too large for a `u64`) is
/// [`MAX_DELAY`]. `None` for anything else: a sign, a fraction, a list,
/// text that is not a date. Surrounding spaces and tabs are allowed.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = value.trim_ascii();
    if let Some(secs) = digits(value) {
        return Some(secs_capped(secs));
    }
    let date = httpdate::parse_http_date(std::str::from_utf8(value).ok()?).ok()?;
    Some(until(date, now))
}

/// Reads a `RateLimit` field value, a structured-field list.
///
/// `None` if the value is not a valid list (RFC 9651 then has the whole
/// field ignored). Within a valid list, an item is skipped when it is not a
/// string or token, when `r` is missing, or when `r`, `t` or `pk` has the
/// wrong type or a negative value; unknown parameters are ignored, and a
/// repeated one counts once, with its last value. A missing `t` reads as
/// [`Duration::ZERO`]; `t` is capped at [`MAX_DELAY`].
pub fn parse_ratelimit(value: &str) -> Option<Vec<Quota>> {
    parse_ratelimit_bytes(value.as_bytes())
}

/// Reads a `RateLimit-Policy` field value, a structured-field list.
///
/// `None` if the value is not a valid list. Within a valid list, an item is
/// skipped when it is not a string or token, when `q` is missing, or when
/// `q`, `w`, `qu` or `pk` has the wrong type or a negative value; unknown
/// parameters are ignored, a repeated one counts with its last value.
pub fn parse_ratelimit_policy(value: &str) -> Option<Vec<Policy>> {
    parse_policy_bytes(value.as_bytes())
}

fn parse_ratelimit_bytes(value: &[u8]) -> Option<Vec<Quota>> {
    let items = parse_list(value)?;
    Some(items.iter().filter_map(quota_of).collect())
}

fn parse_policy_bytes(value: &[u8]) -> Option<Vec<Policy>> {
    let items = parse_list(value)?;
    Some(items.iter().filter_map(policy_of).collect())
}

fn quota_of(item: &Raw) -> Option<Quota> {
    let policy = item.name.clone()?;
    let remaining = item.param("r")?.count()?;
    let reset = match item.param("t") {
        None => Duration::ZERO,
        Some(t) => secs_capped(t.count()?),
    };
    Some(Quota {
        policy,
        remaining,
        reset,
        partition: item.partition()?,
    })
}

fn policy_of(item: &Raw) -> Option<Policy> {
    let name = item.name.clone()?;
    let quota = item.param("q")?.count()?;
    let window = match item.param("w") {
        None => None,
        Some(w) => Some(Duration::from_secs(w.count()?)),
    };
    let unit = match item.param("qu") {
        None => None,
        Some(Value::Text(u)) => Some(u.clone()),
        Some(_) => return None,
    };
    Some(Policy {
        name,
        quota,
        window,
        unit,
        partition: item.partition()?,
    })
}

/// A list member as parsed, before the field's own rules are applied.
#[derive(Debug, Default)]
struct Raw {
    /// The bare item when it is a string or token; `None` otherwise (and for
    /// an inner list, which neither field allows).
    name: Option<String>,
    params: Vec<(String, Value)>,
}

#[derive(Debug)]
enum Value {
    Int(i64),
    Bytes(Vec<u8>),
    Text(String),
    Other,
}

impl Value {
    fn of(bare: BareItemFromInput<'_>) -> Value {
        match bare {
            BareItemFromInput::Integer(i) => Value::Int(i.into()),
            BareItemFromInput::ByteSequence(b) => Value::Bytes(b),
            BareItemFromInput::String(s) => Value::Text(s.as_str().to_owned()),
            BareItemFromInput::Token(t) => Value::Text(t.as_str().to_owned()),
            _ => Value::Other,
        }
    }

    /// A non-negative integer.
    fn count(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

impl Raw {
    /// The last value given to `key` (RFC 9651: a repeated key overwrites).
    fn param(&self, key: &str) -> Option<&Value> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// `Some(None)` without `pk`, `None` (skip the item) if it is no byte
    /// sequence.
    fn partition(&self) -> Option<Option<Vec<u8>>> {
        match self.param("pk") {
            None => Some(None),
            Some(Value::Bytes(b)) => Some(Some(b.clone())),
            Some(_) => None,
        }
    }
}

/// Parses a structured-field list strictly (sfv validates every part,
/// including those we skip), keeping what the two fields need.
fn parse_list(value: &[u8]) -> Option<Vec<Raw>> {
    sfv::Parser::new(value)
        .parse_list_with_visitor(Members::default())
        .ok()
}

#[derive(Default)]
struct Members(Vec<Raw>);

impl<'de> ListVisitor<'de> for Members {
    type Out = Vec<Raw>;
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Self::Error> {
        Ok(Entry(&mut self.0))
    }

    fn finish(self) -> Result<Self::Out, Self::Error> {
        Ok(self.0)
    }
}

struct Entry<'a>(&'a mut Vec<Raw>);

impl<'de> EntryVisitor<'de> for Entry<'_> {
    type Error = Infallible;

    fn item(self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(self)
    }

    fn inner_list(self) -> Result<impl InnerListVisitor<'de>, Self::Error> {
        // Kept as a nameless member so it is skipped, not merged away.
        self.0.push(Raw::default());
        Ok(Ignored)
    }
}

impl<'de, 'a> ItemVisitor<'de> for Entry<'a> {
    type Out = ();
    type Error = Infallible;

    fn bare_item(
        self,
        bare: BareItemFromInput<'de>,
    ) -> Result<impl ParameterVisitor<'de, Out = ()>, Self::Error> {
        let name = match Value::of(bare) {
            Value::Text(t) => Some(t),
            _ => None,
        };
        Ok(Params {
            out: self.0,
            raw: Raw {
                name,
                params: Vec::new(),
            },
        })
    }
}

struct Params<'a> {
    out: &'a mut Vec<Raw>,
    raw: Raw,
}

impl<'de> ParameterVisitor<'de> for Params<'_> {
    type Out = ();
    type Error = Infallible;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Self::Error> {
        self.raw
            .params
            .push((key.as_str().to_owned(), Value::of(value)));
        Ok(())
    }

    fn finish(self) -> Result<(), Self::Error> {
        self.out.push(self.raw);
        Ok(())
    }
}

/// All lines of a field joined with `, ` (RFC 9651 §4.2), or `None` when
/// the field is absent.
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u8>> {
    let mut lines = headers.get_all(name).iter();
    let mut out = lines.next()?.as_bytes().to_vec();
    for line in lines {
        out.extend_from_slice(b", ");
        out.extend_from_slice(line.as_bytes());
    }
    Some(out)
}

/// The longest valid delay among the lines of a `Retry-After`-like field.
fn longest_delay(headers: &HeaderMap, name: &HeaderName, now: SystemTime) -> Option<Duration> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| parse_retry_after(v.as_bytes(), now))
        .max()
}

/// Every number of an `X-RateLimit-*` field, across lines and commas (a
/// proxy may have merged duplicates); `None` if the field is absent or any
/// element is not a plain non-negative integer. Numbers too large for a
/// `u64` read as `u64::MAX`.
fn x_numbers(headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    for line in headers.get_all(name) {
        for element in line.as_bytes().split(|&b| b == b',') {
            out.push(digits(element.trim_ascii())?);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// An `X-RateLimit-Reset` number as a delay from `now`: see
/// [`RESET_EPOCH_SECS`] and [`RESET_EPOCH_MILLIS`].
fn x_reset(n: u64, now: SystemTime) -> Duration {
    let at = if n >= RESET_EPOCH_MILLIS {
        Duration::from_millis(n)
    } else if n >= RESET_EPOCH_SECS {
        Duration::from_secs(n)
    } else {
        return secs_capped(n);
    };
    // `SystemTime + Duration` panics on overflow; a time past what the
    // platform can hold is certainly more than a day away.
    match UNIX_EPOCH.checked_add(at) {
        Some(at) => until(at, now),
        None => MAX_DELAY,
    }
}

/// `1*DIGIT` as a `u64`, saturating; `None` for anything else (`u64`'s own
/// parser would also take a leading `+`).
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |n, &d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

fn secs_capped(secs: u64) -> Duration {
    Duration::from_secs(secs).min(MAX_DELAY)
}

/// From `now` to `at`, zero if `at` is past, at most [`MAX_DELAY`].
fn until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now)
        .map_or(Duration::ZERO, |d| d.min(MAX_DELAY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn t0() -> SystemTime {
        // 2024-01-01T00:00:00Z
        UNIX_EPOCH + Duration::from_secs(1_704_067_200)
    }

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn quota(policy: &str, remaining: u64, reset: u64) -> Quota {
        Quota {
            policy: policy.to_owned(),
            remaining,
            reset: secs(reset),
            partition: None,
        }
    }

    fn policy(name: &str, quota: u64, window: Option<u64>) -> Policy {
        Policy {
            name: name.to_owned(),
            quota,
            window: window.map(secs),
            unit: None,
            partition: None,
        }
    }

    // What spillway-tower's `rate_limit_headers` writes for a denial by
    // the rule `api` (limit 100 per 60 s, reset and retry in 41 s).
    #[test]
    fn spillway_denial() {
        let h = map(&[
            ("ratelimit-policy", r#""api";q=100;w=60"#),
            ("ratelimit", r#""api";r=0;t=41"#),
            ("x-ratelimit-limit", "100"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "41"),
            ("retry-after", "41"),
            ("x-ratelimit-retry-after", "41"),
        ]);
        let a = Advice::from_headers(&h, t0());
        assert_eq!(
            a,
            Advice {
                retry_after: Some(secs(41)),
                limits: vec![quota("api", 0, 41)],
                policies: vec![policy("api", 100, Some(60))],
            }
        );
        assert_eq!(a.wait(), Some(secs(41)));
    }

    // An admission (no Retry-After, a `spillway-zone` that is not ours).
    #[test]
    fn spillway_admission() {
        let h = map(&[
            ("ratelimit-policy", r#""per-ip";q=10;w=1"#),
            ("ratelimit", r#""per-ip";r=7;t=1"#),
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "1"),
            ("spillway-zone", "soft"),
        ]);
        let a = Advice::from_headers(&h, t0());
        assert_eq!(a.retry_after, None);
        assert_eq!(a.limits, vec![quota("per-ip", 7, 1)]);
        assert_eq!(a.policies, vec![policy("per-ip", 10, Some(1))]);
        assert_eq!(a.wait(), None);
    }

    // Rule names escaped by spillway's `push_sf_string`, and its "never"
    // (a limit that does not refill) written as one day.
    #[test]
    fn spillway_escaped_name_and_never() {
        let h = map(&[
            ("ratelimit-policy", r#""a\"b\\c_d";q=0;w=0"#),
            ("ratelimit", r#""a\"b\\c_d";r=0;t=86400"#),
            ("retry-after", "86400"),
            ("x-ratelimit-retry-after", "86400"),
        ]);
        let a = Advice::from_headers(&h, t0());
        assert_eq!(a.limits, vec![quota("a\"b\\c_d", 0, 86_400)]);
        assert_eq!(a.policies, vec![policy("a\"b\\c_d", 0, Some(0))]);
        assert_eq!(a.wait(), Some(MAX_DELAY));
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(parse_retry_after(b"120", t0()), Some(secs(120)));
        assert_eq!(parse_retry_after(b"0", t0()), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(b" 7\t", t0()), Some(secs(7)));
        assert_eq!(parse_retry_after(b"007", t0()), Some(secs(7)));
    }

    #[test]
    fn retry_after_dates() {
        let imf = b"Mon, 01 Jan 2024 00:01:30 GMT";
        assert_eq!(parse_retry_after(imf, t0()), Some(secs(90)));
        let rfc850 = b"Monday, 01-Jan-24 00:00:10 GMT";
        assert_eq!(parse_retry_after(rfc850, t0()), Some(secs(10)));
        let asctime = b"Mon Jan  1 00:00:05 2024";
        assert_eq!(parse_retry_after(asctime, t0()), Some(secs(5)));
        let past = b"Sun, 31 Dec 2023 23:59:00 GMT";
        assert_eq!(parse_retry_after(past, t0()), Some(Duration::ZERO));
        let far = b"Fri, 01 Jan 2100 00:00:00 GMT";
        assert_eq!(parse_retry_after(far, t0()), Some(MAX_DELAY));
    }

    #[test]
    fn retry_after_garbage() {
        for bad in [
            &b""[..],
            b"soon",
            b"-5",
            b"+5",
            b"1.5",
            b"5, 6",
            b"1e3",
            b"Mon, 32 Jan 2024 00:00:00 GMT",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_retry_after(bad, t0()), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_huge() {
        assert_eq!(parse_retry_after(b"86401", t0()), Some(MAX_DELAY));
        assert_eq!(
            parse_retry_after(b"18446744073709551615", t0()),
            Some(MAX_DELAY)
        );
        let huge = [b'9'; 400];
        assert_eq!(parse_retry_after(&huge, t0()), Some(MAX_DELAY));
    }

    #[test]
    fn retry_after_prefers_the_standard_field_and_the_longest_line() {
        let h = map(&[("retry-after", "5"), ("x-ratelimit-retry-after", "50")]);
        assert_eq!(Advice::from_headers(&h, t0()).retry_after, Some(secs(5)));
        let h = map(&[("retry-after", "junk"), ("x-ratelimit-retry-after", "50")]);
        assert_eq!(Advice::from_headers(&h, t0()).retry_after, Some(secs(50)));
        let h = map(&[
            ("retry-after", "5"),
            ("retry-after", "9"),
            ("retry-after", "x"),
        ]);
        assert_eq!(Advice::from_headers(&h, t0()).retry_after, Some(secs(9)));
    }

    #[test]
    fn ratelimit_several_items_and_partitions() {
        let q = parse_ratelimit(r#""sec";r=3;t=1, "day";r=0;t=3600;pk=:YWxpY2U=:, tok;r=1;t=2"#);
        let mut day = quota("day", 0, 3600);
        day.partition = Some(b"alice".to_vec());
        assert_eq!(q, Some(vec![quota("sec", 3, 1), day, quota("tok", 1, 2)]));
    }

    #[test]
    fn ratelimit_params_in_any_order_unknown_ignored_last_wins() {
        let q = parse_ratelimit(r#""a";zz=?1;t=9;x="y";r=4, "b";r=1;r=2;t=3"#);
        assert_eq!(q, Some(vec![quota("a", 4, 9), quota("b", 2, 3)]));
    }

    #[test]
    fn ratelimit_bad_items_skipped() {
        let q = parse_ratelimit(
            r#"5;r=1;t=1, "neg";r=-1;t=1, "negt";r=1;t=-1, "dec";r=1.0;t=1, "str";r="1";t=1, "nor";t=4, ("in" "ner");r=1;t=1, "pk";r=1;t=1;pk="s", "ok";r=1;t=1, "not";r=0"#,
        );
        assert_eq!(q, Some(vec![quota("ok", 1, 1), quota("not", 0, 0)]));
    }

    #[test]
    fn ratelimit_malformed_field_is_none() {
        for bad in [
            r#""a";r=1;t=1,"#,
            r#""a;r=1"#,
            "a;r=1 junk",
            "1a;r=1",
            "\"a\";R=1",
            "\"é\";r=1",
        ] {
            assert_eq!(parse_ratelimit(bad), None, "{bad}");
        }
        assert_eq!(parse_ratelimit(""), Some(vec![]));
    }

    #[test]
    fn ratelimit_caps_reset() {
        let q = parse_ratelimit(r#""m";r=0;t=999999999999999"#);
        assert_eq!(q, Some(vec![quota("m", 0, 86_400)]));
    }

    #[test]
    fn policy_full_and_defaults() {
        let p = parse_ratelimit_policy(
            r#""burst";q=100;qu="requests";w=1, "bytes";w=3600;q=10000;qu=content-bytes;pk=:AQI=:, "bare";q=5, "noq";w=1, "badqu";q=1;qu=3, "negw";q=1;w=-1"#,
        )
        .unwrap();
        let mut burst = policy("burst", 100, Some(1));
        burst.unit = Some("requests".into());
        let mut bytes = policy("bytes", 10_000, Some(3600));
        bytes.unit = Some("content-bytes".into());
        bytes.partition = Some(vec![1, 2]);
        assert_eq!(p, vec![burst, bytes, policy("bare", 5, None)]);
    }

    #[test]
    fn several_lines_are_one_list() {
        let h = map(&[
            ("ratelimit", r#""a";r=1;t=2"#),
            ("ratelimit", r#""b";r=0;t=30"#),
            ("ratelimit-policy", r#""a";q=5"#),
            ("ratelimit-policy", r#""b";q=9;w=60"#),
        ]);
        let a = Advice::from_headers(&h, t0());
        assert_eq!(a.limits, vec![quota("a", 1, 2), quota("b", 0, 30)]);
        assert_eq!(
            a.policies,
            vec![policy("a", 5, None), policy("b", 9, Some(60))]
        );
        assert_eq!(a.wait(), Some(secs(30)));
        // One bad line spoils the whole field (RFC 9651), and X-* steps in.
        let h = map(&[
            ("ratelimit", r#""a";r=1;t=2"#),
            ("ratelimit", "@@"),
            ("x-ratelimit-remaining", "3"),
        ]);
        assert_eq!(Advice::from_headers(&h, t0()).limits, vec![quota("", 3, 0)]);
    }

    #[test]
    fn x_ratelimit_delta_reset() {
        let h = map(&[
            ("x-ratelimit-limit", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "12"),
        ]);
        let a = Advice::from_headers(&h, t0());
        assert_eq!(a.limits, vec![quota(UNNAMED_POLICY, 0, 12)]);
        assert_eq!(a.policies, vec![policy(UNNAMED_POLICY, 60, None)]);
        assert_eq!(a.wait(), Some(secs(12)));
    }

    #[test]
    fn x_ratelimit_epoch_reset() {
        let now = t0();
        let epoch = 1_704_067_200 + 300;
        let h = map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &epoch.to_string()),
        ]);
        assert_eq!(
            Advice::from_headers(&h, now).limits,
            vec![quota("", 0, 300)]
        );
        let ms = (1_704_067_200u64 + 20) * 1000;
        let h = map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &ms.to_string()),
        ]);
        assert_eq!(Advice::from_headers(&h, now).limits, vec![quota("", 0, 20)]);
        // In the past: no wait; far future or beyond SystemTime: capped.
        let h = map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1600000000"),
        ]);
        assert_eq!(Advice::from_headers(&h, now).limits, vec![quota("", 0, 0)]);
        assert_eq!(Advice::from_headers(&h, now).wait(), None);
        let h = map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "99999999999999999999999"),
        ]);
        assert_eq!(
            Advice::from_headers(&h, now).limits,
            vec![quota("", 0, 86_400)]
        );
        // Just below the threshold: a (capped) delay.
        let h = map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "999999999"),
        ]);
        assert_eq!(
            Advice::from_headers(&h, now).limits,
            vec![quota("", 0, 86_400)]
        );
    }

    #[test]
    fn x_ratelimit_merged_and_bad() {
        let h = map(&[
            ("x-ratelimit-remaining", "5, 2"),
            ("x-ratelimit-remaining", "4"),
            ("x-ratelimit-reset", "3, 8"),
        ]);
        assert_eq!(Advice::from_headers(&h, t0()).limits, vec![quota("", 2, 8)]);
        for bad in ["-1", "1.5", "", "x", "1,", "+3"] {
            let h = map(&[("x-ratelimit-remaining", bad), ("x-ratelimit-limit", bad)]);
            assert_eq!(Advice::from_headers(&h, t0()), Advice::default(), "{bad}");
        }
        // A bad reset leaves the quota, with an unknown reset.
        let h = map(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "soon"),
        ]);
        assert_eq!(Advice::from_headers(&h, t0()).limits, vec![quota("", 0, 0)]);
    }

    #[test]
    fn ratelimit_field_wins_over_x() {
        let h = map(&[
            ("ratelimit", r#""a";r=9;t=1"#),
            ("ratelimit-policy", r#""a";q=10"#),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-limit", "1"),
        ]);
        let a = Advice::from_headers(&h, t0());
        assert_eq!(a.limits, vec![quota("a", 9, 1)]);
        assert_eq!(a.policies, vec![policy("a", 10, None)]);
    }

    #[test]
    fn wait_takes_the_longest() {
        let a = Advice {
            retry_after: Some(secs(3)),
            limits: vec![quota("a", 0, 10), quota("b", 1, 99), quota("c", 0, 7)],
            policies: vec![],
        };
        assert_eq!(a.wait(), Some(secs(10)));
        assert_eq!(Advice::default().wait(), None);
        let zero = Advice {
            retry_after: Some(Duration::ZERO),
            ..Advice::default()
        };
        assert_eq!(zero.wait(), None);
    }

    // --- property tests ---

    const NAMES: [&str; 8] = [
        "retry-after",
        "x-ratelimit-retry-after",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "other",
    ];

    /// Bytes a header value may hold, biased towards the fields' syntax.
    fn value_bytes() -> impl Strategy<Value = Vec<u8>> {
        let interesting = prop::sample::select(
            b"\"\\;=,:() \t?*@%-.0123456789rtqwpkuaAZ=+/\x7f\x80\xff".to_vec(),
        );
        prop::collection::vec(prop_oneof![any::<u8>(), interesting], 0..64)
    }

    fn any_time() -> impl Strategy<Value = SystemTime> {
        prop_oneof![
            Just(UNIX_EPOCH),
            Just(t0()),
            (0u64..=u64::from(u32::MAX) * 4).prop_map(|s| UNIX_EPOCH + secs(s)),
        ]
    }

    // Serialisers written here, independent of the parser under test.
    fn sf_string(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    fn base64(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in bytes.chunks(3) {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    /// `;key=value` parameters, shuffled, with unknown ones mixed in.
    fn params(mut known: Vec<String>, unknown: &[String], order: &[usize]) -> String {
        known.extend(unknown.iter().cloned());
        let mut out = String::new();
        for i in order.iter().take(known.len()) {
            let i = i % known.len();
            if !known[i].is_empty() {
                out.push(';');
                out.push_str(&std::mem::take(&mut known[i]));
            }
        }
        for p in known.into_iter().filter(|p| !p.is_empty()) {
            out.push(';');
            out.push_str(&p);
        }
        out
    }

    fn name() -> impl Strategy<Value = String> {
        "[ -~]{0,12}"
    }

    fn count() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..100, 0u64..=999_999_999_999_999]
    }

    fn unknown() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(
            prop_oneof![
                Just("x=1".to_owned()),
                Just("zz=?0".to_owned()),
                Just("u=\"v\"".to_owned()),
                Just("flag".to_owned()),
                Just("d=1.5".to_owned()),
            ],
            0..3,
        )
    }

    fn quotas() -> impl Strategy<Value = Vec<(Quota, Vec<String>, Vec<usize>)>> {
        let q = (
            name(),
            count(),
            0u64..=86_400,
            prop::option::of(prop::collection::vec(any::<u8>(), 0..9)),
        )
            .prop_map(|(policy, remaining, reset, partition)| Quota {
                policy,
                remaining,
                reset: secs(reset),
                partition,
            });
        prop::collection::vec(
            (q, unknown(), prop::collection::vec(any::<usize>(), 6)),
            0..5,
        )
    }

    fn policies() -> impl Strategy<Value = Vec<(Policy, Vec<String>, Vec<usize>)>> {
        let p = (
            name(),
            count(),
            prop::option::of(count()),
            prop::option::of("[a-z][a-z-]{0,10}"),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..9)),
        )
            .prop_map(|(name, quota, window, unit, partition)| Policy {
                name,
                quota,
                window: window.map(secs),
                unit,
                partition,
            });
        prop::collection::vec(
            (p, unknown(), prop::collection::vec(any::<usize>(), 8)),
            0..5,
        )
    }

    fn write_quotas(items: &[(Quota, Vec<String>, Vec<usize>)]) -> String {
        let members: Vec<String> = items
            .iter()
            .map(|(q, unknown, order)| {
                let mut known = vec![
                    format!("r={}", q.remaining),
                    format!("t={}", q.reset.as_secs()),
                ];
                if let Some(pk) = &q.partition {
                    known.push(format!("pk=:{}:", base64(pk)));
                }
                sf_string(&q.policy) + &params(known, unknown, order)
            })
            .collect();
        members.join(", ")
    }

    fn write_policies(items: &[(Policy, Vec<String>, Vec<usize>)]) -> String {
        let members: Vec<String> = items
            .iter()
            .map(|(p, unknown, order)| {
                let mut known = vec![format!("q={}", p.quota)];
                if let Some(w) = p.window {
                    known.push(format!("w={}", w.as_secs()));
                }
                if let Some(u) = &p.unit {
                    // A token or a string: both are read.
                    known.push(if u.len() % 2 == 0 {
                        format!("qu={u}")
                    } else {
                        format!("qu={}", sf_string(u))
                    });
                }
                if let Some(pk) = &p.partition {
                    known.push(format!("pk=:{}:", base64(pk)));
                }
                sf_string(&p.name) + &params(known, unknown, order)
            })
            .collect();
        members.join(", ")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn any_header_no_panic(
            fields in prop::collection::vec((prop::sample::select(&NAMES[..]), value_bytes()), 0..10),
            now in any_time(),
        ) {
            let mut h = HeaderMap::new();
            for (k, v) in &fields {
                if let Ok(v) = HeaderValue::from_bytes(v) {
                    h.append(*k, v);
                }
            }
            let a = Advice::from_headers(&h, now);
            prop_assert!(a.retry_after.is_none_or(|d| d <= MAX_DELAY));
            prop_assert!(a.limits.iter().all(|q| q.reset <= MAX_DELAY));
            prop_assert!(a.wait().is_none_or(|d| d <= MAX_DELAY && !d.is_zero()));
        }

        #[test]
        fn any_value_no_panic(v in value_bytes(), now in any_time()) {
            prop_assert!(parse_retry_after(&v, now).is_none_or(|d| d <= MAX_DELAY));
            let s = String::from_utf8_lossy(&v);
            let _ = parse_ratelimit(&s);
            let _ = parse_ratelimit_policy(&s);
        }

        #[test]
        fn any_string_no_panic(s in "\\PC*", now in any_time()) {
            let _ = parse_retry_after(s.as_bytes(), now);
            let _ = parse_ratelimit(&s);
            let _ = parse_ratelimit_policy(&s);
        }

        #[test]
        fn quotas_round_trip(items in quotas()) {
            let text = write_quotas(&items);
            let want: Vec<Quota> = items.into_iter().map(|(q, _, _)| q).collect();
            prop_assert_eq!(parse_ratelimit(&text), Some(want.clone()), "{}", text);
            let h = map(&[("ratelimit", &text)]);
            if !want.is_empty() {
                prop_assert_eq!(Advice::from_headers(&h, t0()).limits, want);
            }
        }

        #[test]
        fn policies_round_trip(items in policies()) {
            let text = write_policies(&items);
            let want: Vec<Policy> = items.into_iter().map(|(p, _, _)| p).collect();
            prop_assert_eq!(parse_ratelimit_policy(&text), Some(want), "{}", text);
        }

        /// Valid fields with one byte changed, inserted or removed: parsed
        /// or refused as a whole, never a panic, never an uncapped reset.
        #[test]
        fn mutated_fields_no_panic(
            qs in quotas(),
            ps in policies(),
            at in any::<usize>(),
            byte in prop::sample::select(b"\"\\;=,:()?*-.09aZ \t\x7f".to_vec()),
            how in 0u8..3,
        ) {
            for text in [write_quotas(&qs), write_policies(&ps)] {
                let mut v = text.into_bytes();
                let i = if v.is_empty() { 0 } else { at % v.len() };
                match how {
                    0 if !v.is_empty() => v[i] = byte,
                    1 => v.insert(i, byte),
                    _ if !v.is_empty() => { v.remove(i); }
                    _ => v.push(byte),
                }
                let s = String::from_utf8_lossy(&v);
                if let Some(q) = parse_ratelimit(&s) {
                    prop_assert!(q.iter().all(|q| q.reset <= MAX_DELAY));
                }
                let _ = parse_ratelimit_policy(&s);
            }
        }

        #[test]
        fn retry_after_seconds_round_trip(n in any::<u64>()) {
            let got = parse_retry_after(n.to_string().as_bytes(), t0());
            prop_assert_eq!(got, Some(secs(n).min(MAX_DELAY)));
        }

        #[test]
        fn retry_after_date_round_trip(offset in 0u64..200_000) {
            let at = t0() + secs(offset);
            let text = httpdate::fmt_http_date(at);
            let got = parse_retry_after(text.as_bytes(), t0());
            prop_assert_eq!(got, Some(secs(offset).min(MAX_DELAY)));
        }
    }
}
