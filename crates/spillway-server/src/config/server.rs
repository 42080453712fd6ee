//! `server:`: the connection bounds of every HTTP listener.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The `server:` section: connection bounds of every HTTP listener.
pub(super) fn server_limits(
    errs: &mut Collector<'_>,
    s: &Spanned<RawServer>,
) -> spillway_wire::Limits {
    let raw = &s.value;
    let mut l = default_limits();
    for (field, what, slot) in [
        (
            &raw.head_timeout,
            "server.head_timeout",
            &mut l.head_timeout,
        ),
        (
            &raw.idle_timeout,
            "server.idle_timeout",
            &mut l.idle_timeout,
        ),
        (
            &raw.body_timeout,
            "server.body_timeout",
            &mut l.body_timeout,
        ),
        (
            &raw.write_timeout,
            "server.write_timeout",
            &mut l.write_timeout,
        ),
    ] {
        if let Some(t) = field
            && let Some(d) = duration(errs, t, what, false)
        {
            *slot = d.into();
        }
    }
    if let Some(n) = &raw.max_connections
        && let Some(n) = count(errs, n, "server.max_connections")
    {
        l.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = &raw.max_streams
        && let Some(v) = count(errs, n, "server.max_streams")
    {
        match u32::try_from(v) {
            Ok(v) if v > 0 => l.max_streams = v,
            _ => errs.at(
                n,
                format!("server.max_streams: from 1 to {}, not {v}", u32::MAX),
            ),
        }
    }
    if let Some(n) = &raw.max_streams_total
        && let Some(v) = count(errs, n, "server.max_streams_total")
    {
        let v = usize::try_from(v).unwrap_or(usize::MAX);
        // Each HTTP/1.1 request on hyper holds a connection: a bound above
        // the connections would never be reached, and requests held open
        // would fill the connection cap before any share was consulted.
        if v > l.max_connections {
            errs.at(
                n,
                format!(
                    "server.max_streams_total {v} is more than the connections that can carry them (server.max_connections {}): set it to at most that",
                    l.max_connections
                ),
            );
        }
        l.max_streams_total = v;
    } else {
        // The default (4096) is the most; never more than the connections.
        l.max_streams_total = l.max_streams_total.min(l.max_connections);
    }
    if let Some(d) = raw.direct_path {
        l.direct_path = d;
    }
    if let Some(n) = &raw.listen_backlog
        && let Some(v) = count(errs, n, "server.listen_backlog")
    {
        match u32::try_from(v) {
            Ok(v) if v <= 65_535 => l.listen_backlog = v,
            _ => errs.at(
                n,
                format!("server.listen_backlog: from 1 to 65535, not {v}"),
            ),
        }
    }
    for (field, what, most, slot) in [
        (
            &raw.ipv4_prefix,
            "server.ipv4_prefix",
            32,
            &mut l.ipv4_prefix,
        ),
        (
            &raw.ipv6_prefix,
            "server.ipv6_prefix",
            128,
            &mut l.ipv6_prefix,
        ),
    ] {
        if let Some(n) = field
            && let Some(v) = count(errs, n, what)
        {
            match u8::try_from(v) {
                Ok(v) if v <= most => *slot = v,
                _ => errs.at(
                    n,
                    format!("{what}: a prefix length from 1 to {most}, not {v}"),
                ),
            }
        }
    }
    l
}

/// The bounds when the file sets none: the wire's defaults, with the
/// connections the process's descriptors allow and the stream bound
/// within them.
pub(super) fn default_limits() -> spillway_wire::Limits {
    let max_connections = default_max_connections();
    let d = spillway_wire::Limits::default();
    spillway_wire::Limits {
        max_connections,
        max_streams_total: d.max_streams_total.min(max_connections),
        ..d
    }
}

/// The descriptor budget for connections when the file sets none: the
/// process's descriptor limit less 64 for listeners, files and the
/// runtime; at least 64. Every connection the process holds counts
/// against it: clients of every listener, and what the process reserves
/// for its upstream pool and its store (see `spillway_wire::Budget`).
pub fn default_max_connections() -> usize {
    let nofile = crate::descriptor_limit().unwrap_or(1024);
    nofile.saturating_sub(64).max(64)
}

/// A listening address (`ADDR:PORT`); `example_port` goes in the message.
pub(super) fn address(
    errs: &mut Collector<'_>,
    l: &Spanned<String>,
    what: &str,
    example_port: u16,
) -> Option<SocketAddr> {
    match l.value.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.at(
                l,
                format!(
                    "{what} {:?} is not an address like 127.0.0.1:{example_port}",
                    l.value
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;

    fn server(yaml: &str) -> Result<spillway_wire::Limits, String> {
        parse("r.yaml", &format!("server: {yaml}\nrules: []\n"))
            .map(|c| c.server)
            .map_err(|e| e.to_string())
    }

    /// The flood settings of issue 35: defaults, values, and located
    /// errors for what cannot be honoured.
    #[test]
    fn backlog_prefixes_and_the_stream_bound() {
        let l = server("{ max_connections: 300 }").unwrap();
        assert_eq!(l.listen_backlog, 511);
        assert_eq!((l.ipv4_prefix, l.ipv6_prefix), (24, 64));
        assert_eq!(
            l.max_streams_total, 300,
            "the default within the connections"
        );
        let l = server("{ listen_backlog: 4096, ipv4_prefix: 32, ipv6_prefix: 48 }").unwrap();
        assert_eq!(l.listen_backlog, 4096);
        assert_eq!((l.ipv4_prefix, l.ipv6_prefix), (32, 48));
        for (bad, says) in [
            (
                "{ max_connections: 300, max_streams_total: 400 }",
                "max_streams_total 400 is more than",
            ),
            ("{ listen_backlog: 0 }", "listen_backlog must be at least 1"),
            ("{ listen_backlog: 70000 }", "from 1 to 65535"),
            ("{ ipv4_prefix: 33 }", "from 1 to 32"),
            ("{ ipv6_prefix: 129 }", "from 1 to 128"),
            ("{ ipv6_prefix: 0 }", "ipv6_prefix must be at least 1"),
        ] {
            let e = server(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.contains("r.yaml:1:"), "{bad}: located: {e}");
        }
    }
}
