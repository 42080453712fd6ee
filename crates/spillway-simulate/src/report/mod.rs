//! The HTML report of `spillway simulate`: one self-contained page (inline
//! CSS, inline SVG plots, no scripts, nothing fetched) made from a
//! [`Summary`].
//!
//! Every string from a trace or a rules file (keys, rule names, paths,
//! reasons) is attacker-controlled: each one goes through `Esc`, which
//! makes it inert in text and in attribute values alike, and the page's
//! Content-Security-Policy refuses scripts and fetches should anything slip
//! through. The plots are hand-written SVG, in `svg`.

use std::fmt::{self, Display, Write as _};

use super::summary::{Accuracy, Differing, FileSummary, RuleSummary, Summary};

/// Writes to a `String` (which cannot fail).
macro_rules! out {
    ($o:expr, $($t:tt)*) => {{
        let _ = write!($o, $($t)*);
    }};
}

// After the macro: the plots write with it too.
mod svg;

use svg::{accuracy_plot, distribution_plot, empty, timeline_plot};

mod text;
#[allow(clippy::wildcard_imports)]
use text::*;

/// Heaviest keys listed per rule, malformed lines and differing requests
/// shown: the page stays light whatever the summary holds.
const MAX_ROWS: usize = 25;
/// Longest key, rule name or path shown, in characters.
const MAX_TEXT: usize = 160;

/// One rules file as the page shows it: `--config`, or one of `compare`.
struct File<'a> {
    config: &'a str,
    admitted: u64,
    denied: u64,
    rules: &'a [RuleSummary],
}

/// Renders the report as one self-contained HTML page: inline CSS, inline
/// SVG plots, no scripts, no network.
///
/// # Examples
///
/// ```
/// use spillway_simulate::{report, summary::Summary};
///
/// let html = report::render(&Summary::default());
/// assert!(html.starts_with("<!DOCTYPE html>"));
/// assert!(!html.contains("<script"));
/// ```
pub fn render(summary: &Summary) -> String {
    let files: Vec<File<'_>> = match &summary.compare {
        Some(c) if !c.is_empty() => c.iter().map(file_of).collect(),
        _ => vec![File {
            config: &summary.config,
            admitted: summary.admitted,
            denied: summary.denied,
            rules: &summary.rules,
        }],
    };
    let mut o = String::with_capacity(64 * 1024);
    head(&mut o, summary);
    overview(&mut o, summary, &files);
    if let Some(d) = &summary.differing {
        differing(&mut o, d, &files);
    }
    let groups = group_rules(&files);
    if !groups.is_empty() {
        o.push_str("<nav class=\"toc\"><b>Rules</b>");
        for (i, (name, _)) in groups.iter().enumerate() {
            out!(o, "<a href=\"#rule-{i}\">{}</a>", esc_short(name));
        }
        o.push_str("</nav>");
    }
    for (i, (name, rules)) in groups.iter().enumerate() {
        out!(
            o,
            "<section class=\"rule\" id=\"rule-{i}\"><h2>{}</h2><div class=\"cols cols-{}\">",
            esc_short(name),
            rules.len().min(4)
        );
        for (f, rule) in rules.iter().enumerate() {
            o.push_str("<div class=\"card\">");
            if files.len() > 1 {
                out!(o, "<h3>{}</h3>", esc_short(&file_label(f, files[f].config)));
            }
            match rule {
                Some(r) => rule_card(&mut o, r),
                None => o.push_str("<p class=\"empty\">not in this file</p>"),
            }
            o.push_str("</div>");
        }
        o.push_str("</div></section>");
    }
    o.push_str(
        "<footer>Made by <code>spillway simulate</code>. This page is one self-contained \
         file: no scripts, nothing loaded from the network.</footer></main></body></html>\n",
    );
    o
}

fn file_of(f: &FileSummary) -> File<'_> {
    File {
        config: &f.config,
        admitted: f.admitted,
        denied: f.denied,
        rules: &f.rules,
    }
}

/// `A · rules.yaml`: a short name for a file's column.
fn file_label(i: usize, config: &str) -> String {
    let letter = char::from(b'A' + (i % 26) as u8);
    let name = config.rsplit('/').next().unwrap_or(config);
    format!("{letter} · {name}")
}

/// The rules of every file matched by name, in order of first appearance
/// (`--config` first), each with one entry per file.
#[allow(clippy::type_complexity)]
fn group_rules<'a>(files: &[File<'a>]) -> Vec<(&'a str, Vec<Option<&'a RuleSummary>>)> {
    let mut groups: Vec<(&'a str, Vec<Option<&'a RuleSummary>>)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (f, file) in files.iter().enumerate() {
        for r in file.rules {
            let g = *index.entry(r.rule.as_str()).or_insert_with(|| {
                groups.push((r.rule.as_str(), vec![None; files.len()]));
                groups.len() - 1
            });
            // A name twice in one file: the first wins the column.
            if groups[g].1[f].is_none() {
                groups[g].1[f] = Some(r);
            }
        }
    }
    groups
}

fn head(o: &mut String, s: &Summary) {
    out!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; img-src data:\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>spillway simulate: {}</title><style>{CSS}</style></head><body><main>\
         <header><h1>spillway simulate</h1><p class=\"sub\">{} replayed against {}</p></header>",
        esc_short(&s.trace),
        esc_short(&s.config),
        esc_short(&s.trace)
    );
}

fn overview(o: &mut String, s: &Summary, files: &[File<'_>]) {
    o.push_str("<section id=\"overview\"><h2>Trace</h2><dl class=\"facts\">");
    out!(o, "<dt>trace</dt><dd>{}</dd>", esc(&s.trace));
    for (i, f) in files.iter().enumerate() {
        let what = if files.len() > 1 {
            format!("rules {}", char::from(b'A' + (i % 26) as u8))
        } else {
            "rules".into()
        };
        out!(o, "<dt>{what}</dt><dd>{}</dd>", esc(f.config));
    }
    out!(o, "<dt>requests</dt><dd>{}</dd>", int(s.requests));
    out!(
        o,
        "<dt>malformed lines</dt><dd>{}</dd><dt>out of order</dt><dd>{}</dd>",
        int(s.malformed),
        int(s.out_of_order)
    );
    if s.requests > 0 && s.last_ns >= s.first_ns {
        out!(
            o,
            "<dt>time span</dt><dd>{} to {} ({})</dd>",
            time(s.first_ns),
            time(s.last_ns),
            secs((s.last_ns - s.first_ns) as f64 / 1e9)
        );
    }
    out!(
        o,
        "<dt>replay</dt><dd>{:.2} s, {} requests/s</dd></dl>",
        finite(s.speed.seconds),
        int(finite(s.speed.requests_per_second).max(0.0) as u64)
    );
    // Overall outcome, per file.
    o.push_str("<div class=\"kpis\">");
    for (i, f) in files.iter().enumerate() {
        let total = f.admitted + f.denied;
        let tag = if files.len() > 1 {
            format!(" ({})", char::from(b'A' + (i % 26) as u8))
        } else {
            String::new()
        };
        out!(
            o,
            "<div class=\"kpi\"><b>{}</b><span>admitted{tag}, {}</span></div>\
             <div class=\"kpi deny\"><b>{}</b><span>denied{tag}, {}</span></div>",
            int(f.admitted),
            share(ratio(f.admitted, total)),
            int(f.denied),
            share(ratio(f.denied, total))
        );
    }
    o.push_str("</div>");
    if !s.malformed_lines.is_empty() {
        out!(
            o,
            "<h4>Malformed lines (the first {} of {})</h4><table><thead><tr>\
             <th class=\"n\">line</th><th>why</th></tr></thead><tbody>",
            s.malformed_lines.len().min(MAX_ROWS),
            int(s.malformed)
        );
        for b in s.malformed_lines.iter().take(MAX_ROWS) {
            out!(
                o,
                "<tr><td class=\"n\">{}</td><td>{}</td></tr>",
                int(b.line),
                esc_short(&b.reason)
            );
        }
        o.push_str("</tbody></table>");
    }
    rules_table(o, files);
    o.push_str("</section>");
}

/// Every rule in one table; with `--compare`, a group of columns per file.
fn rules_table(o: &mut String, files: &[File<'_>]) {
    let groups = group_rules(files);
    if groups.is_empty() {
        o.push_str("<p class=\"empty\">no rules</p>");
        return;
    }
    o.push_str("<h4>Rules</h4><div class=\"wide\"><table class=\"rules\"><thead>");
    if files.len() == 1 {
        o.push_str(
            "<tr><th>rule</th><th>mode</th><th>limits</th><th class=\"n\">applied</th>\
             <th class=\"n\">admitted</th><th class=\"n\">denied</th><th class=\"n\">denied %</th>\
             <th class=\"n\">clients</th><th class=\"n\">limited</th><th class=\"n\">limited %</th></tr>",
        );
    } else {
        o.push_str("<tr><th rowspan=\"2\">rule</th>");
        for (i, f) in files.iter().enumerate() {
            out!(
                o,
                "<th colspan=\"4\" class=\"file\">{}</th>",
                esc_short(&file_label(i, f.config))
            );
        }
        o.push_str("</tr><tr>");
        for _ in files {
            o.push_str(
                "<th class=\"n file\">applied</th><th class=\"n\">denied %</th>\
                 <th class=\"n\">limited</th><th class=\"n\">limited %</th>",
            );
        }
        o.push_str("</tr>");
    }
    o.push_str("</thead><tbody>");
    for (i, (name, rules)) in groups.iter().enumerate() {
        out!(
            o,
            "<tr><td><a href=\"#rule-{i}\">{}</a></td>",
            esc_short(name)
        );
        if let ([Some(r)], true) = (rules.as_slice(), files.len() == 1) {
            out!(
                o,
                "<td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td>",
                esc_short(&r.mode),
                limits(&r.limits),
                int(r.applied),
                int(r.admitted),
                int(r.denied),
                share(ratio(r.denied, r.applied)),
                int(r.clients),
                int(r.clients_limited),
                share(r.clients_limited_share)
            );
        } else {
            for r in rules {
                match r {
                    Some(r) => out!(
                        o,
                        "<td class=\"n file\">{}</td><td class=\"n\">{}</td>\
                         <td class=\"n\">{}</td><td class=\"n\">{}</td>",
                        int(r.applied),
                        share(ratio(r.denied, r.applied)),
                        int(r.clients_limited),
                        share(r.clients_limited_share)
                    ),
                    None => o.push_str("<td class=\"file\" colspan=\"4\">not in this file</td>"),
                }
            }
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table></div>");
}

fn limits(l: &[String]) -> String {
    let mut s = String::new();
    for (i, l) in l.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        out!(s, "<code>{}</code>", esc_short(l));
    }
    s
}

fn differing(o: &mut String, d: &Differing, files: &[File<'_>]) {
    let (a, b) = (
        files
            .first()
            .map_or(String::from("A"), |f| file_label(0, f.config)),
        files
            .get(1)
            .map_or(String::from("B"), |f| file_label(1, f.config)),
    );
    out!(
        o,
        "<section id=\"differing\"><h2>Requests decided differently</h2><div class=\"kpis\">\
         <div class=\"kpi deny\"><b>{}</b><span>admitted by {}, denied by {}</span></div>\
         <div class=\"kpi\"><b>{}</b><span>denied by {}, admitted by {}</span></div></div>",
        int(d.admitted_then_denied),
        esc_short(&a),
        esc_short(&b),
        int(d.denied_then_admitted),
        esc_short(&a),
        esc_short(&b)
    );
    if !d.samples.is_empty() {
        out!(
            o,
            "<h4>The first {}</h4><div class=\"wide\"><table><thead><tr><th class=\"n\">line</th>\
             <th>time</th><th>api</th><th>user</th><th>ip</th><th>admitted by</th>\
             <th>denied by</th></tr></thead><tbody>",
            d.samples.len().min(MAX_ROWS)
        );
        for r in d.samples.iter().take(MAX_ROWS) {
            let (yes, no) = if r.first_admitted { (&a, &b) } else { (&b, &a) };
            out!(
                o,
                "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"key\">{}</td>\
                 <td class=\"key\">{}</td><td class=\"key\">{}</td><td>{}</td><td>{}: ",
                int(r.line),
                time(r.ts_ns),
                esc_short(&r.api),
                esc_short(&r.user),
                esc_short(&r.ip),
                esc_short(yes),
                esc_short(no)
            );
            for (i, rule) in r.denied_by.iter().enumerate() {
                out!(o, "{}{}", if i > 0 { ", " } else { "" }, esc_short(rule));
            }
            o.push_str("</td></tr>");
        }
        o.push_str("</tbody></table></div>");
    }
    o.push_str("</section>");
}

fn rule_card(o: &mut String, r: &RuleSummary) {
    let mode_class = match r.mode.split_whitespace().next() {
        Some("shadow") => "shadow",
        Some("soft") => "soft",
        Some("elastic") => "elastic",
        _ => "hard",
    };
    out!(
        o,
        "<p class=\"meta\"><span class=\"badge {mode_class}\">{}</span> {}</p><div class=\"kpis\">",
        esc_short(&r.mode),
        limits(&r.limits)
    );
    let kpis = [
        ("applied", int(r.applied)),
        ("admitted", int(r.admitted)),
        (
            "denied",
            format!("{} ({})", int(r.denied), share(ratio(r.denied, r.applied))),
        ),
        ("shadow denied", int(r.shadow_denied)),
        ("soft exceeded", int(r.soft_exceeded)),
        ("skipped (no key)", int(r.skipped)),
        ("clients", int(r.clients)),
        (
            "clients limited",
            format!(
                "{} ({})",
                int(r.clients_limited),
                share(r.clients_limited_share)
            ),
        ),
    ];
    for (what, value) in kpis {
        out!(
            o,
            "<div class=\"kpi\"><b>{value}</b><span>{what}</span></div>"
        );
    }
    o.push_str("</div><div class=\"plots\"><figure>");
    timeline_plot(o, &r.rule, &r.timeline);
    o.push_str(
        "<figcaption>Offered and admitted requests per second</figcaption></figure><figure>",
    );
    distribution_plot(o, &r.rule, &r.distribution);
    out!(
        o,
        "<figcaption>Keys by their busiest {} window</figcaption></figure></div>",
        secs(r.distribution.window_secs)
    );
    top_keys(o, r);
    for a in &r.accuracy {
        accuracy(o, &r.rule, a);
    }
    if !r.suggestions.is_empty() {
        o.push_str(
            "<h4>Suggestions</h4><p class=\"note\">The smallest size limiting at most the \
             target share of clients, from the replay; in brackets, the share each size \
             limits.</p><div class=\"wide\"><table><thead><tr><th>limit</th><th>parameter</th>\
             <th class=\"n\">now</th><th class=\"n\">suggested</th><th class=\"n\">target</th>\
             </tr></thead><tbody>",
        );
        for s in &r.suggestions {
            out!(
                o,
                "<tr><td>#{} {}</td><td>{}</td><td class=\"n\">{} ({})</td>\
                 <td class=\"n\"><b>{}</b> ({}){}</td><td class=\"n\">{}</td></tr>",
                s.limit_index + 1,
                esc_short(&s.algorithm),
                esc_short(&s.parameter),
                int(s.current),
                share(s.current_limited_share),
                int(s.suggested),
                share(s.suggested_limited_share),
                if s.reaches_target {
                    ""
                } else {
                    "<br><span class=\"note\">no size reaches the target: some clients \
                     send a cost above the largest</span>"
                },
                share(s.target)
            );
        }
        o.push_str("</tbody></table></div>");
    }
}

fn top_keys(o: &mut String, r: &RuleSummary) {
    if r.top_keys.is_empty() {
        return;
    }
    out!(
        o,
        "<h4>Heaviest keys</h4><table class=\"keys\"><thead><tr><th class=\"n\">#</th><th>key</th>\
         <th class=\"n\">requests</th><th class=\"n\">share</th><th class=\"n\">denied</th>\
         <th class=\"n\">denied %</th></tr></thead><tbody>"
    );
    for (i, k) in r.top_keys.iter().take(MAX_ROWS).enumerate() {
        out!(
            o,
            "<tr><td class=\"n\">{}</td><td class=\"key\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            i + 1,
            esc_short(&k.key),
            int(k.requests),
            share(ratio(k.requests, r.applied)),
            int(k.denied),
            share(ratio(k.denied, k.requests))
        );
    }
    o.push_str("</tbody></table>");
    if r.top_keys.len() > MAX_ROWS {
        out!(
            o,
            "<p class=\"note\">and {} more in the JSON summary</p>",
            r.top_keys.len() - MAX_ROWS
        );
    }
}

fn accuracy(o: &mut String, rule: &str, a: &Accuracy) {
    out!(
        o,
        "<h4>Accuracy of limit #{}: {} per {}</h4>",
        a.limit_index + 1,
        int(a.limit),
        secs(a.window_secs)
    );
    if a.decisions == 0 || a.algorithms.is_empty() {
        return empty(o, "accuracy");
    }
    out!(
        o,
        "<p class=\"note\">Each algorithm replayed on its own over the same {} requests, \
         against the exact <code>{}</code>.</p><div class=\"wide\"><table class=\"acc\">\
         <thead><tr><th>algorithm, as configured</th><th class=\"n\">wrongly allowed</th>\
         <th class=\"n\">wrongly denied</th><th class=\"n\">wrong</th></tr></thead><tbody>",
        int(a.decisions),
        esc_short(&a.reference)
    );
    for e in &a.algorithms {
        let reference = e.algorithm == a.reference;
        out!(
            o,
            "<tr{}><td>{}{}<br><code>{}</code></td><td class=\"n\">{} ({})</td>\
             <td class=\"n\">{} ({})</td><td class=\"n\"><b>{}</b></td></tr>",
            if reference { " class=\"ref\"" } else { "" },
            esc_short(&e.algorithm),
            if reference {
                " <span class=\"badge ref\">reference</span>"
            } else {
                ""
            },
            esc_short(&e.configured),
            int(e.wrongly_allowed),
            pct(e.wrongly_allowed_pct),
            int(e.wrongly_denied),
            pct(e.wrongly_denied_pct),
            pct(e.wrong_pct)
        );
    }
    o.push_str("</tbody></table></div>");
    accuracy_plot(o, rule, a);
}

const CSS: &str = "\
:root{--fg:#1f2933;--muted:#616e7c;--line:#e1e6ec;--panel:#f5f7fa;--blue:#2563eb;--red:#dc2626}\
*{box-sizing:border-box}\
body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif;color:var(--fg);background:#fff}\
main{max-width:1320px;margin:0 auto;padding:24px 32px 48px}\
h1{font-size:22px;margin:0 0 2px}\
h2{font-size:18px;margin:36px 0 12px;padding-bottom:6px;border-bottom:2px solid var(--line)}\
h3{font-size:14px;margin:0 0 8px;color:var(--muted)}\
h4{font-size:12px;margin:18px 0 6px;color:var(--muted);text-transform:uppercase;letter-spacing:.05em}\
.sub,.note{color:var(--muted);margin:0 0 8px}\
.note{font-size:12px}\
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:3px 18px;margin:0 0 16px}\
dt{color:var(--muted)}dd{margin:0;word-break:break-all;font-variant-numeric:tabular-nums}\
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(140px,1fr));gap:8px;margin:8px 0}\
.kpi{background:var(--panel);border-radius:6px;padding:8px 10px;border-left:3px solid var(--blue)}\
.kpi.deny{border-left-color:var(--red)}\
.kpi b{display:block;font-size:16px;font-variant-numeric:tabular-nums}\
.kpi span{color:var(--muted);font-size:12px}\
.cols{display:grid;gap:16px}.cols-1{grid-template-columns:minmax(0,1fr)}\
.cols-2{grid-template-columns:repeat(2,minmax(0,1fr))}.cols-3{grid-template-columns:repeat(3,minmax(0,1fr))}\
.cols-4{grid-template-columns:repeat(4,minmax(0,1fr))}\
.card{border:1px solid var(--line);border-radius:8px;padding:14px 16px;min-width:0}\
.meta{margin:0 0 8px}\
.wide{overflow-x:auto}\
table{border-collapse:collapse;width:100%;font-size:13px;margin:4px 0}\
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}\
th{font-weight:600;color:var(--muted);background:var(--panel);white-space:nowrap}\
.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
th.file,td.file{border-left:2px solid var(--line)}\
td.key{word-break:break-all;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}\
tr.ref td{background:#f0fbf2}\
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;background:var(--panel);padding:1px 5px;border-radius:4px;overflow-wrap:anywhere}\
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;background:#e0e8f9;color:#1e3a8a}\
.badge.shadow{background:#eee;color:#333}.badge.soft,.badge.elastic{background:#fff3c4;color:#7a4b00}\
.badge.ref{background:#dcf5e1;color:#14532d}\
nav.toc{margin:24px 0 0;display:flex;flex-wrap:wrap;gap:6px 14px;font-size:13px}\
a{color:var(--blue);text-decoration:none}a:hover{text-decoration:underline}\
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:12px;margin:12px 0 4px}\
figure{margin:0}figcaption{font-size:12px;color:var(--muted);text-align:center}\
svg.plot{width:100%;height:auto;display:block;max-width:760px}\
.plot text{font-size:11px;fill:#52606d}\
.plot .at{fill:#3e4c59}.plot .name{fill:#1f2933;font-size:12px}\
.plot .grid{stroke:#edf0f3}.plot .ax{stroke:#9aa5b1}\
.plot .offered{fill:none;stroke:#243b53;stroke-width:1.5;stroke-linejoin:round}\
.plot .admitted-line{fill:none;stroke:var(--blue);stroke-width:1.5;stroke-linejoin:round}\
.plot .admitted{fill:var(--blue);fill-opacity:.16}\
.plot .denied{fill:var(--red);fill-opacity:.38}\
.plot .legend .offered{fill:#243b53}.plot .legend .admitted{fill-opacity:.4}\
.plot .bar.within{fill:var(--blue);fill-opacity:.75}.plot .bar.over{fill:var(--red);fill-opacity:.8}\
.plot .bar.straddle{fill:#d97706;fill-opacity:.8}\
.plot .limit{stroke:#111827;stroke-width:1.5;stroke-dasharray:5 3}\
.plot .limit-label{font-weight:600;fill:#111827}\
.plot .wa{fill:#d97706}.plot .wd{fill:#7c3aed}.plot .value{fill:#1f2933}\
.empty{color:var(--muted);font-style:italic;padding:18px;border:1px dashed var(--line);border-radius:6px;text-align:center;margin:0}\
footer{margin-top:40px;color:var(--muted);font-size:12px}\
@media (max-width:900px){.cols-2,.cols-3,.cols-4{grid-template-columns:minmax(0,1fr)}}";

#[cfg(test)]
mod tests;
