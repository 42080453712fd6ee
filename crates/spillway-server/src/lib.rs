//! # spillway-server
//!
//! The running spillway service, as a library (the `spillway` binary's
//! `serve` and `proxy`), one folder per way in:
//!
//! - [`api`]: the decision API (`POST /v1/check`, `GET /v1/limit`);
//! - [`proxy`]: the reverse proxy (its phases written once, two transports);
//! - [`grpc`]: the Envoy rate limit service;
//! - [`admin`]: metrics, health, status and rules;
//! - [`config`]: the rules file, read into each way in's settings;
//!
//! Ways in never import `config` or each other; each gets a [`Shared`]
//! handle (the limiter and the event sink) and what it needs besides.
//! [`run`] and [`run_proxy`] take their listener and a shutdown future, so
//! tests start them on port 0 in-process; the `spillway` crate only parses
//! flags.

pub mod admin;
pub mod api;
mod app;
pub mod config;
pub mod credentials;
pub mod decide;
pub mod events;
pub mod grpc;
pub mod health;
mod housekeeping;
pub mod identity;
mod json;
pub mod metrics;
pub mod os;
pub mod proxy;
mod reload;
mod stopping;

mod store;
pub mod tls;
pub mod trace;
pub mod xds;

pub(crate) use app::serve_router;
pub use app::{Routed, ServeOptions, Shared, rule_set, run, run_proxy};
pub(crate) use os::unix_ms;
pub use os::{before_park, descriptor_limit, raise_descriptor_limit, shutdown_signal};
pub use store::ServerStore;

#[cfg(test)]
mod tests;
