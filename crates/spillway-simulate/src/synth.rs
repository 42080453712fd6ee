//! Synthetic traces, for when a user has none: `spillway simulate
//! --synthesize SHAPE`.
//!
//! A trace is made in three steps, each seeded from [`SynthOptions::seed`]
//! (same options, byte-identical output):
//!
//! 1. **Who**: each of the `requests` is given to a client, Zipf-distributed
//!    (client `i` has weight `(i + 1)^-s`, so `u0` is the heaviest) or
//!    uniformly. Only the per-client counts are kept: memory is O(clients).
//! 2. **When**: each client's requests are spread over the duration on
//!    their own. Without bursts they are independent draws from the day
//!    curve (a Poisson process given its count). With bursts the client
//!    alternates off and on periods: burst starts are drawn from the day
//!    curve, each burst holds a Pareto-distributed number of requests
//!    (α = 1.5, mean 10), sent at 20 times the client's average rate (and
//!    at least one a second) with exponential gaps. The on periods are
//!    thus heavy-tailed in length; the off periods in between are what
//!    the day curve makes them. A burst that would run past the end is
//!    hurried to fit.
//! 3. **Merged in order**: every client generates its times in ascending
//!    order (sequential uniform order statistics, no sort), and a heap of
//!    the clients' next times merges them: O(requests × log clients) time.
//!
//! The day curve: the request rate is proportional to `1 + 0.6 cos(...)`,
//! a 4:1 swing between the quiet hour and the busy one. A trace of at
//! least 24 h follows the wall clock (busiest at 15:00 UTC, quietest at
//! 03:00); a shorter one is a whole day compressed into the duration,
//! starting and ending at the quietest point, so the shape shows whatever
//! the duration.
//!
//! Each client `i` is the user `u<i>` with the address `10.a.b.c` spelling
//! `i` (unique up to 2^24 clients; beyond, addresses repeat under other
//! users). Each request goes to one of a few APIs with fixed weights, and
//! answers 200 (201 for an order) but for about 2 %.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::binary_heap::PeekMut;
use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

/// Most clients a trace may have: the per-client tables are about 60
/// bytes a client.
pub const MAX_CLIENTS: u64 = 20_000_000;
/// Most requests a trace may have.
pub const MAX_REQUESTS: u64 = 10_000_000_000;
/// 2026-01-01T00:00:00Z, ns since the Unix epoch: the default start.
pub const DEFAULT_START_NS: u64 = 1_767_225_600_000_000_000;

/// Amplitude of the day curve: rate ∝ 1 ± 0.6.
const DAY_AMPLITUDE: f64 = 0.6;
/// A day, ns.
const DAY_NS: u64 = 86_400_000_000_000;
/// Segments of the day curve's tabulated CDF.
const CURVE_SEGMENTS: usize = 4096;
/// Mean requests per burst of a bursty client.
const MEAN_BURST: f64 = 10.0;
/// Within a burst a client sends this many times its average rate.
const BURST_SPEEDUP: f64 = 20.0;
/// Longest mean gap within a burst, ns: a burst is requests in quick
/// succession, whatever the client's average rate.
const MAX_BURST_GAP_NS: f64 = 1e9;
/// Tail index of the burst sizes (Pareto): infinite variance, finite mean.
const BURST_ALPHA: f64 = 1.5;

/// The APIs a synthetic request calls, and their weights (sum 100).
const APIS: [(&str, &str, u32); 5] = [
    ("GET", "/v1/search", 35),
    ("GET", "/v1/items", 30),
    ("GET", "/v1/account", 15),
    ("POST", "/v1/orders", 12),
    ("POST", "/v1/login", 8),
];

/// A synthetic traffic shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Zipf client popularity (exponent [`SynthOptions::zipf_exponent`]),
    /// bursty clients (on/off, Pareto burst sizes) and the day curve: what
    /// a public API sees, and the hard case for a limiter.
    HeavyTail,
    /// Every client equally likely, Poisson arrivals at a constant rate.
    Uniform,
    /// Every client equally likely, each one bursty (on/off, Pareto burst
    /// sizes) at a constant average rate.
    Bursty,
    /// Every client equally likely, Poisson arrivals whose rate follows
    /// the day curve.
    Diurnal,
}

impl Shape {
    /// Every shape, in the order `--help` lists them.
    pub const ALL: [Shape; 4] = [
        Shape::HeavyTail,
        Shape::Uniform,
        Shape::Bursty,
        Shape::Diurnal,
    ];

    /// The name `--synthesize` takes.
    pub fn name(self) -> &'static str {
        match self {
            Shape::HeavyTail => "heavy-tail",
            Shape::Uniform => "uniform",
            Shape::Bursty => "bursty",
            Shape::Diurnal => "diurnal",
        }
    }

    fn zipf(self) -> bool {
        self == Shape::HeavyTail
    }

    fn bursty(self) -> bool {
        matches!(self, Shape::HeavyTail | Shape::Bursty)
    }

    fn diurnal(self) -> bool {
        matches!(self, Shape::HeavyTail | Shape::Diurnal)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Shape {
    type Err = String;

    fn from_str(s: &str) -> Result<Shape, String> {
        Shape::ALL
            .into_iter()
            .find(|shape| shape.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown traffic shape {s:?}: expected heavy-tail, uniform, bursty or diurnal"
                )
            })
    }
}

/// What to synthesize.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// The traffic shape.
    pub shape: Shape,
    /// Distinct clients (users, each with its own address), at least 1.
    pub clients: u64,
    /// Requests (lines) to write, exactly.
    pub requests: u64,
    /// The span of the timestamps, ns, more than 0.
    pub duration_ns: u64,
    /// Seed of every random choice (default 1).
    pub seed: u64,
    /// The first possible timestamp, ns since the Unix epoch (default
    /// 2026-01-01T00:00:00Z).
    pub start_ns: u64,
    /// Zipf exponent `s` of the client popularity (heavy-tail only,
    /// default 1.1): client `i` is `(i + 1)^-s` times as popular as `u0`.
    pub zipf_exponent: f64,
}

impl Default for SynthOptions {
    /// Heavy-tailed, 1,000 clients, 100,000 requests over an hour, seed 1.
    fn default() -> SynthOptions {
        SynthOptions {
            shape: Shape::HeavyTail,
            clients: 1_000,
            requests: 100_000,
            duration_ns: 3_600_000_000_000,
            seed: 1,
            start_ns: DEFAULT_START_NS,
            zipf_exponent: 1.1,
        }
    }
}

/// Checks the options, with a message naming the bad value.
///
/// # Errors
///
/// When `clients` is 0 or above [`MAX_CLIENTS`], `requests` above
/// [`MAX_REQUESTS`], the duration 0, the trace would end after year 2554
/// (u64 ns), or the Zipf exponent is not a positive finite number.
pub fn validate(opts: &SynthOptions) -> Result<(), String> {
    if opts.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    if opts.clients > MAX_CLIENTS {
        return Err(format!(
            "--clients {} is more than {MAX_CLIENTS} (the tables take about 80 bytes a client)",
            opts.clients
        ));
    }
    if opts.requests > MAX_REQUESTS {
        return Err(format!(
            "--requests {} is more than {MAX_REQUESTS}",
            opts.requests
        ));
    }
    if opts.duration_ns == 0 {
        return Err("--duration must be more than 0".into());
    }
    if opts.start_ns.checked_add(opts.duration_ns).is_none() {
        return Err(format!(
            "a trace starting at {} s and lasting {} s ends after what a 64-bit ns timestamp holds",
            opts.start_ns / 1_000_000_000,
            opts.duration_ns / 1_000_000_000
        ));
    }
    if !(opts.zipf_exponent.is_finite() && opts.zipf_exponent > 0.0) {
        return Err(format!(
            "the Zipf exponent must be a positive number, not {}",
            opts.zipf_exponent
        ));
    }
    Ok(())
}

/// Writes `opts.requests` JSON lines, sorted by time, in the format the
/// trace reader reads by default:
/// `{"ts":1767225600.123456,"ip":"10.0.0.7","user":"u7","method":"GET","path":"/v1/search","status":200}`
/// (`ts` in epoch seconds, microseconds, truncated). Returns the number of
/// lines written. The output is buffered here; compressing it is the
/// caller's business.
///
/// # Errors
///
/// `InvalidInput` when [`validate`] refuses the options; any error of
/// `out`.
pub fn synthesize(opts: &SynthOptions, out: &mut dyn Write) -> io::Result<u64> {
    validate(opts).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
    let mut rng = Rng::new(opts.seed);
    let counts = assign_clients(opts, &mut rng);
    let curve = Curve::new(opts);
    let bursty = opts.shape.bursty();
    let duration = opts.duration_ns as f64;

    // Each client with requests, its first time scheduled.
    let mut clients = Vec::new();
    let mut heap = BinaryHeap::new();
    for (id, &n) in counts.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let bursts = if bursty {
            (n as f64 / MEAN_BURST).ceil().max(1.0) as u64
        } else {
            n
        };
        let mut c = Client {
            id: id as u32,
            left: n,
            bursts_left: bursts.min(n),
            in_burst: 0,
            pos: 0.0,
            t: 0,
            gap_ns: (duration / n as f64 / BURST_SPEEDUP).min(MAX_BURST_GAP_NS),
        };
        if c.advance(&curve, bursty, opts.duration_ns, &mut rng) {
            heap.push(Reverse((c.t, clients.len() as u32)));
            clients.push(c);
        }
    }
    drop(counts);

    let mut w = io::BufWriter::with_capacity(1 << 16, out);
    let mut line = Vec::with_capacity(192);
    let mut written = 0u64;
    let mut last_us = 0u64;
    while let Some(mut top) = heap.peek_mut() {
        let Reverse((t, slot)) = *top;
        let Some(c) = clients.get_mut(slot as usize) else {
            PeekMut::pop(top);
            continue;
        };
        // Microseconds, never before the previous line's.
        let us = (opts.start_ns.saturating_add(t) / 1000).max(last_us);
        last_us = us;
        write_line(&mut line, us, c.id, &mut rng);
        w.write_all(&line)?;
        written += 1;
        if c.advance(&curve, bursty, opts.duration_ns, &mut rng) {
            *top = Reverse((c.t, slot));
        } else {
            PeekMut::pop(top);
        }
    }
    w.flush()?;
    Ok(written)
}

/// Step 1: how many requests each client sends.
fn assign_clients(opts: &SynthOptions, rng: &mut Rng) -> Vec<u64> {
    let n = usize::try_from(opts.clients).unwrap_or(usize::MAX);
    let mut counts = vec![0u64; n];
    if opts.shape.zipf() {
        let mut cumulative = Vec::with_capacity(n);
        let mut total = 0.0;
        for i in 0..n {
            total += ((i + 1) as f64).powf(-opts.zipf_exponent);
            cumulative.push(total);
        }
        for _ in 0..opts.requests {
            let x = rng.unit() * total;
            let i = cumulative.partition_point(|&c| c <= x).min(n - 1);
            counts[i] += 1;
        }
    } else {
        for _ in 0..opts.requests {
            let i = rng.below(opts.clients) as usize;
            counts[i] += 1;
        }
    }
    counts
}

/// One client's place in its own ascending sequence of times.
struct Client {
    /// Index of the client (`u<id>`).
    id: u32,
    /// Requests not yet scheduled.
    left: u64,
    /// Bursts not yet started (each of a non-bursty client's requests is
    /// a burst of one).
    bursts_left: u64,
    /// Requests of the current burst not yet scheduled.
    in_burst: u64,
    /// Position of the latest burst start among the client's burst starts,
    /// as a uniform order statistic in [0, 1].
    pos: f64,
    /// The scheduled time, ns from the start.
    t: u64,
    /// Mean gap between two requests of a burst, ns.
    gap_ns: f64,
}

impl Client {
    /// Schedules the next request into `t`; false when there is none.
    fn advance(&mut self, curve: &Curve, bursty: bool, duration: u64, rng: &mut Rng) -> bool {
        if self.left == 0 {
            return false;
        }
        if self.in_burst > 0 {
            self.in_burst -= 1;
            // A burst near the end is hurried so that it fits: no gap
            // takes more than its share of the time left, so no pile of
            // requests at the last instant.
            let room = duration.saturating_sub(self.t) as f64 / (self.in_burst + 2) as f64;
            let gap = (-rng.open_unit().ln() * self.gap_ns).min(room);
            self.t = (self.t as f64 + gap).min(duration as f64) as u64;
        } else {
            let size = if bursty {
                burst_size(self.left, self.bursts_left, rng)
            } else {
                1
            };
            // The next of `bursts_left` sorted uniforms above `pos`.
            let k = self.bursts_left.max(1) as f64;
            let step = -(rng.open_unit().ln() / k).exp_m1();
            self.pos = (self.pos + (1.0 - self.pos) * step).clamp(0.0, 1.0);
            self.bursts_left = self.bursts_left.saturating_sub(1);
            self.t = self.t.max(curve.at(self.pos));
            self.in_burst = size - 1;
        }
        self.t = self.t.min(duration);
        self.left -= 1;
        true
    }
}

/// Size of the next burst given `left` requests for `bursts` bursts
/// (this one included): Pareto around the even share, leaving at least
/// one request for each later burst; the last takes the rest.
fn burst_size(left: u64, bursts: u64, rng: &mut Rng) -> u64 {
    if bursts <= 1 {
        return left.max(1);
    }
    let mean = left as f64 / bursts as f64;
    let scale = mean * (BURST_ALPHA - 1.0) / BURST_ALPHA;
    let x = scale * rng.open_unit().powf(-1.0 / BURST_ALPHA);
    let most = left.saturating_sub(bursts - 1).max(1);
    (x.round().max(1.0) as u64).clamp(1, most)
}

/// The day curve as an inverse CDF over the duration.
enum Curve {
    /// Constant rate.
    Flat { duration: f64 },
    /// `cdf[j]`: the share of requests before `j / SEGMENTS` of the
    /// duration (`cdf[0] = 0`, last = 1).
    Table { cdf: Vec<f64>, duration: f64 },
}

impl Curve {
    fn new(opts: &SynthOptions) -> Curve {
        let duration = opts.duration_ns as f64;
        if !opts.shape.diurnal() {
            return Curve::Flat { duration };
        }
        let rate = |t: f64| -> f64 {
            if opts.duration_ns < DAY_NS {
                // One day compressed, from the quietest point.
                1.0 - DAY_AMPLITUDE * (std::f64::consts::TAU * t / duration).cos()
            } else {
                let abs = opts.start_ns as f64 + t;
                let day = (abs / DAY_NS as f64).fract();
                1.0 + DAY_AMPLITUDE * (std::f64::consts::TAU * (day - 15.0 / 24.0)).cos()
            }
        };
        let step = duration / CURVE_SEGMENTS as f64;
        let mut cdf = Vec::with_capacity(CURVE_SEGMENTS + 1);
        let mut total = 0.0;
        cdf.push(0.0);
        for j in 0..CURVE_SEGMENTS {
            let (a, b) = (j as f64 * step, (j + 1) as f64 * step);
            total += (rate(a) + rate(b)) / 2.0;
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Curve::Table { cdf, duration }
    }

    /// The time, ns from the start, below which a share `u` of the
    /// requests falls.
    fn at(&self, u: f64) -> u64 {
        let (t, duration) = match self {
            Curve::Flat { duration } => (u * duration, *duration),
            Curve::Table { cdf, duration } => {
                let j = cdf.partition_point(|&c| c <= u).clamp(1, CURVE_SEGMENTS) - 1;
                let (lo, hi) = (cdf[j], cdf[j + 1]);
                let frac = if hi > lo { (u - lo) / (hi - lo) } else { 0.0 };
                let t = (j as f64 + frac.clamp(0.0, 1.0)) * duration / CURVE_SEGMENTS as f64;
                (t, *duration)
            }
        };
        t.clamp(0.0, duration) as u64
    }
}

/// Fills `line` with one request of client `id` at `us` µs since the epoch.
fn write_line(line: &mut Vec<u8>, us: u64, id: u32, rng: &mut Rng) {
    let mut num = itoa::Buffer::new();
    line.clear();
    line.extend_from_slice(b"{\"ts\":");
    line.extend_from_slice(num.format(us / 1_000_000).as_bytes());
    let frac = us % 1_000_000;
    let digits = num.format(frac + 1_000_000).as_bytes();
    line.push(b'.');
    line.extend_from_slice(&digits[1..]);
    line.extend_from_slice(b",\"ip\":\"10.");
    for (i, shift) in [16, 8, 0].into_iter().enumerate() {
        if i > 0 {
            line.push(b'.');
        }
        line.extend_from_slice(num.format((id >> shift) & 0xff).as_bytes());
    }
    line.extend_from_slice(b"\",\"user\":\"u");
    line.extend_from_slice(num.format(id).as_bytes());
    line.extend_from_slice(b"\",\"method\":\"");
    let mut pick = rng.below(100) as u32;
    let (mut method, mut path) = (APIS[0].0, APIS[0].1);
    for (m, p, weight) in APIS {
        (method, path) = (m, p);
        if pick < weight {
            break;
        }
        pick -= weight;
    }
    line.extend_from_slice(method.as_bytes());
    line.extend_from_slice(b"\",\"path\":\"");
    line.extend_from_slice(path.as_bytes());
    line.extend_from_slice(b"\",\"status\":");
    let roll = rng.below(1000);
    let status: u16 = match (roll, method, path) {
        (0..15, _, "/v1/login") => 401,
        (0..15, "POST", _) => 400,
        (0..15, _, _) => 404,
        (15..20, _, _) => 503,
        (_, _, "/v1/orders") => 201,
        _ => 200,
    };
    line.extend_from_slice(num.format(status).as_bytes());
    line.extend_from_slice(b"}\n");
}

/// xoshiro256**, seeded through splitmix64: small, fast, and the same
/// stream on every platform (no dependency whose algorithm may change).
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in (0, 1]: safe to take the logarithm of.
    fn open_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n), n > 0, unbiased (Lemire's multiply and reject).
    fn below(&mut self, n: u64) -> u64 {
        let n = n.max(1);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests;
