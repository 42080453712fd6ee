//! One error body for every way in: an RFC 9457 problem document.

use http::StatusCode;
use spillway_store::Checked;

use crate::headers::retry_after_secs;

/// The media type of a [`Problem`].
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document: `type` (always `about:blank`), `title`
/// (the status's reason phrase, lower case), `status`, `detail`, and on a
/// 429 `rule` and `retry_after` (seconds). Every error body of every way in
/// is one of these; internal failures carry a generic `detail` and leave
/// addresses and OS errors to the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem<'a> {
    /// The HTTP status.
    pub status: StatusCode,
    /// What happened, for a person.
    pub detail: std::borrow::Cow<'a, str>,
    /// On a denial: the deciding rule and the seconds to wait.
    pub limited: Option<(&'a str, u64)>,
}

impl<'a> Problem<'a> {
    /// A problem with `status` and `detail`.
    pub fn new(status: StatusCode, detail: impl Into<std::borrow::Cow<'a, str>>) -> Problem<'a> {
        Problem {
            status,
            detail: detail.into(),
            limited: None,
        }
    }

    /// The 429 for a denied decision. Its `detail` is written out when
    /// rendered (`rate limit "NAME" exceeded; retry after N s`), without
    /// building a string first: this is every denial's answer.
    pub fn too_many_requests(checked: &'a Checked) -> Problem<'a> {
        let (rule, retry) = checked
            .decision
            .deciding
            .as_ref()
            .map(|d| {
                (
                    checked.rule(d).map_or("", |r| r.name()),
                    retry_after_secs(d.verdict.retry_after),
                )
            })
            .unwrap_or_default();
        Problem {
            status: StatusCode::TOO_MANY_REQUESTS,
            detail: std::borrow::Cow::Borrowed(""),
            limited: Some((rule, retry)),
        }
    }

    /// The title: the status's reason phrase in lower case.
    pub fn title(&self) -> std::borrow::Cow<'static, str> {
        match self.status.as_u16() {
            400 => "bad request".into(),
            404 => "not found".into(),
            405 => "method not allowed".into(),
            413 => "payload too large".into(),
            429 => "too many requests".into(),
            431 => "request header fields too large".into(),
            500 => "internal server error".into(),
            502 => "bad gateway".into(),
            504 => "gateway timeout".into(),
            _ => self
                .status
                .canonical_reason()
                .unwrap_or("error")
                .to_ascii_lowercase()
                .into(),
        }
    }

    /// Appends the JSON document to `out`.
    pub fn write_json(&self, out: &mut String) {
        let mut num = itoa::Buffer::new();
        out.reserve(96 + self.detail.len() * 2);
        out.push_str(r#"{"type":"about:blank","title":""#);
        // Reason phrases are plain ASCII words: nothing to escape.
        out.push_str(&self.title());
        out.push_str(r#"","status":"#);
        out.push_str(num.format(self.status.as_u16()));
        out.push_str(r#","detail":""#);
        match self.limited {
            Some((rule, retry)) if self.detail.is_empty() => {
                out.push_str(r#"rate limit \""#);
                push_json_escaped(out, rule);
                out.push_str(r#"\" exceeded; retry after "#);
                out.push_str(num.format(retry));
                out.push_str(" s");
            }
            _ => push_json_escaped(out, &self.detail),
        }
        out.push('"');
        if let Some((rule, retry)) = self.limited {
            out.push_str(r#","rule":""#);
            push_json_escaped(out, rule);
            out.push_str(r#"","retry_after":"#);
            out.push_str(num.format(retry));
        }
        out.push('}');
    }

    /// The JSON document.
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out);
        out
    }
}

/// Appends `s` as the inside of a JSON string (quotes, backslashes and
/// control characters escaped), for writers of JSON by hand.
pub fn push_json_escaped(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    let mut plain = 0;
    for (i, b) in s.bytes().enumerate() {
        if b == b'"' || b == b'\\' || b < 0x20 {
            out.push_str(&s[plain..i]);
            match b {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                _ => {
                    let _ = write!(out, "\\u{b:04x}");
                }
            }
            plain = i + 1;
        }
    }
    out.push_str(&s[plain..]);
}

/// The RFC 9457 problem document [`ProblemJson`](crate::ProblemJson) answers a denial with
/// (the deciding rule's name and the seconds to wait), for servers that
/// write their own responses.
pub fn problem_body(checked: &Checked) -> String {
    Problem::too_many_requests(checked).to_json()
}

/// [`problem_body`] appended to `out`, for a writer that reuses its buffer.
pub fn push_problem_body(checked: &Checked, out: &mut String) {
    Problem::too_many_requests(checked).write_json(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_one_json_shape() {
        let p = Problem::new(StatusCode::BAD_GATEWAY, "the \"upstream\" failed");
        let v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "about:blank", "title": "bad gateway", "status": 502,
                "detail": "the \"upstream\" failed"})
        );
    }
}
