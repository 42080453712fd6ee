//! `${NAME}` in the rules file: the value of the environment variable
//! NAME, so that secrets (a Redis password, a token file's path under
//! systemd's `$CREDENTIALS_DIRECTORY`) stay out of the file.
//!
//! The substitution happens inside scalar values, never as text pasted
//! into the YAML: the file is parsed first, every scalar holding a `${`
//! gets its value expanded, and only those scalars are written back, as
//! double-quoted YAML strings with every special character escaped. A
//! value holding `: `, `#`, quotes or line breaks therefore stays one
//! string, in the place it was written. (Numbers and `true`/`false`
//! substituted for a whole unquoted value are written back unquoted, so
//! `max_connections: ${MAX}` is still a number.) A rewritten scalar keeps
//! its line count (escaped line breaks fill in), so every line number an
//! error names is still the file's.
//!
//! The forms:
//! - `${NAME}`: the variable's value; an unset variable is an error
//!   naming it and its line.
//! - `${NAME:url}`: the value percent-encoded for a URL (every byte but
//!   `A-Z a-z 0-9 - . _ ~`), for a password inside `redis://`.
//! - `$${`: a literal `${`. Any other `$` is itself.
//!
//! The values substituted are secrets as far as spillway can tell:
//! [`Secrets`] hides them again in error messages and in `spillway
//! check-config`'s report.

use std::borrow::Cow;

use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle, Span};

use crate::{Error as ConfigError, Errors as ConfigErrors};

/// What the environment says of a variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Var {
    /// Set, to this text.
    Set(String),
    /// Not set.
    Unset,
    /// Set, but not UTF-8 (a rules file is text).
    NotUnicode,
}

/// The process's environment, as [`substitute`] reads it.
pub fn process_env(name: &str) -> Var {
    match std::env::var_os(name) {
        None => Var::Unset,
        Some(v) => v.into_string().map_or(Var::NotUnicode, Var::Set),
    }
}

/// The file's text with every `${...}` substituted, and what was.
#[derive(Debug)]
pub struct Substituted<'a> {
    /// The text to parse (borrowed when nothing was substituted).
    pub text: Cow<'a, str>,
    /// Every value put in, to hide again.
    pub secrets: Secrets,
}

/// Values taken from the environment, and the reference each stands for
/// (`${REDIS_PASSWORD}`): text that shows configuration (an error
/// message, `check-config`'s report) passes through [`Secrets::redact`]
/// so that it says what the file says instead of the value.
///
/// Values shorter than [`Secrets::MIN_LEN`] characters are not hidden:
/// they are no secret worth the name, and replacing every `1` or `on` in
/// a report would garble it.
#[derive(Clone, Default)]
pub struct Secrets {
    /// (text as it may appear, the reference), longest text first.
    pairs: Vec<(String, String)>,
}

/// Never the values: a `{:?}` of a configuration holding them must not
/// print them.
impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} hidden)", self.pairs.len())
    }
}

impl Secrets {
    /// The shortest value hidden, in characters.
    pub const MIN_LEN: usize = 4;

    /// The values the `${...}` references of the rules file `text` take
    /// from the environment now. A file that does not parse, or names an
    /// unset variable, gives those it can.
    pub fn of(text: &str) -> Secrets {
        let mut secrets = Secrets::default();
        let _ = scan(text, &process_env, &mut secrets, None);
        secrets
    }

    fn add(&mut self, value: &str, reference: String) {
        if value.chars().count() < Self::MIN_LEN {
            return;
        }
        // As it is, as `{:?}` prints it inside a message, and lowercased
        // (a header name is shown as it is matched).
        let quoted = format!("{value:?}");
        let debug = &quoted[1..quoted.len() - 1];
        let (lower, lower_debug) = (value.to_ascii_lowercase(), debug.to_ascii_lowercase());
        for text in [value, debug, &lower, &lower_debug] {
            if !self.pairs.iter().any(|(t, _)| t == text) {
                self.pairs.push((text.to_string(), reference.clone()));
            }
        }
        self.pairs.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `text` with every value replaced by its reference, and every part
    /// of one too: each run of [`Secrets::MIN_LEN`] characters or more
    /// that a value holds (as it is, or escaped as `{:?}` prints it)
    /// becomes the value's reference. A message that shows only a piece
    /// of a value (the unit of a duration, the second line of a value
    /// with a line break, the first characters of a long one) hides that
    /// piece. The price: a message's own words that happen to match four
    /// characters of a value are hidden too; too much, never too little.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if self.pairs.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::new();
        // Bytes of `text` up to `copied` are in `out` (when it is used).
        let mut copied = 0;
        let mut at = 0;
        while at < text.len() {
            let rest = &text[at..];
            let best = self
                .pairs
                .iter()
                .map(|(value, reference)| (shared_prefix(rest, value), reference))
                .max_by_key(|(len, _)| *len);
            match best {
                Some((len, reference)) if rest[..len].chars().count() >= Self::MIN_LEN => {
                    out.push_str(&text[copied..at]);
                    out.push_str(reference);
                    at += len;
                    copied = at;
                }
                _ => at += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        if copied == 0 {
            return Cow::Borrowed(text);
        }
        out.push_str(&text[copied..]);
        Cow::Owned(out)
    }

    /// `errors` with every value replaced by its reference.
    pub fn redact_errors(&self, mut errors: ConfigErrors) -> ConfigErrors {
        if !self.is_empty() {
            for e in &mut errors.0 {
                e.message = self.redact(&e.message).into_owned();
            }
        }
        errors
    }
}

/// The length in bytes of the longest start of `text` found anywhere in
/// `value`, cut to a character boundary.
fn shared_prefix(text: &str, value: &str) -> usize {
    let mut best = 0;
    for (j, _) in value.char_indices() {
        let common = text
            .bytes()
            .zip(value[j..].bytes())
            .take_while(|(a, b)| a == b)
            .count();
        if common > best {
            best = common;
        }
    }
    while !text.is_char_boundary(best) {
        best -= 1;
    }
    best
}

/// `text` (the rules file `file`) with every `${...}` in its scalars
/// substituted from `env`.
///
/// # Errors
/// Each reference to an unset (or non-UTF-8) variable, and each malformed
/// `${`, with its line and column. A file that is not valid YAML is
/// returned as it is, for the parser to report.
pub fn substitute<'a>(
    file: &str,
    text: &'a str,
    env: &dyn Fn(&str) -> Var,
) -> Result<Substituted<'a>, ConfigErrors> {
    substitute_in(file, text, env, None)
}

/// As [`substitute`], in the top-level sections named by `only` (all of
/// them when `None`): a reader of some sections of a file (the client's
/// outbound rules) needs no variable that only the others use, say the
/// server's Redis password.
///
/// # Errors
/// As [`substitute`].
pub fn substitute_in<'a>(
    file: &str,
    text: &'a str,
    env: &dyn Fn(&str) -> Var,
    only: Option<&[&str]>,
) -> Result<Substituted<'a>, ConfigErrors> {
    let mut secrets = Secrets::default();
    // No value can hold a `${` without a `$` in the file, or a `\` for a
    // double-quoted escape of one (`"\u0024{X}"` reads `${X}`).
    if !text.contains(['$', '\\']) {
        return Ok(Substituted {
            text: Cow::Borrowed(text),
            secrets,
        });
    }
    let (edits, problems) = scan(text, env, &mut secrets, only);
    if !problems.is_empty() {
        let list = problems
            .into_iter()
            .map(|(at, message)| {
                let (line, column) = line_col(text, at);
                ConfigError {
                    file: file.to_string(),
                    line,
                    column,
                    message,
                }
            })
            .collect();
        return Err(secrets.redact_errors(ConfigErrors(list)));
    }
    if edits.is_empty() {
        return Ok(Substituted {
            text: Cow::Borrowed(text),
            secrets,
        });
    }
    let mut out = String::with_capacity(text.len() + 64);
    let mut at = 0;
    for e in edits {
        out.push_str(&text[at..e.from]);
        out.push_str(&e.with);
        at = e.to;
    }
    out.push_str(&text[at..]);
    Ok(Substituted {
        text: Cow::Owned(out),
        secrets,
    })
}

/// Bytes `from..to` of the file become `with`.
#[derive(Debug)]
struct Edit {
    from: usize,
    to: usize,
    with: String,
}

/// A problem at a byte offset of the file.
type Problem = (usize, String);

/// Every scalar's substitution, or the problems found; the values put in
/// are added to `secrets`. A file the parser refuses gives what was
/// found before the refusal.
fn scan(
    text: &str,
    env: &dyn Fn(&str) -> Var,
    secrets: &mut Secrets,
    only: Option<&[&str]>,
) -> (Vec<Edit>, Vec<Problem>) {
    let mut edits = Vec::new();
    let mut problems = Vec::new();
    // Nesting (mappings and sequences open), whether the next scalar of
    // the top-level mapping is a key, and the top-level section the
    // events are in.
    let mut depth = 0usize;
    let mut key_next = false;
    let mut section: Option<String> = None;
    // Where the previous event ended: a block scalar's header (`|`, `>`)
    // lies between it and the scalar's content.
    let mut previous_end = 0;
    for item in Parser::new_from_str(text) {
        let Ok((event, span)) = item else {
            break;
        };
        let (start, end) = (offset(text, &span, true), offset(text, &span, false));
        // A top-level key or the start of its value: track the section.
        let at_top = depth == 1;
        match &event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if at_top {
                    key_next = false;
                }
                depth += 1;
                if depth == 1 {
                    key_next = matches!(event, Event::MappingStart(..));
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                depth = depth.saturating_sub(1);
                if depth == 1 {
                    key_next = true;
                }
            }
            Event::Scalar(value, ..) if at_top => {
                if key_next {
                    section = Some(value.to_string());
                }
                key_next = !key_next;
            }
            _ => {}
        }
        let wanted = match (only, &section) {
            (None, _) => true,
            (Some(list), Some(s)) => list.contains(&s.as_str()),
            (Some(_), None) => false,
        };
        if let Event::Scalar(value, style, ..) = &event
            && wanted
            && value.contains("${")
        {
            let raw = &text[start..end];
            match expand(value, env, secrets) {
                Err((reference, message)) => {
                    // Point at the reference where it is written, if it
                    // is written as it reads.
                    let at = raw.find(&reference).map_or(start, |i| start + i);
                    problems.push((at, message));
                }
                Ok(None) => {}
                Ok(Some(new)) => match rewrite(text, previous_end, start, end, *style, &new) {
                    Some(edit) => edits.push(edit),
                    None => problems.push((
                        start,
                        "cannot substitute `${...}` in this block scalar: write the value quoted (\"...\")".into(),
                    )),
                },
            }
        }
        previous_end = end.max(previous_end);
    }
    (edits, problems)
}

/// The byte offset of a span's start (or end).
fn offset(text: &str, span: &Span, start: bool) -> usize {
    let m = if start { span.start } else { span.end };
    m.byte_offset().unwrap_or_else(|| {
        text.char_indices()
            .nth(m.index())
            .map_or(text.len(), |(i, _)| i)
    })
}

/// 1-based line and column of byte `at`.
fn line_col(text: &str, at: usize) -> (u64, u64) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line as u64, column as u64)
}

/// `value` with its references substituted: `None` when it has none (only
/// `$$`-free text); `Err` names the first bad reference, as written, and
/// says what is wrong with it.
fn expand(
    value: &str,
    env: &dyn Fn(&str) -> Var,
    secrets: &mut Secrets,
) -> Result<Option<String>, (String, String)> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    let mut changed = false;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
            changed = true;
            continue;
        }
        let Some(body) = rest.strip_prefix("${") else {
            out.push('$');
            rest = &rest[1..];
            continue;
        };
        let Some(close) = body.find('}') else {
            let shown: String = rest.chars().take(24).collect();
            return Err((
                shown.clone(),
                format!("`{shown}`: a `${{` without its `}}` (write `$${{` for a literal `${{`)"),
            ));
        };
        let inner = &body[..close];
        let reference = format!("${{{inner}}}");
        let (name, url) = match inner.split_once(':') {
            None => (inner, false),
            Some((name, "url")) => (name, true),
            Some((_, other)) => {
                return Err((
                    reference.clone(),
                    format!(
                        "`{reference}`: unknown form `:{other}`: `${{NAME}}`, or `${{NAME:url}}` for a value percent-encoded (write `$${{` for a literal `${{`)"
                    ),
                ));
            }
        };
        if !valid_name(name) {
            return Err((
                reference.clone(),
                format!(
                    "`{reference}`: {name:?} is not a variable name (letters, digits and _, not starting with a digit; write `$${{` for a literal `${{`)"
                ),
            ));
        }
        let v = match env(name) {
            Var::Set(v) => v,
            Var::Unset => {
                return Err((
                    reference.clone(),
                    format!(
                        "`{reference}`: the environment variable {name} is not set (set it, or write `$${{{inner}}}` for the text itself)"
                    ),
                ));
            }
            Var::NotUnicode => {
                return Err((
                    reference.clone(),
                    format!("`{reference}`: the environment variable {name} is not valid UTF-8"),
                ));
            }
        };
        let put = if url { percent_encode(&v) } else { v.clone() };
        secrets.add(&v, reference.clone());
        if put != v {
            secrets.add(&put, reference);
        }
        out.push_str(&put);
        rest = &body[close + 1..];
        changed = true;
    }
    out.push_str(rest);
    Ok(changed.then_some(out))
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Every byte but the URL-unreserved ones as `%XX`.
fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len() * 3);
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The edit that puts `value` in place of the scalar at `start..end`
/// (`previous_end`: where the event before it ended). `None` for a block
/// scalar whose header cannot be found.
fn rewrite(
    text: &str,
    previous_end: usize,
    start: usize,
    end: usize,
    style: ScalarStyle,
    value: &str,
) -> Option<Edit> {
    let (from, to) = match style {
        ScalarStyle::Literal | ScalarStyle::Folded => {
            // The span covers the content only (and the blank lines after
            // it): take the header too, and leave the trailing blank lines.
            let from = previous_end + block_header(&text[previous_end..start])?;
            let to = start + text[start..end].trim_end().len();
            (from, to)
        }
        _ => (start, end),
    };
    let breaks = text[from..to].matches('\n').count();
    let plain = matches!(style, ScalarStyle::Plain) && breaks == 0 && keeps_type(value);
    let with = if plain {
        value.to_string()
    } else {
        // Continuation lines are indented past the scalar's column (its
        // 1-based column is one more than its 0-based one), as YAML asks
        // of a flow scalar in a block.
        let (_, column) = line_col(text, from);
        double_quoted(value, breaks, usize::try_from(column).unwrap_or(1))
    };
    Some(Edit { from, to, with })
}

/// Where the `|` or `>` of a block scalar's header is in `between` (the
/// text from the previous event to the scalar's content): the first one
/// outside comments and verbatim tags.
fn block_header(between: &str) -> Option<usize> {
    let mut comment = false;
    let mut verbatim = false;
    let mut prev = '\n';
    for (i, c) in between.char_indices() {
        match c {
            '\n' => comment = false,
            _ if comment => {}
            '#' if prev.is_whitespace() => comment = true,
            '<' if prev == '!' => verbatim = true,
            '>' if verbatim => verbatim = false,
            '|' | '>' if !verbatim => return Some(i),
            _ => {}
        }
        prev = c;
    }
    None
}

/// Whether `v` written unquoted is read as the number or boolean it
/// spells (so a substituted `5000` stays a number).
fn keeps_type(v: &str) -> bool {
    if v == "true" || v == "false" {
        return true;
    }
    let digits = v.strip_prefix(['-', '+']).unwrap_or(v);
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, "0"));
    !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && !frac.is_empty()
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// `v` as a YAML double-quoted scalar, spread over `breaks` more lines
/// (escaped line breaks, which add nothing to the value) indented by
/// `indent` spaces.
fn double_quoted(v: &str, breaks: usize, indent: usize) -> String {
    let mut out = String::with_capacity(v.len() + 2 + breaks * (indent + 2));
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                out.push_str(&format!("\\u{:04X}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    for _ in 0..breaks {
        out.push_str("\\\n");
        out.extend(std::iter::repeat_n(' ', indent));
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Var {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned().map_or(Var::Unset, Var::Set)
    }

    fn sub(text: &str, vars: &[(&str, &str)]) -> Result<String, ConfigErrors> {
        substitute("f.yaml", text, &env_of(vars)).map(|s| s.text.into_owned())
    }

    /// The YAML value at `key` of a top-level map, as serde reads it.
    fn read(text: &str) -> HashMap<String, serde_json::Value> {
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    const NASTY: &str = "p@ss: w#rd \"'\\\n{[*&!|>%`,]}\t$x - ? é\u{1}";

    #[test]
    fn a_value_with_yaml_syntax_stays_one_string_in_every_style() {
        let files = [
            "a: ${V}\nb: after\n",
            "a: \"${V}\"\nb: after\n",
            "a: '${V}'\nb: after\n",
            "a: { x: \"${V}\", y: 1 }\nb: after\n",
            "a: [ '${V}', 2 ]\nb: after\n",
            "a: |\n  ${V}\nb: after\n",
            "a: >-\n  ${V}\nb: after\n",
            "a: !!str ${V}\nb: after\n",
            "- ${V}\n- after\n",
        ];
        for f in files {
            let out = sub(f, &[("V", NASTY)]).unwrap();
            if f.starts_with('-') {
                let v: Vec<String> = serde_saphyr::from_str(&out).unwrap();
                assert_eq!(v, [NASTY, "after"], "{f}");
                continue;
            }
            let v = read(&out);
            let a = &v["a"];
            let got = a
                .as_str()
                .or_else(|| a.get("x").and_then(|x| x.as_str()))
                .or_else(|| a.get(0).and_then(|x| x.as_str()))
                .unwrap_or_else(|| panic!("{f}: {a:?}"));
            let want = if f.contains("|\n") {
                format!("{NASTY}\n")
            } else {
                NASTY.to_string()
            };
            assert_eq!(got, want, "{f}\n{out}");
            assert_eq!(v["b"], "after", "{f}");
            assert_eq!(
                out.lines().count(),
                f.lines().count(),
                "{f}: lines kept\n{out}"
            );
        }
    }

    #[test]
    fn text_around_a_reference_is_kept() {
        let out = sub(
            "url: redis://:${P}@127.0.0.1:6379/0 # the store\nn: 1\n",
            &[("P", "a b#c")],
        )
        .unwrap();
        let v = read(&out);
        assert_eq!(v["url"], "redis://:a b#c@127.0.0.1:6379/0");
        assert_eq!(v["n"], 1);
    }

    #[test]
    fn url_form_percent_encodes() {
        let out = sub("url: redis://:${P:url}@h:1\n", &[("P", "p@ss:w#rd/ é")]).unwrap();
        assert_eq!(
            read(&out)["url"],
            "redis://:p%40ss%3Aw%23rd%2F%20%C3%A9@h:1"
        );
    }

    #[test]
    fn numbers_and_booleans_keep_their_type() {
        let out = sub(
            "n: ${N}\nf: ${F}\nb: ${B}\ns: \"${N}\"\nt: ${T}\n",
            &[("N", "5000"), ("F", "-1.5"), ("B", "true"), ("T", "12ab")],
        )
        .unwrap();
        let v = read(&out);
        assert_eq!(v["n"], 5000);
        assert_eq!(v["f"], -1.5);
        assert_eq!(v["b"], true);
        assert_eq!(v["s"], "5000");
        assert_eq!(v["t"], "12ab");
    }

    #[test]
    fn an_unset_variable_is_named_with_its_line_and_column() {
        let e = sub("a: 1\nb:\n  url: redis://:${NOPE}@h\n", &[]).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("f.yaml:3:17: "), "{text}");
        assert!(text.contains("NOPE is not set"), "{text}");
        // Every one is reported.
        let e = sub("a: ${A}\nb: ${B}\n", &[]).unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
        assert_eq!((e.0[1].line, e.0[1].column), (2, 4));
    }

    #[test]
    fn malformed_references_are_errors() {
        for (f, says) in [
            ("a: ${1X}\n", "not a variable name"),
            ("a: \"${}\"\n", "not a variable name"),
            ("a: ${A\n", "without its `}`"),
            ("a: \"${A:-x}\"\n", "unknown form"),
        ] {
            let e = sub(f, &[("A", "v")]).unwrap_err().to_string();
            assert!(e.contains(says), "{f}: {e}");
            assert!(e.starts_with("f.yaml:1:"), "{f}: {e}");
        }
    }

    #[test]
    fn escape_and_lone_dollars() {
        let out = sub(
            "a: $${A} costs $5 and $$\nb: \"x$${A}${A}\"\n",
            &[("A", "v")],
        )
        .unwrap();
        let v = read(&out);
        assert_eq!(v["a"], "${A} costs $5 and $$");
        assert_eq!(v["b"], "x${A}v");
        // A value's own escapes come first: this one reads `${A}`.
        let out = sub("c: \"\\u0024{A}\"\n", &[("A", "v")]).unwrap();
        assert_eq!(read(&out)["c"], "v");
    }

    #[test]
    fn comments_and_keys_without_references_are_left_alone() {
        let f = "# uses ${UNSET} somewhere\na: 1 # ${UNSET}\n";
        assert_eq!(sub(f, &[]).unwrap(), f);
    }

    #[test]
    fn a_file_that_is_not_yaml_is_left_to_the_parser() {
        let f = "a: [${A}\n";
        assert_eq!(sub(f, &[]).unwrap(), f);
    }

    #[test]
    fn multi_line_scalars_keep_later_line_numbers() {
        let f = "a: first\n  ${V} line\n  third\nb: x\nc: |\n  one\n  ${V}\n\n\nd: z\n";
        let out = sub(f, &[("V", "v")]).unwrap();
        assert_eq!(out.lines().count(), f.lines().count(), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[3], "b: x");
        assert_eq!(lines[9], "d: z");
        let v = read(&out);
        assert_eq!(v["a"], "first v line third");
        assert_eq!(v["c"], "one\nv\n");
        assert_eq!(v["d"], "z");
    }

    proptest::proptest! {
        /// Whatever a variable holds, the scalar it is put in reads as
        /// that text, the keys around it are untouched, and every line
        /// keeps its number.
        #[test]
        fn any_value_stays_one_scalar(v in "(?s).{0,40}", style in 0usize..7) {
            let (file, want) = match style {
                0 => ("k: a${V}b\nz: 1\n", format!("a{v}b")),
                1 => ("k: \"a ${V}\"\nz: 1\n", format!("a {v}")),
                2 => ("k: 'a${V}'\nz: 1\n", format!("a{v}")),
                3 => ("k: |-\n  a\n  ${V}\nz: 1\n", format!("a\n{v}")),
                4 => ("k: [\"${V}\", 2]\nz: 1\n", v.clone()),
                5 => ("k: \"a\n  ${V}\"\nz: 1\n", format!("a {v}")),
                _ => ("k:\n  - x${V}\n  - y\nz: 1\n", format!("x{v}")),
            };
            let out = sub(file, &[("V", &v)]).unwrap();
            proptest::prop_assert_eq!(out.lines().count(), file.lines().count(), "{}", out);
            let parsed: HashMap<String, serde_json::Value> =
                serde_saphyr::from_str(&out).map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}\n{out}")))?;
            let k = &parsed["k"];
            let got = k.as_str().or_else(|| k.get(0).and_then(|x| x.as_str()));
            proptest::prop_assert_eq!(got, Some(want.as_str()), "{}", out);
            proptest::prop_assert_eq!(&parsed["z"], &serde_json::json!(1));
        }
    }

    #[test]
    fn every_part_of_a_value_is_redacted() {
        let s = substitute(
            "f",
            "w: \"${S}\"\n",
            &env_of(&[("S", "7 Hunter2Secret\nSecondLine")]),
        )
        .unwrap();
        let r = |t: &str| s.secrets.redact(t).into_owned();
        // The second line alone, a cut piece, the unit of a duration, the
        // escaped and the lowercased value.
        assert_eq!(r("unit SecondLine!"), "unit ${S}!");
        assert_eq!(r("`Hunter2Se`..."), "`${S}`...");
        assert_eq!(r("\"7 Hunter2Secret\\nSecondLine\""), "\"${S}\"");
        assert_eq!(r("header:7 hunter2secret"), "header:${S}");
        // Fewer than four characters in common are the message's own.
        assert_eq!(r("7 H is not"), "7 H is not");
        proptest::proptest!(|(i in 0usize..25, len in 4usize..25, before in "[a-z ]{0,8}")| {
            let value = "7 Hunter2Secret\nSecondLine";
            let end = (i + len).min(value.len());
            proptest::prop_assume!(end >= i + 4);
            let piece = &value[i..end];
            let shown = r(&format!("{before}{piece}"));
            proptest::prop_assert!(!shown.contains(piece), "{shown}");
        });
    }

    #[test]
    fn secrets_are_redacted_but_short_values_are_not() {
        let s = substitute(
            "f",
            "u: redis://:${P:url}@h\nn: ${N}\n",
            &env_of(&[("P", "p@ss:w#rd"), ("N", "10")]),
        )
        .unwrap();
        let r = s
            .secrets
            .redact("redis://:p%40ss%3Aw%23rd@h, \"p@ss:w#rd\", 10");
        assert_eq!(r, "redis://:${P:url}@h, \"${P:url}\", 10");
    }
}
