//! A large `rules:` list read a chunk of rules at a time.
//!
//! Read whole, a million rules were a million raw structs (every value
//! with its place) alive at once before the first was built: 3.4 GB at
//! the peak, 35 s. Here the file is cut at its rules' first lines: the
//! rest of the file (every other section, and `rules: []`) is read and
//! checked as usual, then the rules are read [`CHUNK`] at a time, each
//! chunk built before the next is read, so only one chunk's raw structs
//! are alive at once.
//!
//! Only the common layout is cut: `rules:` at the start of a line,
//! followed by a block list (its items' `-` at one indentation). Anything
//! else (a flow list, a document marker, a line that fits neither) is
//! read whole, as before. And this is a fast path only: the first error
//! anywhere (a rule that does not parse or does not build, an alias to an
//! anchor in another chunk, a name used twice) sends the file back to the
//! whole read, which reports every error at its line and column.

use std::ops::Range;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::raw::RawRule;

/// Rules read and built at a time.
pub const CHUNK: usize = 4096;

/// Files smaller than this are read whole: cutting gains nothing there.
const MIN_BYTES: usize = 256 * 1024;

/// A file's `rules:` items, by chunk.
#[derive(Debug, Default, Clone)]
pub struct Chunks {
    /// The `rules:` section's text (its items, from the first).
    text: String,
    /// Each chunk's range in `text`.
    ranges: Vec<Range<usize>>,
    /// Items in all.
    items: usize,
}

/// One chunk as serde reads it.
#[derive(Deserialize)]
struct Piece {
    rules: Vec<Spanned<RawRule>>,
}

impl Chunks {
    /// `text` cut: the rest of the file (the rules' lines left out,
    /// `rules: []` in their place), and the rules' chunks; `None` when the
    /// file is small or not laid out as [`Chunks`] reads.
    pub fn split(text: &str) -> Option<(String, Chunks)> {
        if text.len() < MIN_BYTES {
            return None;
        }
        let mut key: Option<usize> = None;
        // Byte offsets: where the section's items begin and end.
        let (mut from, mut to) = (None::<usize>, text.len());
        let mut indent: Option<usize> = None;
        let mut starts: Vec<usize> = Vec::new();
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            let start = at;
            at += line.len();
            let body = line.trim_end_matches(['\n', '\r']);
            let trimmed = body.trim_start_matches(' ');
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if body.starts_with("---") || body.starts_with("...") || body.starts_with('\t') {
                return None;
            }
            let col0 = !body.starts_with(' ');
            match (key, from) {
                (None, _) => {
                    if col0 && body.starts_with("rules:") {
                        let after = body["rules:".len()..].trim();
                        if !(after.is_empty() || after.starts_with('#')) {
                            // A flow list or a scalar: read whole.
                            return None;
                        }
                        key = Some(start);
                    }
                }
                (Some(_), _) if col0 && !body.starts_with('-') => {
                    // The next top-level key: the section ends.
                    if body.starts_with("rules:") {
                        return None;
                    }
                    if from.is_some() {
                        to = start;
                        // A second `rules:` further on is refused as the
                        // whole read refuses it.
                        if text[at..].lines().any(|l| l.starts_with("rules:")) {
                            return None;
                        }
                        break;
                    }
                    return None;
                }
                (Some(_), _) => {
                    let spaces = body.len() - trimmed.len();
                    let item = trimmed == "-" || trimmed.starts_with("- ");
                    match indent {
                        None if item => {
                            indent = Some(spaces);
                            from = Some(start);
                            starts.push(start);
                        }
                        // Not a block list.
                        None => return None,
                        Some(i) if spaces == i && item => starts.push(start),
                        Some(i) if spaces <= i => return None,
                        Some(_) => {}
                    }
                }
            }
        }
        let (key, from) = (key?, from?);
        if starts.len() < 2 {
            return None;
        }
        let section = &text[from..to];
        let mut ranges = Vec::with_capacity(starts.len() / CHUNK + 1);
        for c in starts.chunks(CHUNK) {
            let begin = c[0] - from;
            ranges.push(begin..begin);
        }
        for i in 0..ranges.len() {
            ranges[i].end = ranges.get(i + 1).map_or(section.len(), |n| n.start);
        }
        // The rest: the same lines before and after, `rules: []` for the
        // section (so a file of rules still says it has them).
        let mut rest = String::with_capacity(text.len() - section.len() + 16);
        rest.push_str(&text[..key]);
        rest.push_str("rules: []\n");
        rest.push_str(&text[to..]);
        Some((
            rest,
            Chunks {
                text: section.to_string(),
                items: starts.len(),
                ranges,
            },
        ))
    }

    /// Rules in all.
    pub fn items(&self) -> usize {
        self.items
    }

    /// Chunk `i`'s raw rules.
    fn piece(&self, i: usize, buf: &mut String) -> Result<Vec<Spanned<RawRule>>, String> {
        buf.clear();
        buf.push_str("rules:\n");
        buf.push_str(&self.text[self.ranges[i].clone()]);
        crate::recover::from_str::<Piece>(buf)
            .map(|p| p.rules)
            .map_err(|e| e.to_string())
    }

    /// Reads and builds the rules on up to `threads` threads, a chunk at
    /// a time each: `make` builds one raw rule there; `take` gets each raw
    /// rule and what `make` made of it on the calling thread, in file
    /// order. Stops at the first chunk that does not parse or rule `make`
    /// refuses.
    ///
    /// # Errors
    /// The first error (its place is within a chunk: the caller reads the
    /// file whole for places).
    pub fn build<R: Send>(
        &self,
        threads: usize,
        make: impl Fn(&Spanned<RawRule>) -> Result<R, String> + Sync,
        mut take: impl FnMut(&Spanned<RawRule>, R),
    ) -> Result<(), String> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        type Built<R> = Result<Vec<(Spanned<RawRule>, R)>, String>;
        let n = self.ranges.len();
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let threads = threads.clamp(1, n.max(1));
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Built<R>)>(threads * 2);
            for _ in 0..threads {
                let (tx, next, stop, make) = (tx.clone(), &next, &stop, &make);
                s.spawn(move || {
                    let mut buf = String::new();
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        let built = self.piece(i, &mut buf).and_then(|raws| {
                            raws.into_iter().map(|r| make(&r).map(|b| (r, b))).collect()
                        });
                        if tx.send((i, built)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            // Chunks arrive in any order; each is taken in file order.
            let mut waiting = std::collections::BTreeMap::new();
            let mut due = 0;
            for (i, built) in rx {
                waiting.insert(i, built);
                while let Some(built) = waiting.remove(&due) {
                    match built {
                        Ok(list) => list.into_iter().for_each(|(r, b)| take(&r, b)),
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                    due += 1;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big(n: usize, head: &str, tail: &str, indent: &str) -> String {
        let mut s = String::from(head);
        s.push_str("rules:\n");
        for i in 0..n {
            s.push_str(&format!(
                "{indent}- name: r{i}\n{indent}  api: GET /a/{i}\n{indent}  limits: [ {{ gcra: {{ rate: 5/s }} }} ]\n"
            ));
        }
        s.push_str(tail);
        s
    }

    fn names(c: &Chunks) -> Vec<String> {
        let mut out = Vec::new();
        c.build(2, |r| Ok(r.value.name.value.clone()), |_, n| out.push(n))
            .unwrap();
        out
    }

    #[test]
    fn a_large_block_list_is_cut_into_chunks_in_order() {
        for indent in ["", "  "] {
            let text = big(
                10_000,
                "# head\nstore: memory\n",
                "descriptors: [tenant]\n",
                indent,
            );
            let (rest, c) = Chunks::split(&text).expect("cut");
            assert_eq!(
                rest,
                "# head\nstore: memory\nrules: []\ndescriptors: [tenant]\n"
            );
            assert_eq!(c.items(), 10_000);
            assert_eq!(c.ranges.len(), 3);
            let got = names(&c);
            assert_eq!(got.len(), 10_000);
            assert!(got.iter().enumerate().all(|(i, n)| *n == format!("r{i}")));
        }
    }

    /// Mixed shapes, as `scripts/gen-rules.sh` writes them.
    fn mixed(n: usize) -> String {
        let by = ["ip", "user", "user+ip", "header:X-Api-Key", "route"];
        let mut s = String::from(
            "descriptors: [tenant]\npath_matching: { trailing_slash: false }\nrules:\n",
        );
        for i in 0..n {
            s.push_str(&format!(
                "  - name: svc{}-rule-{i}\n    api: GET /svc/{i}\n    by: {}\n",
                i % 7,
                by[i % 5]
            ));
            if i % 10 == 3 {
                s.push_str("    mode: shadow\n");
            }
            s.push_str("    limits:\n");
            match i % 3 {
                0 => s.push_str(&format!(
                    "      - gcra: {{ rate: {}/s, burst: 5 }}\n",
                    1 + i % 9
                )),
                1 => s.push_str("      - token_bucket: { capacity: 10, refill: 5/s }\n"),
                _ => s.push_str("      - sliding_window_log: { limit: 7, window: 1m }\n"),
            }
            if i % 2 == 1 {
                s.push_str("      - fixed_window: { limit: 1000, window: 1d }\n");
            }
        }
        s
    }

    /// The chunked read gives the rules the whole read gives, in order.
    #[test]
    fn a_large_file_reads_as_the_whole_read_does() {
        let text = mixed(5_000);
        assert!(Chunks::split(&text).is_some(), "large enough to be cut");
        let fast = crate::parse("big.yaml", &text).unwrap();
        let whole = crate::recover::read("big.yaml", &text, |file, raw, any| {
            crate::validate(file, raw, any)
        })
        .unwrap();
        assert_eq!(fast.rules.len(), 5_000);
        assert_eq!(fast.rules, whole.rules);
        assert_eq!(fast.descriptors, whole.descriptors);
        assert_eq!(fast.path_matching, whole.path_matching);
    }

    /// An error in a large file is reported at its place in the file (the
    /// file is read whole for it), and so is a name used in two chunks.
    #[test]
    fn errors_in_a_large_file_keep_their_places() {
        // Rule 3000 (in the first chunk past the first): a rate of 0.
        let mut text = mixed(5_000);
        let at = text.find("name: svc4-rule-3000").unwrap();
        let rate = at + text[at..].find("rate: 4/s").unwrap();
        text.replace_range(rate..rate + "rate: 4/s".len(), "rate: 0/s");
        let line = text[..rate].lines().count() as u64;
        let e = crate::parse("big.yaml", &text).unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert_eq!(e.0[0].line, line, "{e}");
        let text = mixed(5_000).replacen("name: svc1-rule-4999", "name: svc0-rule-0", 1);
        let e = crate::parse("big.yaml", &text).unwrap_err();
        assert!(
            e.to_string()
                .contains("duplicate rule name \"svc0-rule-0\" (first used at line 4)"),
            "{e}"
        );
    }

    #[test]
    fn other_layouts_are_read_whole() {
        let small = big(10, "", "", "  ");
        assert!(Chunks::split(&small).is_none(), "small");
        let flow = format!("rules: [ ]\n{}", " ".repeat(MIN_BYTES));
        assert!(Chunks::split(&flow).is_none(), "flow");
        let doc = big(10_000, "---\n", "", "  ");
        assert!(Chunks::split(&doc).is_none(), "document marker");
        let twice = big(10_000, "", "rules: []\n", "  ");
        assert!(Chunks::split(&twice).is_none(), "rules twice");
        let odd = big(10_000, "", "", "  ").replacen("  - name: r5\n", " - name: r5\n", 1);
        assert!(Chunks::split(&odd).is_none(), "an item out of line");
    }
}
