//! Writing answers by hand into one buffer: the status line, the headers
//! every answer has, a cached `Date`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use http::StatusCode;

/// The status line and the headers every answer has (`content-type`,
/// `content-length`, `date`, and `connection: close` when closing); the
/// caller adds its own and the blank line.
pub fn head(out: &mut Vec<u8>, status: StatusCode, content_type: &str, len: usize, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    http_date(out);
    if close {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n");
}

/// One `name: value` header line.
pub fn header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A whole answer: head, extra header lines (`extra`, already formatted),
/// the blank line, and the body unless it answers a HEAD request.
pub fn answer(
    out: &mut Vec<u8>,
    status: StatusCode,
    content_type: &str,
    body: &[u8],
    close: bool,
    head_request: bool,
    extra: impl FnOnce(&mut Vec<u8>),
) {
    head(out, status, content_type, body.len(), close);
    extra(out);
    out.extend_from_slice(b"\r\n");
    if !head_request {
        out.extend_from_slice(body);
    }
}

/// The current second (since the epoch) for `Date` headers, kept by
/// [`date_ticker`] while a server runs; 0 when none does. Reading it costs
/// a load where reading the clock cost a `clock_gettime` per answer.
static DATE_SECS: AtomicU64 = AtomicU64::new(0);

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs())
}

/// Sets the cached second at every turn of a second. (Several servers in
/// one process each run one; they write the same value.)
pub async fn date_ticker() {
    loop {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::from_secs(1));
        DATE_SECS.store(now.as_secs(), Ordering::Relaxed);
        let to_next = Duration::from_nanos(1_000_000_000 - u64::from(now.subsec_nanos()));
        tokio::time::sleep(to_next + Duration::from_micros(200)).await;
    }
}

/// The `Date` header's value, formatted once a second per thread.
pub fn http_date(out: &mut Vec<u8>) {
    use std::cell::RefCell;
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let secs = match DATE_SECS.load(Ordering::Relaxed) {
        0 => epoch_secs(),
        s => s,
    };
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
            *d = (secs, httpdate::fmt_http_date(at));
        }
        out.extend_from_slice(d.1.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_answer_has_its_length_but_no_body() {
        let mut out = Vec::new();
        answer(
            &mut out,
            StatusCode::TOO_MANY_REQUESTS,
            "a/b",
            b"{}",
            false,
            true,
            |o| header(o, "x", b"1"),
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{text}"
        );
        assert!(
            text.contains("content-length: 2\r\n") && text.contains("x: 1\r\n"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\n"), "{text}");
    }
}
