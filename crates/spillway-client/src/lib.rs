//! # spillway-client
//!
//! The caller's side of rate limits.
//!
//! - [`headers`]: what a server says about its limits: `Retry-After`
//!   (seconds or an HTTP date), the IETF `RateLimit` / `RateLimit-Policy`
//!   structured fields, and `X-RateLimit-*`, read into one [`headers::Advice`].
//! - `honour` (feature `honour`, the default): a tower layer that waits when the server says the quota
//!   is spent and retries idempotent requests after a 429 or 503 as advised.
//! - `outbound` (feature `outbound`): limit your own outbound calls with spillway's rules
//!   and algorithms, in-process, through Redis or through a spillway
//!   server, so you stay within a third party's published limits.
//! - [`events`]: metrics hooks: retries, waits, local refusals.
//! - `adaptive` (feature `adaptive`): adaptive client-side throttling, so an overloaded backend
//!   is not hammered by retries.
//! - `api` (feature `api`): a typed client for spillway's own decision API.
//!
//! ## Features
//!
//! Each part is a cargo feature, so a program takes only what it uses:
//! `honour` (the default: lean, no YAML reader, store or HTTP client),
//! `adaptive`, `outbound` (brings spillway's rules reader and store) and
//! `api` (brings hyper-util and serde). `headers` and `events` are always
//! there. With `outbound` and `api` together, a spillway server can be the
//! outbound `Decider`.

#![warn(missing_docs, unreachable_pub)]

#[cfg(feature = "adaptive")]
pub mod adaptive;
#[cfg(feature = "api")]
pub mod api;
pub mod events;
pub mod headers;
#[cfg(feature = "honour")]
pub mod honour;
#[cfg(feature = "outbound")]
pub mod outbound;

/// docs/CLIENT.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/CLIENT.md")]
pub struct ClientDoc;
