//! Fuzzing on stable: spillway-wire's parsers of untrusted bytes against
//! small strict reference parsers written here from RFC 9112, with
//! proptest's byte and structure generators. The hostile inputs under
//! `tests/corpus/{head,response,chunks}/` (one input per file) are
//! replayed first, through the same checks.
//!
//! - [`classify`] (the direct path's request heads): never panics; when it
//!   says `Direct`, the reference accepts the head with the same head
//!   length, body length and close flag; a prefix of the bytes gives
//!   `Partial` or the same answer.
//! - [`response_head`] (upstream response framing): when it accepts, the
//!   reference frames the response the same way, and the head it emits
//!   for the client frames the same again.
//! - [`Chunks`] (where an upstream's chunked body ends): the same end as the
//!   reference decoder, or both reject, however the bytes are split.

use proptest::prelude::*;
use spillway_wire::framing::{Chunks, Framing, response_head};
use spillway_wire::head::{Head, classify};

/// The direct path's body limit in these checks.
const MAX_BODY: usize = 64 * 1024;

// ------------------------------------------------------------ references

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A field value byte: HTAB, SP, VCHAR, obs-text (RFC 9110 5.5).
fn is_field_byte(b: u8) -> bool {
    b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80
}

/// The next line from `at`: its bytes without the terminator, and where the
/// next line starts. A line ends with CRLF, or a bare LF (RFC 9112 2.2: a
/// recipient MAY take LF alone; hyper does). A CR anywhere else is an error.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, &'static str> {
    let Some(lf) = buf[at..].iter().position(|&b| b == b'\n') else {
        // A bare CR already seen is an error even before the line ends.
        return match buf[at..].iter().position(|&b| b == b'\r') {
            Some(cr) if at + cr + 1 < buf.len() => Err("bare CR"),
            _ => Ok(None),
        };
    };
    let mut l = &buf[at..at + lf];
    if let Some(stripped) = l.strip_suffix(b"\r") {
        l = stripped;
    }
    if l.contains(&b'\r') {
        return Err("bare CR");
    }
    Ok(Some((l, at + lf + 1)))
}

/// A field line `name ":" OWS value OWS` (no obs-fold, no space before
/// the colon), as (name, value).
fn field(l: &[u8]) -> Result<(&[u8], &[u8]), &'static str> {
    let colon = l.iter().position(|&b| b == b':').ok_or("no colon")?;
    let (name, value) = (&l[..colon], &l[colon + 1..]);
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err("bad field name");
    }
    if !value.iter().all(|&b| is_field_byte(b)) {
        return Err("bad field value");
    }
    let value = value.trim_ascii();
    Ok((name, value))
}

/// How a message body is framed, per RFC 9112 6.3, strictly (anything a
/// second reader could read differently is `Err`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefFraming {
    /// No framing headers: no body (request), until close (response).
    Absent,
    Length(u64),
    Chunked,
    /// Transfer codings without chunked last.
    OtherCoding,
}

/// The framing the headers give; `Err` for any ambiguity: a length that is
/// not 1*DIGIT, two lengths that differ, `Transfer-Encoding` beside
/// `Content-Length`, `chunked` twice or not last, an empty coding; for a
/// response (`response`), a framing header named in `Connection` too (a
/// proxy that honoured it would drop the framing; on a request, the proxy
/// writes its own framing, so there it changes nothing).
fn ref_framing(fields: &[(&[u8], &[u8])], response: bool) -> Result<RefFraming, &'static str> {
    let mut length: Option<u64> = None;
    let mut codings: Vec<&[u8]> = Vec::new();
    let mut te = false;
    for (name, value) in fields {
        if name.eq_ignore_ascii_case(b"content-length") {
            if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                return Err("Content-Length is not 1*DIGIT");
            }
            let n = std::str::from_utf8(value)
                .unwrap()
                .parse::<u64>()
                .map_err(|_| "Content-Length overflows")?;
            if length.is_some_and(|l| l != n) {
                return Err("two lengths");
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            te = true;
            for c in value.split(|&b| b == b',') {
                let c = c.trim_ascii();
                if c.is_empty() {
                    return Err("empty coding");
                }
                codings.push(c);
            }
        } else if response && name.eq_ignore_ascii_case(b"connection") {
            for t in value.split(|&b| b == b',') {
                let t = t.trim_ascii();
                if [&b"content-length"[..], b"transfer-encoding", b"host"]
                    .iter()
                    .any(|f| t.eq_ignore_ascii_case(f))
                {
                    return Err("Connection names a framing header");
                }
            }
        }
    }
    if te && length.is_some() {
        return Err("Transfer-Encoding and Content-Length");
    }
    let chunked = codings
        .iter()
        .filter(|c| c.eq_ignore_ascii_case(b"chunked"))
        .count();
    if chunked > 1 {
        return Err("chunked twice");
    }
    Ok(if te {
        if codings
            .last()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
        {
            RefFraming::Chunked
        } else {
            RefFraming::OtherCoding
        }
    } else if let Some(n) = length {
        RefFraming::Length(n)
    } else {
        RefFraming::Absent
    })
}

fn connection_has(fields: &[(&[u8], &[u8])], token: &[u8]) -> bool {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// A request head as the strict reference reads it.
#[derive(Debug, PartialEq, Eq)]
enum RefHead {
    Incomplete,
    Invalid(&'static str),
    Valid {
        head_len: usize,
        /// `HTTP/1.<minor>`, or None for another major version.
        minor: Option<u8>,
        origin_form: bool,
        framing: Result<RefFraming, &'static str>,
        close: bool,
    },
}

/// RFC 9112 sections 2-5: empty lines before the request line are skipped
/// (2.2), `method SP target SP version`, field lines, an empty line.
fn ref_request_head(buf: &[u8]) -> RefHead {
    let mut at = 0;
    let request_line = loop {
        match line(buf, at) {
            Err(e) => return RefHead::Invalid(e),
            Ok(None) => return RefHead::Incomplete,
            Ok(Some((&[], next))) => at = next,
            Ok(Some((l, next))) => {
                at = next;
                break l;
            }
        }
    };
    let parts: Vec<&[u8]> = request_line.split(|&b| b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return RefHead::Invalid("request line is not three parts");
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return RefHead::Invalid("bad method");
    }
    if target.is_empty() || !target.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return RefHead::Invalid("bad target");
    }
    let minor = match version {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            (*major == b'1').then_some(minor - b'0')
        }
        _ => return RefHead::Invalid("bad version"),
    };
    let mut fields = Vec::new();
    loop {
        match line(buf, at) {
            Err(e) => return RefHead::Invalid(e),
            Ok(None) => return RefHead::Incomplete,
            Ok(Some((l, next))) => {
                at = next;
                if l.is_empty() {
                    break;
                }
                if l[0] == b' ' || l[0] == b'\t' {
                    return RefHead::Invalid("obs-fold");
                }
                match field(l) {
                    Ok(f) => fields.push(f),
                    Err(e) => return RefHead::Invalid(e),
                }
            }
        }
    }
    RefHead::Valid {
        head_len: at,
        minor,
        origin_form: target[0] == b'/',
        framing: ref_framing(&fields, false),
        close: connection_has(&fields, b"close"),
    }
}

/// Most bytes of trailer fields (the bound `Chunks` and hyper share).
const MAX_TRAILERS: usize = 16 * 1024;

/// A chunked body decoded fully, RFC 9112 7.1, with hyper's tolerances
/// (whitespace after the size; extensions are any field bytes up to CR).
/// `Ok(Some(n))`: it ends after `n` bytes; `Ok(None)`: not yet; `Err`: the
/// bytes so far cannot be chunked coding. `strict_trailers`: trailer lines
/// must be field lines (else any bytes without a bare CR or LF).
fn ref_chunked(data: &[u8], strict_trailers: bool) -> Result<Option<usize>, &'static str> {
    let mut i = 0;
    // Each step: the byte at `i`, or "not yet".
    macro_rules! byte {
        () => {
            match data.get(i) {
                Some(&b) => b,
                None => return Ok(None),
            }
        };
    }
    loop {
        // chunk-size = 1*HEXDIG (any length, as long as it fits a u64)
        let mut size: u64 = 0;
        let mut digits = 0;
        loop {
            let b = byte!();
            let Some(d) = (b as char).to_digit(16) else {
                break;
            };
            size = size
                .checked_mul(16)
                .and_then(|s| s.checked_add(u64::from(d)))
                .ok_or("chunk size overflows")?;
            digits += 1;
            i += 1;
        }
        if digits == 0 {
            return Err("no chunk size");
        }
        while matches!(byte!(), b' ' | b'\t') {
            i += 1;
        }
        if byte!() == b';' {
            loop {
                let b = byte!();
                if b == b'\r' {
                    break;
                }
                if !is_field_byte(b) {
                    return Err("bad chunk extension byte");
                }
                i += 1;
            }
        }
        if byte!() != b'\r' {
            return Err("size line not ended by CR");
        }
        i += 1;
        if byte!() != b'\n' {
            return Err("size line CR without LF");
        }
        i += 1;
        if size == 0 {
            break;
        }
        let left = (data.len() - i) as u64;
        if left < size {
            return Ok(None);
        }
        i += size as usize;
        if byte!() != b'\r' {
            return Err("data not followed by CR");
        }
        i += 1;
        if byte!() != b'\n' {
            return Err("data CR without LF");
        }
        i += 1;
    }
    // trailer-section, then CRLF.
    let mut trailer_bytes = 0;
    loop {
        let start = i;
        loop {
            let b = byte!();
            if b == b'\n' {
                return Err("bare LF in trailers");
            }
            trailer_bytes += 1;
            if trailer_bytes > MAX_TRAILERS {
                return Err("trailers too large");
            }
            if b == b'\r' {
                break;
            }
            i += 1;
        }
        let l = &data[start..i];
        i += 1;
        if byte!() != b'\n' {
            return Err("bare CR in trailers");
        }
        i += 1;
        if l.is_empty() {
            return Ok(Some(i));
        }
        if strict_trailers && (l[0] == b' ' || l[0] == b'\t' || field(l).is_err()) {
            return Err("trailer is not a field line");
        }
    }
}

// ---------------------------------------------------------------- checks

/// The request-head properties for one input.
fn check_head(buf: &[u8]) -> Result<(), String> {
    let got = classify(buf, MAX_BODY);
    if let Head::Direct {
        head_len,
        body_len,
        close,
    } = got
    {
        let reference = ref_request_head(buf);
        let agrees = match &reference {
            RefHead::Valid {
                head_len: h,
                minor: Some(1),
                origin_form: true,
                framing: Ok(f),
                close: c,
            } => {
                *h == head_len
                    && *c == close
                    && match f {
                        RefFraming::Absent => body_len == 0,
                        RefFraming::Length(n) => *n == body_len as u64,
                        _ => false,
                    }
            }
            _ => false,
        };
        if !agrees {
            return Err(format!(
                "classify says {got:?}, the strict reference {reference:?}"
            ));
        }
    }
    for cut in 0..buf.len() {
        let part = classify(&buf[..cut], MAX_BODY);
        if part != Head::Partial && part != got {
            return Err(format!(
                "the first {cut} bytes classify as {part:?}, all {} as {got:?}",
                buf.len()
            ));
        }
    }
    Ok(())
}

/// The response-framing properties for one input (`raw`: a response head;
/// `head_request`: it answers HEAD).
fn check_response(raw: &[u8], head_request: bool) -> Result<(), String> {
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut resp = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = resp.parse(raw) else {
        return Ok(());
    };
    let Ok(got) = response_head(&resp, head_request, &[]) else {
        return Ok(());
    };
    let fields: Vec<(&[u8], &[u8])> = resp
        .headers
        .iter()
        .map(|h| (h.name.as_bytes(), h.value))
        .collect();
    let code = resp.code.unwrap_or(0);
    let version = resp.version.unwrap_or(1);
    let want = ref_response(&fields, code, version, head_request)
        .map_err(|e| format!("response_head accepted what the reference refuses: {e}"))?;
    if (got.framing, got.reusable) != want {
        return Err(format!(
            "response_head frames {:?} (reusable {}), the reference {want:?}",
            got.framing, got.reusable
        ));
    }
    // The head sent on to the client frames the body the same way.
    let mut sent = got.head.clone();
    sent.extend_from_slice(b"\r\n");
    let mut headers = [httparse::EMPTY_HEADER; 100];
    let mut again = httparse::Response::new(&mut headers);
    if !matches!(again.parse(&sent), Ok(httparse::Status::Complete(_))) {
        return Err(format!(
            "the head for the client does not parse: {:?}",
            String::from_utf8_lossy(&sent)
        ));
    }
    let fields: Vec<(&[u8], &[u8])> = again
        .headers
        .iter()
        .map(|h| (h.name.as_bytes(), h.value))
        .collect();
    for hop in spillway_wire::HOP_BY_HOP {
        if fields
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(hop.as_bytes()))
        {
            return Err(format!("the head for the client keeps {hop}"));
        }
    }
    let relayed = ref_response(&fields, code, 1, head_request)
        .map_err(|e| format!("the head for the client is ambiguous: {e}"))?;
    let framing_only = |f: Framing| match f {
        // Until close either way: the caller closes the client connection.
        Framing::UntilClose => Framing::UntilClose,
        other => other,
    };
    if framing_only(relayed.0) != framing_only(got.framing) {
        return Err(format!(
            "the head for the client frames {:?}, the upstream's {:?}",
            relayed.0, got.framing
        ));
    }
    Ok(())
}

/// RFC 9112 6.3 for a response, and 9.3 for persistence.
fn ref_response(
    fields: &[(&[u8], &[u8])],
    code: u16,
    version: u8,
    head_request: bool,
) -> Result<(Framing, bool), &'static str> {
    if !(100..=599).contains(&code) {
        return Err("status outside 100-599");
    }
    let framing = ref_framing(fields, true)?;
    let close_token = connection_has(fields, b"close");
    let persistent = if version == 0 {
        connection_has(fields, b"keep-alive") && !close_token
    } else {
        !close_token
    };
    let framing = if head_request || code < 200 || code == 204 || code == 304 {
        Framing::None
    } else {
        match framing {
            RefFraming::Chunked => Framing::Chunked,
            RefFraming::Length(n) => Framing::Length(n),
            RefFraming::OtherCoding | RefFraming::Absent => Framing::UntilClose,
        }
    };
    let reusable = persistent && framing != Framing::UntilClose;
    Ok((framing, reusable))
}

/// The chunk-scanner properties for one input.
fn check_chunks(data: &[u8]) -> Result<(), String> {
    let got = Chunks::default().scan(data).map_err(|e| e.0);
    let lenient = ref_chunked(data, false);
    if got.is_err() != lenient.is_err() || got.ok() != lenient.ok() {
        return Err(format!("Chunks says {got:?}, the reference {lenient:?}"));
    }
    if let Ok(Some(end)) = ref_chunked(data, true)
        && got != Ok(Some(end))
    {
        return Err(format!(
            "Chunks says {got:?}, the strict reference ends at {end}"
        ));
    }
    for cut in 0..data.len() {
        let mut c = Chunks::default();
        let parts = match c.scan(&data[..cut]) {
            Ok(None) => c.scan(&data[cut..]).map(|o| o.map(|n| n + cut)),
            other => other,
        };
        if parts.map_err(|e| e.0) != got {
            return Err(format!("split at {cut}: {parts:?}, whole: {got:?}"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- corpus

fn corpus(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(kind);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

fn replay(kind: &str, check: impl Fn(&[u8]) -> Result<(), String>) {
    let inputs = corpus(kind);
    assert!(inputs.len() >= 10, "{kind}: only {} inputs", inputs.len());
    let failures: Vec<String> = inputs
        .iter()
        .filter_map(|(name, bytes)| {
            check(bytes).err().map(|e| {
                format!(
                    "  {kind}/{name}: {e}\n    input: {:?}",
                    String::from_utf8_lossy(bytes)
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corpus_request_heads() {
    replay("head", check_head);
}

#[test]
fn corpus_response_heads() {
    replay("response", |raw| {
        check_response(raw, false)?;
        check_response(raw, true)
    });
}

#[test]
fn corpus_chunked_bodies() {
    replay("chunks", check_chunks);
}

/// The references themselves, on what RFC 9112 says.
#[test]
fn the_references_read_the_rfc() {
    assert_eq!(
        ref_request_head(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"),
        RefHead::Valid {
            head_len: 46,
            minor: Some(1),
            origin_form: true,
            framing: Ok(RefFraming::Length(2)),
            close: false
        }
    );
    assert_eq!(
        ref_request_head(b"GET / HTTP/1.1\r\nHost"),
        RefHead::Incomplete
    );
    for bad in [
        &b"GET / HTTP/1.1\r\nX : y\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nX: y\r\n z\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\rX: y\r\n\r\n",
    ] {
        assert!(
            matches!(ref_request_head(bad), RefHead::Invalid(_)),
            "{bad:?}"
        );
    }
    assert!(matches!(
        ref_request_head(b"GET / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n"),
        RefHead::Valid {
            framing: Err(_),
            ..
        }
    ));
    assert_eq!(ref_chunked(b"5\r\nhello\r\n0\r\n\r\nX", true), Ok(Some(15)));
    assert_eq!(
        ref_chunked(b"5 ;a=b\r\nhello\r\n0\r\nT: 1\r\n\r\n", true),
        Ok(Some(26))
    );
    assert_eq!(ref_chunked(b"5\r\nhel", true), Ok(None));
    assert!(ref_chunked(b"5\r\nhello0\r\n\r\n", true).is_err());
    assert!(ref_chunked(b"0\r\nno colon\r\n\r\n", true).is_err());
    assert_eq!(ref_chunked(b"0\r\nno colon\r\n\r\n", false), Ok(Some(15)));
}

// ------------------------------------------------------------ generators

fn pick(items: &[&'static str]) -> impl Strategy<Value = &'static str> + use<> {
    proptest::sample::select(items.to_vec())
}

/// Request heads from hostile pieces.
fn request_heads() -> impl Strategy<Value = Vec<u8>> {
    let method = pick(&["GET", "POST", "HEAD", "get", "PRI", "G(T", "", "CONNECT"]);
    let target = pick(&[
        "/",
        "/a?b=c",
        "/%41",
        "/%zz",
        "*",
        "http://x/",
        "x:80",
        "/a|b",
        "/\u{e9}",
        "/a/../b",
    ]);
    let version = pick(&[
        "HTTP/1.1",
        "HTTP/1.0",
        "HTTP/2.0",
        "http/1.1",
        "HTTP/1.1 ",
        "HTTP/1",
    ]);
    let sep = || pick(&[" ", " ", " ", "  ", "\t"]);
    let header = pick(&[
        "Host: x",
        "Content-Length: 5",
        "Content-Length: 0",
        "Content-Length: 05",
        "Content-Length: +5",
        "Content-Length: 5, 5",
        "Content-Length:  7 ",
        "Content-Length: 99999999999999999999",
        "content-length: 3",
        "Transfer-Encoding: chunked",
        "Transfer-Encoding: xchunked",
        "Transfer-Encoding:\u{b}chunked",
        "Connection: close",
        "Connection: keep-alive, Close",
        "Connection: content-length",
        "Connection: upgrade",
        "Upgrade: h2c",
        "Expect: 100-continue",
        "X: a\rb",
        "X : y",
        " folded",
        "X:",
        "X: \u{ff}",
        "X: a\u{0}b",
        "Bad Header",
    ]);
    let eol = || pick(&["\r\n", "\r\n", "\r\n", "\n", "\r"]);
    (
        pick(&["", "", "\r\n", "\n"]),
        method,
        sep(),
        target,
        sep(),
        version,
        proptest::collection::vec((header, eol()), 0..8),
        eol(),
        pick(&["", "hello", "0\r\n\r\n", "GET / HTTP/1.1\r\n\r\n"]),
    )
        .prop_map(|(lead, m, s1, t, s2, v, hs, end, body)| {
            let mut r = format!("{lead}{m}{s1}{t}{s2}{v}\r\n");
            for (h, e) in hs {
                r.push_str(h);
                r.push_str(e);
            }
            r.push_str(end);
            r.push_str(body);
            r.into_bytes()
        })
}

/// Bytes from an alphabet HTTP parsers care about.
fn http_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        proptest::sample::select(
            b"GET /HTP1.0\r\n\r\n:: \t,;ContentLgh-TransfrEcodigchunked0123456789abcdefx\x00\x0b\x7f\xff"
                .to_vec(),
        ),
        0..200,
    )
}

/// `base` with a few bytes inserted, removed or replaced.
fn mutated(base: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        base,
        proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..4),
    )
        .prop_map(|(mut b, edits)| {
            for (at, op, byte) in edits {
                if b.is_empty() {
                    b.push(byte);
                    continue;
                }
                let i = at.index(b.len());
                match op {
                    0 => b.insert(i, byte),
                    1 => {
                        b.remove(i);
                    }
                    _ => b[i] = byte,
                }
            }
            b
        })
}

fn response_heads() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let status = pick(&[
        "HTTP/1.1 200 OK",
        "HTTP/1.0 200 OK",
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 304 X",
        "HTTP/1.1 101 Switching",
        "HTTP/1.1 103 Early",
        "HTTP/1.1 999 Odd",
        "HTTP/1.1 429 ",
    ]);
    let header = pick(&[
        "Content-Length: 5",
        "Content-Length: 7",
        "Content-Length: 05",
        "Content-Length: 5, 5",
        "Content-Length: +5",
        "Content-Length: 99999999999999999999",
        "Transfer-Encoding: chunked",
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: chunked, gzip",
        "Transfer-Encoding: gzip",
        "Transfer-Encoding: ,chunked",
        "transfer-encoding: CHUNKED",
        "Connection: close",
        "Connection: keep-alive",
        "Connection: close, keep-alive",
        "Connection: keep-alive, close",
        "Connection: x-a",
        "Connection: content-length",
        "Keep-Alive: timeout=5",
        "Upgrade: h2c",
        "X-A: b",
        "Trailer: X-T",
    ]);
    (
        status,
        proptest::collection::vec(header, 0..6),
        any::<bool>(),
    )
        .prop_map(|(s, hs, head)| {
            let mut r = format!("{s}\r\n");
            for h in hs {
                r.push_str(h);
                r.push_str("\r\n");
            }
            r.push_str("\r\n");
            (r.into_bytes(), head)
        })
}

/// Chunked bodies from hostile pieces: sizes right, short, long, padded
/// or malformed; extensions; line ends; trailers.
fn chunked_bodies() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (
        proptest::collection::vec(any::<u8>(), 0..20),
        pick(&["", "", "", "0", "00000000000000000", "+", "0x", " "]),
        -1i8..=1,
        pick(&["", "", ";a=b", ";a=\"b c\"", " ;x", "\t", ";\u{1}", ";a\nb"]),
        pick(&["\r\n", "\r\n", "\r\n", "\n", "\r"]),
        pick(&["\r\n", "\r\n", "\r\n", "\n", ""]),
    )
        .prop_map(|(data, pad, off, ext, eol, after)| {
            let size = (data.len() as i64 + i64::from(off)).max(0);
            let mut c = format!("{pad}{size:x}{ext}{eol}").into_bytes();
            c.extend_from_slice(&data);
            c.extend_from_slice(after.as_bytes());
            c
        });
    (
        proptest::collection::vec(chunk, 0..4),
        pick(&["0", "0", "00", "0;e=1", "000000000000000000"]),
        pick(&["\r\n", "\r\n", "\n"]),
        pick(&[
            "",
            "",
            "X-T: 1\r\n",
            "no colon\r\n",
            " fold\r\n",
            "X: a\rb\r\n",
            "X: 1\n",
        ]),
        pick(&["\r\n", "\r\n", "\n", "", "\r"]),
        pick(&["", "NEXT", "GET / HTTP/1.1\r\n\r\n"]),
    )
        .prop_map(|(chunks, last, eol, trailer, end, tail)| {
            let mut b: Vec<u8> = chunks.concat();
            b.extend_from_slice(format!("{last}{eol}{trailer}{end}{tail}").as_bytes());
            b
        })
}

/// A failure with its input as text (proptest shows bytes as numbers).
fn failed(_kind: &str, e: String, input: &[u8]) -> TestCaseError {
    TestCaseError::fail(format!(
        "{e}\n    input: {:?}",
        String::from_utf8_lossy(input)
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn request_heads_agree_with_the_reference(buf in request_heads()) {
        check_head(&buf).map_err(|e| failed("head", e, &buf))?;
    }

    #[test]
    fn mutated_request_heads_agree_with_the_reference(buf in mutated(request_heads())) {
        check_head(&buf).map_err(|e| failed("head", e, &buf))?;
    }

    #[test]
    fn any_bytes_classify_without_panic_and_agree(buf in http_bytes()) {
        check_head(&buf).map_err(|e| failed("head", e, &buf))?;
    }

    #[test]
    fn response_heads_agree_with_the_reference((raw, head) in response_heads()) {
        check_response(&raw, head).map_err(|e| failed("response", e, &raw))?;
    }

    #[test]
    fn mutated_response_heads_agree_with_the_reference(
        raw in mutated(response_heads().prop_map(|(r, _)| r)),
        head: bool,
    ) {
        check_response(&raw, head).map_err(|e| failed("response", e, &raw))?;
    }

    #[test]
    fn chunked_bodies_end_where_the_reference_ends(data in chunked_bodies()) {
        check_chunks(&data).map_err(|e| failed("chunks", e, &data))?;
    }

    #[test]
    fn mutated_chunked_bodies_end_where_the_reference_ends(data in mutated(chunked_bodies())) {
        check_chunks(&data).map_err(|e| failed("chunks", e, &data))?;
    }

    #[test]
    fn any_bytes_scan_like_the_reference(data in http_bytes()) {
        check_chunks(&data).map_err(|e| failed("chunks", e, &data))?;
    }
}
