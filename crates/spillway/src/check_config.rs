//! `spillway check-config`: validates a rules file and
//! envoyproxy/ratelimit files (or directories of them), as `serve` would
//! load them together, and prints what they mean.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use spillway_server::config;

/// `println!` for the report, which people pipe into `head` or `grep -q`:
/// a closed pipe ends the report quietly instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = hide(format!($($arg)*));
        let _ = writeln!(std::io::stdout().lock(), "{line}");
    }};
}

/// The values the rules file takes from the environment (`${NAME}`):
/// the report says what the file says (`${REDIS_PASSWORD}`) instead of
/// them. Set once, for the one report this process prints.
static SECRETS: std::sync::OnceLock<config::Secrets> = std::sync::OnceLock::new();

/// `line` with the environment's values hidden.
fn hide(line: String) -> String {
    match SECRETS.get() {
        Some(s) => s.redact(&line).into_owned(),
        None => line,
    }
}

/// Files of more rules than this are summarised (counts per algorithm,
/// mode and key) instead of listed, unless `--verbose`: a million lines
/// is not a report.
const LIST_AT_MOST: usize = 100;

/// The errors shown of a file that has more: enough to fix it by.
const SHOW_ERRORS: usize = 50;

/// Checks `paths` (a rules file, envoyproxy/ratelimit files and
/// directories) and `config` (`--config`: the rules file, or a directory
/// of files, as `serve` reads it) and prints the report; exit code 2 when
/// they are invalid. Rules are listed one by one when `verbose` or when
/// there are at most [`LIST_AT_MOST`]; a larger file is summarised.
pub(crate) fn check_config(
    paths: &[PathBuf],
    config: Option<&std::path::Path>,
    merge_domains: bool,
    verbose: bool,
) -> ExitCode {
    // A directory, or a file with a top-level `domain:`, is
    // envoyproxy/ratelimit's; anything else is a rules file. Each file is
    // read once, here: a pipe, `/dev/stdin` or `<(...)` gives its text
    // once, and the loader takes it from `pre`.
    let mut pre = config::Preread::default();
    let (envoy, rules): (Vec<PathBuf>, Vec<PathBuf>) = paths.iter().cloned().partition(|p| {
        p.is_dir()
            || pre
                .text(p)
                .is_some_and(|t| t.lines().any(|l| l.starts_with("domain:")))
    });
    let source = match (rules.as_slice(), config) {
        ([], Some(c)) => config::Source::of_path(c.to_path_buf()),
        ([], None) => {
            return match config::load_envoy_all_read(&envoy, merge_domains, &pre) {
                Ok(domains) => {
                    let names: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
                    outln!(
                        "{}: ok, envoyproxy/ratelimit domains {names:?}",
                        envoy
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    );
                    print_domains(&domains, verbose);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    print_errors(&e);
                    ExitCode::from(2)
                }
            };
        }
        ([one], None) => {
            if let Some(text) = pre.text(one) {
                let _ = SECRETS.set(config::Secrets::of(text));
            }
            config::Source::File(one.clone())
        }
        (more, _) => {
            let mut all: Vec<String> = more.iter().map(|p| p.display().to_string()).collect();
            all.extend(config.map(|c| c.display().to_string()));
            eprintln!(
                "spillway check-config: one rules file (or --config) at most, not {} ({})",
                all.len(),
                all.join(", ")
            );
            return ExitCode::from(2);
        }
    };
    match config::load_all_listed(&source, &envoy, merge_domains, &pre) {
        Ok((cfg, files)) => {
            // Every file's `${NAME}` values, when in parts.
            let _ = SECRETS.set(cfg.secrets.clone());
            // The certificate and key files, read as `serve` reads them.
            let tls = match cfg.tls.describe() {
                Ok(lines) => lines,
                Err(e) => {
                    // A path may come from `${NAME}`.
                    eprintln!("{}", hide(e.to_string()));
                    return ExitCode::from(2);
                }
            };
            if files.is_empty() {
                outln!("{}: ok, {} rules", source.name(), cfg.rules.len());
            } else {
                outln!(
                    "{}: ok, {} rules from {} files",
                    source.name(),
                    cfg.rules.len(),
                    files.len()
                );
                print_files(&files, verbose);
            }
            match &cfg.store {
                config::StoreConfig::Memory { max_keys } => {
                    outln!("store: memory (max_keys {max_keys})");
                }
                config::StoreConfig::Redis(r) => {
                    if let Some(s) = &r.sentinel {
                        outln!(
                            "store: redis sentinel, master {:?}, {} sentinels",
                            s.master,
                            s.nodes.len()
                        );
                    } else if r.cluster.is_empty() {
                        outln!("store: redis {}", spillway_redis::redact(&r.url));
                    } else {
                        outln!("store: redis cluster, {} seed nodes", r.cluster.len());
                    }
                    outln!("  timeout {:?}, prefix {:?}", r.timeout, r.prefix);
                    if let Err(e) = spillway_redis::probe(r, Duration::from_secs(1)) {
                        outln!(
                            "warning: redis is not reachable now ({e}); spillway serve will start anyway and connect when it is"
                        );
                    }
                }
                config::StoreConfig::Sync(s) => {
                    outln!(
                        "store: redis {}, sync {} every {:?}{}",
                        spillway_redis::redact(&s.redis.url),
                        match s.sync.mode {
                            spillway_sync::SyncMode::Eventual => "eventual",
                            spillway_sync::SyncMode::Lease => "lease",
                        },
                        s.sync.interval,
                        s.sync
                            .region
                            .as_ref()
                            .map(|r| format!(", region {r}"))
                            .unwrap_or_default()
                    );
                    for (name, r) in &s.regions {
                        outln!("  region {name}: redis {}", spillway_redis::redact(&r.url));
                    }
                    let all = std::iter::once(("this region", &s.redis))
                        .chain(s.regions.iter().map(|(n, r)| (n.as_str(), r)));
                    for (name, r) in all {
                        if let Err(e) = spillway_redis::probe(r, Duration::from_secs(1)) {
                            outln!(
                                "warning: redis of {name} is not reachable now ({e}); spillway serve will start anyway and connect when it is"
                            );
                        }
                    }
                }
            }
            outln!(
                "on_store_error: {}",
                match cfg.on_store_error {
                    spillway_core::FailPolicy::Allow => "allow",
                    spillway_core::FailPolicy::Deny => "deny",
                    spillway_core::FailPolicy::Share => "share",
                }
            );
            if let Some(a) = cfg.listen {
                outln!("listen: {a}");
            }
            if let Some(a) = &cfg.grpc_listen {
                outln!("grpc_listen: {a}");
            }
            if let Some(a) = cfg.admin_listen {
                outln!("admin_listen: {a} (metrics, status and rules leave the decision port)");
            }
            let adm = &cfg.admin;
            if adm.tokens.is_empty() {
                outln!(
                    "admin: no tokens (the /admin/v1 API answers 401; metrics and status are open)"
                );
            } else {
                // Names, scopes and where each comes from; never a value.
                let list: Vec<String> = adm
                    .tokens
                    .iter()
                    .map(|t| format!("{} ({}, {})", t.name, t.scope.as_str(), t.source))
                    .collect();
                outln!("admin: tokens {}", list.join(", "));
            }
            outln!(
                "  top_keys {}, show_keys {}, near_limit {}, top_slots {}, audit_entries {}{}",
                adm.top_keys,
                adm.show_keys,
                adm.near_limit,
                adm.top_slots,
                adm.audit_entries,
                adm.state_file
                    .as_ref()
                    .map(|p| format!(", state_file {}", p.display()))
                    .unwrap_or_default()
            );
            if cfg.api.tokens.is_empty() {
                outln!("api: no tokens (the decision API is open)");
            } else {
                let list: Vec<String> = cfg
                    .api
                    .tokens
                    .iter()
                    .map(|t| format!("{} ({}, {})", t.name, t.scope.as_str(), t.source))
                    .collect();
                outln!(
                    "api: tokens {} (every decision route needs one)",
                    list.join(", ")
                );
            }
            for (name, limits) in &cfg.plans.plans {
                outln!("plan {name}: {}", limits.join("; "));
            }
            let l = &cfg.server;
            outln!(
                "server: head_timeout {:?}, idle_timeout {:?}, body_timeout {:?}, write_timeout {:?}, max_connections {}, direct_path {}",
                l.head_timeout,
                l.idle_timeout,
                l.body_timeout,
                l.write_timeout,
                l.max_connections,
                l.direct_path
            );
            for line in tls {
                outln!("{line}");
            }
            if let Some(p) = &cfg.proxy {
                print_proxy(p);
            }
            if !cfg.descriptors.is_empty() {
                outln!("descriptors: {}", cfg.descriptors.join(", "));
            }
            outln!("path_matching: {}", describe_matching(cfg.path_matching));
            outln!(
                "reload: a changed file applies after {:?} unchanged (SIGHUP: at once)",
                cfg.reload_quiet
            );
            if cfg.rules.len() > LIST_AT_MOST {
                print_summary(&cfg.rules);
            }
            let listed = if verbose || cfg.rules.len() <= LIST_AT_MOST {
                cfg.rules.as_slice()
            } else {
                &[]
            };
            for r in listed {
                outln!(
                    "- {} (api: {}, by: {}, mode: {})",
                    r.name(),
                    r.route().map_or("every API", |x| x.as_str()),
                    if r.by().parts().is_empty() {
                        "everyone (one shared counter)".to_string()
                    } else {
                        r.by().to_string()
                    },
                    r.mode()
                );
                if let Some(m) = r.path_matching().filter(|m| *m != cfg.path_matching) {
                    outln!("    path_matching: {}", describe_matching(m));
                }
                for l in r.limits() {
                    outln!("    {}", l.describe());
                }
            }
            print_domains(&cfg.domains, verbose);
            ExitCode::SUCCESS
        }
        Err(e) => {
            print_errors(&e);
            ExitCode::from(2)
        }
    }
}

/// Each file's first [`SHOW_ERRORS`] errors, each with
/// file:line:column, and how many more there are: one file's many errors
/// do not hide another's.
fn print_errors(e: &config::ConfigErrors) {
    let mut i = 0;
    while i < e.0.len() {
        let file = &e.0[i].file;
        let n = e.0[i..].iter().take_while(|x| &x.file == file).count();
        let shown = n.min(SHOW_ERRORS);
        eprintln!("{}", config::ConfigErrors(e.0[i..i + shown].to_vec()));
        if n > shown {
            eprintln!("... and {} more errors in {file} ({n} in all)", n - shown);
        }
        i += n;
    }
}

/// The files of a configuration in parts, and the rules each gives
/// (the first [`LIST_AT_MOST`] unless `verbose`).
fn print_files(files: &[(PathBuf, usize)], verbose: bool) {
    let shown = if verbose {
        files.len()
    } else {
        files.len().min(LIST_AT_MOST)
    };
    for (path, rules) in &files[..shown] {
        outln!("  {}: {rules} rules", path.display());
    }
    if shown < files.len() {
        outln!(
            "  ... and {} more files; --verbose lists them",
            files.len() - shown
        );
    }
}

/// A large rule set in a few lines: how many rules use each algorithm,
/// mode and key (`--verbose` lists them).
fn print_summary(rules: &[spillway_core::Rule]) {
    use std::collections::BTreeMap;
    let mut algorithms: BTreeMap<&str, usize> = BTreeMap::new();
    let mut modes: BTreeMap<String, usize> = BTreeMap::new();
    let mut keys: BTreeMap<String, usize> = BTreeMap::new();
    let (mut routed, mut limits) = (0usize, 0usize);
    for r in rules {
        for l in r.limits() {
            *algorithms.entry(l.algorithm_name()).or_default() += 1;
        }
        limits += r.limits().len();
        routed += usize::from(r.route().is_some());
        *modes.entry(r.mode().to_string()).or_default() += 1;
        let by = if r.by().parts().is_empty() {
            "everyone".to_string()
        } else {
            r.by().to_string()
        };
        *keys.entry(by).or_default() += 1;
    }
    let show = |m: &BTreeMap<String, usize>| -> String {
        m.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!(
        "summary: {} rules ({routed} with an api:), {limits} limits; --verbose lists every rule",
        rules.len()
    );
    outln!("  algorithms (limits): {}", show_str(&algorithms));
    outln!("  modes: {}", show(&modes));
    let top: BTreeMap<String, usize> = {
        let mut v: Vec<(String, usize)> = keys.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let more = v.len().saturating_sub(20);
        let mut m: BTreeMap<String, usize> = v.into_iter().take(20).collect();
        if more > 0 {
            m.insert(format!("(and {more} other keys)"), 0);
        }
        m
    };
    outln!("  keys (by:): {}", show(&top));
}

/// `name n, ...` of a map with `&str` keys.
fn show_str(m: &std::collections::BTreeMap<&str, usize>) -> String {
    m.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The switches as the file writes them, and what they mean.
fn describe_matching(m: spillway_core::PathMatching) -> String {
    let lenient = m == spillway_core::PathMatching::LENIENT;
    format!(
        "trailing_slash {}, path_params {}, encoded_slash {}, head_as_get {}, case {}{}",
        m.trailing_slash,
        m.path_params,
        m.encoded_slash,
        m.head_as_get,
        if m.case_insensitive {
            "insensitive"
        } else {
            "sensitive"
        },
        if lenient {
            " (every respelling counts as its path)"
        } else {
            ""
        }
    )
}

/// Prints the `proxy:` section as understood.
fn print_proxy(p: &spillway_server::proxy::Settings) {
    outln!(
        "proxy: upstream {}",
        p.upstream
            .as_ref()
            .map_or("(none: give --upstream)".to_string(), ToString::to_string)
    );
    if let Some(a) = p.listen {
        outln!("  listen {a}");
    }
    if let Some(a) = p.admin_listen {
        outln!("  admin API (metrics, health) on {a}");
    }
    match &p.user {
        Some(spillway_server::proxy::UserSource::Header(h)) => outln!("  user from header {h}"),
        Some(spillway_server::proxy::UserSource::Query(q)) => {
            outln!("  user from query parameter {q}")
        }
        None => outln!("  no user source (rules by user are skipped)"),
    }
    if !p.trusted_proxies.is_empty() {
        let nets: Vec<String> = p.trusted_proxies.iter().map(|n| n.to_string()).collect();
        outln!("  trusted proxies {}", nets.join(", "));
    }
    outln!("  upstream timeout {:?}", p.timeout);
    match p.max_connections {
        Some(n) => outln!("  upstream connections at most {n}"),
        None => outln!("  upstream connections at most a quarter of server.max_connections"),
    }
    match p.buffer_body {
        0 => outln!("  request bodies streamed as they come"),
        n => outln!("  request bodies up to {n} bytes read whole first"),
    }
    outln!("  upgrades passed through: {}", p.upgrades.join(", "));
}

/// Prints gRPC descriptor trees, one line per node: what it matches, what
/// applies there (the limit's internal name, its name as written), and its
/// switches. Past [`LIST_AT_MOST`] descriptors in all (and without
/// `verbose`), each domain's count instead: a million lines say nothing.
fn print_domains(domains: &[spillway_server::grpc::Domain], verbose: bool) {
    use spillway_server::grpc::{Action, Node};
    fn walk(nodes: &[Node], depth: usize) {
        for n in nodes {
            let what = match &n.action {
                Action::None => String::new(),
                Action::Unlimited => " -> unlimited".to_string(),
                Action::Ban { name, shadow, .. } => format!(
                    " -> {name} [0 per unit: always over limit]{}",
                    if *shadow { " (shadow)" } else { "" }
                ),
                Action::Limit(r) => format!(
                    " -> {} [{}]{}",
                    r.name(),
                    r.limits()
                        .iter()
                        .map(spillway_core::Limit::describe)
                        .collect::<Vec<_>>()
                        .join(", "),
                    if r.mode() == spillway_core::Mode::Shadow {
                        " (shadow)"
                    } else {
                        ""
                    }
                ),
            };
            let mut notes = Vec::new();
            if !n.name.is_empty() {
                notes.push(format!("name {:?}", n.name));
            }
            if !n.replaces.is_empty() {
                notes.push(format!("replaces {:?}", n.replaces));
            }
            if n.share_threshold {
                notes.push("share_threshold: one counter for every matching value".into());
            }
            if n.quota_mode {
                notes.push("quota_mode".into());
            }
            if n.detailed_metric {
                notes.push("detailed_metric".into());
            }
            if n.metadata.is_some() {
                notes.push("metadata".into());
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            };
            outln!(
                "{}{}={}{what}{notes}",
                "  ".repeat(depth + 1),
                n.key,
                n.value.as_deref().unwrap_or("(any value)")
            );
            walk(&n.children, depth + 1);
        }
    }
    fn count(nodes: &[Node]) -> usize {
        nodes.iter().map(|n| 1 + count(&n.children)).sum()
    }
    let total: usize = domains.iter().map(|d| count(&d.nodes)).sum();
    if !verbose && total > LIST_AT_MOST {
        for d in domains {
            outln!("domain {} (gRPC): {} descriptors", d.name, count(&d.nodes));
        }
        outln!(
            "summary: {total} descriptors in {} domains; --verbose lists every one",
            domains.len()
        );
        return;
    }
    for d in domains {
        outln!("domain {} (gRPC):", d.name);
        walk(&d.nodes, 0);
    }
}
