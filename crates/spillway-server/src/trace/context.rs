//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` a caller sends, read strictly, and the one spillway
//! sends on. A `traceparent` names no client and limits nothing: one that
//! cannot be read starts a new trace, it never refuses the request.

/// A caller's span, from its `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The trace's id (16 bytes, not all zero).
    pub trace_id: [u8; 16],
    /// The caller's span id (8 bytes, not all zero).
    pub span_id: [u8; 8],
    /// The caller's `sampled` flag.
    pub sampled: bool,
}

/// Length of a version-00 `traceparent`: `00-` + 32 + `-` + 16 + `-` + 2.
const LEN: usize = 55;

/// Reads a `traceparent` value as the W3C recommendation says:
/// lowercase hex only; version `ff` is invalid; version `00` is exactly
/// 55 characters; a later version is read as version 00's fields, and
/// what follows them must start with `-`; an all-zero trace or span id is
/// invalid. `None` when the value is not one.
pub fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < LEN {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    if version == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    match (version, v.get(LEN)) {
        (0, None) => {}
        (0, Some(_)) => return None,
        (_, None | Some(b'-')) => {}
        (_, Some(_)) => return None,
    }
    let mut trace_id = [0u8; 16];
    for (i, b) in trace_id.iter_mut().enumerate() {
        *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
    }
    let mut span_id = [0u8; 8];
    for (i, b) in span_id.iter_mut().enumerate() {
        *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
    }
    let flags = hex_byte(&v[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

/// The version-00 `traceparent` naming span `span_id` of trace
/// `trace_id`, sampled.
pub fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8]) -> String {
    let mut s = String::with_capacity(LEN);
    s.push_str("00-");
    push_hex(&mut s, trace_id);
    s.push('-');
    push_hex(&mut s, span_id);
    s.push_str("-01");
    s
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
}

/// The longest `tracestate` recorded on a span (the recommendation's
/// 32 members of at most 256 characters each would be 8 KiB; vendors are
/// told to propagate at least 512 characters).
pub const MAX_TRACESTATE: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendations_examples() {
        let p = parse_traceparent(GOOD.as_bytes()).unwrap();
        assert_eq!(
            p.trace_id,
            [
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36
            ]
        );
        assert_eq!(p.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(p.sampled);
        let not = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!parse_traceparent(not.as_bytes()).unwrap().sampled);
        assert_eq!(traceparent(&p.trace_id, &p.span_id), GOOD);
    }

    #[test]
    fn invalid_values_start_a_new_trace() {
        for bad in [
            "",
            "00",
            // all-zero ids
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // uppercase hex
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // version ff, non-hex version
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // version 00 with more after it
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            // wrong separators, short fields
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // a later version followed by something not starting with '-'
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_version_00() {
        for v in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        ] {
            let p = parse_traceparent(v.as_bytes()).unwrap();
            assert!(p.sampled, "{v}");
            assert_eq!(traceparent(&p.trace_id, &p.span_id), GOOD);
        }
    }

    /// A strict reading written apart from the parser: a regular
    /// expression's worth of checks over a `str`.
    fn reference(v: &[u8]) -> Option<Parent> {
        let (head, tail) = v.split_at_checked(55)?;
        let s = std::str::from_utf8(head).ok()?;
        let parts: Vec<&str> = s.split('-').collect();
        if parts.len() != 4 {
            return None;
        }
        let lower_hex = |p: &str, n: usize| {
            p.len() == n
                && p.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        };
        let (ver, tid, sid, flags) = (parts[0], parts[1], parts[2], parts[3]);
        if !lower_hex(ver, 2) || ver == "ff" || !lower_hex(tid, 32) || !lower_hex(sid, 16) {
            return None;
        }
        if !lower_hex(flags, 2) {
            return None;
        }
        if (ver == "00" && !tail.is_empty()) || tail.first().is_some_and(|&c| c != b'-') {
            return None;
        }
        if tid.bytes().all(|c| c == b'0') || sid.bytes().all(|c| c == b'0') {
            return None;
        }
        let byte = |p: &str, i: usize| u8::from_str_radix(&p[2 * i..2 * i + 2], 16).unwrap();
        let flags = u8::from_str_radix(flags, 16).unwrap();
        Some(Parent {
            trace_id: std::array::from_fn(|i| byte(tid, i)),
            span_id: std::array::from_fn(|i| byte(sid, i)),
            sampled: flags & 1 == 1,
        })
    }

    proptest! {
        /// Any bytes: no panic, and the parser agrees with the reference.
        #[test]
        fn any_bytes_never_panic(v in proptest::collection::vec(any::<u8>(), 0..80)) {
            prop_assert_eq!(parse_traceparent(&v), reference(&v));
        }

        /// Near-valid values (one byte changed in a valid one, or cut, or
        /// extended): only the valid ones are accepted.
        #[test]
        fn only_valid_ones_are_accepted(
            tid in any::<[u8; 16]>(),
            sid in any::<[u8; 8]>(),
            flags in any::<u8>(),
            version in any::<u8>(),
            at in 0usize..60,
            to in any::<u8>(),
            tail in "(-[a-z0-9]{0,6})?",
        ) {
            let mut s = format!("{version:02x}-");
            push_hex(&mut s, &tid);
            s.push('-');
            push_hex(&mut s, &sid);
            s.push_str(&format!("-{flags:02x}{tail}"));
            let whole = s.as_bytes().to_vec();
            prop_assert_eq!(parse_traceparent(&whole), reference(&whole));
            let mut changed = whole.clone();
            if at < changed.len() {
                changed[at] = to;
            }
            prop_assert_eq!(parse_traceparent(&changed), reference(&changed));
            let cut = &whole[..at.min(whole.len())];
            prop_assert_eq!(parse_traceparent(cut), reference(cut));
        }
    }
}
