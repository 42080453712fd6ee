//! spillway-server's integration tests, one binary: the real `spillway`
//! process on free loopback ports, real clients, real redis-server.

mod admin;
mod adversarial;
mod api;
mod client;
mod client_api;
mod client_outbound;
mod config;
mod contract;
mod credentials;
mod dashboard;
mod deploy;
mod elastic;
mod envoy_format;
mod forward_auth;
mod gateways;
mod grpc;
mod hardening;
mod http_wire;
mod ops;
mod otel;
mod proxy;
mod proxy_bounds;
mod redis;
mod rules_api;
mod rules_dir;
mod scale;
mod secrets;
mod simulate;
mod simulate_report;
mod smuggling;
mod stall;
mod sync;
mod tls;
mod util;
