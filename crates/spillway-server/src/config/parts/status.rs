//! What the files of a configuration in parts say of themselves: the
//! status `/v1/status` shows, a report's listing, a watcher's digests,
//! and the errors of a version refused for a name another file holds.

use std::path::{Path, PathBuf};

pub use crate::admin::{BadFile, FilesStatus};

use super::{ConfigError, ConfigErrors, RuleFiles, names};

/// The errors of one file shown in the status; the rest are counted.
const SHOWN_ERRORS: usize = 10;

impl RuleFiles {
    /// What `/v1/status` says of the files.
    pub fn status(&self) -> FilesStatus {
        FilesStatus {
            count: self.slots.len(),
            bad: self
                .slots
                .iter()
                .filter_map(|s| {
                    let e = s.error.as_ref()?;
                    let mut text: Vec<String> =
                        e.0.iter()
                            .take(SHOWN_ERRORS)
                            .map(ToString::to_string)
                            .collect();
                    if e.0.len() > SHOWN_ERRORS {
                        text.push(format!("... and {} more errors", e.0.len() - SHOWN_ERRORS));
                    }
                    Some(BadFile {
                        file: s.path.display().to_string(),
                        error: text.join("\n"),
                        last_good_in_force: s.good.is_some(),
                    })
                })
                .collect(),
            dir_problem: self
                .dir_problem
                .as_ref()
                .map(|p| format!("{}: {p}", self.dir().unwrap_or(Path::new("")).display())),
        }
    }

    /// Each file and the digest of its text as last read, for a watcher.
    pub fn digests(&self) -> Vec<(PathBuf, Option<(u64, u64)>)> {
        self.slots
            .iter()
            .map(|s| (s.path.clone(), s.digest))
            .collect()
    }

    /// Each file and the rules of its version in force, for a report.
    pub fn files(&self) -> Vec<(PathBuf, usize)> {
        self.slots
            .iter()
            .map(|s| (s.path.clone(), s.good.as_ref().map_or(0, |v| v.rules.len())))
            .collect()
    }
}

/// The errors of the file `paths[i]` whose new version clashes: each
/// place, with the other file's.
pub(super) fn clash_errors(
    paths: &[String],
    i: usize,
    clashes: &[names::Clash],
    count: usize,
) -> ConfigErrors {
    let mut list: Vec<ConfigError> = clashes
        .iter()
        .map(|c| {
            let other = format!("{}:{}:{}", paths[c.other], c.other_at.0, c.other_at.1);
            let message = match &c.name {
                Some(name) => format!(
                    "rule name {name:?} is used by {other} too: a name is unique across the files of the rule set; rename one of them"
                ),
                None => format!(
                    "this file gives settings (sections besides `rules:`), and so does {other}: one file of a --config directory gives every section but `rules:`; move them into one file"
                ),
            };
            ConfigError::new(
                paths[i].clone(),
                u64::from(c.at.0),
                u64::from(c.at.1),
                message,
            )
        })
        .collect();
    if count > clashes.len() {
        list.push(ConfigError::new(
            paths[i].clone(),
            0,
            0,
            format!(
                "... and {} more rule names used by other files too",
                count - clashes.len()
            ),
        ));
    }
    ConfigErrors(list)
}
