//! Every structural error of a file, not just the first.
//!
//! serde stops at the first unknown field or wrong type. When it does,
//! the file is read again piece by piece: each top-level section alone,
//! and the items of a block `rules:` list in halves down to single items,
//! each piece at its own lines (the lines before it left blank), so every
//! error keeps its `line:column`. The pieces that parse are merged and
//! validated as usual, so a typo in rule 1 and a bad limit in rule 3 are
//! both reported.
//!
//! Only a plain file is split: a block mapping at the top, one document,
//! no aliases (an alias may point into another piece). Anything else
//! reports serde's one error, as before.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_saphyr::granit_parser::{Event, Parser, StructureStyle};

use crate::error::{Error, Errors, first_line};

/// A whole file's raw struct, as read section by section: each section a
/// piece has is taken, and the rules of every piece appended.
pub trait Sections: Default + serde::de::DeserializeOwned {
    /// Takes every section `part` has and `self` lacks; rules are
    /// appended.
    fn merge(&mut self, part: Self);

    /// The file's rules, to be read a chunk at a time (the raw struct was
    /// read from the rest of the file, its `rules:` empty): kept for
    /// validation, which builds them with [`build::rules_in`](crate::build::rules_in).
    fn set_rule_chunks(&mut self, chunks: crate::chunks::Chunks);
}

/// `text` (named `file` in errors) read into `T` and handed to
/// `validate`; when serde stops at a structural error, the file is read
/// again piece by piece ([`recover`]), what parsed is validated (with
/// `any_descriptor` set if `descriptors:` was broken) and every error is
/// returned in file order.
///
/// # Errors
/// Every structural error, and every error `validate` returns.
pub fn read<T: Sections, V>(
    file: &str,
    text: &str,
    validate: impl FnOnce(&str, T, bool) -> Result<V, Errors>,
) -> Result<V, Errors> {
    match from_str::<T>(text) {
        Ok(raw) => validate(file, raw, false),
        // serde stopped at the first structural error: read the file again
        // piece by piece for the others, and validate what parsed.
        Err(e) => {
            let first = located(file, &e);
            let Some(found) = recover::<T>(file, text).filter(|r| !r.errors.is_empty()) else {
                return Err(Errors(vec![first]));
            };
            let mut list = found.errors;
            if let Err(more) = validate(file, found.raw, found.descriptors_broken) {
                list.extend(more.0);
            }
            list.sort_by_key(|e| (e.line, e.column));
            list.dedup();
            Err(Errors(list))
        }
    }
}

/// Stop looking after this many errors: enough to fix a file by.
const MAX_ERRORS: usize = 100;

/// What reading a file piece by piece found.
#[derive(Debug)]
pub struct Recovered<T> {
    /// The sections and rules that parsed, merged.
    pub raw: T,
    /// Every structural error, in file order.
    pub errors: Vec<Error>,
    /// The `descriptors:` section is among the broken ones (so `by:` names
    /// cannot be checked against it).
    pub descriptors_broken: bool,
}

/// `text` read piece by piece; `None` when it cannot be split (see the
/// module's documentation).
pub fn recover<T: Sections>(file: &str, text: &str) -> Option<Recovered<T>> {
    let layout = Layout::of(text)?;
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out = Recovered {
        raw: T::default(),
        errors: Vec::new(),
        descriptors_broken: false,
    };
    for (i, s) in layout.sections.iter().enumerate() {
        let end = layout
            .sections
            .get(i + 1)
            .map_or(lines.len() + 1, |n| n.line);
        if let Some(first) = layout.sections[..i].iter().find(|p| p.key == s.key) {
            out.errors.push(Error {
                file: file.to_string(),
                line: s.line as u64,
                column: s.column as u64 + 1,
                message: format!("duplicate key `{}` (first at line {})", s.key, first.line),
            });
            continue;
        }
        match &s.items {
            Some(items) if !items.is_empty() => {
                let mut pieces = Pieces {
                    file,
                    lines: &lines,
                    items,
                    end,
                    out: &mut out,
                };
                pieces.items(0, items.len());
            }
            _ => {
                let piece = piece(&lines, None, s.line, end);
                match parse(file, &piece) {
                    Ok(part) => out.raw.merge(part),
                    Err(e) => {
                        out.descriptors_broken |= s.key == "descriptors";
                        out.errors.push(e);
                    }
                }
            }
        }
        if out.errors.len() >= MAX_ERRORS {
            break;
        }
    }
    Some(out)
}

/// Rules items parsed in halves until each error is down to one item.
struct Pieces<'a, T> {
    file: &'a str,
    lines: &'a [&'a str],
    /// The first line of each item.
    items: &'a [usize],
    /// The line after the last item.
    end: usize,
    out: &'a mut Recovered<T>,
}

impl<T: Sections> Pieces<'_, T> {
    /// Items `from..to`: merged if they parse together, else each half.
    fn items(&mut self, from: usize, to: usize) {
        if self.out.errors.len() >= MAX_ERRORS {
            return;
        }
        let start = self.items[from];
        let end = self.items.get(to).copied().unwrap_or(self.end);
        match parse(self.file, &piece(self.lines, Some("rules:"), start, end)) {
            Ok(part) => self.out.raw.merge(part),
            Err(e) if to - from == 1 => self.out.errors.push(e),
            Err(_) => {
                let mid = from + (to - from) / 2;
                self.items(from, mid);
                self.items(mid, to);
            }
        }
    }
}

/// Lines `start..end` (1-based) of the file at their own line numbers:
/// the lines before left blank, but for `head` on the first of them.
fn piece(lines: &[&str], head: Option<&str>, start: usize, end: usize) -> String {
    let body = &lines[(start - 1).min(lines.len())..(end - 1).min(lines.len())];
    let mut text = String::with_capacity(start + body.iter().map(|l| l.len() + 1).sum::<usize>());
    for i in 1..start {
        if i == 1
            && let Some(h) = head
        {
            text.push_str(h);
        }
        text.push('\n');
    }
    for l in body {
        text.push_str(l);
        text.push('\n');
    }
    text
}

fn parse<T: Sections>(file: &str, piece: &str) -> Result<T, Error> {
    from_str(piece).map_err(|e| located(file, &e))
}

/// serde-saphyr's error as ours: its first line, at its location.
pub fn located(file: &str, e: &serde_saphyr::Error) -> Error {
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    // The breach itself, under the snippet and alias wrappers.
    let mut inner = e;
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = inner
    {
        inner = error;
    }
    let message = match inner {
        serde_saphyr::Error::Budget { breach, .. } => budget_message(breach),
        _ => None,
    };
    Error {
        file: file.to_string(),
        line,
        column,
        message: crate::error::bounded(message.unwrap_or_else(|| first_line(&e.to_string()))),
    }
}

/// Where the top-level sections and the `rules:` items start.
#[derive(Debug)]
struct Layout {
    sections: Vec<Section>,
}

/// The top-level keys of `text` with their 1-based line and column, when
/// it is a plain block mapping (else `None`).
pub(crate) fn top_level_keys(text: &str) -> Option<Vec<(String, usize, usize)>> {
    Layout::of(text).map(|l| {
        l.sections
            .into_iter()
            .map(|s| (s.key, s.line, s.column + 1))
            .collect()
    })
}

#[derive(Debug)]
struct Section {
    key: String,
    /// 1-based line of the key.
    line: usize,
    /// 0-based column of the key.
    column: usize,
    /// For a block `rules:` list, the line each item starts on (its `-`).
    items: Option<Vec<usize>>,
}

impl Layout {
    fn of(text: &str) -> Option<Layout> {
        let lines: Vec<&str> = text.split('\n').collect();
        let mut events = Events(Parser::new_from_str(text));
        matches!(events.next()?.0, Event::StreamStart).then_some(())?;
        matches!(events.next()?.0, Event::DocumentStart(..)).then_some(())?;
        matches!(
            events.next()?.0,
            Event::MappingStart(StructureStyle::Block, ..)
        )
        .then_some(())?;
        let mut sections = Vec::new();
        loop {
            let (key, at) = events.next()?;
            let key = match key {
                Event::MappingEnd => break,
                Event::Scalar(k, ..) => k.into_owned(),
                _ => return None,
            };
            let (value, _) = events.next()?;
            let items = if key == "rules"
                && matches!(value, Event::SequenceStart(StructureStyle::Block, ..))
            {
                let mut items = Vec::new();
                loop {
                    let (item, at) = events.next()?;
                    if matches!(item, Event::SequenceEnd) {
                        break;
                    }
                    items.push(dash_line(&lines, at.start.line(), at.start.col())?);
                    events.skip(&item)?;
                }
                Some(items)
            } else {
                events.skip(&value)?;
                None
            };
            sections.push(Section {
                key,
                line: at.start.line(),
                column: at.start.col(),
                items,
            });
        }
        matches!(events.next()?.0, Event::DocumentEnd).then_some(())?;
        matches!(events.next()?.0, Event::StreamEnd).then_some(())?;
        Some(Layout { sections })
    }
}

/// The line of the `-` that starts a block list item whose content is at
/// `line`, `column` (the same line, or the one before for a `-` alone).
fn dash_line(lines: &[&str], line: usize, column: usize) -> Option<usize> {
    let text = lines.get(line.checked_sub(1)?)?;
    let before: String = text.chars().take(column).collect();
    if before.trim_end().ends_with('-') || before.trim().starts_with('-') {
        return Some(line);
    }
    let prev = lines.get(line.checked_sub(2)?)?;
    (prev.split('#').next()?.trim() == "-").then(|| line - 1)
}

/// The parser's events, `None` on an error.
struct Events<'a>(Parser<'a, serde_saphyr::granit_parser::StrInput<'a>>);

impl<'a> Events<'a> {
    fn next(&mut self) -> Option<(Event<'a>, serde_saphyr::granit_parser::Span)> {
        loop {
            match self.0.next_event()? {
                Ok((Event::Alias(_) | Event::UnresolvedAlias(_), _)) | Err(_) => return None,
                Ok(
                    e @ (
                        Event::StreamStart
                        | Event::StreamEnd
                        | Event::DocumentStart(..)
                        | Event::DocumentEnd
                        | Event::Scalar(..)
                        | Event::SequenceStart(..)
                        | Event::SequenceEnd
                        | Event::MappingStart(..)
                        | Event::MappingEnd,
                        _,
                    ),
                ) => return Some(e),
                // Presentation only (anchors' names, comments).
                Ok(_) => continue,
            }
        }
    }

    /// Skips the rest of the node that `first` starts.
    fn skip(&mut self, first: &Event<'_>) -> Option<()> {
        let mut depth = match first {
            Event::MappingStart(..) | Event::SequenceStart(..) => 1usize,
            Event::Scalar(..) => 0,
            _ => return None,
        };
        while depth > 0 {
            match self.next()?.0 {
                Event::MappingStart(..) | Event::SequenceStart(..) => depth += 1,
                Event::MappingEnd | Event::SequenceEnd => depth -= 1,
                _ => {}
            }
        }
        Some(())
    }
}

/// The largest file read by default (`--max-file-bytes`): 1 GiB, room
/// for several million rules (a rule is ~135 bytes of YAML).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

/// The largest file read: larger is an error, not a parse. One setting
/// for the process, set once from `--max-file-bytes` before any file is
/// read (every reader of rules files, the server's and the offline
/// tools', goes through [`check_size`] and [`read_file`]).
static MAX_FILE_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_MAX_FILE_BYTES);

/// Sets the largest rules file read (`--max-file-bytes`); 0 is read as
/// the default.
pub fn set_max_file_bytes(bytes: u64) {
    let bytes = if bytes == 0 {
        DEFAULT_MAX_FILE_BYTES
    } else {
        bytes
    };
    MAX_FILE_BYTES.store(bytes, Ordering::Relaxed);
}

/// The largest rules file read (see [`set_max_file_bytes`]).
pub fn max_file_bytes() -> u64 {
    MAX_FILE_BYTES.load(Ordering::Relaxed)
}

/// The deepest nesting of mappings and lists read: a rules file needs
/// about 8; deeper is a hostile file (it would cost stack and time).
pub const MAX_DEPTH: usize = 64;

/// The YAML reader's options for a rules file of any size.
///
/// The reader's default budget caps a document at 250,000 nodes (about
/// 14,000 rules); spillway reads files of millions of rules, so what
/// bounds the work is the file's size (`--max-file-bytes`: a node costs
/// at least a byte of text): node, event and scalar-byte counts are
/// bounded by it, not by a count of their own. What a small file could
/// still blow up stays bounded as before: aliases and their expansion
/// (an alias bomb), anchors, nesting depth, documents.
pub fn yaml_options() -> serde_saphyr::Options {
    let max = usize::try_from(max_file_bytes()).unwrap_or(usize::MAX);
    let mut budget = serde_saphyr::Budget::default();
    budget.max_reader_input_bytes = Some(max);
    // Every node and event is at least one byte of the file, so the file
    // size bounds them; an alias's expansion is bounded apart (below).
    budget.max_nodes = usize::MAX;
    budget.max_events = usize::MAX;
    budget.max_total_scalar_bytes = max;
    budget.max_depth = MAX_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// `text` read into `T` with [`yaml_options`].
///
/// # Errors
/// serde-saphyr's error (see [`located`] for ours).
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, yaml_options())
}

/// Which protection a budget breach hit, in words a user can act on.
#[allow(clippy::unnecessary_wraps)]
fn budget_message(breach: &serde_saphyr::budget::BudgetBreach) -> Option<String> {
    use serde_saphyr::budget::BudgetBreach as B;
    let fixed = "a protection against hostile YAML, fixed: a rules file needs far less";
    Some(match breach {
        B::Depth { depth } => {
            format!("YAML nested too deep: {depth} levels, the limit is {MAX_DEPTH} ({fixed})")
        }
        B::Aliases { aliases } => format!(
            "too many YAML aliases (`*name`): {aliases}, the limit is 50000 ({fixed}; write the values out)"
        ),
        B::Anchors { anchors } => {
            format!("too many YAML anchors (`&name`): {anchors}, the limit is 50000 ({fixed})")
        }
        B::AliasAnchorRatio { aliases, anchors } => format!(
            "YAML aliases expand too much: {aliases} aliases of {anchors} anchors (an alias bomb?; {fixed}; write the values out)"
        ),
        B::RecordedAnchorEvents { .. } | B::RecordedAnchorBytes { .. } => format!(
            "YAML aliases expand too much (an alias bomb?): past 1,000,000 values replayed ({fixed}; write the values out)"
        ),
        B::Documents { documents } => {
            format!("too many YAML documents: {documents}, the limit is 1024 ({fixed})")
        }
        B::ScalarBytes { total_scalar_bytes } => format!(
            "the values add up to {total_scalar_bytes} bytes, more than --max-file-bytes ({}); raise it with --max-file-bytes",
            max_file_bytes()
        ),
        other => format!("YAML too costly to read: {other:?} ({fixed})"),
    })
}

/// The error when a file is larger than [`max_file_bytes`].
fn too_large(file: &str, len: u64) -> Errors {
    Errors(vec![Error {
        file: file.to_string(),
        line: 0,
        column: 0,
        message: format!(
            "file of {len} bytes is larger than the limit of {} bytes; raise it with --max-file-bytes",
            max_file_bytes()
        ),
    }])
}

/// An error if `text` is larger than [`max_file_bytes`].
///
/// # Errors
/// The file is too large.
pub fn check_size(file: &str, text: &str) -> Result<(), Errors> {
    if text.len() as u64 > max_file_bytes() {
        return Err(too_large(file, text.len() as u64));
    }
    Ok(())
}

/// The file's name as errors show it, and its text.
///
/// # Errors
/// The file cannot be read (or is not UTF-8).
pub fn read_file(path: &std::path::Path) -> Result<(String, String), Errors> {
    use std::io::Read;
    let name = path.display().to_string();
    let cannot = |e: std::io::Error| {
        Errors(vec![Error {
            file: name.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        }])
    };
    // Read at most one byte past the limit: a huge file (or an endless
    // pipe) is refused without being held in memory.
    let limit = max_file_bytes();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(&name, bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        cannot(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })?;
    Ok((name, text))
}
