//! CSV (RFC 4180): a header line naming the columns, then one record per
//! line; fields may be quoted (`""` for a quote inside, line breaks
//! allowed inside quotes); CRLF or LF.
//!
//! Columns map to fields as JSON keys do ([`FieldNames`]); the others
//! become fields under their header names. A `headers` column holds a JSON
//! object of headers. Strict where RFC 4180 is: a quote inside an unquoted
//! field, text after a closing quote, a record with a different number of
//! columns than the header, and a quote still open at the end of the file
//! make the record malformed.

use super::record::{Record, push_lower};
use super::{Bad, FieldNames, Fill, KeyMap, Role, TsUnit, json};

/// One column's meaning.
#[derive(Debug, Clone, Default)]
struct Column {
    /// Bits of [`Role::bit`].
    roles: u16,
    /// Headers it is read as.
    headers: Vec<String>,
    /// Its name, when it is a plain field (unmapped, named).
    field: Option<String>,
}

/// The CSV parser, made from the header line.
#[derive(Debug)]
pub(super) struct Csv {
    columns: Vec<Column>,
    fill: Fill,
    spans: Vec<Span>,
    value: String,
    scratch: (String, String),
}

/// A field's contents in the record: start, end, and whether it has
/// doubled quotes to undo.
type Span = (usize, usize, bool);

/// Splits a record (its terminator removed) into its fields' spans.
pub(super) fn split(line: &str, spans: &mut Vec<Span>) -> Result<(), Bad> {
    spans.clear();
    let b = line.as_bytes();
    let mut i = 0;
    loop {
        if b.get(i) == Some(&b'"') {
            let start = i + 1;
            let mut j = start;
            let mut doubled = false;
            loop {
                match b.get(j) {
                    None => return Err(Bad::At("unterminated quoted field", i)),
                    Some(b'"') if b.get(j + 1) == Some(&b'"') => {
                        doubled = true;
                        j += 2;
                    }
                    Some(b'"') => break,
                    Some(_) => j += 1,
                }
            }
            spans.push((start, j, doubled));
            i = j + 1;
            match b.get(i) {
                None => return Ok(()),
                Some(b',') => i += 1,
                Some(_) => return Err(Bad::At("text after a closing quote", i)),
            }
        } else {
            let start = i;
            while let Some(&c) = b.get(i) {
                match c {
                    b',' => break,
                    b'"' => return Err(Bad::At("quote inside an unquoted field", i)),
                    b'\r' | b'\n' => return Err(Bad::At("line break outside quotes", i)),
                    _ => i += 1,
                }
            }
            spans.push((start, i, false));
            if i == b.len() {
                return Ok(());
            }
            i += 1;
        }
    }
}

/// A field's text: its span, with doubled quotes undone into `scratch`.
fn field<'a>(line: &'a str, span: Span, scratch: &'a mut String) -> &'a str {
    let (s, e, doubled) = span;
    let raw = &line[s..e];
    if !doubled {
        return raw;
    }
    scratch.clear();
    let mut rest = raw;
    while let Some(q) = rest.find("\"\"") {
        scratch.push_str(&rest[..=q]);
        rest = &rest[q + 2..];
    }
    scratch.push_str(rest);
    scratch
}

impl Csv {
    /// A parser for the columns of `header`.
    ///
    /// # Errors
    ///
    /// When the header is not CSV, names a column twice, or has no
    /// timestamp column.
    pub(super) fn new(
        header: &str,
        names: &FieldNames,
        unit: Option<TsUnit>,
    ) -> Result<Csv, String> {
        let mut spans = Vec::new();
        if header.contains('\0') {
            return Err("the CSV header has a NUL byte".into());
        }
        split(header, &mut spans).map_err(|bad| match bad {
            Bad::At(what, at) => format!("the CSV header: {what} at column {}", at + 1),
            _ => "the CSV header cannot be read".to_string(),
        })?;
        let mut scratch = String::new();
        let titles: Vec<String> = spans
            .iter()
            .map(|&sp| field(header, sp, &mut scratch).trim().to_string())
            .collect();
        for (i, t) in titles.iter().enumerate() {
            if !t.is_empty() && titles[..i].contains(t) {
                return Err(format!("the CSV header names column {t:?} twice"));
            }
        }
        if !titles.contains(&names.ts) {
            let shown: Vec<&str> = titles.iter().take(30).map(String::as_str).collect();
            return Err(format!(
                "the CSV header has no column {:?} (the timestamp; choose one with \
                 --field ts=COLUMN); its columns: {}",
                names.ts,
                shown.join(", ")
            ));
        }
        let keys = KeyMap::new(names);
        let columns = titles
            .into_iter()
            .map(|t| match keys.find(&t) {
                Some((_, e)) => Column {
                    roles: e.roles,
                    headers: e.headers.clone(),
                    field: None,
                },
                None => Column {
                    field: (!t.is_empty()).then_some(t),
                    ..Column::default()
                },
            })
            .collect();
        Ok(Csv {
            columns,
            fill: Fill::new(unit),
            spans,
            value: String::new(),
            scratch: Default::default(),
        })
    }

    /// A parser for a file with no header (it reads nothing).
    pub(super) fn empty(unit: Option<TsUnit>) -> Csv {
        Csv {
            columns: Vec::new(),
            fill: Fill::new(unit),
            spans: Vec::new(),
            value: String::new(),
            scratch: Default::default(),
        }
    }

    /// Reads one record into `rec`.
    pub(super) fn parse(&mut self, line: &str, rec: &mut Record) -> Result<(), Bad> {
        if let Some(i) = line.bytes().position(|c| c == 0) {
            return Err(Bad::At("NUL byte", i));
        }
        split(line, &mut self.spans)?;
        if self.spans.len() != self.columns.len() {
            return Err(Bad::Columns {
                expected: self.columns.len(),
                found: self.spans.len(),
            });
        }
        self.fill.start();
        for (col, &span) in self.columns.iter().zip(&self.spans) {
            let text = field(line, span, &mut self.value);
            if let Some(name) = &col.field {
                let (k, v) = rec.fields.push();
                k.push_str(name);
                v.push_str(text);
                continue;
            }
            for header in &col.headers {
                // `-` is how most logs write an absent header.
                if matches!(text, "" | "-") {
                    continue;
                }
                if rec.headers.contains(header, true) {
                    return Err(Bad::At("the same header twice", span.0));
                }
                let (k, v) = rec.headers.push();
                push_lower(k, header);
                v.push_str(text);
            }
            for role in Role::ALL {
                if col.roles & role.bit() == 0 {
                    continue;
                }
                if role == Role::Headers {
                    if !text.trim().is_empty() {
                        let (a, b) = &mut self.scratch;
                        json::headers_object(text, &mut rec.headers, a, b)
                            .map_err(|_| Bad::Role(role, "not a JSON object of headers"))?;
                    }
                    continue;
                }
                self.fill.text(rec, role, text)?;
            }
        }
        self.fill.end(rec)
    }
}
