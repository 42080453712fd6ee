//! # spillway-core
//!
//! The pure heart of spillway: rate limiting algorithms as state machines,
//! rules, and the all-or-none decision over several limits. No I/O, no
//! threads, no clock reads: time comes in as an argument ([`Nanos`]), and the
//! caller (a store) owns the state.
//!
//! ## Choosing an algorithm
//! - A rate with bursts, least memory: [`Gcra`] (8 bytes per key).
//! - A bucket users can save up in: [`TokenBucket`] (8 bytes).
//! - A queue size and outflow rate: [`LeakyBucket`] to reject, [`Shaper`] to delay.
//! - A quota per calendar window: [`FixedWindow`] (beware bursts at the boundary).
//! - "N in any W" exactly, N small: [`SlidingLog`] (4 bytes per logged request).
//! - "N per W" smoothly at scale: [`SlidingCounter`] (approximate, 16 bytes).
//!
//! ## Example
//! ```
//! use spillway_core::{Nanos, SlidingLog, Log};
//! // 5 login attempts in any minute.
//! let limit = SlidingLog::new(5, Nanos::from_secs(60))?;
//! let mut log = Log::new();
//! let now = Nanos::from_secs(1_000);
//! for _ in 0..5 {
//!     assert!(limit.decide(&log, now, 1).allowed);
//!     limit.commit(&mut log, now, 1);
//! }
//! let sixth = limit.decide(&log, now, 1);
//! assert!(!sixth.allowed);
//! assert_eq!(sixth.retry_after, Nanos::from_secs(60));
//! # Ok::<(), spillway_core::Error>(())
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod algo;
pub mod date;
pub mod decision;
pub mod elastic;
mod error;
mod ip;
mod path;
pub mod rule;
pub mod time;

pub use algo::{
    FixedWindow, Gcra, LeakyBucket, Limit, Log, MAX_DEBT, Rate, Shaper, SlidingCounter, SlidingLog,
    StateKind, TokenBucket, Verdict, Wide,
};
pub use decision::{Decision, Outcome, RuleDecision, RuleDecisions, StateView, charge, decide};
pub use elastic::{Elastic, Health, HealthGauge};
pub use error::{Error, ErrorKind};
pub use ip::{IpText, canonical_ip};
pub use path::{PathMatching, RequestPath, canonical_path, canonical_path_with};
pub use rule::{
    Attributes, FailPolicy, KeyPart, KeySpec, Mode, Priority, ResponseCost, Route, Rule,
    UNREADABLE_HEADER,
};
pub use time::{Clock, ManualClock, Nanos, parse_duration};
