//! A configuration in several files: `--config DIR` (every `*.yaml` and
//! `*.yml` of the directory, one of which may give the settings), or a
//! main file whose `rules_dir:` names a directory of files of rules.
//!
//! The files make one rule set: their rules in file-name order (a main
//! file's first), each name used once across them. Each file is kept
//! apart, read and built: a reload reads only the files that changed and
//! composes the rule set from every file's version in force, so one team's
//! bad edit keeps that file's last good version and no other file's
//! change waits for it. The texts are not kept; the rules are (they are
//! in force anyway).
//!
//! Rules are built against the settings (`descriptors:`, `plans:`,
//! `path_matching:`, the store's mode), which one file gives; when a
//! reload changes what they build against, every file is read again.
//!
//! A directory that cannot be listed, or holds no file at all (an
//! unmounted volume shows an empty mount point), keeps every file's
//! version in force: it is not a request to drop every rule. A file
//! removed from a directory that is there drops its rules.

mod names;
mod read;
mod status;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(in crate::config) use read::build_rules;
use read::{Role, Settings, Version};
use status::clash_errors;
pub use status::{BadFile, FilesStatus};

use super::{Config, ConfigError, ConfigErrors, Preread, Source, envoy_dir_files};

/// A configuration in several files, as last read: every file's version
/// in force, and why a file's text is not (see the module's
/// documentation).
#[derive(Debug)]
pub struct RuleFiles {
    layout: Layout,
    /// In name order; a main file first.
    slots: Vec<Slot>,
    /// The settings of a directory without a settings file (`None`: the
    /// environment makes every configuration invalid; the error is
    /// reported with the files).
    defaults: Option<Arc<Settings>>,
    /// Why the directory's files were not read at the last reload.
    dir_problem: Option<String>,
}

#[derive(Debug, Clone)]
enum Layout {
    /// `--config DIR`.
    Dir(PathBuf),
    /// A main file, and its `rules_dir:` resolved against its directory.
    Main { main: PathBuf, dir: Option<PathBuf> },
}

/// One file and its versions.
#[derive(Debug)]
struct Slot {
    path: PathBuf,
    /// The version in force.
    good: Option<Version>,
    /// A version read but refused because another file holds one of its
    /// names: tried again at every reload.
    new: Option<Version>,
    /// Why the file's text is not in force.
    error: Option<ConfigErrors>,
    /// The digest of the text last read (`None`: unreadable): a watcher
    /// starts from it, so an edit made since is a change.
    digest: Option<(u64, u64)>,
}

/// What a reload of the files changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// A file's version in force changed (or a file was removed).
    pub changed: bool,
    /// The settings in force changed.
    pub settings_changed: bool,
}

/// Whether the main file `text` is read as [`RuleFiles`]: it names
/// `rules_dir` (a mention in a comment costs a slower reading only).
pub(super) fn wants(text: &str) -> bool {
    text.contains("rules_dir")
}

/// `source` loaded as `spillway serve` starts: every error of every file.
///
/// # Errors
/// Every problem in every file.
pub(super) fn load(source: &Source, pre: &Preread) -> Result<Config, ConfigErrors> {
    let Some((files, errors)) = RuleFiles::open(source, pre) else {
        return Err(ConfigErrors(vec![ConfigError::new(
            "<config>",
            0,
            0,
            "not a configuration in parts",
        )]));
    };
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    files.config().ok_or_else(|| ConfigErrors(Vec::new()))
}

impl RuleFiles {
    /// Reads `source`'s files: `None` when it is a single file without
    /// `rules_dir:` (or the built-in example). Every error of every file
    /// is returned beside what was read: a start refuses them, a
    /// watcher keeps what it can.
    pub fn open(source: &Source, pre: &Preread) -> Option<(RuleFiles, Vec<ConfigError>)> {
        let layout = match source {
            Source::Example => return None,
            Source::Dir(d) => Layout::Dir(d.clone()),
            Source::File(p) => {
                let (_, text) = pre.read(p).ok()?;
                if !wants(&text) {
                    return None;
                }
                Layout::Main {
                    main: p.clone(),
                    dir: None,
                }
            }
        };
        let name = match &layout {
            Layout::Dir(d) | Layout::Main { main: d, .. } => d.display().to_string(),
        };
        let (defaults, mut errors) = match Settings::defaults(&name) {
            Ok(d) => (Some(d), Vec::new()),
            // A main file's reading says the same.
            Err(_) if matches!(layout, Layout::Main { .. }) => (None, Vec::new()),
            Err(e) => (None, e.0),
        };
        let mut files = RuleFiles::new(layout, defaults);
        errors.extend(files.read_all(pre));
        Some((files, errors))
    }

    fn new(layout: Layout, defaults: Option<Arc<Settings>>) -> RuleFiles {
        let slots = match &layout {
            Layout::Main { main, .. } => vec![Slot::new(main.clone())],
            Layout::Dir(_) => Vec::new(),
        };
        RuleFiles {
            layout,
            slots,
            defaults,
            dir_problem: None,
        }
    }

    /// The first reading: every file; every error.
    fn read_all(&mut self, pre: &Preread) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if let Layout::Main { main, .. } = &self.layout {
            let main = main.clone();
            self.update(vec![main.clone()], &|_| false, pre, None);
            let dir = self.slots[0]
                .good
                .as_ref()
                .and_then(|v| v.settings.as_ref())
                .and_then(|(s, _, _)| s.config.rules_dir.clone())
                .map(|d| base(&main).join(d));
            self.layout = Layout::Main { main, dir };
        }
        if self.dir().is_some() {
            match self.list() {
                Ok(list) => {
                    self.slots.extend(list.iter().cloned().map(Slot::new));
                    let key = self.key();
                    self.update(list, &|_| false, pre, key);
                }
                Err(problem) => errors.push(read::whole(
                    self.dir().unwrap_or_else(|| Path::new("")),
                    problem,
                )),
            }
        }
        for s in &self.slots {
            errors.extend(s.error.iter().flat_map(|e| e.0.iter().cloned()));
        }
        errors
    }

    /// The directory of rules files, if any.
    fn dir(&self) -> Option<&Path> {
        match &self.layout {
            Layout::Dir(d) => Some(d),
            Layout::Main { dir, .. } => dir.as_deref(),
        }
    }

    /// The main file, if any.
    fn main(&self) -> Option<&Path> {
        match &self.layout {
            Layout::Main { main, .. } => Some(main),
            Layout::Dir(_) => None,
        }
    }

    /// Whether `path` is one of these files (or would be, once there):
    /// the main file, or a file of the directory.
    pub fn holds(&self, path: &Path) -> bool {
        self.main() == Some(path) || (self.dir().is_some() && path.parent() == self.dir())
    }

    /// The directory's files, in name order, the main file left out;
    /// why not, when it cannot be listed or holds none.
    fn list(&self) -> Result<Vec<PathBuf>, String> {
        let dir = self.dir().unwrap_or_else(|| Path::new("."));
        let main = self.main().and_then(|m| m.canonicalize().ok());
        let mut list = envoy_dir_files(dir).map_err(|e| {
            format!(
                "cannot read the directory: {e} (the rules of its files in force are kept; check the path and that it is mounted)"
            )
        })?;
        if main.is_some() {
            list.retain(|p| p.canonicalize().ok() != main);
        }
        if list.is_empty() {
            return Err(
                "the directory holds no *.yaml or *.yml file (an unmounted volume shows an empty mount point): the rules of its files in force are kept; leave a file with `rules: []` in it for no rules".into(),
            );
        }
        Ok(list)
    }

    /// Reads again the files of `changed` (every file, when `None`: a
    /// SIGHUP) and composes; `pending` files, still being written, are
    /// not read even when the settings change.
    pub fn refresh(
        &mut self,
        changed: Option<&[PathBuf]>,
        pending: &dyn Fn(&Path) -> bool,
    ) -> Refreshed {
        let before = self.settings();
        let built_with = self.key();
        let mut todo: Vec<PathBuf> = Vec::new();
        let mut removed = false;
        if let Some(main) = self.main()
            && changed.is_none_or(|c| c.iter().any(|p| p == main))
        {
            todo.push(main.to_path_buf());
        }
        let in_dir: Vec<PathBuf> = match changed {
            Some(c) => c
                .iter()
                .filter(|p| self.main() != Some(p.as_path()) && self.holds(p))
                .cloned()
                .collect(),
            None => self.slots.iter().map(|s| s.path.clone()).collect(),
        };
        if self.dir().is_some() && (changed.is_none() || !in_dir.is_empty()) {
            match self.list() {
                Err(problem) => self.dir_problem = Some(problem),
                Ok(list) => {
                    self.dir_problem = None;
                    let mut consider = in_dir;
                    if changed.is_none() {
                        consider.extend(list.iter().cloned());
                    }
                    // Sets, not scans: a directory may hold thousands.
                    let listed: HashSet<&PathBuf> = list.iter().collect();
                    let known: HashSet<PathBuf> =
                        self.slots.iter().map(|s| s.path.clone()).collect();
                    let main = self.main().map(Path::to_path_buf);
                    let (there, gone): (Vec<PathBuf>, Vec<PathBuf>) =
                        consider.into_iter().partition(|p| listed.contains(p));
                    let gone: HashSet<PathBuf> = gone
                        .into_iter()
                        .filter(|p| known.contains(p) && main.as_ref() != Some(p))
                        .collect();
                    removed = self
                        .slots
                        .iter()
                        .any(|s| gone.contains(&s.path) && s.good.is_some());
                    self.slots.retain(|s| !gone.contains(&s.path));
                    let mut seen: HashSet<PathBuf> = todo.iter().cloned().collect();
                    let mut added = false;
                    for p in there {
                        if !known.contains(&p) && seen.insert(p.clone()) {
                            self.slots.push(Slot::new(p.clone()));
                            added = true;
                            todo.push(p);
                        } else if seen.insert(p.clone()) {
                            todo.push(p);
                        }
                    }
                    if added {
                        // In name order, after a main file.
                        let from = usize::from(self.main().is_some());
                        self.slots[from..].sort_by(|a, b| a.path.cmp(&b.path));
                    }
                }
            }
        }
        let changed = self.update(todo, pending, &Preread::default(), built_with);
        let after = self.settings();
        let settings_changed = match (&before, &after) {
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            (None, None) => false,
            _ => true,
        };
        Refreshed {
            changed: changed || removed || settings_changed,
            settings_changed,
        }
    }

    /// Reads the files of `todo` and settles which versions are in
    /// force: a file that may give the settings first, then the others
    /// against the settings in force, then (when the settings changed)
    /// every other file again. Whether a version in force changed.
    /// `key_before`: what the files in force were built against (before
    /// a settings file was removed, say).
    fn update(
        &mut self,
        todo: Vec<PathBuf>,
        pending: &dyn Fn(&Path) -> bool,
        pre: &Preread,
        key_before: Option<u64>,
    ) -> bool {
        let (first, rest): (Vec<PathBuf>, Vec<PathBuf>) = todo
            .into_iter()
            .partition(|p| self.may_give_settings(p, pre));
        let mut changed = false;
        if !first.is_empty() {
            changed |= self.read_round(&first, pre);
        }
        let mut rest = rest;
        if self.key() != key_before {
            rest = self.rules_only(pending, &first);
        }
        let mut built_with = self.key();
        changed |= self.read_round(&rest, pre);
        // A file read as rules only gave the settings after all.
        for _ in 0..3 {
            if self.key() == built_with {
                break;
            }
            built_with = self.key();
            let again = self.rules_only(pending, &[]);
            changed |= self.read_round(&again, pre);
        }
        changed
    }

    /// Whether the file `path` is read with the settings, before the
    /// others: the main file, the file giving them now, or one whose
    /// text may give them.
    fn may_give_settings(&self, path: &Path, pre: &Preread) -> bool {
        match self.role(path) {
            Role::Main => return true,
            Role::RulesOnly => return false,
            Role::Member => {}
        }
        // The file giving them now, if any (only one can).
        let giver = self.slots.iter().find(|s| {
            [&s.good, &s.new]
                .into_iter()
                .flatten()
                .any(|v| v.settings.is_some())
        });
        if giver.is_some_and(|s| s.path == path) {
            return true;
        }
        pre.read(path)
            .is_ok_and(|(_, text)| read::may_give_settings(&text))
    }

    /// The files that take the settings from another (every one but
    /// those giving them and those in `skip`), not being written.
    fn rules_only(&self, pending: &dyn Fn(&Path) -> bool, skip: &[PathBuf]) -> Vec<PathBuf> {
        let gives = |v: &Option<Version>| v.as_ref().is_some_and(|v| v.settings.is_some());
        let skip: HashSet<&PathBuf> = skip.iter().collect();
        self.slots
            .iter()
            .filter(|s| !(gives(&s.good) || gives(&s.new) || self.main() == Some(s.path.as_path())))
            .filter(|s| !pending(&s.path) && !skip.contains(&s.path))
            .map(|s| s.path.clone())
            .collect()
    }

    /// Reads `paths` against the settings in force, then settles.
    fn read_round(&mut self, paths: &[PathBuf], pre: &Preread) -> bool {
        let ctx = self.settings().or_else(|| self.defaults.clone());
        let at: HashMap<PathBuf, usize> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.path.clone(), i))
            .collect();
        for p in paths {
            let role = self.role(p);
            let Some(slot) = at.get(p).map(|&i| &mut self.slots[i]) else {
                continue;
            };
            let (digest, read) = read::read(p, pre, role, ctx.as_deref());
            slot.digest = digest;
            match read {
                Ok(v) => {
                    slot.new = Some(v);
                    slot.error = None;
                }
                Err(e) => {
                    slot.new = None;
                    slot.error = Some(e);
                }
            }
        }
        self.settle()
    }

    fn role(&self, path: &Path) -> Role {
        match &self.layout {
            Layout::Dir(_) => Role::Member,
            Layout::Main { main, .. } if main == path => Role::Main,
            Layout::Main { .. } => Role::RulesOnly,
        }
    }

    /// Accepts the new versions that clash with no version in force
    /// (see [`names::resolve`]); the others are kept to try again, their
    /// files' errors saying what clashes where.
    fn settle(&mut self) -> bool {
        let versions: Vec<names::Versions<'_>> = self
            .slots
            .iter()
            .map(|s| names::Versions {
                good: s.good.as_ref(),
                new: s.new.as_ref(),
            })
            .collect();
        let outcome = names::resolve(&versions);
        drop(versions);
        let paths: Vec<String> = self
            .slots
            .iter()
            .map(|s| s.path.display().to_string())
            .collect();
        let mut changed = false;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if outcome.accepted[i] {
                slot.good = slot.new.take();
                slot.error = None;
                changed = true;
            } else if let (clashes, count @ 1..) = &outcome.refused[i] {
                slot.error = Some(clash_errors(&paths, i, clashes, *count));
            }
        }
        changed
    }

    /// The settings in force: the settings file's version in force; a
    /// directory without one, the defaults; `None` for a main file
    /// never read well.
    fn settings(&self) -> Option<Arc<Settings>> {
        let given = self
            .slots
            .iter()
            .find_map(|s| s.good.as_ref()?.settings.as_ref())
            .map(|(s, _, _)| s.clone());
        match &self.layout {
            Layout::Dir(_) => given.or_else(|| self.defaults.clone()),
            Layout::Main { .. } => given,
        }
    }

    fn key(&self) -> Option<u64> {
        self.settings().map(|s| s.key)
    }

    /// The configuration in force: the settings, and every file's rules
    /// in name order (a main file's first); `None` when the main file was
    /// never read well.
    pub fn config(&self) -> Option<Config> {
        let settings = self.settings()?;
        let mut c = settings.config.clone();
        let goods: Vec<&Version> = self.slots.iter().filter_map(|s| s.good.as_ref()).collect();
        c.rules = Vec::with_capacity(goods.iter().map(|v| v.rules.len()).sum());
        for v in &goods {
            c.rules.extend(v.rules.iter().cloned());
            c.plans
                .rules
                .extend(v.plans.iter().map(|(k, p)| (k.clone(), p.clone())));
        }
        // A directory of rules files may be all the rules a main file
        // has; a `--config` directory needs a file with `rules:`.
        c.has_rules = goods.iter().any(|v| v.has_rules)
            || matches!(self.layout, Layout::Main { dir: Some(_), .. });
        c.secrets = read::secrets_of(goods.iter().flat_map(|v| &v.refs));
        if let Some(main) = self.main() {
            c.rules_dir = c.rules_dir.map(|d| base(main).join(d));
        }
        Some(c)
    }
}

impl Slot {
    fn new(path: PathBuf) -> Slot {
        Slot {
            path,
            good: None,
            new: None,
            error: None,
            digest: None,
        }
    }
}

/// The directory a main file's relative paths start from.
fn base(main: &Path) -> PathBuf {
    match main.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
