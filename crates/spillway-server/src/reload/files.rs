//! A reload of a configuration in parts: only the files whose change is
//! due are read; a file that fails keeps its last good version (or gives
//! nothing, if it never had one) and the others apply; `/v1/status`
//! lists the files that failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::track::Due;
use super::{Reloader, apply, store_domains};
use crate::ServeOptions;
use crate::config::{Config, FilesStatus, Preread, RuleFiles};

/// The changes a reload applies.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Everything is read (a SIGHUP).
    all: bool,
    /// The files not in parts changed (`--envoy-config`, a single rules
    /// file).
    rest: bool,
    /// Files in parts whose change is due.
    parts: Vec<PathBuf>,
    /// Files in parts still being written: not read, even when the
    /// settings change.
    waiting: Vec<PathBuf>,
}

impl Batch {
    pub(super) fn all() -> Batch {
        Batch {
            all: true,
            ..Batch::default()
        }
    }

    pub(super) fn of(due: Due, waiting: Vec<PathBuf>) -> Batch {
        Batch {
            all: false,
            rest: due.rest,
            parts: due.parts,
            waiting,
        }
    }

    /// The files this reload reads, as the status names them (`None`:
    /// every file).
    fn read(&self) -> Option<std::collections::HashSet<String>> {
        (!self.all).then(|| self.parts.iter().map(|p| p.display().to_string()).collect())
    }
}

/// The files of a configuration in parts, shared by the watcher and
/// whoever read them.
pub(super) type Parts = Arc<Mutex<RuleFiles>>;

/// At the watcher's start: the configuration as the files are (what
/// start-only settings are compared with, before flags) and, for a
/// configuration in parts, its files as read, kept for reloads: those
/// `serve` read (then every edit since is a change, see
/// [`at_start`](super::at_start)), else read now.
pub(super) fn open(opts: &ServeOptions) -> (Config, Option<Parts>) {
    if let Some(parts) = &opts.parts {
        let started = parts.lock().config();
        return (
            started.unwrap_or_else(|| opts.config.clone()),
            Some(parts.clone()),
        );
    }
    match RuleFiles::open(&opts.source, &Preread::default()) {
        None => {
            // A single file: as `serve` read it, else read again.
            let started = match &opts.as_read {
                Some(read) => Config::clone(read),
                None => crate::config::load_all(
                    &opts.source,
                    &opts.envoy_files,
                    opts.config.merge_domains,
                )
                .unwrap_or_else(|_| opts.config.clone()),
            };
            (started, None)
        }
        Some((files, errors)) => {
            if !errors.is_empty() {
                // Changed since `serve` read them: shown in the status.
                tracing::warn!(
                    "a rules file changed while spillway started and is not valid now:\n{}",
                    crate::config::ConfigErrors(errors)
                );
            }
            let started = files.config().unwrap_or_else(|| opts.config.clone());
            (started, Some(Arc::new(Mutex::new(files))))
        }
    }
}

/// Shows the files' state in `/v1/status`.
pub(super) fn show(state: &Reloader, files: &RuleFiles) {
    let st = files.status();
    let mut r = state.status.lock();
    r.last_error = summary(&st, None);
    r.rules_files = Some(st);
}

/// Reads the files `batch` names and puts the configuration they make in
/// force; returns the quiet period of the settings in force.
pub(super) fn reload(
    state: &Reloader,
    opts: &ServeOptions,
    started: &Config,
    dirs: &[PathBuf],
    files: &mut RuleFiles,
    batch: &Batch,
) -> Option<Duration> {
    let changed = (!batch.all).then_some(batch.parts.as_slice());
    let refreshed = files.refresh(changed, &|p: &Path| batch.waiting.iter().any(|w| w == p));
    let st = files.status();
    let mut failed = false;
    let read = batch.read();
    for b in st
        .bad
        .iter()
        .filter(|b| read.as_ref().is_none_or(|r| r.contains(&b.file)))
    {
        failed = true;
        let keeps = if b.last_good_in_force {
            "keeping its last good version"
        } else {
            "it gives no rules"
        };
        tracing::error!(file = %b.file, "rules file rejected, {keeps}:\n{}", b.error);
    }
    if let Some(p) = &st.dir_problem {
        failed = true;
        tracing::error!("{p}");
    }
    if failed {
        state.shared.events.reload_failed();
    }
    let Some(mut config) = files.config() else {
        // The main file never read well (it changed while spillway
        // started): nothing to compose until it does.
        let mut r = state.status.lock();
        r.last_error = summary(&st, None);
        r.rules_files = Some(st);
        return None;
    };
    config.merge_domains = opts.config.merge_domains;
    let mut envoy_error = None;
    if batch.all || batch.rest || refreshed.settings_changed {
        match crate::config::with_envoy(
            &mut config,
            &opts.source.name(),
            &opts.envoy_files,
            opts.config.merge_domains,
            dirs,
        ) {
            Ok(gone) => {
                for f in &gone {
                    tracing::warn!(file = %f.display(), "envoy config file is gone: its domain is dropped");
                }
                store_domains(state, &config);
            }
            Err(e) => {
                tracing::error!("envoy config rejected, keeping the last good domains:\n{e}");
                state.shared.events.reload_failed();
                envoy_error = Some(e.to_string());
            }
        }
    }
    if refreshed.changed || batch.all || batch.rest {
        // The first 20: a SIGHUP of a thousand files is one line.
        let shown: Vec<String> = if batch.all {
            vec!["(every file)".into()]
        } else {
            batch
                .parts
                .iter()
                .take(20)
                .map(|p| p.display().to_string())
                .collect()
        };
        tracing::info!(files = ?shown, count = batch.parts.len(), "rules files read");
        apply(state, &config, started);
    }
    let mut r = state.status.lock();
    r.last_error = summary(&st, envoy_error);
    r.rules_files = Some(st);
    Some(config.reload_quiet)
}

/// The files shown in `last_reload_error`; `rules_files.bad` lists more.
const SUMMARY_FILES: usize = 10;

/// `last_reload_error`: what is not in force now, `None` when all is.
fn summary(st: &FilesStatus, envoy: Option<String>) -> Option<String> {
    let mut parts: Vec<String> = st.dir_problem.iter().cloned().collect();
    parts.extend(st.bad.iter().take(SUMMARY_FILES).map(|b| b.error.clone()));
    if st.bad.len() > SUMMARY_FILES {
        parts.push(format!(
            "... and {} more files (rules_files.bad)",
            st.bad.len() - SUMMARY_FILES
        ));
    }
    parts.extend(envoy);
    (!parts.is_empty()).then(|| parts.join("\n"))
}
