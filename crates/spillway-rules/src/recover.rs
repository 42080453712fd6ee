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

use serde_saphyr::granit_parser::{Event, Parser, StructureStyle};

use crate::error::{Error, Errors, first_line};

/// A whole file's raw struct, as read section by section: each section a
/// piece has is taken, and the rules of every piece appended.
pub trait Sections: Default + serde::de::DeserializeOwned {
    /// Takes every section `part` has and `self` lacks; rules are
    /// appended.
    fn merge(&mut self, part: Self);
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
    match serde_saphyr::from_str::<T>(text) {
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
    serde_saphyr::from_str(piece).map_err(|e| located(file, &e))
}

/// serde-saphyr's error as ours: its first line, at its location.
pub fn located(file: &str, e: &serde_saphyr::Error) -> Error {
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    Error {
        file: file.to_string(),
        line,
        column,
        message: first_line(&e.to_string()),
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

/// The largest file read: larger is an error, not a parse.
pub const MAX_FILE_LEN: usize = 16 << 20;

/// An error if `text` is larger than [`MAX_FILE_LEN`].
///
/// # Errors
/// The file is too large.
pub fn check_size(file: &str, text: &str) -> Result<(), Errors> {
    if text.len() > MAX_FILE_LEN {
        return Err(Errors(vec![Error {
            file: file.to_string(),
            line: 0,
            column: 0,
            message: "file larger than 16 MiB".to_string(),
        }]));
    }
    Ok(())
}

/// The file's name as errors show it, and its text.
///
/// # Errors
/// The file cannot be read (or is not UTF-8).
pub fn read_file(path: &std::path::Path) -> Result<(String, String), Errors> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((name, text)),
        Err(e) => Err(Errors(vec![Error {
            file: name,
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        }])),
    }
}
