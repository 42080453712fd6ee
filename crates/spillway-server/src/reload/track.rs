//! Which changed files have been quiet long enough to read.
//!
//! A file of a configuration in parts ([`RuleFiles`](crate::config::RuleFiles))
//! waits for its own quiet period: one team's file being written does not
//! hold back another's edit, nor the edit of a file that changes every
//! second hold back the rest. The other files (a single rules file,
//! `--envoy-config` files) are read together, so they wait together: a
//! change applies once none of them has changed for the quiet period.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::{Digest, Snapshot};

/// What was considered of every watched file, and the changes waiting.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// Each file's digest as last considered (applied or refused); a
    /// file gone or unreadable is absent.
    considered: HashMap<PathBuf, Digest>,
    /// Files of a configuration in parts: each changed file's digest now
    /// and since when it has been so.
    parts: HashMap<PathBuf, (Option<Digest>, Instant)>,
    /// The other files: their changes, and since when they have been so.
    rest: Option<(Changes, Instant)>,
}

/// Files and their digests now (`None`: gone or unreadable).
type Changes = Vec<(PathBuf, Option<Digest>)>;

/// The changes quiet long enough to apply.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Due {
    /// The other files changed (they are read together).
    pub(crate) rest: bool,
    /// Files of a configuration in parts, each read alone.
    pub(crate) parts: Vec<PathBuf>,
}

impl Due {
    pub(crate) fn is_empty(&self) -> bool {
        !self.rest && self.parts.is_empty()
    }
}

impl Tracker {
    /// The files as `snap` saw them, all considered.
    pub(crate) fn new(snap: &Snapshot) -> Tracker {
        let mut t = Tracker::default();
        t.consider_all(snap);
        t
    }

    /// Everything as `snap` saw it is considered (a SIGHUP reads all).
    pub(crate) fn consider_all(&mut self, snap: &Snapshot) {
        self.considered = snap
            .iter()
            .filter_map(|(p, d)| Some((p.clone(), (*d)?)))
            .collect();
        self.parts.clear();
        self.rest = None;
    }

    /// Compares `snap` (taken at `now`) with what was considered: a
    /// change starts waiting, a change that has stayed the same for
    /// `quiet` is due (and considered from then on), a change undone
    /// waits no more. `is_part` tells a file of a configuration in parts.
    pub(crate) fn observe(
        &mut self,
        snap: &Snapshot,
        now: Instant,
        quiet: Duration,
        is_part: &dyn Fn(&Path) -> bool,
    ) -> Due {
        let current: HashMap<&Path, Option<Digest>> =
            snap.iter().map(|(p, d)| (p.as_path(), *d)).collect();
        let mut paths: Vec<PathBuf> = current
            .keys()
            .map(|p| p.to_path_buf())
            .chain(self.considered.keys().cloned())
            .chain(self.parts.keys().cloned())
            .collect();
        paths.sort();
        paths.dedup();
        let mut due = Due::default();
        let mut rest = Vec::new();
        for p in paths {
            let now_is = current.get(p.as_path()).copied().flatten();
            if now_is == self.considered.get(&p).copied() {
                self.parts.remove(&p);
                continue;
            }
            if !is_part(&p) {
                rest.push((p, now_is));
                continue;
            }
            match self.parts.get(&p) {
                Some((waiting, since)) if *waiting == now_is => {
                    if now.saturating_duration_since(*since) >= quiet {
                        self.set(&p, now_is);
                        self.parts.remove(&p);
                        due.parts.push(p);
                    }
                }
                _ => {
                    self.parts.insert(p, (now_is, now));
                }
            }
        }
        match &self.rest {
            _ if rest.is_empty() => self.rest = None,
            Some((waiting, since)) if *waiting == rest => {
                if now.saturating_duration_since(*since) >= quiet {
                    for (p, d) in &rest {
                        self.set(p, *d);
                    }
                    self.rest = None;
                    due.rest = true;
                }
            }
            _ => self.rest = Some((rest, now)),
        }
        due
    }

    fn set(&mut self, path: &Path, digest: Option<Digest>) {
        match digest {
            Some(d) => self.considered.insert(path.to_path_buf(), d),
            None => self.considered.remove(path),
        };
    }

    /// When the earliest waiting change will have been quiet for `quiet`.
    pub(crate) fn wake_at(&self, quiet: Duration) -> Option<Instant> {
        self.parts
            .values()
            .map(|(_, since)| *since)
            .chain(self.rest.as_ref().map(|(_, since)| *since))
            .min()
            .map(|since| since + quiet)
    }

    /// Whether `path` has a change waiting (it is being written).
    #[cfg(test)]
    pub(crate) fn waiting(&self, path: &Path) -> bool {
        self.parts.contains_key(path)
    }

    /// The files with a change waiting.
    pub(crate) fn waiting_parts(&self) -> Vec<PathBuf> {
        self.parts.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(list: &[(&str, Option<u64>)]) -> Snapshot {
        list.iter()
            .map(|(p, d)| (PathBuf::from(p), d.map(|d| (d, d))))
            .collect()
    }

    const QUIET: Duration = Duration::from_secs(2);

    fn in_dir(p: &Path) -> bool {
        p.starts_with("/d")
    }

    /// Each file of a directory waits for its own quiet period: a file
    /// changing all the time does not hold back another.
    #[test]
    fn each_part_waits_for_its_own_quiet_period() {
        let t0 = Instant::now();
        let mut t = Tracker::new(&snap(&[("/d/a.yaml", Some(1)), ("/d/b.yaml", Some(1))]));
        let at = |s: u64| t0 + Duration::from_millis(s);
        // a changes at 0 and stays; b changes at 0, 1000, 2000, ...
        assert!(
            t.observe(
                &snap(&[("/d/a.yaml", Some(2)), ("/d/b.yaml", Some(2))]),
                at(0),
                QUIET,
                &in_dir
            )
            .is_empty()
        );
        assert!(t.waiting(Path::new("/d/a.yaml")));
        assert_eq!(t.wake_at(QUIET), Some(at(2000)));
        assert!(
            t.observe(
                &snap(&[("/d/a.yaml", Some(2)), ("/d/b.yaml", Some(3))]),
                at(1000),
                QUIET,
                &in_dir
            )
            .is_empty()
        );
        let due = t.observe(
            &snap(&[("/d/a.yaml", Some(2)), ("/d/b.yaml", Some(4))]),
            at(2000),
            QUIET,
            &in_dir,
        );
        assert_eq!(due.parts, [PathBuf::from("/d/a.yaml")]);
        assert!(!due.rest);
        assert!(!t.waiting(Path::new("/d/a.yaml")));
        assert!(t.waiting(Path::new("/d/b.yaml")));
        // Considered from then on: the same text is no change.
        let due = t.observe(
            &snap(&[("/d/a.yaml", Some(2)), ("/d/b.yaml", Some(4))]),
            at(4000),
            QUIET,
            &in_dir,
        );
        assert_eq!(due.parts, [PathBuf::from("/d/b.yaml")]);
        assert!(
            t.observe(
                &snap(&[("/d/a.yaml", Some(2)), ("/d/b.yaml", Some(4))]),
                at(9000),
                QUIET,
                &in_dir
            )
            .is_empty()
        );
    }

    /// A file removed (or added) is a change that waits too; a change
    /// undone waits no more.
    #[test]
    fn removed_added_and_undone() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        let mut t = Tracker::new(&snap(&[("/d/a.yaml", Some(1))]));
        t.observe(&snap(&[("/d/b.yaml", Some(1))]), at(0), QUIET, &in_dir);
        let mut due = t.observe(&snap(&[("/d/b.yaml", Some(1))]), at(2000), QUIET, &in_dir);
        due.parts.sort();
        assert_eq!(
            due.parts,
            [PathBuf::from("/d/a.yaml"), PathBuf::from("/d/b.yaml")]
        );
        t.observe(&snap(&[("/d/b.yaml", Some(5))]), at(2100), QUIET, &in_dir);
        assert!(t.waiting(Path::new("/d/b.yaml")));
        t.observe(&snap(&[("/d/b.yaml", Some(1))]), at(2200), QUIET, &in_dir);
        assert!(!t.waiting(Path::new("/d/b.yaml")));
        assert_eq!(t.wake_at(QUIET), None);
    }

    /// The other files wait together, as a single file always did.
    #[test]
    fn other_files_wait_together() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        let mut t = Tracker::new(&snap(&[("/r.yaml", Some(1)), ("/e.yaml", Some(1))]));
        t.observe(
            &snap(&[("/r.yaml", Some(2)), ("/e.yaml", Some(1))]),
            at(0),
            QUIET,
            &in_dir,
        );
        // Another of them changes: the wait starts again.
        t.observe(
            &snap(&[("/r.yaml", Some(2)), ("/e.yaml", Some(2))]),
            at(1500),
            QUIET,
            &in_dir,
        );
        assert!(
            t.observe(
                &snap(&[("/r.yaml", Some(2)), ("/e.yaml", Some(2))]),
                at(2500),
                QUIET,
                &in_dir
            )
            .is_empty()
        );
        let due = t.observe(
            &snap(&[("/r.yaml", Some(2)), ("/e.yaml", Some(2))]),
            at(3500),
            QUIET,
            &in_dir,
        );
        assert!(due.rest);
        assert!(due.parts.is_empty());
    }
}
