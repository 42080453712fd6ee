//! `spillway simulate`: the flags handed to the simulate library.

use std::process::ExitCode;

use crate::cli::SimulateArgs;

pub(crate) fn run(args: SimulateArgs) -> ExitCode {
    use spillway_server::simulate;
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
    let opts = simulate::SimulateOptions {
        config: args.config,
        traces: args.trace,
        compare: args.compare,
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
