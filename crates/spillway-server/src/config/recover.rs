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

use super::errors::{ConfigError, first_line};
use super::raw::RawConfig;

/// Stop looking after this many errors: enough to fix a file by.
const MAX_ERRORS: usize = 100;

/// What reading a file piece by piece found.
#[derive(Debug)]
pub(super) struct Recovered {
    /// The sections and rules that parsed, merged.
    pub(super) raw: RawConfig,
    /// Every structural error, in file order.
    pub(super) errors: Vec<ConfigError>,
    /// The `descriptors:` section is among the broken ones (so `by:` names
    /// cannot be checked against it).
    pub(super) descriptors_broken: bool,
}

/// `text` read piece by piece; `None` when it cannot be split (see the
/// module's documentation).
pub(super) fn recover(file: &str, text: &str) -> Option<Recovered> {
    let layout = Layout::of(text)?;
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out = Recovered {
        raw: RawConfig::default(),
        errors: Vec::new(),
        descriptors_broken: false,
    };
    for (i, s) in layout.sections.iter().enumerate() {
        let end = layout
            .sections
            .get(i + 1)
            .map_or(lines.len() + 1, |n| n.line);
        if let Some(first) = layout.sections[..i].iter().find(|p| p.key == s.key) {
            out.errors.push(ConfigError {
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
struct Pieces<'a> {
    file: &'a str,
    lines: &'a [&'a str],
    /// The first line of each item.
    items: &'a [usize],
    /// The line after the last item.
    end: usize,
    out: &'a mut Recovered,
}

impl Pieces<'_> {
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

fn parse(file: &str, piece: &str) -> Result<RawConfig, ConfigError> {
    serde_saphyr::from_str(piece).map_err(|e| located(file, &e))
}

/// serde-saphyr's error as ours: its first line, at its location.
pub(super) fn located(file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    ConfigError {
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

#[cfg(test)]
mod tests {
    use super::super::parse;

    /// The case: a typo in rule 1, a wrong type in a top-level
    /// section and a bad limit in rule 3, all reported with their places.
    #[test]
    fn three_errors_in_three_places_are_all_reported() {
        let text = "\
store: memory
listen: [1, 2]
rules:
  - name: one
    limts: [ { gcra: { rate: 1/s } } ]
  - name: two
    by: user
    limits: [ { gcra: { rate: 1/s } } ]
  - name: three
    limits:
      - fixed_window: { limit: many, window: 1m }
";
        let e = parse("r.yaml", text).unwrap_err();
        let shown: Vec<String> = e.0.iter().map(ToString::to_string).collect();
        assert_eq!(e.0.len(), 3, "{shown:#?}");
        assert!(shown[0].starts_with("r.yaml:2:9: "), "{shown:#?}");
        assert!(
            shown[1].starts_with("r.yaml:5:5: unknown field `limts`"),
            "{shown:#?}"
        );
        assert!(shown[2].starts_with("r.yaml:11:32: "), "{shown:#?}");
    }

    /// Structural errors and validation errors of the parts that parsed,
    /// in file order.
    #[test]
    fn structural_and_validation_errors_come_together_in_file_order() {
        let text = "\
rules:
  - name: a
    by: usr
    limits: [ { gcra: { rate: 1/s } } ]
  - name: b
    colour: red
    limits: [ { gcra: { rate: 1/s } } ]
  - name: c
    limits: [ { fixed_window: { limit: 0, window: 1m } } ]
";
        let e = parse("r.yaml", text).unwrap_err();
        let lines: Vec<u64> = e.0.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 6, 9], "{e}");
        assert!(e.0[0].message.contains("did you mean `user`?"), "{e}");
    }

    /// A file that cannot be split (an alias, flow style at the top) is
    /// reported as serde reports it: its first error.
    #[test]
    fn a_file_that_cannot_be_split_reports_its_first_error() {
        for text in [
            "x: &a 1\ny: *a\nrules: []\n",
            "{ rules: [], colour: red, size: big }\n",
        ] {
            let e = parse("r.yaml", text).unwrap_err();
            assert_eq!(e.0.len(), 1, "{text:?}: {e}");
        }
        let e = parse("r.yaml", "colour: red\nsize: big\nrules: []\n").unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
    }
}
