//! The direct path's request-head parser: which requests it answers
//! itself, which go to hyper, and which are refused.
//!
//! The direct path takes only a strict subset of HTTP/1.1, so that it is
//! never more lenient than hyper: version 1.1; an origin-form target of
//! RFC 3986 characters with well-formed `%` escapes; no
//! `Transfer-Encoding`, `Expect` or `Upgrade`; at most one
//! `Content-Length` of decimal digits; a head within [`MAX_HEAD`] bytes.
//! A request outside it goes to hyper, whose own parser is the reference
//! (it rejects what it cannot read); a head that cannot be parsed at all
//! is refused with 400 here, so every refusal has the same body.
//!
//! An absolute-form target (`GET http://x/a`, which RFC 9112 §3.2.2 says a
//! server must accept) is hyper's too: the proxy's hyper transport makes
//! it the origin-form request it stands for (the authority replacing
//! `Host`) before any policy runs, in one place for every configuration.
//! Such targets are rare (clients send them to forward proxies), so the
//! direct path keeps its one form; authority-form and `*` go the same way,
//! and are refused there.

/// Largest request head read in full (larger ones get 431).
pub const MAX_HEAD: usize = 16 * 1024;
/// Headers parsed in place; a request with more goes to hyper.
pub const MAX_HEADERS: usize = 32;

/// What the bytes of the next request say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Not all there yet.
    Partial,
    /// Valid, but outside the direct path's subset: hyper's.
    Hyper,
    /// Refused: answer with this and close.
    Refuse(Refusal),
    /// For the direct path.
    Direct {
        /// Bytes of the head, the blank line included.
        head_len: usize,
        /// Bytes of the body that follow (its `Content-Length`).
        body_len: usize,
        /// The client asked to close after this answer.
        close: bool,
    },
}

/// Why a request is refused before any handler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the head is not HTTP.
    Malformed,
    /// 431: the head is larger than [`MAX_HEAD`].
    HeadTooLarge,
}

impl Refusal {
    /// The status code.
    pub fn status(self) -> http::StatusCode {
        match self {
            Refusal::Malformed => http::StatusCode::BAD_REQUEST,
            Refusal::HeadTooLarge => http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }

    /// What to tell the client.
    pub fn detail(self) -> &'static str {
        match self {
            Refusal::Malformed => "the request is not valid HTTP/1.1",
            Refusal::HeadTooLarge => "the request head is larger than 16 KiB",
        }
    }
}

/// The request line and headers of a parsed head.
#[derive(Debug)]
pub struct RequestHead<'h, 'b> {
    /// The method, as sent.
    pub method: &'b str,
    /// The origin-form target (`/path?query`).
    pub target: &'b str,
    /// Every header, in order.
    pub headers: &'h [httparse::Header<'b>],
}

impl<'b> RequestHead<'_, 'b> {
    /// The target's path.
    pub fn path(&self) -> &'b str {
        self.target.split_once('?').map_or(self.target, |(p, _)| p)
    }

    /// The target's query, if any.
    pub fn query(&self) -> Option<&'b str> {
        self.target.split_once('?').map(|(_, q)| q)
    }
}

/// Classifies the bytes of the next request; `max_body` is the largest
/// body the direct path buffers (larger ones stream through hyper).
pub fn classify(buf: &[u8], max_body: usize) -> Head {
    let mut headers = uninit_headers();
    read(buf, &mut headers, max_body).0
}

/// Room for the headers [`read`] parses in place. Left uninitialised: the
/// parser writes only the ones it finds (zeroing 32 headers cost a
/// kilobyte of stores per request).
pub fn uninit_headers<'b>() -> [std::mem::MaybeUninit<httparse::Header<'b>>; MAX_HEADERS] {
    [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS]
}

/// [`classify`], and for a direct-path request its parsed head, so the
/// direct path parses each request once.
pub fn read<'h, 'b>(
    buf: &'b [u8],
    headers: &'h mut [std::mem::MaybeUninit<httparse::Header<'b>>; MAX_HEADERS],
    max_body: usize,
) -> (Head, Option<RequestHead<'h, 'b>>) {
    if buf.is_empty() {
        return (Head::Partial, None);
    }
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return (Head::Partial, None),
        Ok(httparse::Status::Partial) => return (Head::Refuse(Refusal::HeadTooLarge), None),
        // More headers than parsed in place: hyper reads up to 100.
        Err(httparse::Error::TooManyHeaders) => return (Head::Hyper, None),
        // The HTTP/2 connection preface (prior knowledge h2c) is hyper's.
        Err(_) if buf.starts_with(b"PRI * HTTP/2.0") => return (Head::Hyper, None),
        Err(_) if b"PRI * HTTP/2.0".starts_with(buf) => return (Head::Partial, None),
        Err(_) => return (Head::Refuse(Refusal::Malformed), None),
    };
    let head = judge(&req, head_len, max_body);
    if !matches!(head, Head::Direct { .. }) {
        return (head, None);
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return (Head::Refuse(Refusal::Malformed), None);
    };
    let parsed = RequestHead {
        method,
        target,
        headers: req.headers,
    };
    (head, Some(parsed))
}

/// Whether a complete head is the direct path's, hyper's or refused.
fn judge(req: &httparse::Request<'_, '_>, head_len: usize, max_body: usize) -> Head {
    if head_len > MAX_HEAD {
        return Head::Refuse(Refusal::HeadTooLarge);
    }
    if req.version != Some(1) {
        return Head::Hyper;
    }
    if !req.path.is_some_and(strict_origin_form) {
        return Head::Hyper;
    }
    let mut body_len = None;
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            if body_len.is_some() {
                return Head::Hyper;
            }
            let Some(n) = parse_length(h.value) else {
                return Head::Hyper;
            };
            body_len = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Head::Hyper;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Head::Hyper;
                }
            }
        }
    }
    let body_len = body_len.unwrap_or(0);
    if body_len > max_body {
        return Head::Hyper;
    }
    Head::Direct {
        head_len,
        body_len,
        close,
    }
}

/// A `Content-Length` value: 1 to 15 decimal digits, nothing else (no
/// sign, no list, no inner space; surrounding space is the parser's).
pub fn parse_length(v: &[u8]) -> Option<usize> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 15 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// An origin-form target (RFC 9112 §3.2.1) of RFC 3986 characters only,
/// every `%` followed by two hex digits.
pub fn strict_origin_form(t: &str) -> bool {
    let b = t.as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            if !b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                || !b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
            {
                return false;
            }
            i += 3;
            continue;
        }
        if !TARGET[usize::from(c)] {
            return false;
        }
        i += 1;
    }
    true
}

/// The bytes an origin-form target may hold besides `%`: RFC 3986's
/// unreserved and sub-delims characters, `:`, `@`, `/` and `?`.
static TARGET: [bool; 256] = rfc3986_bytes(b":@/?");

/// A lookup table of RFC 3986's unreserved and sub-delims characters
/// (letters, digits, `-._~!$&'()*+,;=`) and `extra`, for byte-at-a-time
/// checks of targets and hosts.
pub const fn rfc3986_bytes(extra: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let base = b"-._~!$&'()*+,;=";
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric();
        c += 1;
    }
    let mut i = 0;
    while i < base.len() {
        t[base[i] as usize] = true;
        i += 1;
    }
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(head_len: usize, body_len: usize, close: bool) -> Head {
        Head::Direct {
            head_len,
            body_len,
            close,
        }
    }

    #[test]
    fn takes_plain_requests() {
        let r = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(classify(r, 64), direct(r.len() - 2, 2, false));
        let r = b"GET /v1/limit?key=a&api=x HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n";
        assert_eq!(classify(r, 64), direct(r.len(), 0, true));
    }

    #[test]
    fn waits_for_the_whole_head() {
        assert_eq!(classify(b"", 64), Head::Partial);
        assert_eq!(
            classify(b"POST /v1/check HTTP/1.1\r\nHost", 64),
            Head::Partial
        );
        assert_eq!(classify(b"PRI * HT", 64), Head::Partial);
    }

    #[test]
    fn leaves_the_rest_to_hyper_or_refuses_it() {
        for r in [
            &b"POST /v1/check HTTP/1.0\r\n\r\n"[..],
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\n\r\n",
            b"GET HTTP://x/a HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET http://u:p@x/a HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET x:80 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\n",
            b"GET /a|b HTTP/1.1\r\n\r\n",
            b"GET /%zz HTTP/1.1\r\n\r\n",
            b"GET /%4 HTTP/1.1\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
            b"GET /v1/limit HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n",
            b"POST /v1/check HTTP/1.1\r\nContent-Length: 1,1\r\n\r\n",
        ] {
            assert_eq!(
                classify(r, 64),
                Head::Hyper,
                "{}",
                String::from_utf8_lossy(r)
            );
        }
        for r in [
            &b"\x00\x01garbage\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
            b"GET / HTTP/1.1\r\nX : a\r\n\r\n",
        ] {
            assert_eq!(
                classify(r, 64),
                Head::Refuse(Refusal::Malformed),
                "{}",
                String::from_utf8_lossy(r)
            );
        }
        let huge = format!("POST /v1/check HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
        assert_eq!(
            classify(huge.as_bytes(), 64),
            Head::Refuse(Refusal::HeadTooLarge)
        );
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("h{i}: v\r\n"))
            .collect();
        let r = format!("POST /v1/check HTTP/1.1\r\n{many}\r\n");
        assert_eq!(classify(r.as_bytes(), 64), Head::Hyper);
    }
}
