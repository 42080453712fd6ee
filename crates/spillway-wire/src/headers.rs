//! Header lookups shared by both transports, and the hop-by-hop list.

use http::HeaderMap;

/// Headers that describe one connection, not the message: never forwarded
/// (an allowed upgrade puts `Connection`/`Upgrade` back itself).
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Headers that frame a message or name its target: a proxy writes its
/// own, so `Connection` may never remove them and a client's are never
/// copied.
pub const FRAMING: [&str; 3] = ["content-length", "transfer-encoding", "host"];

/// Request or response headers by name (case-insensitive), as text: a
/// `HeaderMap`, or the headers the direct path parsed in place.
pub trait Headers {
    /// Every value of `name` that is valid text, in order.
    fn all(&self, name: &str) -> Vec<&str>;
    /// The first value of `name`.
    fn value(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }
    /// Every value of `name`, as bytes (text or not), in order.
    fn all_raw(&self, name: &str) -> Vec<&[u8]>;
    /// `name`'s value when it occurs exactly once, in one pass.
    fn sole(&self, name: &str) -> Sole<'_>;
    /// `name`'s value as bytes, when every occurrence says the same (a
    /// header a gateway set once, or copied twice alike); `None` when
    /// absent.
    ///
    /// # Errors
    /// Two occurrences differ: which one a reader takes is a guess (the
    /// first here, perhaps the last upstream), so a value that names what
    /// is limited must refuse the request instead.
    fn agreed(&self, name: &str) -> Result<Option<&[u8]>, Disagree>;
}

/// A header sent more than once with different values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disagree;

/// The one value of a sequence of occurrences, if they all agree.
fn agree<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Result<Option<&'a [u8]>, Disagree> {
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.all(|v| v == first) {
        Ok(Some(first))
    } else {
        Err(Disagree)
    }
}

/// How often a header occurs, and its value when once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sole<'a> {
    /// Not at all.
    Missing,
    /// Once, with this value.
    One(&'a [u8]),
    /// More than once.
    Many,
}

impl Headers for HeaderMap {
    fn all(&self, name: &str) -> Vec<&str> {
        self.get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
    fn all_raw(&self, name: &str) -> Vec<&[u8]> {
        self.get_all(name).iter().map(|v| v.as_bytes()).collect()
    }
    fn sole(&self, name: &str) -> Sole<'_> {
        let mut all = self.get_all(name).iter();
        match (all.next(), all.next()) {
            (None, _) => Sole::Missing,
            (Some(v), None) => Sole::One(v.as_bytes()),
            (Some(_), Some(_)) => Sole::Many,
        }
    }
    fn agreed(&self, name: &str) -> Result<Option<&[u8]>, Disagree> {
        agree(self.get_all(name).iter().map(http::HeaderValue::as_bytes))
    }
}

impl Headers for [httparse::Header<'_>] {
    fn all(&self, name: &str) -> Vec<&str> {
        self.iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
            .collect()
    }
    fn value(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    }
    fn all_raw(&self, name: &str) -> Vec<&[u8]> {
        self.iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    }
    fn sole(&self, name: &str) -> Sole<'_> {
        let mut found = Sole::Missing;
        for h in self {
            if h.name.len() == name.len() && h.name.eq_ignore_ascii_case(name) {
                if found != Sole::Missing {
                    return Sole::Many;
                }
                found = Sole::One(h.value);
            }
        }
        found
    }
    fn agreed(&self, name: &str) -> Result<Option<&[u8]>, Disagree> {
        agree(
            self.iter()
                .filter(|h| h.name.len() == name.len() && h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value),
        )
    }
}

/// The comma-separated tokens of every `Connection` header, trimmed. A
/// value with bytes that are not text still gives its text tokens (a
/// `close` beside an odd byte must not be missed); a token that is not
/// text names no header, so it is left out.
pub fn connection_tokens<H: Headers + ?Sized>(h: &H) -> Vec<&str> {
    h.all_raw("connection")
        .into_iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .filter_map(|t| std::str::from_utf8(t).ok())
        .collect()
}

/// Whether `name` is one of `list`, ignoring case.
pub fn named(list: &[&str], name: &str) -> bool {
    list.iter().any(|n| n.eq_ignore_ascii_case(name))
}
