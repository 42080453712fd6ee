//! Hot reload: poll the rules file (read it each tick and compare: a rules
//! file is small, and size and mtime alone miss an edit that keeps the size
//! within the filesystem's timestamp tick) and reload at once on SIGHUP. A
//! file that fails validation is rejected whole; the last good rules stay
//! in force.

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Source;
use crate::{AppState, ServeOptions, rule_set, unix_ms};

pub(crate) async fn watch(
    state: Arc<AppState>,
    opts: ServeOptions,
    mut stop: watch::Receiver<bool>,
) {
    let mut paths: Vec<std::path::PathBuf> = opts.envoy_files.clone();
    if let Source::File(p) = &opts.source {
        paths.push(p.clone());
    }
    let read_all = |paths: &[std::path::PathBuf]| -> Vec<Option<String>> {
        paths
            .iter()
            .map(|p| std::fs::read_to_string(p).ok())
            .collect()
    };
    let mut last_text = read_all(&paths);
    let mut tick = tokio::time::interval(opts.poll_interval);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let sighup = async {
            match hup.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let sighup = std::future::pending::<()>();
        let forced = tokio::select! {
            _ = tick.tick() => false,
            () = sighup => true,
            _ = stop.changed() => return,
        };
        if paths.is_empty() {
            continue;
        }
        let text = read_all(&paths);
        if !forced && text == last_text {
            continue;
        }
        last_text = text;
        reload(&state, &opts);
    }
}

/// Loads the source again and swaps the rules in if it is valid.
pub(crate) fn reload(state: &AppState, opts: &ServeOptions) {
    match ServeOptions::load(&opts.source, &opts.envoy_files) {
        Ok(config) => {
            state
                .envoy
                .store(Arc::new(crate::envoy::Domains::new(config.domains.clone())));
            let version = state.limiter.rules().version + 1;
            let set = rule_set(&config, version);
            state.metrics.rules_changed(&set);
            state.limiter.replace_rules(set);
            state.metrics.reloaded();
            let mut r = state.reload.lock();
            r.last_error = None;
            r.last_reload_unix_ms = unix_ms();
            let names: Vec<&str> = config.rules.iter().map(|r| r.name()).collect();
            tracing::info!(version, rules = ?names, "rules reloaded");
        }
        Err(e) => {
            state.metrics.reload_failed();
            state.reload.lock().last_error = Some(e.to_string());
            tracing::error!("rules file rejected, keeping the last good rules:\n{e}");
        }
    }
}
