//! `spillway check-config --from-store`: the rules made over the admin API,
//! read back from where `serve` keeps them (Redis, from the rules file's
//! `store:`; else the memory store's `admin.state_file`), checked against
//! the rules file as an instance would, and printed.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use spillway_server::admin::assign::Assignments;
use spillway_server::admin::rules_api::{self, ApiRules, Context};
use spillway_server::config::{Config, StoreConfig};

/// The most changes read from Redis at once.
const BATCH: usize = 5_000;

/// Prints the API rules `cfg`'s store holds; exit code 2 when one does not
/// read, 1 when the store cannot be read.
pub(crate) fn print(cfg: &Config) -> ExitCode {
    let ctx = Context {
        descriptors: cfg.descriptors.clone(),
        path_matching: cfg.path_matching,
    };
    let redis = match &cfg.store {
        StoreConfig::Memory { .. } => None,
        StoreConfig::Redis(r) => Some(r.clone()),
        StoreConfig::Sync(s) => Some(s.redis.clone()),
    };
    let read = match redis {
        Some(r) => from_redis(r),
        None => from_file(cfg, &ctx),
    };
    let list = match read {
        Ok(l) => l,
        Err(e) => {
            eprintln!("spillway check-config --from-store: {e}");
            return ExitCode::from(1);
        }
    };
    let file: std::collections::HashSet<&str> = cfg.rules.iter().map(|r| r.name()).collect();
    let mut bad = 0;
    println!("API rules in the store: {}", list.len());
    for (name, version, json) in &list {
        match rules_api::build(&ctx, json) {
            Ok(r) if file.contains(name.as_str()) => {
                println!(
                    "  {name} (version {version}): shadowed by the rules file's rule of that name: {}",
                    rule_line(&r)
                );
            }
            Ok(r) => println!("  {name} (version {version}): {}", rule_line(&r)),
            Err(e) => {
                bad += 1;
                println!("  {name} (version {version}): does not read: {e}");
            }
        }
    }
    if bad > 0 {
        eprintln!("{bad} API rule(s) do not read against this rules file");
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

fn rule_line(r: &spillway_core::Rule) -> String {
    let limits: Vec<String> = r
        .limits()
        .iter()
        .map(spillway_core::Limit::describe)
        .collect();
    format!(
        "api {}, by {}, mode {}, limits [{}]",
        r.route().map_or("any", |x| x.as_str()),
        r.by(),
        r.mode(),
        limits.join(", ")
    )
}

type Listed = Vec<(String, u64, serde_json::Value)>;

fn from_redis(cfg: spillway_redis::RedisConfig) -> Result<Listed, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let wait = cfg.timeout.max(Duration::from_secs(2));
        let store = spillway_redis::RedisStore::new(cfg).map_err(|e| e.to_string())?;
        if !store.wait_connected(wait).await {
            return Err(format!("redis did not answer within {wait:?}"));
        }
        let mut out = Vec::new();
        let mut cursor = 0;
        loop {
            let (_, list) = store
                .rules_since(cursor, BATCH)
                .await
                .map_err(|e| e.to_string())?;
            let full = list.len() >= BATCH;
            for c in list {
                cursor = cursor.max(c.version);
                if let Some(text) = c.json {
                    let json = serde_json::from_str(&text)
                        .unwrap_or_else(|e| serde_json::Value::String(format!("unreadable: {e}")));
                    out.push((c.name, c.version, json));
                }
            }
            if !full {
                break;
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    })
}

fn from_file(cfg: &Config, ctx: &Context) -> Result<Listed, String> {
    let Some(path) = cfg.admin.state_file.as_deref() else {
        return Err(
            "the store is memory and admin.state_file is not set: API rules live only in the running process"
                .into(),
        );
    };
    let assign = Assignments::open(Some(path))?;
    let api = ApiRules::open(
        &assign,
        ctx.clone(),
        Arc::new(spillway_core::HealthGauge::new()),
    )?;
    Ok(api
        .page("", "", usize::MAX)
        .into_iter()
        .map(|(n, e)| (n, e.version, e.json.clone()))
        .collect())
}

/// `check-config FILE... --from-store` after the files checked: the rules
/// file among `paths` loaded again for its store, then [`print`].
pub(crate) fn run(paths: &[std::path::PathBuf], config: Option<&std::path::Path>) -> ExitCode {
    if let Some(c) = config {
        let source = spillway_server::config::Source::of_path(c.to_path_buf());
        return match spillway_server::config::load_all(&source, &[], false) {
            Ok(cfg) => print(&cfg),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    let rules: Vec<&std::path::PathBuf> = paths
        .iter()
        .filter(|p| {
            !p.is_dir()
                && !std::fs::read_to_string(p)
                    .is_ok_and(|t| t.lines().any(|l| l.starts_with("domain:")))
        })
        .collect();
    let [file] = rules.as_slice() else {
        eprintln!("spillway check-config --from-store: name the rules file whose store: to read");
        return ExitCode::from(2);
    };
    let source = spillway_server::config::Source::File((*file).clone());
    match spillway_server::config::load_all(&source, &[], false) {
        Ok(cfg) => print(&cfg),
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
