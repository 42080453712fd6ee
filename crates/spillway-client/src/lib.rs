//! # spillway-client
//!
//! The caller's side of rate limits.
//!
//! - [`headers`]: what a server says about its limits: `Retry-After`
//!   (seconds or an HTTP date), the IETF `RateLimit` / `RateLimit-Policy`
//!   structured fields, and `X-RateLimit-*`, read into one [`headers::Advice`].

pub mod headers;
