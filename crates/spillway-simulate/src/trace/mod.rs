//! Trace readers: nginx/Apache combined (and common) log format, JSON lines
//! and CSV, plain or gzip, into [`Record`]s.
//!
//! ```no_run
//! use spillway_simulate::trace::{Record, TraceOptions, TraceReader};
//!
//! let mut reader = TraceReader::open("access.log.gz".as_ref(), &TraceOptions::default())?;
//! let mut rec = Record::default();
//! while reader.read(&mut rec)? {
//!     println!("{} {} {} {}", rec.ts_ns, rec.ip, rec.method, rec.path);
//! }
//! println!("{} malformed lines", reader.malformed());
//! # Ok::<(), spillway_simulate::trace::TraceError>(())
//! ```
//!
//! A line that is not a request is counted and skipped, never an error:
//! the first 100 are kept with their line numbers and why
//! ([`TraceReader::bad_lines`]). The decisions every format shares:
//!
//! - **UTF-8**: a line that is not UTF-8 is malformed, not repaired with
//!   U+FFFD, because a repaired user or IP could merge two clients into
//!   one key and falsify per-key counts. (Bytes a log writer escaped, such
//!   as nginx's `\xFF`, are decoded; a decoded value that is not UTF-8 is
//!   kept as logged, escapes and all, for the same reason.)
//! - **Duplicate names** (a JSON key twice, a combined `k=v` twice) make a
//!   line malformed: which value counts would be a guess, and the decision
//!   API refuses a field sent twice too. A CSV header naming a column twice
//!   is an error of the file.
//! - **Timestamps** must fall between 1970 and 2554 (the last second a
//!   `u64` of nanoseconds holds); offsets are applied, the result is UTC.
//! - **Lines over 1 MiB** (CSV records, counted across their lines) are
//!   read to their end without being kept, and are malformed; a first line
//!   that long still tells the format. Empty (or blank) lines are skipped
//!   and not counted.
//! - `-` as user or IP means none, and so does `-` or an empty value for a
//!   header read from a key of its own (`--field header:NAME=KEY`), as
//!   nginx logs an absent header; an IP's `:port` is cut; an absolute
//!   target (`GET http://host/x`, as load balancers log) becomes `/x` with
//!   a `host` header.
//! - **Numbers** in text fields (a JSON `"user": 42`) are read as written;
//!   `status` and `cost` must be whole numbers (`status` at most 999), as
//!   JSON numbers or numeric strings.

mod combined;
mod csv;
mod error;
mod fields;
mod json;
mod lines;
mod reader;
mod record;
mod time;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

pub use error::{TraceError, TraceErrorKind};
pub use fields::FieldNames;
pub use reader::TraceReader;
pub use record::Record;
pub use time::format_rfc3339;

use error::Bad;
use fields::{Fill, KeyMap, Role};

/// A trace format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// nginx/Apache combined log format (and the common log format).
    Combined,
    /// One JSON object per line.
    Json,
    /// CSV with a header line naming the columns (RFC 4180).
    Csv,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "combined" => Ok(Format::Combined),
            "json" | "jsonl" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            _ => Err(format!(
                "unknown trace format {s:?}: expected combined, json (or jsonl) or csv"
            )),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Combined => "combined",
            Format::Json => "json",
            Format::Csv => "csv",
        })
    }
}

/// The unit of a numeric timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsUnit {
    /// Seconds (`s`).
    Seconds,
    /// Milliseconds (`ms`).
    Millis,
    /// Microseconds (`us`).
    Micros,
    /// Nanoseconds (`ns`).
    Nanos,
}

impl FromStr for TsUnit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "s" => Ok(TsUnit::Seconds),
            "ms" => Ok(TsUnit::Millis),
            "us" => Ok(TsUnit::Micros),
            "ns" => Ok(TsUnit::Nanos),
            _ => Err(format!(
                "unknown timestamp unit {s:?}: expected s, ms, us or ns"
            )),
        }
    }
}

impl fmt::Display for TsUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TsUnit::Seconds => "s",
            TsUnit::Millis => "ms",
            TsUnit::Micros => "us",
            TsUnit::Nanos => "ns",
        })
    }
}

/// How to read a trace.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// The format; `None` detects it from the first non-empty line (`{`:
    /// JSON lines; `... [date] "...`: combined; else CSV).
    pub format: Option<Format>,
    /// JSON keys and CSV columns.
    pub fields: FieldNames,
    /// The unit of numeric timestamps; `None` decides by magnitude (below
    /// 1e11 seconds, 1e14 milliseconds, 1e17 microseconds, else ns).
    pub ts_unit: Option<TsUnit>,
}
