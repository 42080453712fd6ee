//! Which version of each file is in force when rule names must be unique
//! across the files (and one file at most gives the settings).
//!
//! The versions in force never clash (they were accepted together). A
//! file's new version is accepted when none of its names is held by
//! another file's version in force; accepting one can free names for
//! another (a rule moved from one file to another, both saved at once),
//! so the new versions are tried until none more is accepted. A refused
//! version is kept and tried again at every later reload: the file that
//! holds the name may change.

use std::collections::HashMap;

use super::read::Version;

/// What a file claims for itself alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Claim<'a> {
    /// A rule name.
    Rule(&'a str),
    /// The settings: every section but `rules:`.
    Settings,
}

/// A claim another file holds, refusing a new version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Clash {
    /// The rule name; `None` for the settings.
    pub(crate) name: Option<String>,
    /// Where the refused version writes it.
    pub(crate) at: (u32, u32),
    /// The file that holds it (an index into the files given).
    pub(crate) other: usize,
    /// Where that file writes it.
    pub(crate) other_at: (u32, u32),
}

/// The clashes listed of one refused version; the rest are counted.
pub(crate) const MAX_CLASHES: usize = 20;

/// A file's versions: the one in force, and a new one waiting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Versions<'v> {
    pub(crate) good: Option<&'v Version>,
    pub(crate) new: Option<&'v Version>,
}

/// The outcome for each file: its new version accepted, or refused
/// with the first [`MAX_CLASHES`] clashes and how many there are.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) accepted: Vec<bool>,
    pub(crate) refused: Vec<(Vec<Clash>, usize)>,
}

/// What `v` claims, and where.
fn claims(v: &Version) -> impl Iterator<Item = (Claim<'_>, (u32, u32))> {
    v.rules
        .iter()
        .zip(&v.at)
        .map(|(r, at)| (Claim::Rule(r.name()), *at))
        .chain(v.settings.as_ref().map(|(_, _, at)| (Claim::Settings, *at)))
}

/// Decides which new versions are accepted (see the module's
/// documentation). Only the claims a new version makes are contested: the
/// versions in force are scanned once for those (a lookup in a map of the
/// new claims, not a map of a million names built at every reload), and
/// the rounds run over the contested claims alone.
pub(crate) fn resolve(files: &[Versions<'_>]) -> Outcome {
    let mut out = Outcome {
        accepted: vec![false; files.len()],
        refused: vec![(Vec::new(), 0); files.len()],
    };
    if files.iter().all(|f| f.new.is_none()) {
        return out;
    }
    let contested: std::collections::HashSet<Claim<'_>> = files
        .iter()
        .filter_map(|f| f.new)
        .flat_map(|v| claims(v).map(|(c, _)| c))
        .collect();
    // Who holds each contested claim in force, and where.
    let mut held: HashMap<Claim<'_>, (usize, (u32, u32))> = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        for (c, at) in f.good.into_iter().flat_map(claims) {
            if contested.contains(&c) {
                held.insert(c, (i, at));
            }
        }
    }
    loop {
        let mut progress = false;
        for (i, f) in files.iter().enumerate() {
            let Some(new) = f.new.filter(|_| !out.accepted[i]) else {
                continue;
            };
            let mut clashes = Vec::new();
            let mut count = 0;
            for (c, at) in claims(new) {
                if let Some(&(other, other_at)) = held.get(&c)
                    && other != i
                {
                    count += 1;
                    if clashes.len() < MAX_CLASHES {
                        clashes.push(Clash {
                            name: match c {
                                Claim::Rule(n) => Some(n.to_string()),
                                Claim::Settings => None,
                            },
                            at,
                            other,
                            other_at,
                        });
                    }
                }
            }
            if count > 0 {
                out.refused[i] = (clashes, count);
                continue;
            }
            // Its version in force lets its contested claims go.
            for (c, _) in f.good.into_iter().flat_map(claims) {
                if held.get(&c).is_some_and(|(owner, _)| *owner == i) {
                    held.remove(&c);
                }
            }
            for (c, at) in claims(new) {
                held.insert(c, (i, at));
            }
            out.accepted[i] = true;
            out.refused[i] = (Vec::new(), 0);
            progress = true;
        }
        if !progress {
            return out;
        }
    }
}
