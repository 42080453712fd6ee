//! Timestamps: calendar dates (combined log, RFC 3339) and epoch numbers,
//! all to nanoseconds since the Unix epoch, UTC.
//!
//! The date arithmetic is spillway-core's (`spillway_core::date`); the
//! readers need only dates from 1970 to 2554 (the last second a `u64` of
//! nanoseconds holds).

use super::TsUnit;

const NS_PER_SEC: i128 = 1_000_000_000;

pub(crate) use spillway_core::date::{civil_from_days, days_from_civil, days_in_month};

/// A local date and time with its offset from UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    /// 0..=60 (60: a leap second, read as the next minute's first second,
    /// as POSIX time does).
    pub second: u32,
    pub nanos: u32,
    /// Seconds east of UTC.
    pub offset: i32,
}

impl Civil {
    /// Nanoseconds since the Unix epoch, checking every part's range.
    pub(crate) fn to_ns(self) -> Result<u64, &'static str> {
        if !(1..=12).contains(&self.month) {
            return Err("month out of range");
        }
        if self.day == 0 || self.day > days_in_month(self.year, self.month) {
            return Err("no such day in that month");
        }
        if self.hour > 23 || self.minute > 59 || self.second > 60 {
            return Err("time of day out of range");
        }
        let days = days_from_civil(self.year, self.month, self.day);
        let secs = i128::from(days) * 86_400
            + i128::from(self.hour * 3600 + self.minute * 60 + self.second)
            - i128::from(self.offset);
        if secs < 0 {
            return Err("before 1970");
        }
        let ns = secs * NS_PER_SEC + i128::from(self.nanos);
        u64::try_from(ns).map_err(|_| "too far in the future (after 2554)")
    }
}

/// `n` ASCII digits at `b[at..]` as a number.
fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let s = b.get(at..at + n)?;
    let mut v = 0u32;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

/// A run of 1 or more digits at `b[at..]` read as a fraction of a second:
/// (nanoseconds, digits consumed). Digits past the ninth are read and
/// dropped (truncated), as a `u64` of nanoseconds cannot hold them.
fn fraction(b: &[u8], at: usize) -> (u32, usize) {
    let mut ns = 0u32;
    let mut n = 0;
    while let Some(&c) = b.get(at + n) {
        if !c.is_ascii_digit() {
            break;
        }
        if n < 9 {
            ns = ns * 10 + u32::from(c - b'0');
        }
        n += 1;
    }
    let mut scale = n;
    while scale < 9 {
        ns *= 10;
        scale += 1;
    }
    (ns, n)
}

const MONTHS: [&[u8; 3]; 12] = [
    b"jan", b"feb", b"mar", b"apr", b"may", b"jun", b"jul", b"aug", b"sep", b"oct", b"nov", b"dec",
];

/// The date of a combined log line, between its brackets:
/// `10/Oct/2000:13:55:36 -0700`, with up to 9 digits of a fraction of a
/// second after the seconds (`13:55:36.123 -0700`).
pub(crate) fn parse_clf_date(s: &str) -> Result<u64, &'static str> {
    const SHAPE: &str = "not a date like 10/Oct/2000:13:55:36 -0700";
    let b = s.as_bytes();
    let day = digits(b, 0, 2).ok_or(SHAPE)?;
    let month_name = b.get(3..6).ok_or(SHAPE)?;
    if b.get(2) != Some(&b'/') || b.get(6) != Some(&b'/') {
        return Err(SHAPE);
    }
    let month = MONTHS
        .iter()
        .position(|m| m.eq_ignore_ascii_case(month_name))
        .ok_or("unknown month name")?;
    let year = digits(b, 7, 4).ok_or(SHAPE)?;
    let hour = digits(b, 12, 2).ok_or(SHAPE)?;
    let minute = digits(b, 15, 2).ok_or(SHAPE)?;
    let second = digits(b, 18, 2).ok_or(SHAPE)?;
    if b.get(11) != Some(&b':') || b.get(14) != Some(&b':') || b.get(17) != Some(&b':') {
        return Err(SHAPE);
    }
    let mut at = 20;
    let mut nanos = 0;
    if b.get(at) == Some(&b'.') {
        let (ns, n) = fraction(b, at + 1);
        if n == 0 || n > 9 {
            return Err("fraction of a second must have 1 to 9 digits");
        }
        nanos = ns;
        at += 1 + n;
    }
    if b.get(at) != Some(&b' ') {
        return Err(SHAPE);
    }
    let sign = match b.get(at + 1) {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err("no UTC offset like -0700"),
    };
    let oh = digits(b, at + 2, 2).ok_or("no UTC offset like -0700")?;
    let om = digits(b, at + 4, 2).ok_or("no UTC offset like -0700")?;
    if at + 6 != b.len() {
        return Err(SHAPE);
    }
    if oh > 23 || om > 59 {
        return Err("UTC offset out of range");
    }
    Civil {
        year: i64::from(year),
        // `position` in a 12-entry table.
        month: u32::try_from(month + 1).unwrap_or(1),
        day,
        hour,
        minute,
        second,
        nanos,
        offset: sign * i32::try_from(oh * 3600 + om * 60).unwrap_or(0),
    }
    .to_ns()
}

/// An RFC 3339 / ISO 8601 date and time: `2026-11-25T10:00:00.123456Z`,
/// `T` or a space between date and time, any number of fraction digits
/// (`.` or `,`), and `Z`, `+01:00`, `+0100` or `+01`; none means UTC.
pub(crate) fn parse_rfc3339(s: &str) -> Result<u64, &'static str> {
    const SHAPE: &str = "not a date like 2026-11-25T10:00:00Z";
    let b = s.as_bytes();
    let year = digits(b, 0, 4).ok_or(SHAPE)?;
    let month = digits(b, 5, 2).ok_or(SHAPE)?;
    let day = digits(b, 8, 2).ok_or(SHAPE)?;
    let hour = digits(b, 11, 2).ok_or(SHAPE)?;
    let minute = digits(b, 14, 2).ok_or(SHAPE)?;
    let second = digits(b, 17, 2).ok_or(SHAPE)?;
    if b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return Err(SHAPE);
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return Err(SHAPE);
    }
    let mut at = 19;
    let mut nanos = 0;
    if matches!(b.get(at), Some(b'.' | b',')) {
        let (ns, n) = fraction(b, at + 1);
        if n == 0 {
            return Err("no digits after the decimal point");
        }
        nanos = ns;
        at += 1 + n;
    }
    let offset = match b.get(at) {
        None => 0,
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(&c @ (b'+' | b'-')) => {
            let sign = if c == b'+' { 1 } else { -1 };
            let oh = digits(b, at + 1, 2).ok_or("bad UTC offset")?;
            let rest = &b[at + 3..];
            let om = match rest {
                [] => 0,
                [b':', _, _] => digits(rest, 1, 2).ok_or("bad UTC offset")?,
                [_, _] => digits(rest, 0, 2).ok_or("bad UTC offset")?,
                _ => return Err("bad UTC offset"),
            };
            if oh > 23 || om > 59 {
                return Err("UTC offset out of range");
            }
            sign * i32::try_from(oh * 3600 + om * 60).unwrap_or(0)
        }
        Some(_) => return Err(SHAPE),
    };
    Civil {
        year: i64::from(year),
        month,
        day,
        hour,
        minute,
        second,
        nanos,
        offset,
    }
    .to_ns()
}

/// A decimal number's parts, as written: `-? digits (. digits)? (e[+-]digits)?`.
struct Decimal<'a> {
    negative: bool,
    int: &'a [u8],
    frac: &'a [u8],
    exp: i64,
}

/// Reads a decimal number (JSON's grammar, leading zeros allowed), or
/// `None` when `s` is not one.
fn decimal(s: &str) -> Option<Decimal<'_>> {
    let b = s.as_bytes();
    let mut i = 0;
    let negative = b.first() == Some(&b'-');
    if negative {
        i = 1;
    }
    let run = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let n = run(i);
    if n == 0 {
        return None;
    }
    let int = &b[i..i + n];
    i += n;
    let mut frac: &[u8] = &[];
    if b.get(i) == Some(&b'.') {
        let n = run(i + 1);
        if n == 0 {
            return None;
        }
        frac = &b[i + 1..i + 1 + n];
        i += 1 + n;
    }
    let mut exp = 0i64;
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let neg = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let n = run(i);
        if n == 0 {
            return None;
        }
        for &c in &b[i..i + n] {
            // Saturates far beyond any meaningful exponent.
            exp = (exp * 10 + i64::from(c - b'0')).min(1 << 40);
        }
        if neg {
            exp = -exp;
        }
        i += n;
    }
    (i == b.len()).then_some(Decimal {
        negative,
        int,
        frac,
        exp,
    })
}

impl Decimal<'_> {
    /// `floor(value * 10^scale)`, or `None` past `u128`.
    fn scaled(&self, scale: i64) -> Option<u128> {
        let all = || self.int.iter().chain(self.frac.iter()).copied();
        let len = i64::try_from(self.int.len() + self.frac.len()).ok()?;
        let zeros = i64::try_from(all().take_while(|&c| c == b'0').count()).ok()?;
        if zeros == len {
            return Some(0);
        }
        // Digits left of the point once scaled, counted from the first
        // significant one.
        let point = i64::try_from(self.int.len()).ok()? + self.exp + scale;
        let int_digits = point - zeros;
        if int_digits <= 0 {
            return Some(0);
        }
        if int_digits > 39 {
            return None;
        }
        let mut v: u128 = 0;
        let zeros = usize::try_from(zeros).ok()?;
        let take = usize::try_from(int_digits).ok()?;
        let mut used = 0;
        for c in all().skip(zeros).take(take) {
            v = v.checked_mul(10)?.checked_add(u128::from(c - b'0'))?;
            used += 1;
        }
        for _ in used..take {
            v = v.checked_mul(10)?;
        }
        Some(v)
    }
}

/// An epoch timestamp written as a decimal number (`1764064800`,
/// `1764064800.123`, `1.7640648e9`, `"1764064800123"`), in `unit`, or by
/// magnitude when `None`: below 1e11 seconds, below 1e14 milliseconds,
/// below 1e17 microseconds, else nanoseconds. Fractions are kept to the
/// nanosecond and truncated below.
pub(crate) fn parse_epoch(s: &str, unit: Option<TsUnit>) -> Result<u64, &'static str> {
    // The common case, a whole number, without the general arithmetic.
    if !s.is_empty() && s.len() <= 19 && s.bytes().all(|c| c.is_ascii_digit()) {
        let n: u64 = s.parse().map_err(|_| "not a number")?;
        let scale: u64 = match unit {
            Some(TsUnit::Seconds) => 1_000_000_000,
            Some(TsUnit::Millis) => 1_000_000,
            Some(TsUnit::Micros) => 1000,
            Some(TsUnit::Nanos) => 1,
            None if n < 100_000_000_000 => 1_000_000_000,
            None if n < 100_000_000_000_000 => 1_000_000,
            None if n < 100_000_000_000_000_000 => 1000,
            None => 1,
        };
        return n
            .checked_mul(scale)
            .ok_or("too far in the future (after 2554)");
    }
    let d = decimal(s).ok_or("not a number")?;
    let whole = d.scaled(0);
    if d.negative && whole.is_none_or(|w| w > 0 || d.scaled(9) != Some(0)) {
        return Err("before 1970");
    }
    let unit = match unit {
        Some(u) => u,
        None => match whole {
            Some(w) if w < 100_000_000_000 => TsUnit::Seconds,
            Some(w) if w < 100_000_000_000_000 => TsUnit::Millis,
            Some(w) if w < 100_000_000_000_000_000 => TsUnit::Micros,
            _ => TsUnit::Nanos,
        },
    };
    let scale = match unit {
        TsUnit::Seconds => 9,
        TsUnit::Millis => 6,
        TsUnit::Micros => 3,
        TsUnit::Nanos => 0,
    };
    d.scaled(scale)
        .and_then(|ns| u64::try_from(ns).ok())
        .ok_or("too far in the future (after 2554)")
}

/// A timestamp given as text: an epoch number, else an RFC 3339 date.
pub(crate) fn parse_ts_text(s: &str, unit: Option<TsUnit>) -> Result<u64, &'static str> {
    let s = s.trim_matches(|c: char| c.is_ascii_whitespace());
    match s.as_bytes().first() {
        None => Err("empty"),
        Some(c) if (c.is_ascii_digit() || *c == b'-') && decimal(s).is_some() => {
            parse_epoch(s, unit)
        }
        _ if s.len() >= 19 => parse_rfc3339(s),
        _ => Err("not a number or a date like 2026-11-25T10:00:00Z"),
    }
}

/// `ts_ns` as RFC 3339 in UTC with nanoseconds, e.g.
/// `2026-11-25T10:00:00.123456789Z` (for reports and synthetic traces;
/// the readers take it back exactly).
pub fn format_rfc3339(ts_ns: u64) -> String {
    let secs = ts_ns / 1_000_000_000;
    let nanos = ts_ns % 1_000_000_000;
    // `secs` is below 2^64 / 1e9, far inside i64.
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
