//! `--log-format json`: one JSON object per line and event, with names
//! that do not change between releases (part of the binary: `main.rs`
//! declares this module).
//!
//! ```text
//! {"ts":"2025-11-24T22:28:01.123456Z","level":"info","target":"spillway_server","message":"listening on http://127.0.0.1:8080","addr":"127.0.0.1:8080"}
//! ```
//!
//! `ts` (RFC 3339, UTC, microseconds), `level` (`error`, `warn`, `info`,
//! `debug`, `trace`), `target` (the module that logged) and `message`
//! come first; the event's own fields follow, flat, under their own
//! names. A field that would take one of those four names is written as
//! `fields.NAME` instead. Numbers and booleans stay JSON numbers and
//! booleans; anything else is its text. Written by hand rather than with
//! tracing-subscriber's `json` feature, whose names (`timestamp`,
//! `fields`, upper-case levels) are not these.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let line = line(
            SystemTime::now(),
            meta.level(),
            meta.target(),
            &fields.message,
            &fields.rest,
        );
        writer.write_str(&line)
    }
}

/// One event's line, newline included.
fn line(
    now: SystemTime,
    level: &tracing::Level,
    target: &str,
    message: &str,
    rest: &[(String, serde_json::Value)],
) -> String {
    let mut out = String::with_capacity(160 + message.len());
    out.push_str("{\"ts\":\"");
    timestamp(&mut out, now);
    out.push_str("\",\"level\":\"");
    out.push_str(match *level {
        tracing::Level::ERROR => "error",
        tracing::Level::WARN => "warn",
        tracing::Level::INFO => "info",
        tracing::Level::DEBUG => "debug",
        tracing::Level::TRACE => "trace",
    });
    out.push_str("\",\"target\":");
    string(&mut out, target);
    out.push_str(",\"message\":");
    string(&mut out, message);
    for (name, value) in rest {
        out.push(',');
        if matches!(name.as_str(), "ts" | "level" | "target") {
            string(&mut out, &format!("fields.{name}"));
        } else {
            string(&mut out, name);
        }
        out.push(':');
        out.push_str(&value.to_string());
    }
    out.push_str("}\n");
    out
}

/// `s` as a JSON string.
fn string(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

/// An event's message and its other fields, in order.
#[derive(Debug, Default)]
struct Fields {
    message: String,
    rest: Vec<(String, serde_json::Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        if field.name() == "message" {
            self.message = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.rest.push((field.name().to_string(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%x` fields come here too, their Debug being their Display.
        self.put(field, format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // NaN and the infinities are no JSON numbers: their text, then.
        let v = serde_json::Number::from_f64(value)
            .map_or_else(|| value.to_string().into(), serde_json::Value::Number);
        self.put(field, v);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }
}

/// `t` as RFC 3339 in UTC with microseconds: `2025-11-24T22:28:01.123456Z`.
fn timestamp(out: &mut String, t: SystemTime) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) =
        spillway_core::date::civil_from_days(i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2));
    let s = secs % 86_400;
    let _ = write!(
        out,
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_micros()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64, micros: u32) -> String {
        let mut s = String::new();
        timestamp(
            &mut s,
            UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(u64::from(micros)),
        );
        s
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_microseconds() {
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(at(1_700_000_000, 123_456), "2023-11-14T22:13:20.123456Z");
        assert_eq!(at(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
        assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z");
    }

    #[test]
    fn a_line_is_one_object_with_fixed_names_first() {
        let rest = vec![
            ("addr".to_string(), serde_json::json!("127.0.0.1:1")),
            ("n".to_string(), serde_json::json!(3)),
            ("level".to_string(), serde_json::json!("mine")),
        ];
        let l = line(
            UNIX_EPOCH,
            &tracing::Level::WARN,
            "spillway_server::reload",
            "a \"quoted\"\nmessage",
            &rest,
        );
        assert!(l.ends_with("}\n") && l.matches('\n').count() == 1, "{l}");
        assert!(
            l.starts_with(r#"{"ts":"1970-01-01T00:00:00.000000Z","level":"warn","target":"spillway_server::reload","message":"a \"quoted\"\nmessage","#),
            "{l}"
        );
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["addr"], "127.0.0.1:1");
        assert_eq!(v["n"], 3);
        assert_eq!(v["level"], "warn");
        assert_eq!(v["fields.level"], "mine");
    }
}
