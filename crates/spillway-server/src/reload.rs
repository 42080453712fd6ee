//! Hot reload: watch the rules files' directories (inotify on Linux: a
//! change is seen at once, whether the file is written in place or replaced
//! by a rename, as editors and config management do), poll them as a
//! fallback (read each tick and compare: a rules file is small, and size and
//! mtime alone miss an edit that keeps the size within the filesystem's
//! timestamp tick; a directory's many files are read again only when they
//! may have changed, see [`snap`]), and reload at once on SIGHUP. A file
//! that fails validation is rejected whole; the last good rules stay in
//! force.
//!
//! A changed file applies only once it has stayed unchanged for the quiet
//! period (`reload.quiet`, 2 s by default): a writer that truncates the
//! file, then writes it in pieces, shows every prefix of it on the way,
//! and a prefix cut between two rules is a valid file with fewer limits.
//! A file without a `rules:` key (an empty one, a truncated one) never
//! replaces the rules: `rules: []` says "no rules" explicitly.
//!
//! An `--envoy-config` directory is listed again each time: a file added to
//! it brings its domain, a file removed takes its domain away (as
//! envoyproxy/ratelimit's runtime directory does), and so does an
//! `--envoy-config` file that is gone; a directory that is gone keeps the
//! last good configuration.
//!
//! A configuration in parts (`--config DIR`, `rules_dir:`) is read file by
//! file ([`RuleFiles`](crate::config::RuleFiles)): each changed file waits
//! for its own quiet period and is then read alone, and a file that fails
//! keeps its last good version while the others apply (see
//! [`files`]).

mod files;
mod snap;
mod track;

use std::sync::Arc;

use tokio::sync::watch;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use std::path::PathBuf;

use crate::admin::ReloadStatus;
use crate::config::Source;
use crate::grpc::Domains;
use crate::{ServeOptions, Shared, rule_set, unix_ms};

/// What a reload replaces.
#[derive(Debug)]
pub(crate) struct Reloader {
    pub(crate) shared: Shared,
    pub(crate) domains: Arc<ArcSwap<Domains>>,
    pub(crate) status: Arc<Mutex<ReloadStatus>>,
    /// The admin plane: tokens, plans and per-key rules follow the file.
    pub(crate) admin: Arc<crate::admin::AdminState>,
    /// With an xDS client, where a reload's domains go: beside the ones
    /// received over xDS.
    pub(crate) xds: Option<Arc<crate::xds::Sources>>,
    /// SIGHUP, taken over before the server says it listens: a SIGHUP
    /// that came before the handler was installed would end the process.
    #[cfg(unix)]
    pub(crate) hup: Option<tokio::signal::unix::Signal>,
}

pub(crate) use snap::Snapshot;
use snap::{Digest, Hashed};
pub(crate) use track::Tracker;

/// The files [`watch`] watches: a directory stands for its files.
fn watched(opts: &ServeOptions) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = opts.envoy_files.clone();
    match &opts.source {
        Source::File(p) => {
            paths.push(p.clone());
            // Resolved by the loader; a change to it waits for a restart.
            paths.extend(opts.config.rules_dir.clone());
        }
        Source::Dir(d) => paths.push(d.clone()),
        Source::Example => {}
    }
    paths
}

/// The watched files as they are at start, for [`watch`]: taken before
/// the service answers, so every later edit is a change. The files of a
/// configuration in parts are as they were read: an edit made since (a
/// file added, changed or removed while spillway started) is a change.
pub(crate) fn at_start(opts: &ServeOptions) -> Snapshot {
    let mut snap = Hashed::default().snapshot(&watched(opts));
    if let Some(parts) = &opts.parts {
        let parts = parts.lock();
        snap.retain(|(p, _)| !parts.holds(p));
        snap.extend(parts.digests());
    }
    snap
}

/// [`Hashed::snapshot`] on a blocking thread: reading and hashing a
/// large file must not hold a worker that decides requests.
async fn snapshot_off(paths: &Arc<Vec<PathBuf>>, hashed: &Arc<Mutex<Hashed>>) -> Snapshot {
    let (paths, hashed) = (paths.clone(), hashed.clone());
    tokio::task::spawn_blocking(move || hashed.lock().snapshot(&paths))
        .await
        .unwrap_or_default()
}

/// Watches the rules files and reloads them. Every read, parse and build
/// runs on a blocking thread ([`tokio::task::spawn_blocking`]): the new
/// rule set is built beside the one in force, which decides every request
/// meanwhile, and is swapped in at once when whole; the old one is freed
/// there too (see [`Limiter::replace_rules`](spillway_store::Limiter::replace_rules)).
pub(crate) async fn watch(
    mut state: Reloader,
    opts: ServeOptions,
    considered: Snapshot,
    mut stop: watch::Receiver<bool>,
) {
    let paths = Arc::new(watched(&opts));
    // The files as last considered (applied or rejected), and the changes
    // waiting for their quiet period. Taken by the caller before the
    // service answers ([`at_start`]): taken here, on a busy machine, it
    // could see an edit made after the start and never consider it.
    let mut tracker = Tracker::new(&considered);
    let mut quiet = opts.config.reload_quiet;
    // The files as they were at start, before flags: start-only settings
    // are compared with these (the running settings carry the flags, which
    // a reloaded file does not, and would always look changed).
    // The rules themselves are not needed here (a reload reads them
    // again): a million of them would be held twice more for nothing.
    // A configuration in parts is read here file by file, and kept so.
    let mut opts = opts;
    opts.config.rules = Vec::new();
    let (started, parts) = {
        let o = opts.clone();
        let fallback = opts.config.clone();
        let (mut started, parts) = tokio::task::spawn_blocking(move || files::open(&o))
            .await
            .unwrap_or_else(|_| (fallback, None));
        started.rules = Vec::new();
        (started, parts)
    };
    opts.as_read = None;
    opts.parts = None;
    if let Some(p) = &parts {
        files::show(&state, &p.lock());
    }
    // The `--envoy-config` paths that are directories: one that goes away
    // later fails the reload rather than dropping its domains.
    let dirs: Vec<PathBuf> = opts
        .envoy_files
        .iter()
        .filter(|p| p.is_dir())
        .cloned()
        .collect();
    let mut watcher = Watcher::new(&paths);
    let hashed = Arc::new(Mutex::new(Hashed::default()));
    let mut tick = tokio::time::interval(opts.poll_interval);
    #[cfg(unix)]
    let mut hup = state.hup.take();
    let work = Arc::new((state, opts, started, dirs, parts));
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
        // Wakes when a change waiting has been quiet long enough (then the
        // file is read once more: it applies only if still the same).
        let wake = tracker.wake_at(quiet);
        let settled = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending::<()>().await,
            }
        };
        let forced = tokio::select! {
            _ = tick.tick() => false,
            () = watcher.changed() => false,
            () = settled => false,
            () = sighup => true,
            _ = stop.changed() => return,
        };
        if paths.is_empty() {
            continue;
        }
        let text = snapshot_off(&paths, &hashed).await;
        let batch = if forced {
            tracker.consider_all(&text);
            files::Batch::all()
        } else {
            let w = work.clone();
            let is_part =
                move |p: &std::path::Path| w.4.as_ref().is_some_and(|f| f.lock().holds(p));
            let due = tracker.observe(&text, tokio::time::Instant::now(), quiet, &is_part);
            if due.is_empty() {
                continue;
            }
            files::Batch::of(due, tracker.waiting_parts())
        };
        let w = work.clone();
        let applied = tokio::task::spawn_blocking(move || {
            let (state, opts, started, dirs, parts) = &*w;
            match parts {
                Some(p) => files::reload(state, opts, started, dirs, &mut p.lock(), &batch),
                None => reload(state, opts, started, dirs),
            }
        })
        .await;
        if let Ok(Some(q)) = applied {
            quiet = q;
        }
    }
}

/// Loads the source again and swaps the rules in if it is valid and
/// has a `rules:` key; returns the new file's quiet period if it applied.
pub(crate) fn reload(
    state: &Reloader,
    opts: &ServeOptions,
    started: &crate::config::Config,
    dirs: &[PathBuf],
) -> Option<std::time::Duration> {
    // A file without `rules:` is refused there, as at start.
    let loaded = crate::config::reload_all(
        &opts.source,
        &opts.envoy_files,
        opts.config.merge_domains,
        dirs,
    );
    match loaded {
        Ok((config, gone)) => {
            for f in &gone {
                tracing::warn!(file = %f.display(), "envoy config file is gone: its domain is dropped");
            }
            store_domains(state, &config);
            apply(state, &config, started);
            state.status.lock().last_error = None;
            Some(config.reload_quiet)
        }
        Err(e) => {
            state.shared.events.reload_failed();
            state.status.lock().last_error = Some(e.to_string());
            tracing::error!("rules file rejected, keeping the last good rules:\n{e}");
            None
        }
    }
}

/// Puts `config`'s gRPC domains in force.
fn store_domains(state: &Reloader, config: &crate::config::Config) {
    // With xDS, the file's domains go beside the xDS ones (which a
    // comparison with the file's alone would show as dropped).
    if let Some(sources) = &state.xds {
        sources.set_file(config.domains.clone());
        return;
    }
    let domains = Domains::new(config.domains.clone());
    let before = state.domains.load();
    let (old, new) = (before.names(), domains.names());
    if old != new {
        let dropped: Vec<&str> = old.iter().filter(|d| !new.contains(d)).copied().collect();
        let added: Vec<&str> = new.iter().filter(|d| !old.contains(d)).copied().collect();
        tracing::info!(?added, ?dropped, "gRPC domains changed");
    }
    drop(before);
    state.domains.store(Arc::new(domains));
}

/// Puts `config`'s rules and reloadable settings in force, and says so
/// (the log, `/v1/status`); `started` tells what waits for a restart.
fn apply(state: &Reloader, config: &crate::config::Config, started: &crate::config::Config) {
    let version = state.shared.limiter.rules().version + 1;
    let set = rule_set(config, version, &state.shared.health);
    swap_in_with_api_rules(state, config, set);
    state
        .admin
        .reloaded(&config.admin, &config.plans, &config.health);
    state.shared.api_tokens.set(config.api.tokens.clone());
    state.shared.events.reloaded();
    let mut r = state.status.lock();
    r.last_reload_unix_ms = unix_ms();
    r.secrets = config.secrets.clone();
    // A name may come from `${NAME}`: the log shows the reference.
    // The first 100: a million names would be one 20 MB line.
    let names: Vec<String> = config
        .rules
        .iter()
        .take(100)
        .map(|r| config.secrets.redact(r.name()).into_owned())
        .collect();
    tracing::info!(version, count = config.rules.len(), rules = ?names, "rules reloaded");
    let waiting = started.start_only_changes(config);
    r.restart_pending.clone_from(&waiting);
    drop(r);
    if !waiting.is_empty() {
        tracing::warn!(
            settings = ?waiting,
            "the rules file changes settings that apply only at start; restart spillway to apply them (the rules are in force)"
        );
    }
}

/// Puts the file's rule set `set` in force together with the rules made
/// over the admin API (issue 36's seam: file rules and API rules are
/// composed in `admin::rules_api`, until the rule set is rebuilt from
/// every source here).
///
/// Called from [`reload`], which [`watch`] runs on a blocking thread: the
/// composition (a copy of the file's rule handles, 16 bytes each, plus
/// the API rules) and the new set's route index are built there, beside
/// the set in force, and swapped in by
/// [`Limiter::replace_rules`](spillway_store::Limiter::replace_rules),
/// which also frees the old set there. The file's `set` arrives without
/// an index (built on first use), so keeping it aside costs its handles
/// only. A caller on an async worker with many rules should go through
/// `spawn_blocking` as well.
fn swap_in_with_api_rules(
    state: &Reloader,
    config: &crate::config::Config,
    set: spillway_store::RuleSet,
) {
    crate::admin::rules_api::swap_in(&state.admin, set, api_rules_context(config));
}

/// What a rule made over the admin API is read against: the rules
/// file's `descriptors:` and `path_matching:`.
pub(crate) fn api_rules_context(
    config: &crate::config::Config,
) -> crate::admin::rules_api::Context {
    crate::admin::rules_api::Context {
        descriptors: config.descriptors.clone(),
        path_matching: config.path_matching,
    }
}

/// Change notifications for the directories holding the watched files.
struct Watcher {
    #[cfg(target_os = "linux")]
    fd: Option<tokio::io::unix::AsyncFd<inotify::Inotify>>,
}

impl Watcher {
    #[cfg(target_os = "linux")]
    fn new(paths: &[PathBuf]) -> Watcher {
        use inotify::{Inotify, WatchMask};
        if paths.is_empty() {
            return Watcher { fd: None };
        }
        let setup = || -> std::io::Result<tokio::io::unix::AsyncFd<Inotify>> {
            let inotify = Inotify::init()?;
            // A file's directory (it may be replaced by a rename); an
            // `--envoy-config` directory itself (files come and go in it).
            let mut dirs: Vec<PathBuf> = paths
                .iter()
                .map(|p| match p.parent() {
                    _ if p.is_dir() => p.clone(),
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                })
                .collect();
            dirs.sort();
            dirs.dedup();
            for d in dirs {
                inotify.watches().add(
                    d,
                    WatchMask::CLOSE_WRITE
                        | WatchMask::MODIFY
                        | WatchMask::MOVED_TO
                        | WatchMask::CREATE
                        | WatchMask::DELETE,
                )?;
            }
            // SAFETY: the Inotify instance owns its descriptor until it is
            // dropped (with the AsyncFd) and always reports the same one.
            let fd = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    inotify,
                    tokio::io::Interest::READABLE,
                )
            }?;
            Ok(fd)
        };
        match setup() {
            Ok(fd) => Watcher { fd: Some(fd) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the rules files; polling only");
                Watcher { fd: None }
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn new(_paths: &[PathBuf]) -> Watcher {
        Watcher {}
    }

    /// Waits for a change in a watched directory, then for 50 ms of quiet
    /// (an editor's save is several events; the caller compares contents).
    #[cfg(target_os = "linux")]
    async fn changed(&mut self) {
        let Some(fd) = self.fd.as_mut() else {
            return std::future::pending().await;
        };
        let mut buf = [0u8; 4096];
        loop {
            let Ok(mut guard) = fd.readable_mut().await else {
                return std::future::pending().await;
            };
            match guard.try_io(|inner| inner.get_mut().read_events(&mut buf).map(|_| ())) {
                Ok(Ok(())) => break,
                Ok(Err(_)) => return std::future::pending().await,
                Err(_would_block) => continue,
            }
        }
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let quiet = fd
                .get_mut()
                .read_events(&mut buf)
                .map_or(true, |mut events| events.next().is_none());
            if quiet {
                return;
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    async fn changed(&mut self) {
        std::future::pending().await
    }
}
