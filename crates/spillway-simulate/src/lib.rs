//! `spillway simulate`: replay recorded or synthetic traffic through rules
//! files at virtual time, and report what they would do.
//!
//! - [`trace`]: readers of access logs (combined log format, JSON lines,
//!   CSV; gzip), one reused [`trace::Record`] per request.
//! - [`replay`]: the real engine (the limiter and memory store `serve`
//!   runs) on a clock the trace moves, with the statistics, the
//!   comparison of algorithms against the exact log, and suggestions.
//! - [`summary`]: what a replay found (`--json`).
//! - [`report`]: the same as one self-contained HTML page with SVG plots.
//! - [`synth`]: synthetic traces when there is no log to replay.

#![warn(missing_docs, unreachable_pub)]

pub mod replay;
pub mod report;
pub mod summary;
pub mod synth;
pub mod trace;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use spillway_core::{ManualClock, Nanos};
use spillway_store::RuleSet;

use replay::{FileRun, ReplayOptions};
use summary::{Differing, DifferingRequest, Speed, Summary};
use trace::{Record, TraceOptions, TraceReader};

/// Differing requests listed by `--compare` (all are counted).
const DIFFERING_SAMPLES: usize = 50;

/// What `spillway simulate` was asked to do.
#[derive(Debug, Clone)]
pub struct SimulateOptions {
    /// The rules file (`--config`), read and validated by the caller as
    /// `serve` reads it.
    pub config: RulesFile,
    /// Trace files (`--trace`, `-` for stdin), replayed one after another.
    pub traces: Vec<PathBuf>,
    /// A second rules file to replay side by side (`--compare`).
    pub compare: Option<RulesFile>,
    /// Where to write the HTML report (`--report`).
    pub report: Option<PathBuf>,
    /// Where to write the summary as JSON (`--json`).
    pub json: Option<PathBuf>,
    /// Where to write every decision, one JSON object per line (`--decisions`).
    pub decisions: Option<PathBuf>,
    /// How to read the traces.
    pub trace: TraceOptions,
    /// What to work out besides the decisions.
    pub replay: ReplayOptions,
    /// Draw a progress bar on standard error (when it is a terminal).
    pub progress: bool,
}

/// A rules file to replay, as the caller read and validated it (the
/// `spillway` binary reads it exactly as `serve` does, so a file `serve`
/// refuses is refused here too, with the same errors).
#[derive(Debug, Clone)]
pub struct RulesFile {
    /// The name shown in the summary and report (its path as given).
    pub name: String,
    /// The rules `serve` would build from the file (elastic rules without
    /// a health source: held to their plain limits).
    pub rules: RuleSet,
    /// The memory store's key cap (`store.memory.max_keys`, or the
    /// default when the file names another store: the replay always runs
    /// on the memory store, where every store decides alike).
    pub max_keys: usize,
}

impl RulesFile {
    /// Reads the rules of a rules file as spillway-rules reads them
    /// (rules, plans' default limits, descriptors, path matching, failure
    /// policy; a server's other sections skipped), for a library user who
    /// replays rules without the server. The `spillway` binary reads the
    /// whole file as `serve` does instead, so that it refuses what `serve`
    /// refuses and honours `store.memory.max_keys`.
    ///
    /// # Errors
    /// Every problem in the file, located.
    pub fn parse(name: &str, text: &str) -> Result<RulesFile, spillway_rules::Errors> {
        let file = spillway_rules::parse(name, text)?;
        // Elastic rules without a health source: held to their plain limits.
        let health = std::sync::Arc::new(spillway_core::HealthGauge::default());
        let rules = file
            .rules
            .into_iter()
            .map(|r| r.with_health(health.clone()))
            .collect();
        let mut set = RuleSet::with_path_matching(rules, file.path_matching);
        set.on_store_error = file.on_store_error;
        Ok(RulesFile {
            name: name.to_string(),
            rules: set,
            max_keys: spillway_store::MemoryConfig::default().max_keys,
        })
    }
}

/// Why a simulation could not run: a message for the operator.
#[derive(Debug)]
pub struct SimulateError(String);

impl std::fmt::Display for SimulateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimulateError {}

fn create(path: &Path, what: &str) -> Result<std::io::BufWriter<std::fs::File>, SimulateError> {
    std::fs::File::create(path)
        .map(|f| std::io::BufWriter::with_capacity(1 << 16, f))
        .map_err(|e| SimulateError(format!("{}: cannot write the {what}: {e}", path.display())))
}

fn write_failed(path: &Path, e: std::io::Error) -> SimulateError {
    SimulateError(format!("{}: write failed: {e}", path.display()))
}

/// Replays the traces through the rules file(s) and writes the outputs
/// asked for. Returns the summary (also printed by the command).
///
/// # Errors
/// A rules file is not valid, a trace cannot be opened or fails while
/// being read (I/O, corrupt gzip), or an output cannot be written.
/// Malformed lines are not errors: they are counted in the summary.
pub fn simulate(opts: &SimulateOptions) -> Result<Summary, SimulateError> {
    let started = Instant::now();
    let files: Vec<&RulesFile> = std::iter::once(&opts.config)
        .chain(opts.compare.as_ref())
        .collect();
    if opts.traces.is_empty() {
        return Err(SimulateError("no trace given: --trace FILE".into()));
    }
    let mut readers = Vec::new();
    for path in &opts.traces {
        let reader =
            TraceReader::open(path, &opts.trace).map_err(|e| SimulateError(e.to_string()))?;
        readers.push(reader);
    }
    let clock = ManualClock::new(Nanos(0));
    let mut runs: Vec<FileRun> = files
        .iter()
        .map(|file| FileRun::new(file, &clock, &opts.replay))
        .collect();
    let mut decisions = match &opts.decisions {
        Some(p) => Some((create(p, "decisions")?, p)),
        None => None,
    };
    let total: u64 = readers.iter().filter_map(TraceReader::total_bytes).sum();
    let bar = progress_bar(opts.progress, total);
    let mut summary = Summary {
        trace: opts
            .traces
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        config: files[0].name.clone(),
        ..Summary::default()
    };
    let mut differing = Differing::default();
    let mut rec = Record::default();
    let mut now: Option<u64> = None;
    let mut done_bytes = 0u64;
    let mut line_buf = String::new();
    for (reader, trace_path) in readers.iter_mut().zip(&opts.traces) {
        let trace_name = trace_path.display().to_string();
        let mut since_tick = 0u32;
        loop {
            let more = reader
                .read(&mut rec)
                .map_err(|e| SimulateError(e.to_string()))?;
            if !more {
                break;
            }
            summary.requests += 1;
            let t = match now {
                Some(n) if rec.ts_ns < n => {
                    summary.out_of_order += 1;
                    n
                }
                _ => rec.ts_ns,
            };
            if now.is_none() {
                summary.first_ns = t;
            }
            now = Some(t);
            clock.set(Nanos(t));
            let first = runs[0].decide(&rec, t);
            if let Some((out, path)) = decisions.as_mut() {
                line_buf.clear();
                decision_line(&mut line_buf, &trace_name, &rec, t, &first);
                out.write_all(line_buf.as_bytes())
                    .map_err(|e| write_failed(path, e))?;
            }
            if runs.len() > 1 {
                let second = runs[1].decide(&rec, t);
                if first.decision.allowed != second.decision.allowed {
                    if first.decision.allowed {
                        differing.admitted_then_denied += 1;
                    } else {
                        differing.denied_then_admitted += 1;
                    }
                    if differing.samples.len() < DIFFERING_SAMPLES {
                        let denier = if first.decision.allowed {
                            &second
                        } else {
                            &first
                        };
                        differing.samples.push(differing_request(
                            &trace_name,
                            &rec,
                            t,
                            &first,
                            denier,
                        ));
                    }
                }
            }
            since_tick += 1;
            if since_tick == 65_536 {
                since_tick = 0;
                if let Some(bar) = &bar {
                    bar.set_position(done_bytes + reader.bytes_read());
                }
            }
        }
        done_bytes += reader.bytes_read();
        summary.malformed += reader.malformed();
        for bad in reader.bad_lines() {
            if summary.malformed_lines.len() < 100 {
                summary.malformed_lines.push(bad.clone());
            }
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if let Some((mut out, path)) = decisions {
        out.flush().map_err(|e| write_failed(path, e))?;
    }
    summary.last_ns = now.unwrap_or(0);
    let seconds = started.elapsed().as_secs_f64();
    summary.speed = Speed {
        seconds,
        requests_per_second: if seconds > 0.0 {
            summary.requests as f64 / seconds
        } else {
            0.0
        },
    };
    let top = opts.replay.top;
    let mut per_file: Vec<_> = runs
        .iter()
        .map(|r| r.summary(summary.requests, summary.malformed, top))
        .collect();
    summary.admitted = per_file[0].admitted;
    summary.denied = per_file[0].denied;
    summary.rules = per_file[0].rules.clone();
    if per_file.len() > 1 {
        summary.differing = Some(differing);
        summary.compare = Some(std::mem::take(&mut per_file));
    }
    if let Some(path) = &opts.json {
        let mut out = create(path, "JSON summary")?;
        serde_json::to_writer_pretty(&mut out, &summary)
            .map_err(|e| write_failed(path, std::io::Error::other(e)))?;
        out.write_all(b"\n").map_err(|e| write_failed(path, e))?;
        out.flush().map_err(|e| write_failed(path, e))?;
    }
    if let Some(path) = &opts.report {
        std::fs::write(path, report::render(&summary)).map_err(|e| write_failed(path, e))?;
    }
    Ok(summary)
}

fn progress_bar(wanted: bool, total: u64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !wanted || total == 0 || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} replaying [{bar:40}] {bytes}/{total_bytes} ({eta} left)",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

/// One decision as a JSON line: `{"file", "line", "ts_ns", "allowed", "rules":
/// [{"rule", "outcome", "limit", "remaining", "retry_after_ms"}]}`, the
/// per-rule fields as the decision API writes them.
fn decision_line(
    out: &mut String,
    file: &str,
    rec: &Record,
    now: u64,
    checked: &spillway_store::Checked,
) {
    out.push_str("{\"file\":");
    out.push_str(&serde_json::to_string(file).unwrap_or_default());
    let _ = write!(
        out,
        ",\"line\":{},\"ts_ns\":{},\"allowed\":{},\"rules\":[",
        rec.line, now, checked.decision.allowed
    );
    for (i, d) in checked.decision.rules.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let name = checked.rule(d).map_or("", |r| r.name());
        out.push_str("{\"rule\":");
        out.push_str(&serde_json::to_string(name).unwrap_or_default());
        let _ = write!(
            out,
            ",\"outcome\":\"{}\",\"limit\":{},\"remaining\":{},\"retry_after_ms\":{}}}",
            d.outcome.as_str(),
            d.verdict.limit,
            d.verdict.remaining,
            d.retry_ms()
        );
    }
    out.push_str("]}\n");
}

fn differing_request(
    file: &str,
    rec: &Record,
    now: u64,
    first: &spillway_store::Checked,
    denier: &spillway_store::Checked,
) -> DifferingRequest {
    let api = if rec.method.is_empty() {
        rec.path.clone()
    } else {
        format!("{} {}", rec.method, rec.path)
    };
    DifferingRequest {
        file: file.to_string(),
        line: rec.line,
        ts_ns: now,
        api,
        user: rec.user.clone(),
        ip: rec.ip.clone(),
        first_admitted: first.decision.allowed,
        denied_by: denier
            .decision
            .rules
            .iter()
            .filter(|d| d.outcome == spillway_core::Outcome::Denied)
            .filter_map(|d| denier.rule(d).map(|r| r.name().to_string()))
            .collect(),
    }
}

/// The summary for a terminal: per rule, what it did and to how many
/// clients; the algorithm comparison and suggestions when present.
pub fn text(summary: &Summary) -> String {
    let mut s = String::new();
    let span = summary.last_ns.saturating_sub(summary.first_ns) as f64 / 1e9;
    let _ = writeln!(
        s,
        "{} requests over {:.1}s replayed in {:.2}s ({:.0}/s); {} malformed lines, {} out of order",
        summary.requests,
        span,
        summary.speed.seconds,
        summary.speed.requests_per_second,
        summary.malformed,
        summary.out_of_order
    );
    for bad in summary.malformed_lines.iter().take(5) {
        let _ = writeln!(s, "  {}:{}: {}", bad.file, bad.line, bad.reason);
    }
    let files: Vec<(&str, u64, u64, &[summary::RuleSummary])> = match &summary.compare {
        Some(c) => c
            .iter()
            .map(|f| (f.config.as_str(), f.admitted, f.denied, f.rules.as_slice()))
            .collect(),
        None => vec![(
            summary.config.as_str(),
            summary.admitted,
            summary.denied,
            summary.rules.as_slice(),
        )],
    };
    for (config, admitted, denied, rules) in files {
        let _ = writeln!(
            s,
            "\n{config}: {admitted} admitted, {denied} denied\n  {:<24} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7}",
            "rule", "applied", "admitted", "denied", "clients", "limited", "share"
        );
        for r in rules {
            let _ = writeln!(
                s,
                "  {:<24} {:>10} {:>10} {:>10} {:>9} {:>9} {:>6.2}%",
                r.rule,
                r.applied,
                r.admitted,
                r.denied,
                r.clients,
                r.clients_limited,
                100.0 * r.clients_limited_share
            );
        }
        for r in rules {
            for a in &r.accuracy {
                let _ = writeln!(
                    s,
                    "  {} limit #{} ({} per {}s) against the exact log, {} decisions:",
                    r.rule,
                    a.limit_index + 1,
                    a.limit,
                    a.window_secs,
                    a.decisions
                );
                for e in &a.algorithms {
                    let _ = writeln!(
                        s,
                        "    {:<24} wrongly allowed {:>9} ({:.4}%)  wrongly denied {:>9} ({:.4}%)",
                        e.algorithm,
                        e.wrongly_allowed,
                        e.wrongly_allowed_pct,
                        e.wrongly_denied,
                        e.wrongly_denied_pct
                    );
                }
            }
            for g in &r.suggestions {
                let miss = if g.reaches_target {
                    ""
                } else {
                    " (no size reaches the target: some clients send a cost above the largest)"
                };
                let _ = writeln!(
                    s,
                    "  {} limit #{} ({}): {} {} limits {:.2}% of clients; {} would limit {:.2}% (target {:.2}%){miss}",
                    r.rule,
                    g.limit_index + 1,
                    g.algorithm,
                    g.parameter,
                    g.current,
                    100.0 * g.current_limited_share,
                    g.suggested,
                    100.0 * g.suggested_limited_share,
                    100.0 * g.target
                );
            }
        }
    }
    if let Some(d) = &summary.differing {
        let _ = writeln!(
            s,
            "\ndiffering: {} admitted then denied, {} denied then admitted",
            d.admitted_then_denied, d.denied_then_admitted
        );
    }
    s
}

/// Parses `--target-limited`: a percentage, `1%` or `1` (0 to 100).
///
/// # Errors
/// Not a number, or outside 0 to 100.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let n = s.trim().trim_end_matches('%').trim();
    let v: f64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a percentage such as 1% or 0.5%"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s:?}: a share of clients is from 0% to 100%"));
    }
    Ok(v / 100.0)
}

/// Writes a synthetic trace to `out` (standard output when `None` or
/// `-`; gzipped when the name ends in `.gz`). Returns the requests written.
///
/// # Errors
/// The options are out of range, or the file cannot be written.
pub fn write_synthetic(
    opts: &synth::SynthOptions,
    out: Option<&Path>,
) -> Result<u64, SimulateError> {
    synth::validate(opts).map_err(SimulateError)?;
    let path = out.filter(|p| p.as_os_str() != "-");
    let failed = |e: std::io::Error| match path {
        Some(p) => write_failed(p, e),
        None => SimulateError(format!("standard output: write failed: {e}")),
    };
    match path {
        Some(p) => {
            let file = create(p, "trace")?;
            if p.extension().is_some_and(|e| e == "gz") {
                let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
                let n = synth::synthesize(opts, &mut gz).map_err(failed)?;
                gz.finish().and_then(|mut f| f.flush()).map_err(failed)?;
                Ok(n)
            } else {
                let mut file = file;
                let n = synth::synthesize(opts, &mut file).map_err(failed)?;
                file.flush().map_err(failed)?;
                Ok(n)
            }
        }
        None => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
            let n = synth::synthesize(opts, &mut out).map_err(failed)?;
            out.flush().map_err(failed)?;
            Ok(n)
        }
    }
}

#[cfg(test)]
mod tests;
