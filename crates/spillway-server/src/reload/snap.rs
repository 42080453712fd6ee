//! What the watched files are now: a digest of each file's bytes.
//!
//! A watched file is read and hashed at every look (a rules file is
//! compared by its bytes: size and times alone miss an edit that keeps
//! the size within the filesystem's timestamp tick). A directory's files
//! are many (a hundred files of 10,000 rules are 150 MB, 90 ms to read
//! and hash every 500 ms: a fifth of a core for nothing), so each is
//! hashed again only when its size, times, inode or device changed, when
//! its status changed in the last [`RECENT`] (a second write within the
//! timestamp tick of the first keeps every time the same), and at least
//! every [`REHASH_EVERY`] whatever they say (a filesystem whose times do
//! not move).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// A file's length and a hash of its bytes (see
/// [`digest`](crate::config::digest)).
pub(crate) type Digest = (u64, u64);

/// Every watched file's path and a digest of its text (`None`:
/// unreadable or gone), a directory's files listed afresh (the directory
/// itself with `None` when it cannot be listed). A digest, not the text:
/// a million-rule file is 170 MB, which the watcher would otherwise hold
/// for ever beside the rules.
pub(crate) type Snapshot = Vec<(PathBuf, Option<Digest>)>;

/// A status change this recent may hide a second write with the same
/// times: the file is hashed again.
const RECENT: Duration = Duration::from_secs(2);

/// A directory's files are all hashed again at least this often.
const REHASH_EVERY: Duration = Duration::from_secs(10);

/// What identifies a file's content short of reading it: length,
/// modification and status-change times, inode and device.
type Meta = (u64, SystemTime, Option<SystemTime>, u64, u64);

/// The digests of a directory's files, with their metadata when hashed.
#[derive(Debug, Default)]
pub(crate) struct Hashed {
    seen: HashMap<PathBuf, (Meta, Digest)>,
    /// When every directory file was last hashed.
    full_at: Option<Instant>,
}

impl Hashed {
    /// The files of `paths` now: a file read and hashed; a directory's
    /// files listed, each hashed when it may have changed.
    pub(crate) fn snapshot(&mut self, paths: &[PathBuf]) -> Snapshot {
        let full = self.full_at.is_none_or(|t| t.elapsed() >= REHASH_EVERY);
        if full {
            self.full_at = Some(Instant::now());
        }
        let mut listed = Vec::new();
        let mut out = Vec::new();
        for p in paths {
            if p.is_dir() {
                match crate::config::envoy_dir_files(p) {
                    Ok(files) => {
                        for f in files {
                            let d = self.dir_file(&f, full);
                            listed.push(f.clone());
                            out.push((f, d));
                        }
                    }
                    Err(_) => out.push((p.clone(), None)),
                }
            } else {
                out.push((p.clone(), digest(p)));
            }
        }
        // Files gone are forgotten.
        let listed: std::collections::HashSet<&PathBuf> = listed.iter().collect();
        self.seen.retain(|p, _| listed.contains(p));
        out
    }

    /// A directory file's digest: the one held while its metadata say
    /// the same (see the module's documentation), else read now.
    fn dir_file(&mut self, path: &Path, full: bool) -> Option<Digest> {
        let Some(meta) = meta(path) else {
            self.seen.remove(path);
            return digest(path);
        };
        // The wall clock, as file times are (a time ahead of it: recent).
        let changed = meta.2.unwrap_or(meta.1);
        let changed_ms = changed
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(u128::MAX, |d| d.as_millis());
        let settled =
            u128::from(crate::os::unix_ms()).saturating_sub(changed_ms) >= RECENT.as_millis();
        if !full
            && settled
            && let Some((m, d)) = self.seen.get(path)
            && *m == meta
        {
            return Some(*d);
        }
        let d = digest(path)?;
        self.seen.insert(path.to_path_buf(), (meta, d));
        Some(d)
    }
}

/// `path`'s bytes hashed; `None` when it cannot be read.
pub(crate) fn digest(path: &Path) -> Option<Digest> {
    std::fs::read(path)
        .ok()
        .map(|bytes| crate::config::digest(&bytes))
}

/// `path`'s metadata (following links, as the reader does).
fn meta(path: &Path) -> Option<Meta> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let (changed, ino, dev) = {
        use std::os::unix::fs::MetadataExt as _;
        let ctime = u64::try_from(m.ctime()).ok().and_then(|s| {
            SystemTime::UNIX_EPOCH
                .checked_add(Duration::new(s, u32::try_from(m.ctime_nsec()).unwrap_or(0)))
        });
        (ctime, m.ino(), m.dev())
    };
    #[cfg(not(unix))]
    let (changed, ino, dev) = (None, 0, 0);
    Some((m.len(), m.modified().ok()?, changed, ino, dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An edit that keeps the size and lands within the timestamp tick
    /// of the write before is still seen: a status change that recent
    /// is always read again.
    #[test]
    fn a_same_size_edit_within_the_tick_is_seen() {
        let dir = std::env::temp_dir().join(format!("spillway-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.yaml");
        std::fs::write(&f, "rules: [] # one\n").unwrap();
        let mut h = Hashed::default();
        let first = h.snapshot(std::slice::from_ref(&dir));
        std::fs::write(&f, "rules: [] # two\n").unwrap();
        let second = h.snapshot(std::slice::from_ref(&dir));
        assert_ne!(first, second);
        std::fs::remove_file(&f).unwrap();
        assert!(h.snapshot(std::slice::from_ref(&dir)).is_empty());
        assert!(h.seen.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
