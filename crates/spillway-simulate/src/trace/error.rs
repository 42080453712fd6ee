//! What goes wrong with a trace as a whole, and why a line is malformed.

use std::fmt;

use super::lines::MAX_LINE;
use super::{FieldNames, Role};

/// What went wrong with a trace file as a whole (a malformed line is not
/// one: it is counted and skipped).
#[derive(Debug)]
pub struct TraceError {
    pub(super) file: String,
    pub(super) line: u64,
    pub(super) kind: TraceErrorKind,
    pub(super) what: String,
}

/// The kind of a [`TraceError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The file could not be opened.
    Open,
    /// Reading failed.
    Io,
    /// The gzip stream is corrupt or truncated.
    Gzip,
    /// A CSV header the records cannot be read by (no timestamp column, a
    /// column named twice, not CSV).
    Header,
}

impl TraceError {
    /// The file (`stdin` for standard input).
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The line reached (0: before the first).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// What kind of failure.
    pub fn kind(&self) -> TraceErrorKind {
        self.kind
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.what)
        } else {
            write!(f, "{}: line {}: {}", self.file, self.line, self.what)
        }
    }
}

impl std::error::Error for TraceError {}

/// Why a line is not a request; put in words only for the lines kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bad {
    /// A problem at a byte offset of the line.
    At(&'static str, usize),
    /// A field's value that cannot be read as that field.
    Role(Role, &'static str),
    /// A CSV record with the wrong number of columns.
    Columns { expected: usize, found: usize },
    /// No timestamp.
    NoTs,
    /// Over [`MAX_LINE`].
    TooLong,
    /// Not UTF-8 from this byte on.
    Utf8(usize),
}

impl Bad {
    pub(super) fn describe(self, line: &[u8], names: &FieldNames) -> String {
        match self {
            Bad::At(what, at) => {
                let at = at.min(line.len());
                let end = (at + 40).min(line.len());
                let near = String::from_utf8_lossy(&line[at..end]);
                if near.is_empty() {
                    format!("{what} (at column {}, the end of the line)", at + 1)
                } else {
                    format!("{what} (at column {}: `{}`)", at + 1, near.escape_debug())
                }
            }
            Bad::Role(role, what) => {
                let key = names.get(role);
                if key == role.name() {
                    format!("{}: {what}", role.name())
                } else {
                    format!("{} (`{key}`): {what}", role.name())
                }
            }
            Bad::Columns { expected, found } => {
                format!("{found} columns where the header has {expected}")
            }
            Bad::NoTs => format!("no timestamp (`{}`)", names.ts),
            Bad::TooLong => format!("longer than {} MiB", MAX_LINE >> 20),
            Bad::Utf8(at) => format!("not UTF-8 (at byte {})", at + 1),
        }
    }
}
