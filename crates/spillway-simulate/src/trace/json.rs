//! JSON lines: one object per line, keys mapped by [`FieldNames`].
//!
//! A hand-written reader rather than serde_json, for two reasons: a
//! timestamp number's exact digits are needed (`1764064800.123456789` is
//! not exact as an `f64`), and one pass over the bytes with no allocation
//! per line is several times faster than building a value. It accepts
//! exactly RFC 8259 (checked against serde_json in the tests), but for
//! numbers: any magnitude is accepted where serde_json refuses one beyond
//! an `f64`, since the grammar has no limit.

use super::record::{Pairs, Record, push_lower};
use super::{Bad, FieldNames, Fill, KeyMap, Role, TsUnit};

/// Containers nested deeper than this make a line malformed (serde_json's
/// limit, so both agree).
const MAX_DEPTH: u32 = 127;

/// The JSON lines parser.
#[derive(Debug)]
pub(super) struct Json {
    keys: KeyMap,
    fill: Fill,
    /// `seen[i] == stamp`: mapped key `i` was met on this line.
    seen: Vec<u32>,
    stamp: u32,
    /// Unmapped keys met on this line (duplicate check), and how many.
    others: Vec<String>,
    n_others: usize,
    key: String,
    /// A header name.
    name: String,
    value: String,
}

/// A value, located in the line.
#[derive(Debug, Clone, Copy)]
enum Val {
    /// A string's contents (between its quotes), and whether it has escapes.
    Str(usize, usize, bool),
    /// A number's text.
    Num(usize, usize),
    Bool(bool),
    Null,
    /// An object or array.
    Nested,
}

impl Json {
    pub(super) fn new(names: &FieldNames, unit: Option<TsUnit>) -> Json {
        let keys = KeyMap::new(names);
        Json {
            seen: vec![0; keys.len()],
            keys,
            fill: Fill::new(unit),
            stamp: 0,
            others: Vec::new(),
            n_others: 0,
            key: String::new(),
            name: String::new(),
            value: String::new(),
        }
    }

    /// Reads one line into `rec`.
    pub(super) fn parse(&mut self, line: &str, rec: &mut Record) -> Result<(), Bad> {
        self.fill.start();
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.seen.iter_mut().for_each(|s| *s = 0);
            self.stamp = 1;
        }
        self.n_others = 0;
        let b = line.as_bytes();
        let mut i = ws(b, 0);
        if b.get(i) != Some(&b'{') {
            return Err(Bad::At("not a JSON object", i));
        }
        i = ws(b, i + 1);
        if b.get(i) == Some(&b'}') {
            i += 1;
        } else {
            loop {
                i = self.member(line, i, rec)?;
                i = ws(b, i);
                match b.get(i) {
                    Some(b',') => i = ws(b, i + 1),
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    _ => return Err(Bad::At("expected `,` or `}`", i)),
                }
            }
        }
        if ws(b, i) != b.len() {
            return Err(Bad::At("text after the object", i));
        }
        self.fill.end(rec)
    }

    /// One `"key": value` of the top-level object at `i`; returns where it
    /// ends.
    fn member(&mut self, line: &str, i: usize, rec: &mut Record) -> Result<usize, Bad> {
        let b = line.as_bytes();
        if b.get(i) != Some(&b'"') {
            return Err(Bad::At("expected a key", i));
        }
        let key_at = i;
        let (end, escaped) = string(b, i)?;
        let key = if escaped {
            self.key.clear();
            decode(&line[i + 1..end - 1], &mut self.key);
            self.key.as_str()
        } else {
            &line[i + 1..end - 1]
        };
        let mut i = ws(b, end);
        if b.get(i) != Some(&b':') {
            return Err(Bad::At("expected `:` after the key", i));
        }
        i = ws(b, i + 1);
        let Some((index, entry)) = self.keys.find(key) else {
            // Not mapped: a field (duplicates refused, whatever the value).
            let others = &self.others[..self.n_others];
            if others.iter().any(|k| k == key) {
                return Err(Bad::At("the same key twice", key_at));
            }
            if self.n_others == self.others.len() {
                self.others.push(String::new());
            }
            let slot = &mut self.others[self.n_others];
            slot.clear();
            slot.push_str(key);
            self.n_others += 1;
            let (val, end) = value(b, i, 2)?;
            if let Some(text) = text(line, val, &mut self.value) {
                let (k, v) = rec.fields.push();
                k.push_str(&self.others[self.n_others - 1]);
                v.push_str(text);
            }
            return Ok(end);
        };
        if self.seen[index] == self.stamp {
            return Err(Bad::At("the same key twice", key_at));
        }
        self.seen[index] = self.stamp;
        if entry.roles & Role::Headers.bit() != 0 && b.get(i) == Some(&b'{') {
            return headers(line, i, &mut rec.headers, &mut self.value, &mut self.name);
        }
        let (val, end) = value(b, i, 2)?;
        for header in &entry.headers {
            // `-` is how nginx logs an absent header.
            if let Some(t) = text(line, val, &mut self.value)
                && !matches!(t, "" | "-")
            {
                push_header(&mut rec.headers, header, t, key_at)?;
            }
        }
        if entry.roles == 0 {
            return Ok(end);
        }
        let t = match val {
            Val::Null => return Ok(end),
            Val::Bool(_) | Val::Nested => None,
            v => text(line, v, &mut self.value),
        };
        for role in super::Role::ALL {
            if entry.roles & role.bit() == 0 {
                continue;
            }
            match (role, t) {
                (Role::Headers, _) => return Err(Bad::Role(role, "not an object")),
                (_, Some(t)) => self.fill.text(rec, role, t)?,
                (_, None) => return Err(Bad::Role(role, "not a string or a number")),
            }
        }
        Ok(end)
    }
}

/// A headers object at `at` (names lower-cased; scalar values as text;
/// `null` and nested values skipped); returns where it ends.
fn headers(
    line: &str,
    at: usize,
    out: &mut Pairs,
    scratch: &mut String,
    key: &mut String,
) -> Result<usize, Bad> {
    let b = line.as_bytes();
    let mut i = ws(b, at + 1);
    if b.get(i) == Some(&b'}') {
        return Ok(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return Err(Bad::At("expected a header name", i));
        }
        let name_at = i;
        let (end, escaped) = string(b, i)?;
        key.clear();
        if escaped {
            decode(&line[i + 1..end - 1], key);
        } else {
            key.push_str(&line[i + 1..end - 1]);
        }
        i = ws(b, end);
        if b.get(i) != Some(&b':') {
            return Err(Bad::At("expected `:` after the header name", i));
        }
        let (val, end) = value(b, ws(b, i + 1), 3)?;
        if let Some(t) = text(line, val, scratch) {
            push_header(out, key, t, name_at)?;
        }
        i = ws(b, end);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => return Ok(i + 1),
            _ => return Err(Bad::At("expected `,` or `}`", i)),
        }
    }
}

fn push_header(out: &mut Pairs, name: &str, value: &str, at: usize) -> Result<(), Bad> {
    if out.contains(name, true) {
        return Err(Bad::At("the same header twice", at));
    }
    let (k, v) = out.push();
    push_lower(k, name);
    v.push_str(value);
    Ok(())
}

/// A scalar's text: a string decoded (into `scratch` if it has escapes),
/// a number as written, a boolean as `true`/`false`; `None` for `null` and
/// nested values.
fn text<'a>(line: &'a str, val: Val, scratch: &'a mut String) -> Option<&'a str> {
    match val {
        Val::Str(s, e, false) => Some(&line[s..e]),
        Val::Str(s, e, true) => {
            scratch.clear();
            decode(&line[s..e], scratch);
            Some(scratch.as_str())
        }
        Val::Num(s, e) => Some(&line[s..e]),
        Val::Bool(true) => Some("true"),
        Val::Bool(false) => Some("false"),
        Val::Null | Val::Nested => None,
    }
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The value at `i` (at nesting `depth`, the top object being 1), and
/// where it ends.
fn value(b: &[u8], i: usize, depth: u32) -> Result<(Val, usize), Bad> {
    match b.get(i) {
        Some(b'"') => {
            let (end, escaped) = string(b, i)?;
            Ok((Val::Str(i + 1, end - 1, escaped), end))
        }
        Some(b'-' | b'0'..=b'9') => {
            let end = number(b, i)?;
            Ok((Val::Num(i, end), end))
        }
        Some(b't') if b[i..].starts_with(b"true") => Ok((Val::Bool(true), i + 4)),
        Some(b'f') if b[i..].starts_with(b"false") => Ok((Val::Bool(false), i + 5)),
        Some(b'n') if b[i..].starts_with(b"null") => Ok((Val::Null, i + 4)),
        Some(b'{' | b'[') => Ok((Val::Nested, nested(b, i, depth)?)),
        _ => Err(Bad::At("expected a value", i)),
    }
}

/// Checks an object or array at `i` and returns where it ends.
fn nested(b: &[u8], i: usize, depth: u32) -> Result<usize, Bad> {
    if depth > MAX_DEPTH {
        return Err(Bad::At("nested too deeply", i));
    }
    let object = b[i] == b'{';
    let close = if object { b'}' } else { b']' };
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&close) {
        return Ok(i + 1);
    }
    loop {
        if object {
            if b.get(i) != Some(&b'"') {
                return Err(Bad::At("expected a key", i));
            }
            i = ws(b, string(b, i)?.0);
            if b.get(i) != Some(&b':') {
                return Err(Bad::At("expected `:` after the key", i));
            }
            i = ws(b, i + 1);
        }
        i = ws(b, value(b, i, depth + 1)?.1);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(&c) if c == close => return Ok(i + 1),
            _ => return Err(Bad::At("expected `,` or a closing bracket", i)),
        }
    }
}

/// A number at `i` (RFC 8259's grammar); returns where it ends.
fn number(b: &[u8], mut i: usize) -> Result<usize, Bad> {
    let start = i;
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i),
        _ => return Err(Bad::At("bad number", start)),
    }
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err(Bad::At("bad number", start));
        }
        i = end;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err(Bad::At("bad number", start));
        }
        i = end;
    }
    Ok(i)
}

fn hex4(b: &[u8], i: usize) -> Option<u32> {
    let h = b.get(i..i + 4)?;
    h.iter().try_fold(0u32, |n, &c| {
        let d = (c as char).to_digit(16)?;
        Some(n << 4 | d)
    })
}

/// A string opened at `at`: where it ends (after the closing quote), and
/// whether it has escapes. Escapes are checked, surrogates paired.
fn string(b: &[u8], at: usize) -> Result<(usize, bool), Bad> {
    let mut i = at + 1;
    let mut escaped = false;
    loop {
        match b.get(i) {
            None => return Err(Bad::At("unterminated string", at)),
            Some(b'"') => return Ok((i + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                match b.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                    Some(b'u') => {
                        let u = hex4(b, i + 2).ok_or(Bad::At("bad \\u escape", i))?;
                        if (0xDC00..0xE000).contains(&u) {
                            return Err(Bad::At("lone surrogate in a \\u escape", i));
                        }
                        if (0xD800..0xDC00).contains(&u) {
                            let low = (b.get(i + 6..i + 8) == Some(b"\\u"))
                                .then(|| hex4(b, i + 8))
                                .flatten()
                                .filter(|l| (0xDC00..0xE000).contains(l));
                            if low.is_none() {
                                return Err(Bad::At("lone surrogate in a \\u escape", i));
                            }
                            i += 6;
                        }
                        i += 6;
                    }
                    _ => return Err(Bad::At("bad escape", i)),
                }
            }
            Some(&c) if c < 0x20 => return Err(Bad::At("control character in a string", i)),
            Some(_) => i += 1,
        }
    }
}

/// Appends a checked string's contents with its escapes decoded.
fn decode(raw: &str, out: &mut String) {
    let b = raw.as_bytes();
    let mut i = 0;
    let mut plain = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        out.push_str(&raw[plain..i]);
        let Some(&e) = b.get(i + 1) else { break };
        i += 2;
        let c = match e {
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = hex4(b, i).unwrap_or(0xFFFD);
                i += 4;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    let lo = hex4(b, i + 2).unwrap_or(0xDC00);
                    i += 6;
                    0x10000 + ((hi - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF)
                } else {
                    hi
                };
                char::from_u32(code).unwrap_or('\u{FFFD}')
            }
            other => char::from(other),
        };
        out.push(c);
        plain = i;
    }
    out.push_str(raw.get(plain..).unwrap_or_default());
}

/// A whole text that is a JSON object of headers (a CSV `headers` column).
pub(super) fn headers_object(
    text: &str,
    out: &mut Pairs,
    value: &mut String,
    name: &mut String,
) -> Result<(), Bad> {
    let b = text.as_bytes();
    let i = ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return Err(Bad::At("not a JSON object", i));
    }
    let end = headers(text, i, out, value, name)?;
    if ws(b, end) != b.len() {
        return Err(Bad::At("text after the object", end));
    }
    Ok(())
}
