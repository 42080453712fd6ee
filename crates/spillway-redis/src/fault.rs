//! What went wrong with a call to Redis: the kinds of failure the store
//! tells apart, whether each may pass by itself, and the message an
//! operator reads.
//!
//! Every kind counts against the circuit breaker. A server that answers
//! every call with an error (out of memory, a replica, a flushed script
//! cache, someone else's data under our keys, a user without the right to
//! run scripts) is as unusable as one that does not answer, and before
//! these counted, such a server looked healthy while every decision
//! followed the failure policy.

/// A kind of failure. The breaker keeps the last one in an atomic (the
/// discriminant), so a request answered by the open breaker can say why
/// without a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fault {
    /// No answer within the configured timeout.
    Timeout,
    /// The connection failed, dropped or was refused (or our own queue to
    /// it is full).
    Connection,
    /// No connection has been made yet.
    NotConnected,
    /// `OOM`: Redis is at `maxmemory` and evicts nothing (`noeviction`).
    OutOfMemory,
    /// `READONLY`: the server is a replica (a failover left us on one).
    ReadOnly,
    /// `LOADING`, `BUSY`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`: the
    /// server or cluster says to come back later.
    Busy,
    /// `NOSCRIPT` again right after loading the script: something flushes
    /// the script cache over and over.
    NoScript,
    /// `WRONGTYPE`: a key under our prefix holds something else.
    WrongType,
    /// `NOAUTH`, `NOPERM`, `WRONGPASS`: the credentials or the ACL.
    Auth,
    /// `ERR` and other errors raised by the script.
    Script,
    /// A reply the store cannot read.
    Reply,
    /// Anything else.
    Other,
}

impl Fault {
    /// Every kind, in discriminant order (see [`Fault::from_u8`]).
    const ALL: [Fault; 12] = [
        Fault::Timeout,
        Fault::Connection,
        Fault::NotConnected,
        Fault::OutOfMemory,
        Fault::ReadOnly,
        Fault::Busy,
        Fault::NoScript,
        Fault::WrongType,
        Fault::Auth,
        Fault::Script,
        Fault::Reply,
        Fault::Other,
    ];

    pub(crate) fn from_u8(n: u8) -> Fault {
        Fault::ALL
            .get(usize::from(n))
            .copied()
            .unwrap_or(Fault::Other)
    }

    /// The kind of `e`.
    pub(crate) fn of(e: &redis::RedisError) -> Fault {
        use redis::{ErrorKind as K, ServerErrorKind as S};
        if e.is_timeout() {
            return Fault::Timeout;
        }
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            return Fault::Connection;
        }
        match e.kind() {
            K::Server(S::ReadOnly) => Fault::ReadOnly,
            K::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown) => Fault::Busy,
            K::Server(S::NoScript) => Fault::NoScript,
            K::Server(S::NoPerm) | K::AuthenticationFailed => Fault::Auth,
            K::Server(S::ResponseError | S::ExecAbort) => Fault::Script,
            K::Parse | K::UnexpectedReturnType => Fault::Reply,
            _ => match e.code() {
                Some("OOM") => Fault::OutOfMemory,
                Some("BUSY") => Fault::Busy,
                Some("WRONGTYPE") => Fault::WrongType,
                Some("NOAUTH" | "WRONGPASS") => Fault::Auth,
                Some(_) => Fault::Script,
                None => Fault::Other,
            },
        }
    }

    /// Whether retrying later may succeed without anyone changing our
    /// configuration or our data: a lost connection or a full server may
    /// come back; a script error, a wrong password or a foreign key will
    /// not.
    pub(crate) fn transient(self) -> bool {
        match self {
            Fault::Timeout
            | Fault::Connection
            | Fault::NotConnected
            | Fault::OutOfMemory
            | Fault::ReadOnly
            | Fault::Busy
            | Fault::NoScript => true,
            Fault::WrongType | Fault::Auth | Fault::Script | Fault::Reply | Fault::Other => false,
        }
    }

    /// A short name for logs and for the open breaker's answers.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Timeout => "timeout",
            Fault::Connection => "connection",
            Fault::NotConnected => "not connected",
            Fault::OutOfMemory => "out of memory",
            Fault::ReadOnly => "read-only replica",
            Fault::Busy => "busy",
            Fault::NoScript => "script cache flushed",
            Fault::WrongType => "wrong type",
            Fault::Auth => "not allowed",
            Fault::Script => "script error",
            Fault::Reply => "bad reply",
            Fault::Other => "error",
        }
    }
}

/// What Redis said, as it said it: `OOM command not allowed when used
/// memory > 'maxmemory'.` (redis-rs would print the code quoted and the
/// error's category around it).
pub(crate) fn said(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_survive_their_discriminant() {
        for f in Fault::ALL {
            assert_eq!(Fault::from_u8(f as u8), f);
        }
    }

    #[test]
    fn server_errors_are_told_apart() {
        // The kinds redis-rs names itself; OOM and WRONGTYPE come as codes
        // in replies (tests/redis.rs has a real server give them).
        let readonly: redis::RedisError = (
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "READONLY",
        )
            .into();
        assert_eq!(Fault::of(&readonly), Fault::ReadOnly);
        assert!(Fault::of(&readonly).transient());
        let script: redis::RedisError = (
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR",
        )
            .into();
        assert_eq!(Fault::of(&script), Fault::Script);
        assert!(!Fault::of(&script).transient());
        let timeout: redis::RedisError =
            std::io::Error::new(std::io::ErrorKind::TimedOut, "late").into();
        assert_eq!(Fault::of(&timeout), Fault::Timeout);
    }
}
