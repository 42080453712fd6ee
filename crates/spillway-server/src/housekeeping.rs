//! The service's background rounds: the memory store's sweep and the
//! admin plane's housekeeping, each until the stop signal.

use std::sync::Arc;
use std::time::Duration;

use crate::admin::{self, AdminState};
use crate::app::Shared;
use spillway_store::Store as _;

use crate::os::unix_ms;

/// Sweeps idle keys once a second, on a blocking thread: a sweep touches
/// every shard and would otherwise stall the requests queued on the worker
/// that runs it (it showed as a 4 ms p99 under load).
pub(crate) async fn maintain(shared: Shared, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let shared = shared.clone();
                let _ = tokio::task::spawn_blocking(move || shared.limiter.store().maintain()).await;
            }
            _ = stop.changed() => return,
        }
    }
}

/// The admin plane's housekeeping: every second the top keys' minute,
/// expired overrides and other instances' changes (see
/// [`AdminState::tick`]); every [`admin::series::STEP`] a point of the
/// dashboard's chart; every [`admin::HEALTH_EVERY`] the health elastic
/// rules read.
pub(crate) async fn admin_housekeeping(
    admin: Arc<AdminState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut step = tokio::time::interval(admin::series::STEP);
    step.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The API rules' pull from Redis, on its own: every 250 ms.
    tokio::spawn(admin::rules_api::follow(admin.clone(), stop.clone()));
    // Its own task: a slow Redis read in `tick` must not hold elastic
    // rules at a stale health.
    let health_admin = admin.clone();
    let mut health_stop = stop.clone();
    tokio::spawn(async move {
        let mut health = tokio::time::interval(admin::HEALTH_EVERY);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = health.tick() => health_admin.shared.health.set(health_admin.health_now()),
                _ = health_stop.changed() => return,
            }
        }
    });
    loop {
        tokio::select! {
            _ = tick.tick() => admin.tick().await,
            _ = step.tick() => admin.series.record(unix_ms(), admin.shared.events.rule_totals()),
            _ = stop.changed() => return,
        }
    }
}
