//! `spillway check-config`: validates a rules file (or an
//! envoyproxy/ratelimit file) and prints what it means.

use std::process::ExitCode;
use std::time::Duration;

use crate::admin::describe_limit;
use crate::config;

/// `println!` for the report, which people pipe into `head` or `grep -q`:
/// a closed pipe ends the report quietly instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Checks `file` and prints the report; exit code 2 when it is invalid.
pub fn check_config(file: &std::path::Path) -> ExitCode {
    // An envoyproxy/ratelimit file (a top-level `domain:`) is checked as one.
    let text = std::fs::read_to_string(file).unwrap_or_default();
    if text.lines().any(|l| l.starts_with("domain:")) {
        return match config::parse_envoy(&file.display().to_string(), &text) {
            Ok(d) => {
                outln!(
                    "{}: ok, envoyproxy/ratelimit domain {:?}",
                    file.display(),
                    d.name
                );
                print_domains(std::slice::from_ref(&d));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    match config::load(file) {
        Ok(cfg) => {
            outln!("{}: ok, {} rules", file.display(), cfg.rules.len());
            match &cfg.store {
                config::StoreConfig::Memory { max_keys } => {
                    outln!("store: memory (max_keys {max_keys})");
                }
                config::StoreConfig::Redis(r) => {
                    if r.cluster.is_empty() {
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
            }
            outln!(
                "on_store_error: {}",
                match cfg.on_store_error {
                    spillway_core::FailPolicy::Allow => "allow",
                    spillway_core::FailPolicy::Deny => "deny",
                }
            );
            if let Some(a) = cfg.listen {
                outln!("listen: {a}");
            }
            if let Some(a) = cfg.grpc_listen {
                outln!("grpc_listen: {a}");
            }
            if let Some(a) = cfg.admin_listen {
                outln!("admin_listen: {a} (metrics, status and rules leave the decision port)");
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
            for r in &cfg.rules {
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
                    outln!("    {}", describe_limit(l));
                }
            }
            print_domains(&cfg.domains);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// The switches as the file writes them, and what they mean.
fn describe_matching(m: spillway_core::PathMatching) -> String {
    let lenient = m == spillway_core::PathMatching::LENIENT;
    format!(
        "trailing_slash {}, path_params {}, encoded_slash {}, head_as_get {}{}",
        m.trailing_slash,
        m.path_params,
        m.encoded_slash,
        m.head_as_get,
        if lenient {
            " (every respelling counts as its path)"
        } else {
            ""
        }
    )
}

/// Prints the `proxy:` section as understood.
fn print_proxy(p: &crate::proxy::Settings) {
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
        Some(crate::proxy::UserSource::Header(h)) => outln!("  user from header {h}"),
        Some(crate::proxy::UserSource::Query(q)) => outln!("  user from query parameter {q}"),
        None => outln!("  no user source (rules by user are skipped)"),
    }
    if !p.trusted_proxies.is_empty() {
        let nets: Vec<String> = p.trusted_proxies.iter().map(|n| n.to_string()).collect();
        outln!("  trusted proxies {}", nets.join(", "));
    }
    outln!("  upstream timeout {:?}", p.timeout);
    outln!("  upgrades passed through: {}", p.upgrades.join(", "));
}

/// Prints gRPC descriptor trees, one line per node.
fn print_domains(domains: &[crate::grpc::Domain]) {
    use crate::grpc::{Action, Node};
    fn walk(nodes: &[Node], depth: usize) {
        for n in nodes {
            let what = match &n.action {
                Action::None => String::new(),
                Action::Unlimited => " -> unlimited".to_string(),
                Action::Ban { name, .. } => format!(" -> {name} [0 per unit: always over limit]"),
                Action::Limit(r) => format!(
                    " -> {} [{}]{}",
                    r.name(),
                    r.limits()
                        .iter()
                        .map(describe_limit)
                        .collect::<Vec<_>>()
                        .join(", "),
                    if r.mode() == spillway_core::Mode::Shadow {
                        " (shadow)"
                    } else {
                        ""
                    }
                ),
            };
            let replaces = if n.replaces.is_empty() {
                String::new()
            } else {
                format!(" replaces {:?}", n.replaces)
            };
            outln!(
                "{}{}={}{what}{replaces}",
                "  ".repeat(depth + 1),
                n.key,
                n.value.as_deref().unwrap_or("*")
            );
            walk(&n.children, depth + 1);
        }
    }
    for d in domains {
        outln!("domain {} (gRPC):", d.name);
        walk(&d.nodes, 0);
    }
}
