//! `spillway simulate`: the flags handed to the simulate library, and the
//! rules files read exactly as `serve` reads them.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use spillway_server::config::{Source, StoreConfig};
use spillway_simulate::RulesFile;

use crate::cli::SimulateArgs;

/// Reads and validates a rules file (the shipped examples without one) as
/// `serve` does, into the rules the replay runs.
fn load(path: Option<&Path>) -> Result<RulesFile, String> {
    let source = path.map_or(Source::Example, |p| Source::of_path(p.to_path_buf()));
    let name = path.map_or_else(
        || "<examples/rules.yaml>".to_string(),
        |p| p.display().to_string(),
    );
    let config = source
        .load()
        .map_err(|e| format!("{name}: the rules file is not valid:\n{e}"))?;
    let max_keys = match &config.store {
        StoreConfig::Memory { max_keys } => *max_keys,
        _ => {
            tracing::info!(
                "{name}: replayed on the embedded memory store at virtual time (the file's store is not used; every store decides alike)"
            );
            spillway_store::MemoryConfig::default().max_keys
        }
    };
    // Elastic rules without a health source: held to their plain limits.
    let health = Arc::new(spillway_core::HealthGauge::default());
    Ok(RulesFile {
        name,
        rules: spillway_server::rule_set(&config, 1, &health),
        max_keys,
    })
}

pub(crate) fn run(args: SimulateArgs) -> ExitCode {
    use spillway_simulate as simulate;
    if let Some(shape) = args.synthesize {
        let opts = simulate::synth::SynthOptions {
            shape,
            clients: args.clients,
            requests: args.requests,
            duration_ns: u64::try_from(args.duration.as_nanos()).unwrap_or(u64::MAX),
            seed: args.seed,
            ..simulate::synth::SynthOptions::default()
        };
        return match simulate::write_synthetic(&opts, args.out.as_deref()) {
            Ok(n) => {
                if args.out.is_some() {
                    eprintln!("wrote {n} requests");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut trace = simulate::trace::TraceOptions {
        format: args.format,
        ts_unit: args.ts_unit,
        ..Default::default()
    };
    for f in &args.field {
        if let Err(e) = trace.fields.set(f) {
            eprintln!("error: --field {f}: {e}");
            return ExitCode::from(2);
        }
    }
    let files = load(args.config.as_deref()).and_then(|config| {
        let compare = args.compare.as_deref().map(|p| load(Some(p))).transpose()?;
        Ok((config, compare))
    });
    let (config, compare) = match files {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = simulate::SimulateOptions {
        config,
        traces: args.trace,
        compare,
        report: args.report,
        json: args.json,
        decisions: args.decisions,
        trace,
        replay: simulate::replay::ReplayOptions {
            top: args.top,
            target_limited: args.target_limited,
            accuracy: !args.no_accuracy,
        },
        progress: !args.quiet,
    };
    match simulate::simulate(&opts) {
        Ok(summary) => {
            print!("{}", simulate::text(&summary));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
