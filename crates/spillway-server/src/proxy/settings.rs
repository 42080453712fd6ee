//! The proxy's settings (`proxy:`, with flags over it) and its checked
//! upstream URL, as `config/` builds them.

use std::net::SocketAddr;
use std::time::Duration;

use http::Uri;

use super::{ConcurrencySettings, IpNet, UserSource};

/// The proxy's settings: the `proxy:` section, with flags over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where admitted requests go.
    pub upstream: Option<UpstreamUrl>,
    /// Connections open to the upstream at most
    /// (`proxy.upstream.max_connections`); `None`: derived from the
    /// connection budget ([`default_upstream_connections`]).
    pub max_connections: Option<usize>,
    /// Where the user identity comes from.
    pub user: Option<UserSource>,
    /// Peers whose `Forwarded` / `X-Forwarded-For` are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Longest wait for the upstream's response head, and for each part of
    /// its body.
    pub timeout: Duration,
    /// Where `spillway proxy` listens (before the file's `listen`).
    pub listen: Option<SocketAddr>,
    /// Where `spillway proxy` serves the admin API (metrics, health,
    /// status, rules), which its own address forwards upstream.
    pub admin_listen: Option<SocketAddr>,
    /// Upgrade protocols passed through (lower case); others are served as
    /// plain requests. `h2c` is never among them.
    pub upgrades: Vec<String>,
    /// The in-flight limit to the upstream (`proxy.concurrency`), if any.
    pub concurrency: Option<ConcurrencySettings>,
    /// Request bodies up to this many bytes are read whole before the
    /// request takes an in-flight slot or an upstream connection
    /// (`proxy.buffer_body`; 0: never).
    pub buffer_body: usize,
}

/// The most `proxy.buffer_body` may be: each buffered request holds that
/// much memory while its body arrives.
pub const MOST_BUFFERED: usize = 16 * 1024 * 1024;

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            upstream: None,
            max_connections: None,
            user: None,
            trusted_proxies: Vec::new(),
            timeout: Duration::from_secs(30),
            listen: None,
            admin_listen: None,
            upgrades: vec!["websocket".to_string()],
            concurrency: None,
            buffer_body: 64 * 1024,
        }
    }
}

/// An upstream URL, checked once: `http://host[:port][/base]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    uri: Uri,
    authority: String,
    base: String,
}

impl UpstreamUrl {
    /// Parses and checks an upstream URL.
    ///
    /// # Errors
    /// Not an `http://` URL with a host, or one with a query.
    pub fn parse(s: &str) -> Result<UpstreamUrl, String> {
        let uri: Uri = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
            return Err(format!("{s:?}: expected http://host[:port][/path]"));
        };
        if uri.scheme_str() != Some("http") || uri.query().is_some() {
            return Err(format!("{s:?}: expected http://host[:port][/path]"));
        }
        let port = uri.port_u16().unwrap_or(80);
        Ok(UpstreamUrl {
            authority: format!("{host}:{port}"),
            base: uri.path().trim_end_matches('/').to_string(),
            uri,
        })
    }

    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The path every target is put under (no trailing `/`; may be empty).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// As given.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }
}

impl std::fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.uri.fmt(f)
    }
}

/// `proxy.upstream.max_connections` when the file sets none: a quarter of
/// the connection budget (`server.max_connections`, itself derived from
/// the descriptor limit), at least 8: each proxied request may hold an
/// upstream connection, and the rest of the descriptors serve clients,
/// Redis and the other listeners.
pub fn default_upstream_connections(server_max_connections: usize) -> usize {
    (server_max_connections / 4).max(8)
}
