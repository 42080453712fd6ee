//! Tests of the trace readers: real sample lines, property tests,
//! differential tests against strict reference parsers, and the hostile
//! corpus under `tests/corpus/traces/`.

mod corpus;
mod props;
mod reference;
mod samples;

use std::io;
use std::path::Path;

use super::*;
use crate::summary::BadLine;

/// Everything a reader produced.
#[derive(Debug)]
pub(super) struct Out {
    pub recs: Vec<Record>,
    pub malformed: u64,
    pub bad: Vec<BadLine>,
    pub format: Format,
}

/// Reads all of `bytes`.
pub(super) fn read_all(bytes: &[u8], opts: &TraceOptions) -> Result<Out, TraceError> {
    let mut r = TraceReader::from_reader("test", Box::new(io::Cursor::new(bytes.to_vec())), opts)?;
    let mut recs = Vec::new();
    let mut rec = Record::default();
    while r.read(&mut rec)? {
        recs.push(rec.clone());
    }
    Ok(Out {
        recs,
        malformed: r.malformed(),
        bad: r.bad_lines().to_vec(),
        format: r.format(),
    })
}

/// Options with `--field` values applied.
pub(super) fn opts(format: Option<Format>, fields: &[&str]) -> TraceOptions {
    let mut o = TraceOptions {
        format,
        ..TraceOptions::default()
    };
    for f in fields {
        o.fields.set(f).unwrap();
    }
    o
}

/// Reads `text`, format detected, default fields.
pub(super) fn read_str(text: &str) -> Out {
    read_all(text.as_bytes(), &TraceOptions::default()).unwrap()
}

/// One record's fields as pairs.
pub(super) fn fields(r: &Record) -> Vec<(String, String)> {
    r.fields()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One record's headers as pairs.
pub(super) fn headers(r: &Record) -> Vec<(String, String)> {
    r.headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Seconds since the epoch as ns.
pub(super) const fn s(secs: u64) -> u64 {
    secs * 1_000_000_000
}
