//! Errors in a rules file, each with where it is, and the collector
//! validation adds them to.

use std::fmt;

use serde_saphyr::Spanned;

/// One problem in a rules file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Error {
    /// The file (or `<example>` for the built-in one).
    pub file: String,
    /// 1-based line; 0 if unknown.
    pub line: u64,
    /// 1-based column; 0 if unknown.
    pub column: u64,
    /// What is wrong.
    pub message: String,
}

impl Error {
    /// A problem in `file` at `line` and `column` (1-based; 0 when not
    /// known): `message`.
    pub fn new(
        file: impl Into<String>,
        line: u64,
        column: u64,
        message: impl Into<String>,
    ) -> Error {
        Error {
            file: file.into(),
            line,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

impl std::error::Error for Error {}

/// Every problem found in a file, in file order; shown one per line as
/// `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Errors(pub Vec<Error>);

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Errors {}

/// serde-saphyr renders a snippet after the message; the message is the
/// first line, without the location the library may put before it
/// (`error: line X column Y: `) or after it (` at line X column Y`): we
/// print our own. Its word for a value that is not a whole number (or too
/// large) is the type's name; ours says what was expected.
pub fn first_line(s: &str) -> String {
    let mut line = s.lines().next().unwrap_or(s).trim();
    line = line.strip_prefix("error: ").unwrap_or(line);
    if let Some(rest) = line.strip_prefix("line ")
        && let Some((at, msg)) = rest.split_once(": ")
        && at.split(" column ").all(|n| n.parse::<u64>().is_ok())
    {
        line = msg;
    }
    if let Some(i) = line.find(" at line ") {
        line = &line[..i];
    }
    if let Some(rest) = line.strip_prefix("duplicate mapping key: ") {
        // The library's advice that follows (a parser option) is not the
        // user's to act on.
        let key = rest.split_once(", set ").map_or(rest, |(k, _)| k);
        return format!("duplicate key `{key}`");
    }
    match line {
        "invalid i64" => format!("expected a whole number (at most {})", i64::MAX),
        "invalid u64" => format!("expected a whole number from 0 to {}", u64::MAX),
        "expected sequence start" => {
            "expected a list (`[a, b]` or lines starting with `- `)".into()
        }
        "expected mapping start" => {
            "expected a map (`{ key: value }` or `key: value` lines)".into()
        }
        "expected string scalar" => "expected a string".into(),
        _ => line.to_string(),
    }
}

/// The errors of one file as validation finds them (plumbing shared with
/// spillway-server, which validates the rest of the file with it).
#[derive(Debug)]
pub struct Collector<'a> {
    /// The file's name, as errors show it.
    pub file: &'a str,
    /// The errors so far, in the order found.
    pub list: Vec<Error>,
}

impl<'a> Collector<'a> {
    /// No errors yet, in `file`.
    pub fn new(file: &'a str) -> Collector<'a> {
        Collector {
            file,
            list: Vec::new(),
        }
    }

    /// An error at a value's line and column.
    pub fn at<T>(&mut self, span: &Spanned<T>, message: impl Into<String>) {
        self.list.push(Error {
            file: self.file.to_string(),
            line: span.referenced.line(),
            column: span.referenced.column(),
            message: bounded(message.into()),
        });
    }

    /// An error at a line and column (0, 0: the file as a whole).
    pub fn at_loc(&mut self, (line, column): (u64, u64), message: impl Into<String>) {
        self.list.push(Error {
            file: self.file.to_string(),
            line,
            column,
            message: bounded(message.into()),
        });
    }
}

/// The longest message shown: a message quoting a value of megabytes (a
/// hostile or broken file) shows its start and how long it was.
const MAX_MESSAGE: usize = 1024;

/// `message` cut to [`MAX_MESSAGE`] bytes (at a character boundary).
pub(crate) fn bounded(message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}... (message cut: {} bytes in all)",
        &message[..end],
        message.len()
    )
}
