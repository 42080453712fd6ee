//! `server:`: the connection bounds of every HTTP listener.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The `server:` section: connection bounds of every HTTP listener.
pub(super) fn server_limits(
    errs: &mut Collector<'_>,
    s: &Spanned<RawServer>,
) -> spillway_wire::Limits {
    let raw = &s.value;
    let mut l = spillway_wire::Limits {
        max_connections: default_max_connections(),
        ..spillway_wire::Limits::default()
    };
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
        l.max_streams_total = usize::try_from(v).unwrap_or(usize::MAX);
    }
    if let Some(d) = raw.direct_path {
        l.direct_path = d;
    }
    l
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
