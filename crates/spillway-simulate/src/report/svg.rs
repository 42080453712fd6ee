//! The report's plots: hand-written SVG (scales, nice ticks, polylines,
//! bars). Every coordinate is written through `C`, which turns a
//! non-finite number into 0, so a degenerate summary draws a flat plot,
//! never a broken one.

use std::fmt::{self, Display, Write as _};

use super::{esc, esc_short, finite, int, pct, secs};
use crate::summary::{Accuracy, Distribution, Timeline};

/// Width and height of the timeline and distribution plots (viewBox units).
const W: f64 = 640.0;
const H: f64 = 260.0;

/// "no requests" where a plot would have nothing to draw.
pub(super) fn empty(o: &mut String, kind: &str) {
    out!(
        o,
        "<p class=\"empty\" data-empty=\"{kind}\">no requests</p>"
    );
}

pub(super) fn timeline_plot(o: &mut String, rule: &str, t: &Timeline) {
    let n = t.offered.len().max(t.admitted.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    if (0..n).all(|i| at(&t.offered, i) == 0 && at(&t.admitted, i) == 0) {
        return empty(o, "timeline");
    }
    let b = if t.bucket_secs.is_finite() && t.bucket_secs > 0.0 {
        t.bucket_secs
    } else {
        1.0
    };
    let rate = |c: u64| c as f64 / b;
    let top = (0..n)
        .map(|i| rate(at(&t.offered, i).max(at(&t.admitted, i))))
        .fold(0.0, f64::max);
    let area = Area::new(W, H, 64.0);
    let x = Scale::linear(0.0, n as f64 * b, area.x0, area.x1);
    let y = Scale::linear(0.0, nice_max(top), area.y1, area.y0);
    let title = format!("Offered and admitted requests per second over time, rule {rule}");
    svg_open(o, "timeline", &title, W, H);
    axes(
        o,
        &area,
        &x,
        &y,
        Ticks::Time,
        "time from the start",
        "requests / s",
    );
    // Bucket centres; a single bucket is drawn across its width.
    let xs: Vec<f64> = if n == 1 {
        vec![0.0, b]
    } else {
        (0..n).map(|i| (i as f64 + 0.5) * b).collect()
    };
    let value = |v: &[u64], j: usize| rate(at(v, if n == 1 { 0 } else { j }));
    let line = |v: &[u64]| -> Vec<(f64, f64)> {
        xs.iter()
            .enumerate()
            .map(|(j, &xv)| (x.px(xv), y.px(value(v, j))))
            .collect()
    };
    let (offered, admitted) = (line(&t.offered), line(&t.admitted));
    let base = y.px(0.0);
    // Admitted: an area down to zero; denied: the band up to offered.
    let mut area_pts = vec![(admitted[0].0, base)];
    area_pts.extend_from_slice(&admitted);
    area_pts.push((admitted[admitted.len() - 1].0, base));
    out!(
        o,
        "<polygon class=\"mark admitted\" points=\"{}\"/>",
        Points(&area_pts)
    );
    if (0..n).any(|i| at(&t.offered, i) > at(&t.admitted, i)) {
        let mut band = offered.clone();
        band.extend(admitted.iter().rev());
        out!(
            o,
            "<polygon class=\"mark denied\" points=\"{}\"/>",
            Points(&band)
        );
    }
    out!(
        o,
        "<polyline class=\"mark admitted-line\" points=\"{}\"/>\
         <polyline class=\"mark offered\" points=\"{}\"/>",
        Points(&admitted),
        Points(&offered)
    );
    legend(
        o,
        &area,
        &[
            ("offered", "offered"),
            ("admitted", "admitted"),
            ("denied", "denied"),
        ],
    );
    o.push_str("</svg>");
}

pub(super) fn distribution_plot(o: &mut String, rule: &str, d: &Distribution) {
    if d.buckets.iter().all(|b| b.keys == 0) {
        return empty(o, "distribution");
    }
    let most = d.buckets.iter().map(|b| b.upto).max().unwrap_or(1);
    let most_keys = d.buckets.iter().map(|b| b.keys).max().unwrap_or(1);
    let fewest_keys = d
        .buckets
        .iter()
        .map(|b| b.keys)
        .filter(|&k| k > 0)
        .min()
        .unwrap_or(1);
    let area = Area::new(W, H, 56.0);
    // Counts are integers: the bar of (prev, upto] spans prev + 0.5 to
    // upto + 0.5, and the limit line sits at limit + 0.5, between the last
    // count a key may reach and the first it may not.
    let hi = most.max(d.limit.saturating_add(1)) as f64 + 0.5;
    let x = if hi >= 20.0 {
        Scale::log(0.5, hi * 1.15, area.x0, area.x1)
    } else {
        Scale::linear(0.0, nice_max(hi), area.x0, area.x1)
    };
    let y = if most_keys >= fewest_keys.saturating_mul(10) {
        Scale::log(0.5, nice_log_max(most_keys as f64), area.y1, area.y0)
    } else {
        Scale::linear(0.0, nice_max(most_keys as f64), area.y1, area.y0)
    };
    let title = format!(
        "Keys by requests in their busiest {} window, rule {rule}, limit {}",
        secs(d.window_secs),
        d.limit
    );
    svg_open(o, "distribution", &title, W, H);
    axes(
        o,
        &area,
        &x,
        &y,
        Ticks::Count,
        &format!(
            "requests in the key's busiest {} window",
            secs(d.window_secs)
        ),
        "keys",
    );
    let base = y.px(y.lo);
    let mut prev = 0u64;
    for b in &d.buckets {
        let (lo, hi) = (prev.min(b.upto), b.upto);
        prev = prev.max(b.upto);
        if b.keys == 0 {
            continue;
        }
        let (x0, x1) = (x.px(lo as f64 + 0.5), x.px(hi as f64 + 0.5));
        let (left, width) = (x0.min(x1), (x1 - x0).abs());
        let gap = if width > 4.0 { 1.0 } else { 0.0 };
        let top = y.px(b.keys as f64);
        let class = if lo >= d.limit {
            "over"
        } else if hi > d.limit {
            "straddle"
        } else {
            "within"
        };
        out!(
            o,
            "<rect class=\"mark bar {class}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\">\
             <title>{} to {}: {} keys</title></rect>",
            C(left + gap / 2.0),
            C(top),
            C((width - gap).max(1.0)),
            C((base - top).max(0.0)),
            int(if lo == 0 { 0 } else { lo + 1 }),
            int(hi),
            int(b.keys)
        );
    }
    let lx = x.px(d.limit as f64 + 0.5);
    let (anchor, dx) = if lx > area.x1 - 80.0 {
        ("end", -5.0)
    } else {
        ("start", 5.0)
    };
    out!(
        o,
        "<line class=\"mark limit\" x1=\"{lx}\" y1=\"{}\" x2=\"{lx}\" y2=\"{}\"/>\
         <text class=\"limit-label\" x=\"{}\" y=\"{}\" text-anchor=\"{anchor}\">limit {}</text>",
        C(area.y0),
        C(area.y1),
        C(lx + dx),
        C(area.y0 + 12.0),
        int(d.limit),
        lx = C(lx)
    );
    legend(
        o,
        &area,
        &[("bar within", "within the limit"), ("bar over", "over it")],
    );
    o.push_str("</svg>");
}

pub(super) fn accuracy_plot(o: &mut String, rule: &str, a: &Accuracy) {
    if a.decisions == 0 || a.algorithms.is_empty() {
        return empty(o, "accuracy");
    }
    let row = 24.0;
    let h = 56.0 + row * a.algorithms.len() as f64;
    let area = Area {
        x0: 170.0,
        x1: W - 70.0,
        y0: 26.0,
        y1: h - 30.0,
    };
    let top = a
        .algorithms
        .iter()
        .map(|e| finite(e.wrongly_allowed_pct) + finite(e.wrongly_denied_pct))
        .fold(0.0, f64::max);
    let x = Scale::linear(0.0, nice_max(top), area.x0, area.x1);
    let title = format!(
        "Wrong decisions per algorithm against {}, rule {rule}, limit #{}",
        a.reference,
        a.limit_index + 1
    );
    svg_open(o, "accuracy", &title, W, h);
    for t in x.ticks() {
        let px = C(x.px(t));
        out!(
            o,
            "<line class=\"grid\" x1=\"{px}\" y1=\"{}\" x2=\"{px}\" y2=\"{}\"/>\
             <text class=\"tl\" x=\"{px}\" y=\"{}\" text-anchor=\"middle\">{}%</text>",
            C(area.y0),
            C(area.y1),
            C(area.y1 + 14.0),
            tick_label(t, x.step())
        );
    }
    out!(
        o,
        "<text class=\"at\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">wrong decisions, % of requests</text>",
        C((area.x0 + area.x1) / 2.0),
        C(h - 4.0)
    );
    for (i, e) in a.algorithms.iter().enumerate() {
        let cy = area.y0 + row * (i as f64 + 0.5);
        let (wa, wd) = (finite(e.wrongly_allowed_pct), finite(e.wrongly_denied_pct));
        out!(
            o,
            "<text class=\"name\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}{}</text>",
            C(area.x0 - 8.0),
            C(cy + 4.0),
            esc_short(&e.algorithm),
            if e.algorithm == a.reference {
                " (ref.)"
            } else {
                ""
            }
        );
        let x_wa = x.px(wa);
        let x_end = x.px(wa + wd);
        for (class, from, to, what, v) in [
            ("wa", area.x0, x_wa, "wrongly allowed", wa),
            ("wd", x_wa, x_end, "wrongly denied", wd),
        ] {
            if to - from > 0.0 {
                out!(
                    o,
                    "<rect class=\"mark {class}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"14\">\
                     <title>{}: {what} {}</title></rect>",
                    C(from),
                    C(cy - 7.0),
                    C((to - from).max(0.5)),
                    esc_short(&e.algorithm),
                    pct(v)
                );
            }
        }
        out!(
            o,
            "<text class=\"mark value\" x=\"{}\" y=\"{}\">{}</text>",
            C(x_end + 6.0),
            C(cy + 4.0),
            pct(finite(e.wrong_pct))
        );
    }
    out!(
        o,
        "<line class=\"ax\" x1=\"{x0}\" y1=\"{}\" x2=\"{x0}\" y2=\"{}\"/>",
        C(area.y0),
        C(area.y1),
        x0 = C(area.x0)
    );
    legend(
        o,
        &area,
        &[("wa", "wrongly allowed"), ("wd", "wrongly denied")],
    );
    o.push_str("</svg>");
}

/// The plotting area inside a plot's margins.
struct Area {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Area {
    fn new(w: f64, h: f64, left: f64) -> Area {
        Area {
            x0: left,
            x1: w - 18.0,
            y0: 28.0,
            y1: h - 40.0,
        }
    }
}

/// A map from data to pixels, linear or logarithmic (base 10).
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    r0: f64,
    r1: f64,
}

impl Scale {
    fn linear(lo: f64, hi: f64, r0: f64, r1: f64) -> Scale {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        Scale {
            lo,
            hi,
            log: false,
            r0,
            r1,
        }
    }

    /// `lo` must be positive; values below it are drawn at it.
    fn log(lo: f64, hi: f64, r0: f64, r1: f64) -> Scale {
        let lo = if lo > 0.0 { lo } else { 1.0 };
        let hi = if hi > lo { hi } else { lo * 10.0 };
        Scale {
            lo,
            hi,
            log: true,
            r0,
            r1,
        }
    }

    fn px(&self, v: f64) -> f64 {
        let t = if self.log {
            (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        let t = if t.is_finite() { t } else { 0.0 };
        self.r0 + t * (self.r1 - self.r0)
    }

    /// The step between linear ticks (the smallest decade for log).
    fn step(&self) -> f64 {
        if self.log {
            1.0
        } else {
            nice_step((self.hi - self.lo) / 5.0)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let mut ticks = Vec::new();
        if self.log {
            let (a, b) = (
                self.lo.log10().floor() as i32,
                self.hi.log10().ceil() as i32,
            );
            for k in a..=b.min(a + 30) {
                for m in [1.0, 2.0, 5.0] {
                    let v = m * 10f64.powi(k);
                    if v >= self.lo && v <= self.hi && (m == 1.0 || b - a <= 2) {
                        ticks.push(v);
                    }
                }
            }
        } else {
            let step = self.step();
            let mut v = (self.lo / step).ceil() * step;
            while v <= self.hi * (1.0 + 1e-9) && ticks.len() < 20 {
                ticks.push(v);
                v += step;
            }
        }
        ticks
    }

    /// Ticks at round durations (the data are seconds).
    fn time_ticks(&self) -> (Vec<f64>, f64) {
        const STEPS: [f64; 22] = [
            0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
            900.0, 1800.0, 3600.0, 7200.0, 10_800.0, 21_600.0, 43_200.0, 86_400.0,
        ];
        let span = self.hi - self.lo;
        let step = STEPS
            .iter()
            .copied()
            .find(|s| span / s <= 7.0)
            .unwrap_or_else(|| nice_step(span / 6.0 / 86_400.0) * 86_400.0);
        let mut ticks = Vec::new();
        let mut v = (self.lo / step).ceil() * step;
        while v <= self.hi * (1.0 + 1e-9) && ticks.len() < 20 {
            ticks.push(v);
            v += step;
        }
        (ticks, step)
    }
}

/// How an axis labels its ticks.
#[derive(Clone, Copy)]
enum Ticks {
    /// Seconds, as durations.
    Time,
    /// Plain numbers.
    Count,
}

/// Opens `<svg class="plot" data-plot=KIND>` with its title.
fn svg_open(o: &mut String, kind: &str, title: &str, w: f64, h: f64) {
    out!(
        o,
        "<svg class=\"plot\" data-plot=\"{kind}\" viewBox=\"0 0 {} {}\" role=\"img\">\
         <title>{}</title>",
        C(w),
        C(h),
        esc(title)
    );
}

/// Grid lines, tick labels, both axis lines and their titles.
fn axes(o: &mut String, a: &Area, x: &Scale, y: &Scale, xt: Ticks, xtitle: &str, ytitle: &str) {
    for t in y.ticks() {
        let py = C(y.px(t));
        out!(
            o,
            "<line class=\"grid\" x1=\"{}\" y1=\"{py}\" x2=\"{}\" y2=\"{py}\"/>\
             <text class=\"tl\" x=\"{}\" y=\"{py}\" dy=\"4\" text-anchor=\"end\">{}</text>",
            C(a.x0),
            C(a.x1),
            C(a.x0 - 6.0),
            tick_label(t, y.step())
        );
    }
    let (ticks, step) = match xt {
        Ticks::Time if !x.log => x.time_ticks(),
        _ => (x.ticks(), x.step()),
    };
    for t in ticks {
        let px = C(x.px(t));
        let label = match xt {
            Ticks::Time => secs(t),
            Ticks::Count => tick_label(t, step),
        };
        out!(
            o,
            "<line class=\"ax\" x1=\"{px}\" y1=\"{}\" x2=\"{px}\" y2=\"{}\"/>\
             <text class=\"tl\" x=\"{px}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            C(a.y1),
            C(a.y1 + 4.0),
            C(a.y1 + 16.0)
        );
    }
    out!(
        o,
        "<line class=\"ax\" x1=\"{x0}\" y1=\"{y1}\" x2=\"{}\" y2=\"{y1}\"/>\
         <line class=\"ax\" x1=\"{x0}\" y1=\"{}\" x2=\"{x0}\" y2=\"{y1}\"/>\
         <text class=\"at\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text class=\"at\" x=\"{}\" y=\"{}\" text-anchor=\"start\">{}</text>",
        C(a.x1),
        C(a.y0),
        C((a.x0 + a.x1) / 2.0),
        C(a.y1 + 32.0),
        esc(xtitle),
        C(a.x0 - 6.0),
        C(a.y0 - 12.0),
        esc(ytitle),
        x0 = C(a.x0),
        y1 = C(a.y1)
    );
}

/// Swatches and names, right-aligned above the plotting area.
fn legend(o: &mut String, a: &Area, items: &[(&str, &str)]) {
    let mut x = a.x1;
    for (class, name) in items.iter().rev() {
        let width = 7.0 * name.len() as f64 + 20.0;
        x -= width;
        out!(
            o,
            "<g class=\"legend\"><rect class=\"{class}\" x=\"{}\" y=\"{}\" width=\"12\" height=\"8\"/>\
             <text x=\"{}\" y=\"{}\">{}</text></g>",
            C(x),
            C(a.y0 - 18.0),
            C(x + 16.0),
            C(a.y0 - 10.0),
            esc(name)
        );
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let f = raw / p;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * p
}

/// A round top for a linear axis showing `max`.
fn nice_max(max: f64) -> f64 {
    if !(max.is_finite() && max > 0.0) {
        return 1.0;
    }
    let step = nice_step(max / 5.0);
    (max / step).ceil() * step
}

/// The power of ten at or above `max` (at least 10).
fn nice_log_max(max: f64) -> f64 {
    if !(max.is_finite() && max > 1.0) {
        return 10.0;
    }
    10f64.powf(max.log10().ceil()).max(10.0)
}

/// A tick value, with as many decimals as its step needs, and `k`/`M`/`G`
/// for large ones.
fn tick_label(v: f64, step: f64) -> String {
    let v = finite(v);
    let a = v.abs();
    let (div, suffix) = if a >= 1e9 {
        (1e9, "G")
    } else if a >= 1e6 {
        (1e6, "M")
    } else if a >= 1e4 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    if div > 1.0 {
        let s = format!("{:.1}", v / div);
        return format!("{}{suffix}", s.trim_end_matches(".0"));
    }
    let decimals = if step >= 1.0 || !step.is_finite() || step <= 0.0 {
        0
    } else {
        ((-step.log10()).ceil() as usize).min(6)
    };
    format!("{v:.decimals$}")
}

/// A coordinate: one decimal, and 0 for a non-finite number.
struct C(f64);

impl Display for C {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = if self.0.is_finite() { self.0 } else { 0.0 };
        let r = (v * 10.0).round() / 10.0;
        if r.fract() == 0.0 {
            write!(f, "{}", r as i64)
        } else {
            write!(f, "{r:.1}")
        }
    }
}

/// Polyline points `x,y x,y ...`.
struct Points<'a>(&'a [(f64, f64)]);

impl Display for Points<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (x, y)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{},{}", C(*x), C(*y))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_scales_place_them() {
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(0.013), 0.02);
        assert_eq!(nice_max(87.0), 100.0);
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(tick_label(25_000.0, 5_000.0), "25k");
        assert_eq!(tick_label(2_500_000.0, 500_000.0), "2.5M");
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        let s = Scale::log(0.5, 1000.0, 0.0, 100.0);
        assert_eq!(s.ticks(), [1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(s.px(0.0), 0.0);
        let t = Scale::linear(0.0, 600.0, 0.0, 100.0).time_ticks();
        assert_eq!(t.0, [0.0, 120.0, 240.0, 360.0, 480.0, 600.0]);
    }
}
