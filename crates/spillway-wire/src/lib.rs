//! # spillway-wire
//!
//! The HTTP/1.1 code of spillway's hot path, and nothing else: it knows no
//! rule, metric or configuration file.
//!
//! - [`server`]: the accept loop and a direct HTTP/1.1 path in front of
//!   hyper. Plain requests (a strictly validated subset: see [`head`]) are
//!   parsed in place and given to a [`Handler`]; the first request that is
//!   anything else hands the connection, with the bytes already read, to
//!   hyper and the handler's fallback service. Every connection has a head
//!   deadline, an idle timeout, a whole-body deadline and a write timeout,
//!   and the number of connections is capped ([`Limits`], [`Budget`]).
//! - [`stream`]: what connections run over: plain TCP, or (feature `tls`)
//!   TLS, whose handshake is bounded and capped like any connection.
//! - [`client`]: a pooled HTTP/1.1 client to one upstream that writes its
//!   own framing, validates the upstream's response framing as strictly as
//!   hyper does and relays the body as it arrives.
//! - [`head`], [`framing`]: the parsers of untrusted bytes (request heads,
//!   response heads, chunked bodies), fuzzed and differential-tested on
//!   their own.
//!
//! Ways in plug in through [`Handler`], with static dispatch.

#![warn(missing_docs, unreachable_pub)]

pub mod budget;
pub mod client;
pub mod framing;
pub mod head;
pub mod headers;
mod io;
pub mod server;
pub mod stream;
mod streams;
pub mod write;

pub use budget::Budget;
pub use headers::{Disagree, HOP_BY_HOP, Headers, Sole};
pub use server::{ClientConn, Handler, Limits, Message, serve, serve_in, serve_on};
#[cfg(unix)]
pub use server::{UNIX_PEER, serve_unix};
#[cfg(feature = "tls")]
pub use stream::Tls;
pub use stream::{Accept, PlainTcp};
pub use streams::{BodyError, RequestBody};
