//! Text for the page: escaping (the report shows what the trace holds,
//! never as markup), numbers, shares and times as people read them.

#[allow(clippy::wildcard_imports)]
use super::*;

// ------------------------------------------------------------ text

/// A string made safe for HTML text and quoted attribute values: `& < > "
/// '` escaped, control and bidirectional-override characters replaced by
/// U+FFFD, and cut to `max` characters with an ellipsis.
pub(super) struct Esc<'a> {
    s: &'a str,
    max: usize,
}

pub(super) fn esc(s: &str) -> Esc<'_> {
    Esc { s, max: usize::MAX }
}

/// [`esc`], cut to [`MAX_TEXT`] characters.
pub(super) fn esc_short(s: &str) -> Esc<'_> {
    Esc { s, max: MAX_TEXT }
}

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.s.chars().enumerate() {
            if i == self.max {
                return f.write_str("…");
            }
            match c {
                '&' => f.write_str("&amp;")?,
                '<' => f.write_str("&lt;")?,
                '>' => f.write_str("&gt;")?,
                '"' => f.write_str("&quot;")?,
                '\'' => f.write_str("&#39;")?,
                '\t' | '\n' => f.write_char(c)?,
                c if c.is_control()
                    || ('\u{202a}'..='\u{202e}').contains(&c)
                    || ('\u{2066}'..='\u{2069}').contains(&c) =>
                {
                    f.write_char('\u{fffd}')?
                }
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `1234567` as `1,234,567`.
pub(super) fn int(n: u64) -> String {
    let digits = n.to_string();
    let mut s = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    s
}

/// A percentage (already in percent) with the precision it deserves:
/// `12.5%`, `1.25%`, `0.0030%`.
pub(super) fn pct(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    if v == 0.0 {
        return "0%".into();
    }
    let a = v.abs();
    let decimals = if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        ((-a.log10()).floor() as usize + 2).min(6)
    };
    format!("{v:.decimals$}%")
}

/// A share in 0..1 as a percentage.
pub(super) fn share(v: f64) -> String {
    pct(v * 100.0)
}

pub(super) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

pub(super) fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// ns since the epoch in RFC 3339, UTC, milliseconds.
pub(super) fn time(ns: u64) -> String {
    spillway_core::date::rfc3339_ms(ns / 1_000_000)
}

/// Seconds as a short duration: `250ms`, `10s`, `1m`, `1m30s`, `2h`, `1d`.
pub(super) fn secs(v: f64) -> String {
    if !(v.is_finite() && v > 0.0) {
        return "0".into();
    }
    if v < 1.0 {
        let ms = v * 1000.0;
        return if ms.fract() == 0.0 {
            format!("{ms}ms")
        } else {
            format!("{ms:.1}ms")
        };
    }
    if v.fract() != 0.0 && v < 60.0 {
        return format!("{v:.1}s");
    }
    let mut rest = v.round() as u64;
    let mut out = String::new();
    let mut units = 0;
    for (unit, name) in [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")] {
        // Two units at most: `1h30m`, not `1h30m5s`.
        if units == 2 || (units == 1 && rest < unit) {
            break;
        }
        if rest >= unit {
            out!(out, "{}{name}", rest / unit);
            rest %= unit;
            units += 1;
        }
    }
    out
}
