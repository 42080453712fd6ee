//! One spelling per request path, for matching routes.
//!
//! `/admin`, `/v1/../admin`, `//admin` and `/%61dmin` name the same
//! resource to most servers, so a rule for `/admin` must see them all as
//! `/admin`: otherwise a client could step around a limit by respelling
//! the path its upstream will resolve anyway. Only matching uses this
//! form; a proxy forwards the path as the client sent it.

use std::borrow::Cow;

/// `path` (its query and fragment dropped) in the form routes are matched
/// against:
/// - percent-escapes of unreserved characters (letters, digits, `-._~`)
///   decoded, other escapes' hex digits upper-cased (`%2f` is `%2F`, and
///   stays encoded: it is not a separator), a stray `%` written `%25`;
/// - dot segments resolved (`/a/./b` is `/a/b`, `/a/b/..` is `/a/`, and
///   nothing climbs above the root);
/// - empty segments dropped (`//a///b` is `/a/b`), but for a trailing `/`.
///
/// Borrows when nothing needs to change, which is the usual case.
///
/// ```
/// use spillway_core::canonical_path;
/// assert_eq!(canonical_path("/v1/login?next=/x"), "/v1/login");
/// assert_eq!(canonical_path("/v1/../admin"), "/admin");
/// assert_eq!(canonical_path("//%61dmin"), "/admin");
/// ```
pub fn canonical_path(path: &str) -> Cow<'_, str> {
    let path = match path.find(['?', '#']) {
        Some(i) => &path[..i],
        None => path,
    };
    if !path.starts_with('/') || !needs_work(path.as_bytes()) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing = false;
    for seg in decoded[1..].split('/') {
        trailing = false;
        match seg {
            "" => trailing = true,
            "." => trailing = true,
            ".." => {
                segments.pop();
                trailing = true;
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// True if `p` holds a `%`, a `//`, or a `.` or `..` segment.
fn needs_work(p: &[u8]) -> bool {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'%' => return true,
            b'/' => match &p[i + 1..] {
                [b'/', ..] | [b'.'] | [b'.', b'/', ..] | [b'.', b'.'] | [b'.', b'.', b'/', ..] => {
                    return true;
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    false
}

/// Decodes the escapes of unreserved characters and upper-cases the hex of
/// the others. A `%` not followed by two hex digits becomes `%25`, so that
/// decoding never puts a new escape together (`%%61c` would be `%ac`).
fn decode_unreserved(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = String::with_capacity(p.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| (*c as char).to_digit(16)),
                b.get(i + 2).and_then(|c| (*c as char).to_digit(16)),
            )
        {
            let c = (h * 16 + l) as u8;
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                out.push(c as char);
            } else {
                out.push('%');
                out.push(char::from_digit(h, 16).unwrap_or('0').to_ascii_uppercase());
                out.push(char::from_digit(l, 16).unwrap_or('0').to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        if b[i] == b'%' {
            out.push_str("%25");
            i += 1;
            continue;
        }
        // Whole characters: the path is text, and only ASCII is decoded.
        let ch = p[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respellings_of_a_path_are_one_path() {
        for (given, want) in [
            ("/admin", "/admin"),
            ("/admin/", "/admin/"),
            ("/", "/"),
            ("/v1/../admin", "/admin"),
            ("/v1/./../admin", "/admin"),
            ("/../../admin", "/admin"),
            ("//admin", "/admin"),
            ("/a///b//", "/a/b/"),
            ("/%61dmin", "/admin"),
            ("/%2e%2e/admin", "/admin"),
            ("/a/%2E/b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/a%2fb", "/a%2Fb"),
            ("/a%2Fb", "/a%2Fb"),
            ("/%zz/%4", "/%25zz/%254"),
            ("/%%61c", "/%25ac"),
            ("/.well-known/x", "/.well-known/x"),
            ("/a/..b/c.", "/a/..b/c."),
            ("/café/%C3%A9", "/café/%C3%A9"),
            ("/a?x=/../b", "/a"),
            ("/a#../b", "/a"),
            ("relative/../x", "relative/../x"),
        ] {
            assert_eq!(canonical_path(given), want, "{given}");
        }
        assert!(matches!(
            canonical_path("/v1/users/42?x=1"),
            Cow::Borrowed(_)
        ));
    }

    proptest::proptest! {
        /// One more pass changes nothing, and the result has no dot
        /// segments, no empty segments but a trailing one, and no escaped
        /// unreserved character.
        #[test]
        fn the_canonical_form_is_a_fixed_point(
            segs in proptest::collection::vec("(\\.|\\.\\.|%2[eE]|%6[1-9]|%2[fF]|[a-c]{0,2}|%)", 0..8),
        ) {
            let path = format!("/{}", segs.join("/"));
            let once = canonical_path(&path).into_owned();
            proptest::prop_assert_eq!(canonical_path(&once), once.as_str(), "{}", path);
            let body = once.trim_end_matches('/');
            for seg in body.split('/').skip(1) {
                proptest::prop_assert!(seg != "." && seg != ".." && !seg.is_empty(), "{} -> {}", path, once);
            }
            for esc in ["%2e", "%2E", "%61"] {
                proptest::prop_assert!(!once.contains(esc), "{} -> {}", path, once);
            }
        }
    }
}
