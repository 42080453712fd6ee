//! Store gauges for /metrics: Redis (connection, circuit breaker) and
//! local-first sync (links, pushes, pulls).

#[allow(clippy::wildcard_imports)]
use super::*;

/// Whether Redis answers, as Prometheus gauges: `spillway_redis_connected`
/// (1 when connected and the circuit breaker is not open) and
/// `spillway_redis_breaker_state`, one-hot over closed, open and
/// half_open.
pub fn redis_gauges(connected: bool, breaker: spillway_redis::BreakerState) -> String {
    use spillway_redis::BreakerState;
    let mut out = String::new();
    let up = connected && breaker != BreakerState::Open;
    let _ = writeln!(
        out,
        "# HELP spillway_redis_connected 1 when connected to Redis and calls go through (the circuit breaker not open); 0 before the first connection and while the breaker is open.\n# TYPE spillway_redis_connected gauge\nspillway_redis_connected {}",
        u8::from(up)
    );
    let _ = writeln!(
        out,
        "# HELP spillway_redis_breaker_state The Redis circuit breaker, one-hot: closed (calls go through), open (calls fail at once), half_open (one probe call under way).\n# TYPE spillway_redis_breaker_state gauge"
    );
    for (name, state) in [
        ("closed", BreakerState::Closed),
        ("open", BreakerState::Open),
        ("half_open", BreakerState::HalfOpen),
    ] {
        let _ = writeln!(
            out,
            "spillway_redis_breaker_state{{state=\"{name}\"}} {}",
            u8::from(breaker == state)
        );
    }
    out
}

/// The sync's gauges, per store (region), as Prometheus text: how far
/// behind each link is, what waits to be counted there, and whether this
/// instance decides on its share.
pub fn sync_metrics(st: &spillway_sync::SyncStatus) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, rows: &mut dyn Iterator<Item = (String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in rows {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let region = |l: &spillway_sync::LinkStatus| {
        format!(
            "{{region=\"{}\",home=\"{}\"}}",
            l.region.replace(['"', '\\', '\n'], "_"),
            l.home
        )
    };
    let per_link = |f: &dyn Fn(&spillway_sync::LinkStatus) -> f64| {
        st.links
            .iter()
            .map(|l| (region(l), f(l)))
            .collect::<Vec<_>>()
            .into_iter()
    };
    gauge(
        "spillway_sync_lag_seconds",
        "Time since the last exchange a store answered (0: never answered).",
        &mut per_link(&|l| l.lag_ms as f64 / 1000.0),
    );
    gauge(
        "spillway_sync_last_success_timestamp_seconds",
        "Unix time of the last exchange a store answered.",
        &mut per_link(&|l| l.last_ok_unix_ms as f64 / 1000.0),
    );
    gauge(
        "spillway_sync_round_trip_seconds",
        "Round trip of the last exchange a store answered.",
        &mut per_link(&|l| l.rtt_us as f64 / 1e6),
    );
    gauge(
        "spillway_sync_deltas_waiting",
        "Units admitted here that a store has not counted yet.",
        &mut per_link(&|l| l.deltas_waiting as f64),
    );
    gauge(
        "spillway_sync_keys_synced",
        "Keys the last exchange with a store carried.",
        &mut per_link(&|l| l.keys_synced as f64),
    );
    gauge(
        "spillway_sync_failures",
        "Failed exchanges with a store in a row.",
        &mut per_link(&|l| f64::from(l.failures)),
    );
    gauge(
        "spillway_sync_share_active",
        "1 while the store is unreachable and this instance enforces its share of every limit.",
        &mut std::iter::once((String::new(), f64::from(u8::from(st.sharing)))),
    );
    gauge(
        "spillway_sync_live_instances",
        "Live instances last seen through the store's heartbeats (the N of limit / N).",
        &mut std::iter::once((String::new(), st.live as f64)),
    );
    gauge(
        "spillway_sync_keys",
        "Keys this instance tracks for the sync.",
        &mut std::iter::once((String::new(), st.keys as f64)),
    );
    out
}
