//! The reader: bytes in (plain or gzip), physical lines assembled into
//! records (a CSV record may span lines), records out.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;

use super::lines::{Got, Lines, MAX_LINE};
use super::{
    Bad, FieldNames, Format, Record, TraceError, TraceErrorKind, TraceOptions, combined, csv, json,
};
use crate::summary::BadLine;

/// How many malformed lines are kept with their reasons.
const KEPT_BAD_LINES: usize = 100;

/// One parser per format.
#[derive(Debug)]
enum Parser {
    Combined(combined::Combined),
    Json(json::Json),
    Csv(csv::Csv),
}

/// Reads one trace file, or standard input for `-`: gzip is recognised by
/// its first bytes, the format (unless given) by the first non-empty line.
pub struct TraceReader {
    name: String,
    lines: Lines,
    format: Format,
    parser: Parser,
    names: FieldNames,
    /// The current record's bytes (a CSV record may span lines).
    buf: Vec<u8>,
    /// The first record, read to detect the format, not yet returned:
    /// its line number and whether it was too long.
    pending: Option<(u64, bool)>,
    malformed: u64,
    bad_lines: Vec<BadLine>,
    total: Option<u64>,
    done: bool,
}

impl fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceReader")
            .field("name", &self.name)
            .field("format", &self.format)
            .field("line", &self.lines.line)
            .field("gzip", &self.lines.gzip)
            .field("malformed", &self.malformed)
            .finish_non_exhaustive()
    }
}

/// A record assembled in `buf`: its first line, and whether it was over
/// [`MAX_LINE`].
type Assembled = Option<(u64, bool)>;

impl TraceReader {
    /// Opens a trace file (`-`: standard input).
    ///
    /// # Errors
    ///
    /// When the file cannot be opened or its first line read (I/O error,
    /// corrupt gzip), or a CSV header has no timestamp column.
    pub fn open(path: &Path, opts: &TraceOptions) -> Result<TraceReader, TraceError> {
        if path.as_os_str() == "-" {
            return Self::from_reader("stdin", Box::new(io::stdin()), opts);
        }
        let name = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| TraceError {
            file: name.clone(),
            line: 0,
            kind: TraceErrorKind::Open,
            what: format!("cannot open: {e}"),
        })?;
        let total = file
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        let mut reader = Self::from_reader(&name, Box::new(file), opts)?;
        reader.total = total;
        Ok(reader)
    }

    /// Reads a trace from any byte stream; `name` is used in messages.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), without the opening.
    pub fn from_reader(
        name: &str,
        input: Box<dyn Read + Send>,
        opts: &TraceOptions,
    ) -> Result<TraceReader, TraceError> {
        let lines = Lines::new(input).map_err(|e| TraceError {
            file: name.to_string(),
            line: 1,
            kind: TraceErrorKind::Io,
            what: e.to_string(),
        })?;
        let mut reader = TraceReader {
            name: name.to_string(),
            lines,
            format: opts.format.unwrap_or(Format::Json),
            parser: Parser::Combined(combined::Combined::default()),
            names: opts.fields.clone(),
            buf: Vec::with_capacity(1024),
            pending: None,
            malformed: 0,
            bad_lines: Vec::new(),
            total: None,
            done: false,
        };
        // The first non-empty line, without its byte order mark.
        let mut first = None;
        while let Some((line, too_long)) = reader.physical()? {
            if line == 1 && reader.buf.starts_with(b"\xEF\xBB\xBF") {
                reader.buf.drain(..3);
            }
            if too_long || !is_blank(&reader.buf) {
                first = Some((line, too_long));
                break;
            }
        }
        let Some((line, too_long)) = first else {
            reader.done = true;
            reader.parser = reader.new_parser(opts, None)?;
            return Ok(reader);
        };
        reader.format = opts.format.unwrap_or_else(|| detect(&reader.buf));
        if reader.format == Format::Csv {
            let too_long = too_long || reader.more_csv()?;
            if too_long {
                return Err(reader.header_error(line, "the CSV header is longer than 1 MiB"));
            }
            trim_end(&mut reader.buf);
            let header = std::str::from_utf8(&reader.buf)
                .map_err(|_| reader.header_error(line, "the CSV header is not UTF-8"))?
                .to_string();
            reader.parser = reader.new_parser(opts, Some((line, &header)))?;
        } else {
            reader.parser = reader.new_parser(opts, None)?;
            reader.pending = Some((line, too_long));
        }
        Ok(reader)
    }

    fn new_parser(
        &self,
        opts: &TraceOptions,
        header: Option<(u64, &str)>,
    ) -> Result<Parser, TraceError> {
        Ok(match self.format {
            Format::Combined => Parser::Combined(combined::Combined::default()),
            Format::Json => Parser::Json(json::Json::new(&opts.fields, opts.ts_unit)),
            Format::Csv => {
                let (line, text) = header.unwrap_or((1, ""));
                let csv = match header {
                    Some(_) => csv::Csv::new(text, &opts.fields, opts.ts_unit),
                    None => Ok(csv::Csv::empty(opts.ts_unit)),
                };
                Parser::Csv(csv.map_err(|e| self.header_error(line, &e))?)
            }
        })
    }

    fn header_error(&self, line: u64, what: &str) -> TraceError {
        TraceError {
            file: self.name.clone(),
            line,
            kind: TraceErrorKind::Header,
            what: what.to_string(),
        }
    }

    fn io_error(&self, e: &io::Error) -> TraceError {
        let gzip = self.lines.gzip
            && matches!(
                e.kind(),
                io::ErrorKind::InvalidData
                    | io::ErrorKind::InvalidInput
                    | io::ErrorKind::UnexpectedEof
            );
        TraceError {
            file: self.name.clone(),
            line: self.lines.line + 1,
            kind: if gzip {
                TraceErrorKind::Gzip
            } else {
                TraceErrorKind::Io
            },
            what: if gzip {
                format!("corrupt or truncated gzip: {e}")
            } else {
                e.to_string()
            },
        }
    }

    /// Reads the next physical line into a cleared `buf`.
    fn physical(&mut self) -> Result<Assembled, TraceError> {
        self.buf.clear();
        match self.lines.next(&mut self.buf, MAX_LINE) {
            Ok(Got::Eof) => Ok(None),
            Ok(got) => Ok(Some((self.lines.line, got == Got::TooLong))),
            Err(e) => Err(self.io_error(&e)),
        }
    }

    /// Appends lines to a CSV record in `buf` while a quoted field is
    /// open (an odd number of quotes so far); true if it went over 1 MiB.
    /// A quote still open at the end of the file leaves the record as it
    /// is, for the parser to refuse.
    fn more_csv(&mut self) -> Result<bool, TraceError> {
        let mut quotes = count_quotes(&self.buf);
        while quotes % 2 == 1 {
            let from = self.buf.len();
            let budget = MAX_LINE.saturating_sub(from);
            match self.lines.next(&mut self.buf, budget) {
                Ok(Got::Eof) => break,
                Ok(Got::TooLong) => return Ok(true),
                Ok(Got::Line) => quotes += count_quotes(&self.buf[from..]),
                Err(e) => return Err(self.io_error(&e)),
            }
        }
        Ok(false)
    }

    /// Fills `rec` with the next well-formed request: `Ok(true)`, or
    /// `Ok(false)` at the end. Malformed lines are skipped and counted.
    ///
    /// # Errors
    ///
    /// Only when the input fails (I/O error, corrupt or truncated gzip),
    /// saying the file and the line reached; the reader then ends.
    pub fn read(&mut self, rec: &mut Record) -> Result<bool, TraceError> {
        loop {
            let (line, too_long) = match self.pending.take() {
                Some(p) => p,
                None => {
                    if self.done {
                        return Ok(false);
                    }
                    let next = self.physical().and_then(|a| match a {
                        Some((l, false)) if self.format == Format::Csv => {
                            Ok(Some((l, self.more_csv()?)))
                        }
                        a => Ok(a),
                    });
                    match next {
                        Ok(Some(a)) => a,
                        Ok(None) => {
                            self.done = true;
                            return Ok(false);
                        }
                        Err(e) => {
                            self.done = true;
                            return Err(e);
                        }
                    }
                }
            };
            if too_long {
                self.bad(line, Bad::TooLong);
                continue;
            }
            trim_end(&mut self.buf);
            if is_blank(&self.buf) {
                continue;
            }
            rec.clear();
            let parsed = match std::str::from_utf8(&self.buf) {
                Err(e) => Err(Bad::Utf8(e.valid_up_to())),
                Ok(text) => match &mut self.parser {
                    Parser::Combined(p) => p.parse(text, rec),
                    Parser::Json(p) => p.parse(text, rec),
                    Parser::Csv(p) => p.parse(text, rec),
                },
            };
            match parsed {
                Ok(()) => {
                    rec.line = line;
                    return Ok(true);
                }
                Err(bad) => self.bad(line, bad),
            }
        }
    }

    fn bad(&mut self, line: u64, bad: Bad) {
        self.malformed += 1;
        if self.bad_lines.len() < KEPT_BAD_LINES {
            let reason = bad.describe(&self.buf, &self.names);
            self.bad_lines.push(BadLine {
                file: self.name.clone(),
                line,
                reason,
            });
        }
    }

    /// The format being read (given or detected; JSON for an empty input
    /// when none was given).
    pub fn format(&self) -> Format {
        self.format
    }

    /// Lines skipped as malformed so far.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// The first 100 malformed lines, with their line numbers and why.
    pub fn bad_lines(&self) -> &[BadLine] {
        &self.bad_lines
    }

    /// Bytes of the file read so far (compressed bytes for gzip), for a
    /// progress bar against [`total_bytes`](Self::total_bytes).
    pub fn bytes_read(&self) -> u64 {
        self.lines.bytes_read()
    }

    /// The file's size, when known (not for standard input or a pipe).
    pub fn total_bytes(&self) -> Option<u64> {
        self.total
    }

    /// Physical lines read so far.
    pub fn lines_read(&self) -> u64 {
        self.lines.line
    }
}

/// Guesses the format from the first non-empty line.
fn detect(line: &[u8]) -> Format {
    let t = line.trim_ascii_start();
    if t.first() == Some(&b'{') {
        return Format::Json;
    }
    // `... [date] "request" ...`
    if let Some(open) = t.iter().position(|&c| c == b'[')
        && t[open..].windows(3).any(|w| w == b"] \"")
    {
        return Format::Combined;
    }
    Format::Csv
}

/// Removes the line terminator (`\n` or `\r\n`).
fn trim_end(buf: &mut Vec<u8>) {
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
}

fn is_blank(buf: &[u8]) -> bool {
    buf.iter()
        .all(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
}

fn count_quotes(b: &[u8]) -> usize {
    b.iter().filter(|&&c| c == b'"').count()
}
