//! Draws a run recorded by `elastic_run` as an SVG: two panels over one
//! time axis, the upstream's p99 latency (log scale, the target dashed) and
//! the admitted rate (the offered rate dashed), one colour per
//! configuration.
//!
//! ```text
//! cargo run -p spillway-testkit --example elastic_plot -- \
//!     --in docs/elastic-run.csv --out docs/elastic.svg [--target-ms 100]
//! ```
//!
//! The SVG is written by hand (a few hundred bytes of markup per series):
//! no plotting crate for one figure. The CSV needs the columns `config`,
//! `second`, `offered_rps`, `admitted_rps` and `latency_p99_ms` (others
//! are ignored; an empty latency cell is a gap in the line).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str =
    "usage: elastic_plot --in FILE.csv --out FILE.svg [--target-ms MS] [--title TEXT]";

/// The figure's size, and where the panels sit in it.
const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 24.0;
/// Top of the upper panel (below the title and legend).
const TOP: f64 = 72.0;
const PANEL: f64 = 176.0;
const GAP: f64 = 28.0;

/// Series colours, in the order configurations first appear (colour-blind
/// safe pairs first).
const COLOURS: [&str; 6] = [
    "#d55e00", "#0072b2", "#009e73", "#cc79a7", "#e69f00", "#56b4e9",
];

/// One second of one configuration.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    second: f64,
    offered: f64,
    admitted: f64,
    /// `None`: no answer that second.
    p99_ms: Option<f64>,
}

/// One configuration's seconds, in file order.
#[derive(Debug, Clone, PartialEq)]
struct Run {
    config: String,
    rows: Vec<Row>,
}

/// Reads the CSV into runs, in the order their configurations first
/// appear. Errors name the line and column.
fn read_csv(text: &str) -> Result<Vec<Run>, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines.next().ok_or("the CSV is empty")?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |want: &str| {
        names
            .iter()
            .position(|n| *n == want)
            .ok_or(format!("line 1: no column {want:?} (header: {header:?})"))
    };
    let [config, second, offered, admitted, p99] = [
        col("config")?,
        col("second")?,
        col("offered_rps")?,
        col("admitted_rps")?,
        col("latency_p99_ms")?,
    ];
    let mut runs: Vec<Run> = Vec::new();
    for (i, line) in lines {
        let at = i + 1;
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        if cells.len() != names.len() {
            return Err(format!(
                "line {at}: {} fields, the header has {}",
                cells.len(),
                names.len()
            ));
        }
        let number = |c: usize| -> Result<Option<f64>, String> {
            let cell = cells[c];
            if cell.is_empty() {
                return Ok(None);
            }
            match cell.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
                _ => Err(format!(
                    "line {at}, column {}: {cell:?} is not a number >= 0",
                    names[c]
                )),
            }
        };
        let needed = |c: usize| number(c)?.ok_or(format!("line {at}, column {}: empty", names[c]));
        let name = cells[config];
        if name.is_empty() {
            return Err(format!("line {at}: no config name"));
        }
        let row = Row {
            second: needed(second)?,
            offered: needed(offered)?,
            admitted: needed(admitted)?,
            p99_ms: number(p99)?,
        };
        match runs.iter_mut().find(|r| r.config == name) {
            Some(run) => run.rows.push(row),
            None => runs.push(Run {
                config: name.to_string(),
                rows: vec![row],
            }),
        }
    }
    if runs.is_empty() {
        return Err("the CSV has a header and no rows".to_string());
    }
    Ok(runs)
}

/// A legend's words for a configuration `elastic_run` names.
fn label(config: &str) -> &str {
    match config {
        "fixed" => "fixed limit (256)",
        "adaptive" => "adaptive limit (4..256)",
        "direct" => "no proxy",
        other => other,
    }
}

/// Round steps for an axis from 0 to `max`, about `n` of them: 1, 2 or 5
/// times a power of ten.
fn nice_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n;
    let power = 10f64.powf(raw.log10().floor());
    let m = raw / power;
    let m = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * power
}

/// A latency for a tick label: `100 ms`, `1 s`.
fn ms_label(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{} s", ms / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The figure.
fn svg(runs: &[Run], target_ms: f64, title: &str) -> String {
    let rows = || runs.iter().flat_map(|r| &r.rows);
    let x_max = rows().map(|r| r.second).fold(1.0, f64::max);
    let x_step = nice_step(x_max, 8.0);
    let x_max = (x_max / x_step).ceil() * x_step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |s: f64| LEFT + s / x_max * plot_w;

    // Latency: decades from one at or below the fastest (at least 1 ms)
    // to one at or above the slowest and the target.
    let lats = || rows().filter_map(|r| r.p99_ms).filter(|v| *v > 0.0);
    let lo = lats().fold(target_ms, f64::min).max(1.0).log10().floor();
    let hi = lats().fold(target_ms, f64::max).max(1.0).log10().ceil();
    let hi = if hi <= lo { lo + 1.0 } else { hi };
    let lat_top = TOP;
    let lat_y = |ms: f64| {
        let v = ms.max(10f64.powf(lo)).log10();
        lat_top + PANEL - (v - lo) / (hi - lo) * PANEL
    };

    let rate_top = TOP + PANEL + GAP;
    let r_max = rows()
        .map(|r| r.offered.max(r.admitted))
        .fold(1.0, f64::max);
    let r_step = nice_step(r_max, 5.0);
    let r_max = (r_max / r_step).ceil() * r_step;
    let rate_y = |v: f64| rate_top + PANEL - v / r_max * PANEL;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );

    // Legend: one swatch per configuration, then what dashes mean.
    let mut lx = LEFT;
    for (i, run) in runs.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="44" x2="{}" y2="44" stroke="{c}" stroke-width="2.5"/><text x="{}" y="48">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            escape(label(&run.config))
        );
        lx += 48.0 + 6.2 * label(&run.config).len() as f64;
    }
    let _ = writeln!(
        s,
        r##"<line x1="{lx}" y1="44" x2="{}" y2="44" stroke="#555555" stroke-width="1.5" stroke-dasharray="5 4"/><text x="{}" y="48">dashed: latency target (top), offered rate (bottom)</text>"##,
        lx + 24.0,
        lx + 30.0
    );

    // Panels: frame, grid, ticks, labels.
    for top in [lat_top, rate_top] {
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#333333"/>"##
        );
        let mut t = 0.0;
        while t <= x_max + 1e-9 {
            let px = x(t);
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{}" stroke="#e5e5e5"/><line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{}" stroke="#333333"/>"##,
                top + PANEL,
                top + PANEL,
                top + PANEL + 4.0
            );
            // One time axis: numbers under the lower panel only.
            if top == rate_top {
                let _ = writeln!(
                    s,
                    r#"<text x="{px:.1}" y="{}" text-anchor="middle">{t}</text>"#,
                    top + PANEL + 16.0
                );
            }
            t += x_step;
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">time (s)</text>"#,
        LEFT + plot_w / 2.0,
        rate_top + PANEL + 34.0
    );
    let mut decade = lo;
    while decade <= hi + 1e-9 {
        let ms = 10f64.powf(decade);
        let py = lat_y(ms);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0,
            ms_label(ms)
        );
        decade += 1.0;
    }
    let mut v = 0.0;
    while v <= r_max + 1e-9 {
        let py = rate_y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0
        );
        v += r_step;
    }
    for (top, text) in [
        (lat_top, "upstream latency p99 (log)"),
        (rate_top, "admitted rate (req/s)"),
    ] {
        let cy = top + PANEL / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="18" y="{cy}" text-anchor="middle" transform="rotate(-90 18 {cy})">{text}</text>"#
        );
    }
    let ty = lat_y(target_ms);
    let _ = writeln!(
        s,
        r##"<line class="target" x1="{LEFT}" y1="{ty:.1}" x2="{}" y2="{ty:.1}" stroke="#555555" stroke-width="1.5" stroke-dasharray="5 4"/><text x="{}" y="{:.1}" fill="#555555">target {}</text>"##,
        LEFT + plot_w,
        LEFT + 6.0,
        ty - 4.0,
        ms_label(target_ms)
    );

    // Series: offered dashed under admitted, latency with gaps.
    for (i, run) in runs.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let id = escape(&run.config);
        let points = |f: &dyn Fn(&Row) -> f64| {
            run.rows
                .iter()
                .map(|r| format!("{:.1},{:.1}", x(r.second), rate_y(f(r))))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            s,
            r#"<polyline class="offered" data-config="{id}" points="{}" fill="none" stroke="{c}" stroke-opacity="0.6" stroke-width="1.5" stroke-dasharray="5 4"/>"#,
            points(&|r| r.offered)
        );
        let _ = writeln!(
            s,
            r#"<polyline class="admitted" data-config="{id}" points="{}" fill="none" stroke="{c}" stroke-width="2.5"/>"#,
            points(&|r| r.admitted)
        );
        let mut d = String::new();
        let mut pen_down = false;
        for r in &run.rows {
            match r.p99_ms {
                Some(ms) => {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1} ",
                        if pen_down { "L" } else { "M" },
                        x(r.second),
                        lat_y(ms)
                    );
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        let _ = writeln!(
            s,
            r#"<path class="latency" data-config="{id}" d="{}" fill="none" stroke="{c}" stroke-width="2.5"/>"#,
            d.trim_end()
        );
    }
    s.push_str("</svg>\n");
    s
}

struct Args {
    input: PathBuf,
    out: PathBuf,
    target_ms: f64,
    title: String,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut input, mut out, mut target_ms) = (None, None, 100.0);
    let mut title = "Fixed and adaptive concurrency limits under the same rising load".to_string();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--in" => input = Some(PathBuf::from(value("--in")?)),
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--title" => title = value("--title")?,
            "--target-ms" => {
                let v = value("--target-ms")?;
                target_ms = v
                    .parse()
                    .ok()
                    .filter(|t: &f64| t.is_finite() && *t > 0.0)
                    .ok_or(format!(
                        "--target-ms {v:?}: want a number of milliseconds > 0"
                    ))?;
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Args {
        input: input.ok_or(format!("--in is required\n{USAGE}"))?,
        out: out.ok_or(format!("--out is required\n{USAGE}"))?,
        target_ms,
        title,
    })
}

fn run(args: &Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.input)
        .map_err(|e| format!("cannot read {}: {e}", args.input.display()))?;
    let runs = read_csv(&text).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let tmp = args.out.with_extension("svg.tmp");
    std::fs::write(&tmp, svg(&runs, args.target_ms, &args.title))
        .and_then(|()| std::fs::rename(&tmp, &args.out))
        .map_err(|e| format!("cannot write {}: {e}", args.out.display()))
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)).and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("elastic_plot: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "\
config,second,offered_rps,admitted_rps,latency_p50_ms,latency_p99_ms,shed_rps,extra
fixed,0,100,100,20.5,22.0,0,x
fixed,1,200,180,300,950.5,20,
adaptive,0,100,100,20.0,21.0,0,
adaptive,1,200,190,40,,10,

adaptive,2,300,200,50,110,100,
";

    #[test]
    fn the_csv_reads_into_runs_in_order() {
        let runs = read_csv(CSV).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].config, "fixed");
        assert_eq!(runs[1].config, "adaptive");
        assert_eq!(runs[1].rows.len(), 3);
        assert_eq!(
            runs[0].rows[1],
            Row {
                second: 1.0,
                offered: 200.0,
                admitted: 180.0,
                p99_ms: Some(950.5)
            }
        );
        assert_eq!(runs[1].rows[1].p99_ms, None);
    }

    #[test]
    fn a_malformed_csv_is_an_error_that_says_where() {
        let header = "config,second,offered_rps,admitted_rps,latency_p99_ms";
        for (text, want) in [
            ("", "empty"),
            ("\n\n", "empty"),
            ("config,second\nfixed,1\n", "no column \"offered_rps\""),
            (&format!("{header}\n") as &str, "no rows"),
            (&format!("{header}\nfixed,0,1,1\n"), "line 2: 4 fields"),
            (
                &format!("{header}\nfixed,0,1,1,1\nfixed,1,1,x,1\n"),
                "line 3, column admitted_rps: \"x\"",
            ),
            (&format!("{header}\nfixed,0,-1,1,1\n"), "offered_rps"),
            (&format!("{header}\nfixed,0,1,1,NaN\n"), "latency_p99_ms"),
            (&format!("{header}\nfixed,0,1,1,inf\n"), "latency_p99_ms"),
            (&format!("{header}\nfixed,,1,1,1\n"), "column second: empty"),
            (&format!("{header}\n,0,1,1,1\n"), "no config name"),
        ] {
            let e = read_csv(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    /// Tags open and close in order, attributes are quoted, text has no
    /// bare `<` or `&`: a small well-formedness check, enough for markup
    /// this file writes.
    fn assert_well_formed(svg: &str) {
        let mut open: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find(['<', '&']) {
            let after = &rest[i..];
            if let Some(entity) = after.strip_prefix('&') {
                let ok = ["amp;", "lt;", "gt;", "quot;"]
                    .iter()
                    .any(|e| entity.starts_with(e));
                assert!(ok, "bare & at {:?}", &after[..after.len().min(20)]);
                rest = entity;
                continue;
            }
            let end = after.find('>').expect("a tag ends");
            let tag = &after[1..end];
            assert!(!tag.contains('<'), "< inside a tag: {tag:?}");
            assert_eq!(tag.matches('"').count() % 2, 0, "quotes in {tag:?}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop().as_deref(), Some(name), "closing {name}");
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().expect("a tag name");
                open.push(name.to_string());
            }
            rest = &after[end + 1..];
        }
        assert!(open.is_empty(), "left open: {open:?}");
    }

    #[test]
    fn the_svg_is_well_formed_and_has_every_series() {
        let runs = read_csv(CSV).unwrap();
        let out = svg(&runs, 100.0, "a <title> & more");
        assert!(out.starts_with("<svg "), "{out}");
        assert!(out.trim_end().ends_with("</svg>"));
        assert_well_formed(&out);
        assert!(out.contains("a &lt;title&gt; &amp; more"));
        for config in ["fixed", "adaptive"] {
            for class in ["offered", "admitted", "latency"] {
                let want = format!(r#"class="{class}" data-config="{config}""#);
                assert_eq!(out.matches(&want).count(), 1, "{want}");
            }
            assert!(out.contains(label(config)));
        }
        assert!(out.contains(r#"class="target""#));
        assert!(out.contains("target 100 ms"));
        // The gap in adaptive's latency starts a new piece of the line.
        let adaptive = out
            .lines()
            .find(|l| l.contains(r#"class="latency" data-config="adaptive""#))
            .unwrap();
        assert_eq!(adaptive.matches('M').count(), 2, "{adaptive}");
        assert_eq!(adaptive.matches('L').count(), 0, "{adaptive}");
        // Decades from 10 ms to 1 s cover 21 ms to 950 ms.
        for tick in [">10 ms<", ">100 ms<", ">1 s<"] {
            assert!(out.contains(tick), "{tick}");
        }
    }

    #[test]
    fn axes_take_round_steps() {
        assert_eq!(nice_step(1200.0, 5.0), 500.0);
        assert_eq!(nice_step(30.0, 8.0), 5.0);
        assert_eq!(nice_step(9.0, 8.0), 2.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(nice_step(f64::NAN, 5.0), 1.0);
        assert_eq!(ms_label(100.0), "100 ms");
        assert_eq!(ms_label(10000.0), "10 s");
    }

    #[test]
    fn arguments_are_checked() {
        let args = |a: &[&str]| parse_args(a.iter().map(|s| s.to_string()));
        assert!(args(&["--in", "a", "--out", "b"]).is_ok());
        for (bad, want) in [
            (&["--out", "b"][..], "--in is required"),
            (&["--in", "a"], "--out is required"),
            (&["--in"], "needs a value"),
            (
                &["--in", "a", "--out", "b", "--target-ms", "0"],
                "target-ms",
            ),
            (
                &["--in", "a", "--out", "b", "--target-ms", "x"],
                "target-ms",
            ),
            (&["--bogus"], "unknown argument"),
        ] {
            let e = args(bad).err().unwrap();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }
}
