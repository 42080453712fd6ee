//! nginx/Apache combined log format, and the common log format (the same
//! without referer and user agent):
//!
//! ```text
//! 203.0.113.7 - alice [10/Oct/2000:13:55:36.123 -0700] "GET /a?b HTTP/1.1" 200 2326 "https://ref/" "curl/8.5" rt=0.004
//! ```
//!
//! Client, ident (ignored), user, `[date]`, `"request line"`, status,
//! bytes (ignored), then optionally `"referer" "user-agent"` (headers
//! `referer`, `user-agent`; `-` = none) and anything else: trailing
//! `name=value` tokens (nginx's `rt=$request_time uct="..."`) become
//! fields, other tokens (Apache's `%D`) are ignored.
//!
//! A request line that is not `METHOD target [HTTP/x]` (`-`, a TLS
//! handshake sent to a plain port and logged as `\x16\x03\x01...`) is still
//! a request the server answered: the record has no method and path.

use super::Bad;
use super::record::{Pairs, Record};
use super::time::parse_clf_date;

/// The combined log parser (scratch buffers for escaped fields).
#[derive(Debug, Default)]
pub(super) struct Combined {
    /// The request line, unescaped.
    request: String,
    bytes: Vec<u8>,
}

fn find(b: &[u8], from: usize, c: u8) -> Option<usize> {
    b.get(from..)?
        .iter()
        .position(|&x| x == c)
        .map(|i| from + i)
}

/// The closing quote of a field opened at `open`, and whether the field
/// has backslash escapes.
fn quoted(b: &[u8], open: usize) -> Result<(usize, bool), Bad> {
    let mut i = open + 1;
    let mut escaped = false;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                escaped = true;
                i += 2;
            }
            b'"' => return Ok((i, escaped)),
            _ => i += 1,
        }
    }
    Err(Bad::At("unterminated quoted field", open))
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Appends `raw` to `out` with the escapes log writers use undone: `\"`,
/// `\\`, `\xHH` (nginx, Apache), `\n` `\t` `\r` `\b` `\f` `\v` (Apache)
/// and `\uXXXX` (nginx's `escape=json`). An unknown escape stays as it is.
/// If the bytes so decoded are not UTF-8, `raw` is kept as logged.
pub(super) fn unescape(raw: &str, out: &mut String, bytes: &mut Vec<u8>) {
    if !raw.contains('\\') {
        out.push_str(raw);
        return;
    }
    bytes.clear();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c != b'\\' || i + 1 == b.len() {
            bytes.push(c);
            i += 1;
            continue;
        }
        let simple = match b[i + 1] {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'n' => Some(b'\n'),
            b't' => Some(b'\t'),
            b'r' => Some(b'\r'),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'v' => Some(0x0b),
            _ => None,
        };
        if let Some(s) = simple {
            bytes.push(s);
            i += 2;
            continue;
        }
        if b[i + 1] == b'x'
            && let (Some(h), Some(l)) = (
                b.get(i + 2).copied().and_then(hex),
                b.get(i + 3).copied().and_then(hex),
            )
        {
            bytes.push(h << 4 | l);
            i += 4;
            continue;
        }
        if b[i + 1] == b'u'
            && let Some(ch) = b
                .get(i + 2..i + 6)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32)
        {
            let mut tmp = [0u8; 4];
            bytes.extend_from_slice(ch.encode_utf8(&mut tmp).as_bytes());
            i += 6;
            continue;
        }
        bytes.push(c);
        i += 1;
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => out.push_str(s),
        Err(_) => out.push_str(raw),
    }
}

/// HTTP's token characters (RFC 9110 `tchar`): what a method is made of.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// `METHOD target [HTTP/x.y]` as method and target, or `None` for
/// anything else (`-`, binary garbage, a target with spaces).
pub(super) fn request_line(s: &str) -> Option<(&str, &str)> {
    let (method, rest) = s.split_once(' ')?;
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return None;
    }
    let target = match rest.rsplit_once(' ') {
        Some((t, version)) if version.starts_with("HTTP/") => t,
        _ => rest,
    };
    let ok = !target.is_empty() && target.bytes().all(|c| c > b' ' && c != 0x7f);
    ok.then_some((method, target))
}

impl Combined {
    /// Reads one line into `rec`.
    pub(super) fn parse(&mut self, line: &str, rec: &mut Record) -> Result<(), Bad> {
        let b = line.as_bytes();
        // Log writers escape these; raw, they are a damaged file.
        if let Some(i) = b
            .iter()
            .position(|&c| (c < 0x20 && c != b'\t') || c == 0x7f)
        {
            return Err(Bad::At("control character", i));
        }
        let sp1 = find(b, 0, b' ').ok_or(Bad::At("no space after the client", 0))?;
        if sp1 == 0 {
            return Err(Bad::At("no client address", 0));
        }
        rec.ip.push_str(&line[..sp1]);
        let sp2 = find(b, sp1 + 1, b' ').ok_or(Bad::At("no space after the ident", sp1))?;
        let lb = find(b, sp2 + 1, b'[').ok_or(Bad::At("no `[` opening the date", sp2))?;
        if lb == sp2 + 1 || b[lb - 1] != b' ' {
            return Err(Bad::At("no user before the date", sp2 + 1));
        }
        rec.user.push_str(&line[sp2 + 1..lb - 1]);
        let rb = find(b, lb + 1, b']').ok_or(Bad::At("no `]` closing the date", lb))?;
        rec.ts_ns = parse_clf_date(&line[lb + 1..rb]).map_err(|e| Bad::At(e, lb + 1))?;

        let mut i = rb + 1;
        if b.get(i..i + 2) != Some(b" \"") {
            return Err(Bad::At("no quoted request line after the date", i));
        }
        let (close, escaped) = quoted(b, i + 1)?;
        let raw = &line[i + 2..close];
        let request = if escaped {
            self.request.clear();
            unescape(raw, &mut self.request, &mut self.bytes);
            self.request.as_str()
        } else {
            raw
        };
        if let Some((m, p)) = request_line(request) {
            rec.method.push_str(m);
            rec.path.push_str(p);
        }

        i = close + 1;
        if b.get(i) != Some(&b' ') {
            return Err(Bad::At("no status after the request line", i));
        }
        let (status, next) = token(b, i + 1);
        rec.status = match status {
            b"-" => 0,
            s if (1..=3).contains(&s.len()) && s.iter().all(u8::is_ascii_digit) => {
                s.iter().fold(0u16, |n, &c| n * 10 + u16::from(c - b'0'))
            }
            _ => return Err(Bad::At("status is not a number", i + 1)),
        };
        i = next;
        if i < b.len() {
            let (sent, next) = token(b, i + 1);
            if sent != b"-" && (sent.is_empty() || !sent.iter().all(u8::is_ascii_digit)) {
                return Err(Bad::At("bytes sent is not a number", i + 1));
            }
            i = next;
        }
        for header in ["referer", "user-agent"] {
            if b.get(i..i + 2) != Some(b" \"") {
                break;
            }
            let (close, _) = quoted(b, i + 1)?;
            let raw = &line[i + 2..close];
            if raw != "-" {
                let (k, v) = rec.headers.push();
                k.push_str(header);
                unescape(raw, v, &mut self.bytes);
            }
            i = close + 1;
        }
        self.extras(line, i, &mut rec.fields)?;
        rec.finish();
        Ok(())
    }

    /// Trailing `name=value` tokens as fields; other tokens are skipped.
    fn extras(&mut self, line: &str, mut i: usize, fields: &mut Pairs) -> Result<(), Bad> {
        let b = line.as_bytes();
        loop {
            while b.get(i) == Some(&b' ') {
                i += 1;
            }
            if i >= b.len() {
                return Ok(());
            }
            if b[i] == b'"' {
                i = quoted(b, i)?.0 + 1;
                continue;
            }
            let start = i;
            while i < b.len() && b[i] != b' ' && b[i] != b'=' && b[i] != b'"' {
                i += 1;
            }
            if b.get(i) != Some(&b'=') || i == start {
                // Not a name: skip the token.
                while i < b.len() && b[i] != b' ' {
                    i += 1;
                }
                continue;
            }
            let name = &line[start..i];
            if fields.contains(name, false) {
                return Err(Bad::At("the same name twice", start));
            }
            let (k, v) = fields.push();
            k.push_str(name);
            i += 1;
            if b.get(i) == Some(&b'"') {
                let (close, _) = quoted(b, i)?;
                unescape(&line[i + 1..close], v, &mut self.bytes);
                i = close + 1;
            } else {
                let (value, next) = token(b, i);
                // `token` stops at a space: whole characters.
                v.push_str(std::str::from_utf8(value).unwrap_or_default());
                i = next;
            }
        }
    }
}

/// The bytes from `at` to the next space or the end, and where that is.
fn token(b: &[u8], at: usize) -> (&[u8], usize) {
    let at = at.min(b.len());
    let end = find(b, at, b' ').unwrap_or(b.len());
    (&b[at..end], end)
}
