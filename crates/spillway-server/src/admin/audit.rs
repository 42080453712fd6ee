//! The audit trail: every write call of the admin API, refused ones
//! included, kept in memory (the most recent `admin.audit_entries`) and
//! written to the log as one structured line each.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::Serialize;
use spillway_core::date::{civil_from_days, days_from_civil};

/// One write call.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Entry {
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// When, in RFC 3339 (UTC).
    pub at: String,
    /// The token's name.
    pub token: String,
    /// The HTTP method.
    pub method: String,
    /// The path called.
    pub path: String,
    /// What was done: `key.reset`, `override.put`, `override.delete`,
    /// `plan.put`, `plan.delete`, `health.put`.
    pub action: String,
    /// The rule, if the call named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The key's parts, if the call named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<String>>,
    /// The reason given, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The answer's status.
    pub status: u16,
    /// Why the call was refused (401, 403, 400, 404, ...): the problem's
    /// detail, control characters replaced and cut to
    /// [`MAX_REFUSED`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The longest refusal reason kept.
pub const MAX_REFUSED: usize = 256;

tokio::task_local! {
    /// Set while a write call runs: whether its handler recorded it.
    static AUDITED: std::cell::Cell<bool>;
}

/// Runs a write call's handler (`call`), and says whether it recorded
/// its own entry; a refusal before the handler got that far is recorded
/// by the caller.
pub async fn watch<F: Future>(call: F) -> (F::Output, bool) {
    AUDITED
        .scope(std::cell::Cell::new(false), async move {
            let out = call.await;
            (out, AUDITED.with(std::cell::Cell::get))
        })
        .await
}

/// `detail` fit for one audit field: control characters as `?`, at most
/// [`MAX_REFUSED`] bytes.
pub fn refusal_reason(detail: &str) -> String {
    let mut out = String::with_capacity(detail.len().min(MAX_REFUSED));
    for c in detail.chars() {
        if out.len() + c.len_utf8() > MAX_REFUSED {
            break;
        }
        out.push(if c.is_control() { '?' } else { c });
    }
    out
}

/// The trail.
#[derive(Debug)]
pub struct Audit {
    entries: Mutex<VecDeque<Entry>>,
    keep: Mutex<usize>,
}

impl Audit {
    /// A trail keeping the `keep` most recent entries.
    pub fn new(keep: usize) -> Audit {
        Audit {
            entries: Mutex::new(VecDeque::new()),
            keep: Mutex::new(keep.max(1)),
        }
    }

    /// Keeps `keep` entries from now on.
    pub fn set_keep(&self, keep: usize) {
        *self.keep.lock() = keep.max(1);
        let mut e = self.entries.lock();
        while e.len() > keep.max(1) {
            e.pop_front();
        }
    }

    /// Records `entry` and logs it.
    pub fn record(&self, entry: Entry) {
        // Inside a watched write call: its handler recorded it.
        let _ = AUDITED.try_with(|a| a.set(true));
        tracing::info!(
            target: "spillway::audit",
            token = %entry.token,
            method = %entry.method,
            path = %entry.path,
            action = %entry.action,
            rule = entry.rule.as_deref().unwrap_or(""),
            key = ?entry.key.as_deref().unwrap_or_default(),
            reason = ?entry.reason.as_deref().unwrap_or(""),
            refused = ?entry.refused.as_deref().unwrap_or(""),
            status = entry.status,
            "audit: {} {} by {} -> {}",
            entry.action,
            entry.path,
            entry.token,
            entry.status
        );
        let keep = *self.keep.lock();
        let mut e = self.entries.lock();
        if e.len() >= keep {
            e.pop_front();
        }
        e.push_back(entry);
    }

    /// Entries at or after `since_unix_ms`, oldest first, at most `limit`
    /// (the most recent ones).
    pub fn since(&self, since_unix_ms: u64, limit: usize) -> Vec<Entry> {
        let e = self.entries.lock();
        let list: Vec<&Entry> = e.iter().filter(|x| x.at_unix_ms >= since_unix_ms).collect();
        let skip = list.len().saturating_sub(limit);
        list.into_iter().skip(skip).cloned().collect()
    }
}

/// `ms` since the Unix epoch in RFC 3339, UTC, with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    spillway_core::date::rfc3339_ms(ms)
}

/// Reads `since`: milliseconds since the Unix epoch, or an RFC 3339 time
/// (`2026-11-24T10:00:00Z`, with an optional fraction and a `Z` or
/// `+HH:MM` offset).
///
/// # Errors
/// Neither.
pub fn parse_since(s: &str) -> Result<u64, String> {
    // Digits only: Rust's parser would also take `+5`, and a value with
    // spaces around it is not one docs/openapi.yaml offers.
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map_err(|_| format!("since {s:?}: milliseconds since 1970, at most 2^64 - 1"));
    }
    let bad = || {
        format!("since {s:?}: expected milliseconds since 1970 or a time like 2026-11-24T10:00:00Z")
    };
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let t = s.get(r).ok_or_else(bad)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse::<i64>().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let (y, mo, d, h, mi, se) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut frac_ms = 0i64;
    if let Some(f) = rest.strip_prefix('.') {
        let digits = f.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let mut ms = f[..digits.min(3)].to_string();
        while ms.len() < 3 {
            ms.push('0');
        }
        frac_ms = ms.parse().map_err(|_| bad())?;
        rest = &f[digits..];
    }
    let offset_s: i64 = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6
            && o.is_ascii()
            && (o.starts_with('+') || o.starts_with('-'))
            && &o[3..4] == ":" =>
        {
            let hh: i64 = o[1..3].parse().map_err(|_| bad())?;
            let mm: i64 = o[4..6].parse().map_err(|_| bad())?;
            let v = hh * 3600 + mm * 60;
            if o.starts_with('-') { -v } else { v }
        }
        _ => return Err(bad()),
    };
    // No Feb 31: the date must read back as itself.
    let days = days_from_civil(y, mo as u32, d as u32);
    if civil_from_days(days) != (y, mo as u32, d as u32) {
        return Err(bad());
    }
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    u64::try_from(secs * 1000 + frac_ms).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Any time written by `rfc3339` reads back; any text reads or is
        /// refused, never a panic.
        #[test]
        fn times_round_trip(ms in 0u64..253_402_300_799_000) {
            proptest::prop_assert_eq!(parse_since(&rfc3339(ms)), Ok(ms));
        }

        #[test]
        fn any_text_is_read_or_refused(s in "\\PC{0,40}") {
            let _ = parse_since(&s);
        }
    }

    #[test]
    fn known_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_since("2026-11-24T10:00:00Z"), Ok(1_795_514_400_000));
        assert_eq!(
            parse_since("2026-11-24T11:00:00+01:00"),
            Ok(1_795_514_400_000)
        );
        assert_eq!(parse_since("2026-11-24T10:00:00.5Z"), Ok(1_795_514_400_500));
        assert_eq!(parse_since("1795514400000"), Ok(1_795_514_400_000));
        assert!(parse_since("yesterday").is_err());
        // As docs/openapi.yaml spells it, nothing else (the contract test).
        assert!(parse_since("+5").is_err());
        assert!(parse_since(" 123").is_err());
        assert!(parse_since("99999999999999999999").is_err());
        assert!(parse_since("2026-13-24T10:00:00Z").is_err());
        assert!(parse_since("2026-02-31T10:00:00Z").is_err());
        // A multi-byte character where the offset's colon would be.
        assert!(parse_since("2026-11-24T10:00:00+0\u{e9}00").is_err());
    }

    #[test]
    fn keeps_the_most_recent() {
        let a = Audit::new(2);
        for i in 0..5 {
            a.record(Entry {
                at_unix_ms: i,
                at: rfc3339(i),
                token: "ops".into(),
                method: "PUT".into(),
                path: "/x".into(),
                action: "plan.put".into(),
                rule: None,
                key: None,
                reason: None,
                status: 200,
                refused: None,
            });
        }
        let got: Vec<u64> = a.since(0, 10).iter().map(|e| e.at_unix_ms).collect();
        assert_eq!(got, vec![3, 4]);
        assert_eq!(a.since(4, 10).len(), 1);
    }
}
