//! A listener's time and connection bounds.

use std::time::Duration;

/// Time and connection bounds of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request head must arrive in full within this, from its first byte.
    pub head_timeout: Duration,
    /// A connection may wait this long for its next request (and a hyper
    /// connection this long with nothing moving either way).
    pub idle_timeout: Duration,
    /// A request's whole body must arrive within this, from the end of its
    /// head, on every path (direct, hyper's HTTP/1.1, HTTP/2 streams,
    /// TLS); bytes arriving do not extend it.
    pub body_timeout: Duration,
    /// Each write of an answer must be taken by the client within this.
    pub write_timeout: Duration,
    /// Most connections open at once (for [`serve`](super::serve) and
    /// [`serve_on`](super::serve_on); [`serve_in`](super::serve_in) takes
    /// the process's [`Budget`](crate::budget::Budget) instead).
    pub max_connections: usize,
    /// Most requests in flight on one HTTP/2 connection (its
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_streams: u32,
    /// Most requests in flight on hyper connections process-wide (see
    /// [`Budget`](crate::budget::Budget); for [`serve`](super::serve) and
    /// [`serve_on`](super::serve_on), like `max_connections`). Never more
    /// than the client connections: the budget lowers it to them.
    pub max_streams_total: usize,
    /// How long shutdown waits for requests in flight.
    pub drain_timeout: Duration,
    /// Whether plain requests take the direct path; `false` hands every
    /// connection to hyper from its first byte (for operators who want one
    /// HTTP implementation only, and for tests that compare the two).
    pub direct_path: bool,
    /// Whether the listener speaks HTTP/2 only (gRPC): an HTTP/1.1 request
    /// ends its connection.
    pub http2_only: bool,
    /// Connections the kernel queues for accepting (the listen backlog):
    /// 511, as nginx, where Tokio's 128 filled under a reconnecting flood
    /// and left legitimate clients waiting for SYN retransmits. The
    /// kernel caps it at `net.core.somaxconn`.
    pub listen_backlog: u32,
    /// Prefix length by which IPv4 clients are grouped into one network
    /// for fair shares of connections and streams (consulted only at the
    /// connection cap or the stream bound).
    pub ipv4_prefix: u8,
    /// As `ipv4_prefix`, for IPv6: 64, the prefix a single subscriber
    /// usually holds whole.
    pub ipv6_prefix: u8,
    /// How long a connection handed to hyper may live (gRPC's
    /// `MaxConnectionAge`): past it, plus up to a tenth more at random (so
    /// connections opened together do not all leave together), it is told
    /// to go (HTTP/2 GOAWAY; HTTP/1.1 closes after its answer) and calls
    /// in flight have `max_connection_age_grace` to finish. Long-lived
    /// client connections (Envoy's) thus move to new instances after a
    /// scale-out. `None`: no bound.
    pub max_connection_age: Option<Duration>,
    /// After `max_connection_age`, how long calls in flight may take
    /// before the connection is closed under them.
    pub max_connection_age_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            max_streams: 100,
            max_streams_total: 4096,
            drain_timeout: Duration::from_secs(30),
            direct_path: true,
            http2_only: false,
            listen_backlog: 511,
            ipv4_prefix: 24,
            ipv6_prefix: 64,
            max_connection_age: None,
            max_connection_age_grace: Duration::from_secs(3600),
        }
    }
}
