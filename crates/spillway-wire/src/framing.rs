//! An upstream's response framing, read as strictly as hyper reads it: the
//! response head ([`response_head`]) and the end of a chunked body
//! ([`Chunks`]). Anything ambiguous is an error, so the proxy answers 502
//! and drops the upstream connection instead of relaying bytes the client
//! could read differently.

use crate::head::parse_length;
use crate::headers::{FRAMING, HOP_BY_HOP, connection_tokens, named};

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked: [`Chunks`] finds the end.
    Chunked,
    /// Until the upstream closes the connection.
    UntilClose,
}

/// A response head from the upstream, ready for the client.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status code.
    pub code: u16,
    /// Status line and kept headers (hop-by-hop ones and the caller's
    /// dropped), without the final blank line, so the caller can add its own.
    pub head: Vec<u8>,
    /// How the body ends.
    pub framing: Framing,
    /// The upstream connection can serve another request afterwards.
    pub reusable: bool,
}

/// Reads a parsed response head: its framing and the head to send on.
/// `head_request`: the request was HEAD (no body follows whatever the head
/// says). `drop`: header names the caller replaces with its own.
///
/// # Errors
/// Framing that cannot be trusted: lengths that are not plain decimal or
/// disagree, `Transfer-Encoding` with `Content-Length`, `chunked` twice or
/// not last beside a length, framing headers named in `Connection`, a
/// status outside 100-599.
pub fn response_head(
    resp: &httparse::Response<'_, '_>,
    head_request: bool,
    drop: &[&str],
) -> Result<ResponseHead, &'static str> {
    let code = resp.code.ok_or("no status code")?;
    if !(100..=599).contains(&code) {
        return Err("status code outside 100-599");
    }
    let headers: &[httparse::Header<'_>] = resp.headers;
    let listed = connection_tokens(headers);
    if listed.iter().any(|t| named(&FRAMING, t)) {
        return Err("Connection names a framing header");
    }
    // `close` wins wherever it stands; HTTP/1.0 keeps the connection only
    // when asked to with `keep-alive`.
    let said_close = listed.iter().any(|t| t.eq_ignore_ascii_case("close"));
    let said_keep = listed.iter().any(|t| t.eq_ignore_ascii_case("keep-alive"));
    let mut close = said_close || (resp.version == Some(0) && !said_keep);
    let mut length: Option<u64> = None;
    // The transfer codings, counted as they are read (no list is kept):
    // how many, how many are `chunked`, and whether the last one is.
    let (mut te, mut chunked_count, mut last_chunked) = (false, 0usize, false);
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(h.value).ok_or("bad Content-Length")? as u64;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length");
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te = true;
            for c in h.value.split(|&b| b == b',') {
                let c = c.trim_ascii();
                if c.is_empty() {
                    return Err("empty transfer coding");
                }
                last_chunked = c.eq_ignore_ascii_case(b"chunked");
                chunked_count += usize::from(last_chunked);
            }
        }
    }
    if chunked_count > 1 {
        return Err("chunked applied twice");
    }
    if te && length.is_some() {
        return Err("both Transfer-Encoding and Content-Length");
    }
    let chunked = te && last_chunked;
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(itoa::Buffer::new().format(code).as_bytes());
    head.push(b' ');
    head.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for h in headers {
        let name = h.name;
        // Transfer-Encoding is relayed as is: the client gets the same
        // (validated) chunked bytes.
        if named(&HOP_BY_HOP, name) || named(&listed, name) || named(drop, name) {
            continue;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    let bodiless = head_request || code < 200 || code == 204 || code == 304;
    let framing = if bodiless {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if te {
        // Codings without chunked last: the body ends at close.
        close = true;
        Framing::UntilClose
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        close = true;
        Framing::UntilClose
    };
    Ok(ResponseHead {
        code,
        head,
        framing,
        reusable: !close,
    })
}

/// Most bytes of trailer fields after a chunked body.
const MAX_TRAILERS: usize = 16 * 1024;

/// Finds where a chunked body ends, fed the bytes as they arrive, and
/// refuses anything that is not RFC 9112 chunked coding: sizes that are
/// not hex digits or do not fit 64 bits, bare CR or LF, data not followed by CRLF,
/// control characters in extensions, oversized trailers.
#[derive(Debug, Default)]
pub struct Chunks {
    state: ChunkState,
    size: u64,
    digits: u8,
    trailer_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Hex digits of a chunk size.
    #[default]
    Size,
    /// After the size: optional whitespace, then `;` or CR.
    AfterSize,
    /// A chunk extension, up to CR.
    Extension,
    /// The LF after a size line's CR.
    SizeLf,
    /// Chunk data.
    Data,
    /// The CR LF after chunk data.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final blank line).
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// The LF of a trailer line.
    TrailerLf,
    /// The LF of the final blank line.
    EndLf,
}

/// Bytes that are not chunked coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl Chunks {
    /// Consumes `data`; `Ok(Some(n))` when the body ends after its first
    /// `n` bytes.
    ///
    /// # Errors
    /// The bytes are not chunked coding (see the type's doc).
    pub fn scan(&mut self, data: &[u8]) -> Result<Option<usize>, ChunkError> {
        use ChunkState as S;
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match self.state {
                S::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        // Leading zeros are digits too (RFC 9112 sets no
                        // width), but only significant ones can overflow.
                        if self.size >> 60 != 0 {
                            return Err(ChunkError("chunk size too long"));
                        }
                        let d = u64::from((b as char).to_digit(16).unwrap_or(0));
                        self.size = (self.size << 4) | d;
                        self.digits = self.digits.saturating_add(1);
                    }
                    _ if self.digits == 0 => return Err(ChunkError("chunk size missing")),
                    b'\r' => self.state = S::SizeLf,
                    b';' => self.state = S::Extension,
                    b' ' | b'\t' => self.state = S::AfterSize,
                    _ => return Err(ChunkError("bad chunk size")),
                },
                S::AfterSize => match b {
                    b' ' | b'\t' => {}
                    b';' => self.state = S::Extension,
                    b'\r' => self.state = S::SizeLf,
                    _ => return Err(ChunkError("bad chunk size line")),
                },
                S::Extension => match b {
                    b'\r' => self.state = S::SizeLf,
                    b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                    _ => return Err(ChunkError("control character in a chunk extension")),
                },
                S::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkError("chunk size line without CRLF"));
                    }
                    self.state = if self.size == 0 {
                        S::TrailerStart
                    } else {
                        S::Data
                    };
                    self.digits = 0;
                }
                S::Data => {
                    let n = (self.size.min((data.len() - i) as u64)) as usize;
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = S::DataCr;
                    }
                    continue;
                }
                S::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkError("chunk data longer than its size"));
                    }
                    self.state = S::DataLf;
                }
                S::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkError("chunk data without CRLF"));
                    }
                    self.state = S::Size;
                    self.size = 0;
                }
                S::TrailerStart => {
                    self.state = if b == b'\r' { S::EndLf } else { S::Trailer };
                    if b == b'\n' {
                        return Err(ChunkError("bare LF in trailers"));
                    }
                    self.count_trailer()?;
                }
                S::Trailer => {
                    match b {
                        b'\r' => self.state = S::TrailerLf,
                        b'\n' => return Err(ChunkError("bare LF in trailers")),
                        _ => {}
                    }
                    self.count_trailer()?;
                }
                S::TrailerLf => {
                    if b != b'\n' {
                        return Err(ChunkError("bare CR in trailers"));
                    }
                    self.state = S::TrailerStart;
                }
                S::EndLf => {
                    if b != b'\n' {
                        return Err(ChunkError("bare CR at the end of a chunked body"));
                    }
                    return Ok(Some(i + 1));
                }
            }
            i += 1;
        }
        Ok(None)
    }

    fn count_trailer(&mut self) -> Result<(), ChunkError> {
        self.trailer_bytes += 1;
        if self.trailer_bytes > MAX_TRAILERS {
            return Err(ChunkError("trailers larger than 16 KiB"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8], head_request: bool) -> Result<(String, Framing, bool), &'static str> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        assert!(resp.parse(raw).unwrap().is_complete());
        response_head(&resp, head_request, &[])
            .map(|h| (String::from_utf8(h.head).unwrap(), h.framing, h.reusable))
    }

    #[test]
    fn response_heads_are_framed_and_cleaned() {
        let (h, f, reuse) = head(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\nX-A: 1\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(f, Framing::Chunked);
        assert!(reuse);
        assert!(!h.to_ascii_lowercase().contains("keep-alive"), "{h}");
        assert!(
            h.contains("Transfer-Encoding: chunked") && h.contains("X-A: 1"),
            "{h}"
        );
        let (_, f, reuse) = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((f, reuse), (Framing::Length(3), false));
        let (_, f, reuse) = head(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n", false).unwrap();
        assert_eq!((f, reuse), (Framing::Length(3), false));
        let (_, f, reuse) = head(b"HTTP/1.1 200 OK\r\n\r\n", false).unwrap();
        assert_eq!((f, reuse), (Framing::UntilClose, false));
        let (_, f, reuse) =
            head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false).unwrap();
        assert_eq!((f, reuse), (Framing::UntilClose, false));
        let (_, f, _) = head(b"HTTP/1.1 204 No Content\r\n\r\n", false).unwrap();
        assert_eq!(f, Framing::None);
        let (_, f, _) = head(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).unwrap();
        assert_eq!(f, Framing::None);
    }

    /// Regression (issue 15): framing the direct path relayed unchecked.
    #[test]
    fn ambiguous_response_framing_is_refused() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\nContent-Length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: ,chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nConnection: transfer-encoding\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nConnection: host\r\n\r\n",
            b"HTTP/1.1 999 Odd\r\n\r\n",
        ] {
            assert!(
                head(raw, false).is_err(),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn finds_the_end_of_a_chunked_body_however_it_is_split() {
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut c = Chunks::default();
            let (a, b) = body.split_at(split);
            let got = match c.scan(a).unwrap() {
                Some(n) => Some(n),
                None => c.scan(b).unwrap().map(|n| n + split),
            };
            assert_eq!(got, Some(end), "split at {split}");
        }
        assert_eq!(Chunks::default().scan(b"0\r\n\r\n"), Ok(Some(5)));
        assert_eq!(Chunks::default().scan(b"3\r\nabc\r\n"), Ok(None));
        assert_eq!(
            Chunks::default().scan(b"3 ;a=b\r\nabc\r\n0\r\n\r\n"),
            Ok(Some(18))
        );
    }

    /// Regression (issue 15): malformed chunk lines were relayed.
    #[test]
    fn malformed_chunks_are_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"3\nabc\r\n",
            b"3\r\nabcd\r\n",
            b"3\r\nabc\n0\r\n\r\n",
            b"3\r\nabc\r\n0\r\n\n",
            b"3\r\nabc\r\n0\r\nX: 1\n\r\n",
            b"11111111111111111\r\n",
            b"3;\x01\r\nabc\r\n",
            b"-3\r\n",
            b"0x3\r\nabc\r\n",
        ] {
            assert!(
                Chunks::default().scan(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest::proptest! {
        /// Whatever an upstream sends, and however the reads split it,
        /// the scanner gives the same answer (an end, none yet, or an
        /// error) and never panics.
        #[test]
        fn any_bytes_scan_the_same_however_split(
            data in proptest::collection::vec(
                proptest::sample::select(b"0123456789abcdefxX;=\r\n \t\x01".to_vec()),
                0..200,
            ),
            split in 0usize..200,
        ) {
            let whole = Chunks::default().scan(&data);
            let (a, b) = data.split_at(split.min(data.len()));
            let mut c = Chunks::default();
            let parts = match c.scan(a) {
                Ok(Some(n)) => Ok(Some(n)),
                Ok(None) => c.scan(b).map(|o| o.map(|n| n + a.len())),
                Err(e) => Err(e),
            };
            proptest::prop_assert_eq!(whole.is_err(), parts.is_err());
            if let (Ok(w), Ok(p)) = (whole, parts) {
                proptest::prop_assert_eq!(w, p);
            }
        }

        /// Response heads from a misbehaving upstream: framed or refused,
        /// never a panic; a framed one never keeps two framings.
        #[test]
        fn any_response_head_is_framed_or_refused(
            lines in proptest::collection::vec(
                proptest::sample::select(vec![
                    "Content-Length: 5", "Content-Length: 7", "content-length: -1",
                    "Content-Length: 99999999999999999999999", "Transfer-Encoding: chunked",
                    "Transfer-Encoding: gzip, chunked", "Transfer-Encoding: chunked, gzip",
                    "Connection: close", "Connection: keep-alive, Upgrade", "Keep-Alive: timeout=5",
                    "X-A: b", "Connection: content-length",
                ]),
                0..6,
            ),
            code in proptest::sample::select(vec!["100", "101", "200", "204", "304", "429", "599"]),
            version in proptest::sample::select(vec!["1.0", "1.1"]),
            head_request: bool,
        ) {
            let raw = format!("HTTP/{version} {code} X\r\n{}\r\n", lines.iter().map(|l| format!("{l}\r\n")).collect::<String>());
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut headers);
            if let Ok(httparse::Status::Complete(_)) = resp.parse(raw.as_bytes())
                && let Ok(h) = response_head(&resp, head_request, &[])
            {
                let text = String::from_utf8_lossy(&h.head).to_ascii_lowercase();
                proptest::prop_assert!(!(text.contains("content-length") && text.contains("transfer-encoding")), "{text}");
            }
        }
    }
}
