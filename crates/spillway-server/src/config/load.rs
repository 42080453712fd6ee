//! Reading the rules file and the envoyproxy/ratelimit files together, as
//! `serve`, a reload and `check-config` do.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Reads and validates the file at `path`.
///
/// # Errors
/// The file cannot be read, is not valid YAML, or fails validation.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let (name, text) = spillway_rules::recover::read_file(path)?;
    parse(&name, &text)
}

/// The configuration source: a file, a directory, or the built-in
/// example.
#[derive(Debug, Clone)]
pub enum Source {
    /// The rules file at this path (with `rules_dir:`, its files too;
    /// see [`RuleFiles`]).
    File(PathBuf),
    /// Every `*.yaml` and `*.yml` file of this directory, as one
    /// configuration (`--config DIR`; see [`RuleFiles`]).
    Dir(PathBuf),
    /// The built-in `examples/rules.yaml`.
    Example,
}

impl Source {
    /// `--config PATH`: a directory of files, or a file.
    pub fn of_path(path: PathBuf) -> Source {
        if path.is_dir() {
            Source::Dir(path)
        } else {
            Source::File(path)
        }
    }

    /// How errors and the status name it.
    pub fn name(&self) -> String {
        match self {
            Source::File(p) | Source::Dir(p) => p.display().to_string(),
            Source::Example => "<examples/rules.yaml>".to_string(),
        }
    }

    /// Loads and validates.
    ///
    /// # Errors
    /// As [`load`].
    pub fn load(&self) -> Result<Config, ConfigErrors> {
        self.load_from(&Preread::default())
    }

    /// As [`Source::load`], taking the file's text from `pre` when it
    /// was read already.
    fn load_from(&self, pre: &Preread) -> Result<Config, ConfigErrors> {
        match self {
            Source::File(p) => {
                let (name, text) = pre.read(p)?;
                if super::parts::wants(&text) {
                    return super::parts::load(self, pre);
                }
                parse(&name, &text)
            }
            Source::Dir(_) => super::parts::load(self, pre),
            Source::Example => parse("<examples/rules.yaml>", EXAMPLE_RULES),
        }
    }
}

/// Files read once already. A pipe, `/dev/stdin` or a process
/// substitution (`<(...)`) gives its text once: `check-config`, which
/// looks into each file to tell a rules file from an envoyproxy/ratelimit
/// one, hands what it read to the loader instead of letting it read an
/// empty pipe (which checked as a valid file of no rules).
#[derive(Debug, Default)]
pub struct Preread {
    /// Each path, and its text or why it could not be read.
    files: Vec<(PathBuf, Result<String, String>)>,
}

impl Preread {
    /// Reads `path` (once: a second call gives the same text); `None`
    /// when it cannot be read (the loader reports why).
    pub fn text(&mut self, path: &Path) -> Option<&str> {
        let at = match self.files.iter().position(|(p, _)| p == path) {
            Some(i) => i,
            None => {
                let read = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"));
                self.files.push((path.to_path_buf(), read));
                self.files.len() - 1
            }
        };
        self.files[at].1.as_deref().ok()
    }

    /// `path`'s name and text: as read before, else read now.
    pub(super) fn read(&self, path: &Path) -> Result<(String, String), ConfigErrors> {
        match self.files.iter().find(|(p, _)| p == path) {
            None => spillway_rules::recover::read_file(path),
            Some((_, Ok(text))) => Ok((path.display().to_string(), text.clone())),
            Some((_, Err(message))) => Err(ConfigErrors(vec![ConfigError::new(
                path.display().to_string(),
                0,
                0,
                message.clone(),
            )])),
        }
    }
}

/// Why a file without a `rules:` key is refused.
pub const NO_RULES: &str = "no `rules:` key (an empty or cut-short file?): it would limit \
     nothing; write `rules: []` for a file of no rules";

/// Why a `--config` directory without a `rules:` key in any file is
/// refused.
pub const NO_RULES_DIR: &str = "no file of the directory has a `rules:` key: it would limit \
     nothing; write `rules: []` in one for no rules";

/// The files an `--envoy-config` directory gives: its `*.yaml` and `*.yml`
/// files (following links; hidden ones left out, as editors' and
/// Kubernetes' `..data` are), in name order.
///
/// # Errors
/// The directory cannot be listed.
pub fn envoy_dir_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let hidden = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if yaml && !hidden && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// What `spillway serve` loads: the rules file (or the built-in example)
/// and every `--envoy-config` path, a file or a directory of them (see
/// [`envoy_dir_files`]). A domain given twice (by two files, or by a file
/// and the rules file's `domains:`) is refused, as envoyproxy/ratelimit
/// refuses it, unless `merge_domains`: then its top-level descriptors are
/// merged, in file order, and only a composite key given twice is refused.
///
/// # Errors
/// Every problem in every file.
pub fn load_all(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
) -> Result<Config, ConfigErrors> {
    load_with(source, envoy, merge_domains, None, &Preread::default()).map(|(c, _)| c)
}

/// As [`load_all`], taking each file's text from `pre` when it was read
/// already (`check-config`'s pipes).
///
/// # Errors
/// As [`load_all`].
pub fn load_all_read(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    pre: &Preread,
) -> Result<Config, ConfigErrors> {
    load_with(source, envoy, merge_domains, None, pre).map(|(c, _)| c)
}

/// As [`load_all`], for a reload: an `--envoy-config` file that is gone
/// drops its domain (and is returned) instead of failing the load. A
/// directory that is gone (one of `dirs`, the paths that were directories
/// at start) still fails it: an unmounted volume is not a request to drop
/// every domain.
///
/// # Errors
/// As [`load_all`].
pub fn reload_all(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    dirs: &[PathBuf],
) -> Result<(Config, Vec<PathBuf>), ConfigErrors> {
    load_with(
        source,
        envoy,
        merge_domains,
        Some(dirs),
        &Preread::default(),
    )
}

/// `config`'s own domains (`domains:`, of the source `name`) and every
/// `--envoy-config` path's, composed as [`reload_all`] composes them: for
/// a reload of a configuration in parts ([`RuleFiles`]), whose files are
/// read apart. Returns the `--envoy-config` files found gone.
///
/// # Errors
/// As [`reload_all`], for the domains.
pub fn with_envoy(
    config: &mut Config,
    name: &str,
    envoy: &[PathBuf],
    merge_domains: bool,
    dirs: &[PathBuf],
) -> Result<Vec<PathBuf>, ConfigErrors> {
    let mut errors = Vec::new();
    let start = config
        .domains
        .iter()
        .cloned()
        .map(|d| (d, name.to_string()))
        .collect();
    let (domains, gone) = envoy_domains(
        start,
        envoy,
        merge_domains,
        Some(dirs),
        &Preread::default(),
        &mut errors,
    );
    if errors.is_empty() {
        config.domains = domains;
        Ok(gone)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// `reload`: a file gone is dropped, unless it is one of these directories.
pub(super) fn load_with(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    reload: Option<&[PathBuf]>,
    pre: &Preread,
) -> Result<(Config, Vec<PathBuf>), ConfigErrors> {
    compose(
        source,
        source.load_from(pre),
        envoy,
        merge_domains,
        reload,
        pre,
    )
}

/// As [`load_all_read`], with each file of a configuration in parts
/// ([`RuleFiles`]) and the rules it gives (none for a single file), for
/// `check-config`'s report.
///
/// # Errors
/// As [`load_all`].
pub fn load_all_listed(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    pre: &Preread,
) -> Result<(Config, Vec<(PathBuf, usize)>), ConfigErrors> {
    load_all_parts(source, envoy, merge_domains, pre)
        .map(|(c, files)| (c, files.map(|f| f.files()).unwrap_or_default()))
}

/// As [`load_all_read`], with a configuration in parts' files as read
/// (`None` for a single file): `serve` hands them to the watcher, which
/// then reads only the files that change.
///
/// # Errors
/// As [`load_all`].
pub fn load_all_parts(
    source: &Source,
    envoy: &[PathBuf],
    merge_domains: bool,
    pre: &Preread,
) -> Result<(Config, Option<RuleFiles>), ConfigErrors> {
    let Some((files, errors)) = RuleFiles::open(source, pre) else {
        return load_all_read(source, envoy, merge_domains, pre).map(|c| (c, None));
    };
    let loaded = match files.config() {
        Some(c) if errors.is_empty() => Ok(c),
        _ => Err(ConfigErrors(errors)),
    };
    compose(source, loaded, envoy, merge_domains, None, pre).map(|(c, _)| (c, Some(files)))
}

/// A file's length and a hash of its bytes: how a reload tells a changed
/// file (an edit that keeps the size within the filesystem's timestamp
/// tick still changes the hash).
pub fn digest(bytes: &[u8]) -> (u64, u64) {
    use std::hash::Hasher as _;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(bytes);
    (bytes.len() as u64, h.finish())
}

/// `loaded` (the source's configuration) with every `--envoy-config`
/// path's domains (see [`load_with`]).
fn compose(
    source: &Source,
    loaded: Result<Config, ConfigErrors>,
    envoy: &[PathBuf],
    merge_domains: bool,
    reload: Option<&[PathBuf]>,
    pre: &Preread,
) -> Result<(Config, Vec<PathBuf>), ConfigErrors> {
    let mut errors = Vec::new();
    let source_name = source.name();
    let mut config = match loaded {
        // Start, check and reload refuse alike a file without `rules:`:
        // an empty or cut-short file is not a request to limit nothing.
        Ok(c) if !c.has_rules => {
            let message = match source {
                Source::Dir(_) => NO_RULES_DIR,
                _ => NO_RULES,
            };
            errors.push(ConfigError::new(
                source_name.clone(),
                0,
                0,
                message.to_string(),
            ));
            None
        }
        Ok(c) => Some(c),
        Err(e) => {
            errors.extend(e.0);
            None
        }
    };
    // Each domain, and the file it came from.
    let start: Vec<(crate::grpc::Domain, String)> = config
        .as_mut()
        .map(|c| std::mem::take(&mut c.domains))
        .unwrap_or_default()
        .into_iter()
        .map(|d| (d, source_name.clone()))
        .collect();
    let (domains, gone) = envoy_domains(start, envoy, merge_domains, reload, pre, &mut errors);
    match config {
        Some(mut c) if errors.is_empty() => {
            c.domains = domains;
            c.merge_domains = merge_domains;
            Ok((c, gone))
        }
        _ => Err(ConfigErrors(errors)),
    }
}

/// The domains of `--envoy-config` paths alone (`spillway check-config`
/// without a rules file), checked as [`load_all`] checks them.
///
/// # Errors
/// Every problem in every file.
pub fn load_envoy_all(
    envoy: &[PathBuf],
    merge_domains: bool,
) -> Result<Vec<crate::grpc::Domain>, ConfigErrors> {
    load_envoy_all_read(envoy, merge_domains, &Preread::default())
}

/// As [`load_envoy_all`], taking each file's text from `pre` when it was
/// read already.
///
/// # Errors
/// As [`load_envoy_all`].
pub fn load_envoy_all_read(
    envoy: &[PathBuf],
    merge_domains: bool,
    pre: &Preread,
) -> Result<Vec<crate::grpc::Domain>, ConfigErrors> {
    let mut errors = Vec::new();
    let (domains, _) = envoy_domains(Vec::new(), envoy, merge_domains, None, pre, &mut errors);
    if errors.is_empty() {
        Ok(domains)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// `start`'s domains and those of every `--envoy-config` path; and, on a
/// `reload` (the paths that were directories), the files found gone.
pub(super) fn envoy_domains(
    mut domains: Vec<(crate::grpc::Domain, String)>,
    envoy: &[PathBuf],
    merge_domains: bool,
    reload: Option<&[PathBuf]>,
    pre: &Preread,
    errors: &mut Vec<ConfigError>,
) -> (Vec<crate::grpc::Domain>, Vec<PathBuf>) {
    let mut gone = Vec::new();
    let mut files = Vec::new();
    for p in envoy {
        if p.is_dir() || reload.is_some_and(|dirs| dirs.contains(p)) {
            match envoy_dir_files(p) {
                Ok(list) => files.extend(list),
                Err(e) => errors.push(ConfigError::new(
                    p.display().to_string(),
                    0,
                    0,
                    format!("cannot read the directory: {e}"),
                )),
            }
        } else if reload.is_some() && !p.exists() {
            gone.push(p.clone());
        } else {
            files.push(p.clone());
        }
    }
    for f in files {
        match pre
            .read(&f)
            .and_then(|(name, text)| envoy::parse_located(&name, &text))
        {
            Ok(l) => add_domain(&mut domains, l, merge_domains, errors),
            Err(e) => errors.extend(e.0),
        }
    }
    (domains.into_iter().map(|(d, _)| d).collect(), gone)
}

/// Adds a file's domain: a new one, or (merging) its descriptors to the
/// one of that name.
pub(super) fn add_domain(
    domains: &mut Vec<(crate::grpc::Domain, String)>,
    l: envoy::Located,
    merge: bool,
    errors: &mut Vec<ConfigError>,
) {
    let envoy::Located {
        domain,
        file,
        at,
        tops,
    } = l;
    let Some((existing, other)) = domains.iter_mut().find(|(d, _)| d.name == domain.name) else {
        domains.push((domain, file));
        return;
    };
    let error = |(line, column): (u64, u64), message: String| {
        ConfigError::new(file.clone(), line, column, message)
    };
    if !merge {
        errors.push(error(
            at,
            format!(
                "duplicate domain {:?}: {other} gives it too (one file per domain; --merge-domains, or MERGE_DOMAIN_CONFIG=true, merges them)",
                domain.name
            ),
        ));
        return;
    }
    for (node, at) in domain.nodes.into_iter().zip(tops) {
        let key = envoy::composite(&node.key, node.value.as_deref());
        if existing
            .nodes
            .iter()
            .any(|n| envoy::composite(&n.key, n.value.as_deref()) == key)
        {
            errors.push(error(
                at,
                format!(
                    "duplicate descriptor composite key '{}.{key}' in the merged domain: {other} gives it too",
                    domain.name
                ),
            ));
        } else {
            existing.nodes.push(node);
        }
    }
}

/// The domains of resources received over xDS ([`crate::xds`]), each
/// `(name, text)` one `RateLimitConfig` in envoyproxy/ratelimit's file
/// form (as ratelimit turns them into its YAML form before loading them),
/// read and checked as an `--envoy-config` file is and composed with the
/// rules file's domains `files` as `--envoy-config` files are (a domain
/// given twice refused unless `merge_domains`). Returns the resources'
/// domains alone.
///
/// # Errors
/// Every problem in every resource, each named `xds:NAME`.
pub fn xds_domains(
    files: &[crate::grpc::Domain],
    resources: &[(String, String)],
    merge_domains: bool,
) -> Result<Vec<crate::grpc::Domain>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut all: Vec<(crate::grpc::Domain, String)> = files
        .iter()
        .map(|d| (d.clone(), "the rules file".to_string()))
        .collect();
    let mut own = Vec::with_capacity(resources.len());
    for (name, text) in resources {
        match envoy::parse_located(&format!("xds:{name}"), text) {
            Ok(l) => {
                own.push(l.domain.clone());
                add_domain(&mut all, l, merge_domains, &mut errors);
            }
            Err(e) => errors.extend(e.0),
        }
    }
    if errors.is_empty() {
        Ok(own)
    } else {
        Err(ConfigErrors(errors))
    }
}
