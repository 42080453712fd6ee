//! Errors from building algorithm parameters and rules.

use std::fmt;

/// Why a limit or rule could not be built.
///
/// Messages carry the offending numbers so a config error can be fixed
/// without reading the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
}

/// The kind of [`Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A count (limit, capacity, burst, rate numerator) was zero.
    Zero(&'static str),
    /// A duration was zero.
    ZeroDuration(&'static str),
    /// A rate asks for more than one unit per nanosecond, which the integer
    /// arithmetic cannot represent.
    RateTooHigh {
        /// Units in the period.
        count: u64,
        /// The period, in nanoseconds.
        per_nanos: u64,
    },
    /// A counter algorithm's limit exceeds what its compact state stores.
    LimitTooLarge {
        /// The parameter's name.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A rule had no limits.
    NoLimits,
    /// A route pattern could not be parsed.
    BadRoute(String),
    /// A key specification could not be parsed.
    BadKey(String),
    /// A duration (`500ms`, `1h`) could not be parsed; the message quotes it.
    BadDuration(String),
    /// A rate (`5/s`, `100/1m`) could not be parsed or built; the message quotes it.
    BadRate(String),
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Error {
        Error { kind }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Zero(what) => write!(f, "{what} must be at least 1"),
            ErrorKind::ZeroDuration(what) => write!(f, "{what} must be longer than zero"),
            ErrorKind::RateTooHigh { count, per_nanos } => write!(
                f,
                "rate {count} per {per_nanos}ns is more than one per nanosecond"
            ),
            ErrorKind::LimitTooLarge { what, value, max } => {
                write!(f, "{what} {value} is larger than the maximum {max}")
            }
            ErrorKind::NoLimits => write!(f, "a rule needs at least one limit"),
            ErrorKind::BadRoute(msg) => write!(f, "bad route: {msg}"),
            ErrorKind::BadKey(msg) => write!(f, "bad key: {msg}"),
            ErrorKind::BadDuration(msg) | ErrorKind::BadRate(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {}
