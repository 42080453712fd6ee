//! Records the run behind docs/ELASTIC.md's plot: the real `spillway proxy`
//! in front of a saturating upstream, once with a fixed concurrency limit
//! set too high and once with the adaptive one, under the same rising load.
//!
//! ```text
//! cargo run --release -p spillway-testkit --example elastic_run -- \
//!     --spillway target/release/spillway --out docs/elastic-run.csv
//! ```
//!
//! The upstream is a [`QueueingUpstream`] of 8 workers taking 20 ms each
//! (400 answers a second at most); the load rises in a straight line from
//! 100 requests a second to three times that capacity over `--seconds`
//! (30 by default, at most 40, so the whole run stays under 90 s). Both
//! configurations let excess requests wait 500 ms in the proxy's queue,
//! then answer 503. The adaptive one aims at a 100 ms p99 upstream latency.
//!
//! One CSV line per configuration and second:
//! `config,second,offered_rps,admitted_rps,latency_p50_ms,latency_p99_ms,shed_rps`
//! then `client_p50_ms,client_p99_ms,failed_rps,concurrency_limit`, where
//! the `latency_*` columns are the upstream's own (arrival to answer, as it
//! measured them, by arrival second), `client_*` are what the load's
//! clients saw for their 2xx answers (the proxy's queue included), `shed`
//! counts 503s, `failed` requests without an answer, and
//! `concurrency_limit` is the proxy's `spillway_concurrency_limit` gauge
//! read during that second. A cell without data is empty.
//!
//! `--direct` drives the upstream with no proxy (configuration `direct`),
//! to check the driver and the plot without a spillway binary.
//!
//! Loopback only; a binary that does not start is an error that shows what
//! it printed, never a hang.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_testkit::load::{self, LoadPlan, Outgoing, Sample};
use spillway_testkit::queueing::{QueueingUpstream, Served};

/// The upstream's workers and service time: 400 answers a second.
const WORKERS: usize = 8;
const SERVICE: Duration = Duration::from_millis(20);
/// The load's first rate, and its last as a multiple of the capacity.
const FROM_RPS: f64 = 100.0;
const OVERLOAD: f64 = 3.0;
/// The adaptive configuration's latency target.
const TARGET: &str = "100ms";
/// Distinct users the load is spread over (the rule counts by user).
const USERS: u64 = 50;

const USAGE: &str = "usage: elastic_run (--spillway PATH | --direct) --out FILE.csv [--seconds N]";

/// The CSV's columns, in order.
const HEADER: &str = "config,second,offered_rps,admitted_rps,latency_p50_ms,latency_p99_ms,shed_rps,client_p50_ms,client_p99_ms,failed_rps,concurrency_limit";

struct Args {
    spillway: Option<PathBuf>,
    out: PathBuf,
    seconds: u64,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut spillway = None;
    let mut direct = false;
    let mut out = None;
    let mut seconds = 30;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--spillway" => spillway = Some(PathBuf::from(value("--spillway")?)),
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--seconds" => {
                let v = value("--seconds")?;
                seconds = v
                    .parse()
                    .ok()
                    .filter(|s| (5..=40).contains(s))
                    .ok_or(format!("--seconds {v:?}: want a whole number from 5 to 40"))?;
            }
            "--direct" => direct = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let out = out.ok_or(format!("--out is required\n{USAGE}"))?;
    match (spillway, direct) {
        (Some(_), true) => Err(format!(
            "--spillway and --direct exclude each other\n{USAGE}"
        )),
        (None, false) => Err(format!(
            "--spillway PATH (or --direct) is required\n{USAGE}"
        )),
        (spillway, _) => Ok(Args {
            spillway,
            out,
            seconds,
        }),
    }
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)).and_then(|a| run(&a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("elastic_run: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let up = start_upstream()?;
    let seconds = args.seconds;
    let top = OVERLOAD * up.capacity();
    eprintln!(
        "upstream {} ({WORKERS} workers x {SERVICE:?}: {:.0} req/s); load {FROM_RPS:.0} -> {top:.0} req/s over {seconds} s",
        up.url(),
        up.capacity()
    );
    let runs: Vec<(&str, Option<&str>)> = match args.spillway {
        None => vec![("direct", None)],
        Some(_) => vec![
            ("fixed", Some("limit: 256")),
            ("adaptive", Some("adaptive: { min: 4, max: 256 }")),
        ],
    };
    let mut csv = String::from(HEADER);
    csv.push('\n');
    for (name, concurrency) in runs {
        let mut proxy = match (&args.spillway, concurrency) {
            (Some(bin), Some(c)) => Some(Proxy::start(bin, &up.url(), c)?),
            _ => None,
        };
        let url = proxy.as_ref().map_or_else(|| up.url(), |p| p.url());
        let limits = Poller::start(proxy.as_ref().map(|p| p.admin));
        let _ = up.take_log();
        let plan = LoadPlan::new(&url, Duration::from_secs(seconds))
            .map_err(|e| e.to_string())?
            .ramp(FROM_RPS, top)
            .timeout(Duration::from_secs(5))
            .max_outstanding(1500)
            .request(|n| Outgoing {
                headers: vec![("x-user".to_string(), format!("u{}", n % USERS))],
                ..Outgoing::default()
            });
        let (samples, began) = drive(plan)?;
        let limits = limits.stop();
        let served = up.take_log();
        if let Some(p) = &mut proxy {
            p.check_alive()?;
        }
        drop(proxy);
        let rows = rows(name, seconds, &samples, &served, began, &limits);
        summarize(name, &samples, &served);
        csv.push_str(&rows);
        // The next configuration starts on an idle upstream.
        let deadline = Instant::now() + Duration::from_secs(10);
        while up.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    write_atomically(&args.out, &csv)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

/// The upstream, on a thread and runtime of its own so the load's work does
/// not delay its answers.
fn start_upstream() -> Result<QueueingUpstream, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("upstream".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("upstream runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async {
                let up = QueueingUpstream::start(WORKERS, SERVICE).await;
                let _ = tx.send(Ok(up));
                std::future::pending::<()>().await;
            });
        })
        .map_err(|e| format!("upstream thread: {e}"))?;
    rx.recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the upstream did not start".to_string())?
}

/// Runs the load on a runtime of its own: its samples and when it began.
fn drive(plan: LoadPlan) -> Result<(Vec<Sample>, Instant), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("load runtime: {e}"))?;
    let began = Instant::now();
    Ok((rt.block_on(load::drive(plan)), began))
}

/// The CSV lines of one configuration.
fn rows(
    name: &str,
    seconds: u64,
    samples: &[Sample],
    served: &[Served],
    began: Instant,
    limits: &[(Duration, f64)],
) -> String {
    let n = seconds as usize;
    let pad = |mut v: Vec<u64>| {
        v.resize(n.max(v.len()), 0);
        v
    };
    let offered = pad(load::sent_per_second(samples));
    let admitted = pad(load::admitted_per_second(samples));
    let shed = pad(load::per_second(samples, |s| s.status == 503));
    let failed = pad(load::per_second(samples, |s| s.status == 0));
    let client_p50 = load::latency_per_second(samples, 0.5);
    let client_p99 = load::latency_per_second(samples, 0.99);
    let mut upstream = vec![Vec::new(); n];
    for s in served {
        let second = s.arrived.saturating_duration_since(began).as_secs() as usize;
        if let Some(l) = upstream.get_mut(second) {
            l.push(s.latency);
        }
    }
    let ms =
        |d: Option<Duration>| d.map_or(String::new(), |d| format!("{:.1}", d.as_secs_f64() * 1e3));
    let mut out = String::new();
    for second in 0..n {
        let up_p50 = load::percentile(&mut upstream[second], 0.5);
        let up_p99 = load::percentile(&mut upstream[second], 0.99);
        // The last reading within this second.
        let limit = limits
            .iter()
            .rev()
            .find(|(t, _)| t.as_secs() as usize == second)
            .map_or(String::new(), |(_, v)| format!("{v}"));
        let _ = writeln!(
            out,
            "{name},{second},{},{},{},{},{},{},{},{},{limit}",
            offered[second],
            admitted[second],
            ms(up_p50),
            ms(up_p99),
            shed[second],
            ms(client_p50.get(second).copied().flatten()),
            ms(client_p99.get(second).copied().flatten()),
            failed[second],
        );
    }
    out
}

/// A line on stderr per configuration: what it sent and what came of it.
fn summarize(name: &str, samples: &[Sample], served: &[Served]) {
    let statuses = load::by_status(samples);
    let mut lat: Vec<Duration> = served.iter().map(|s| s.latency).collect();
    let p99 = load::percentile(&mut lat, 0.99).unwrap_or_default();
    eprintln!("{name}: answers by status {statuses:?}; upstream p99 over the run {p99:?}");
}

fn write_atomically(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A `spillway proxy` process, killed when dropped.
struct Proxy {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
    /// Its last lines on stderr, to show when it fails.
    stderr: Arc<Mutex<Vec<String>>>,
    _dir: spillway_testkit::TempDir,
}

impl Proxy {
    /// Writes the configuration, starts the binary and waits (20 s at most)
    /// until its admin listener says it is ready.
    fn start(bin: &Path, upstream: &str, concurrency: &str) -> Result<Proxy, String> {
        let dir = spillway_testkit::TempDir::new("elastic-run");
        let config = dir.0.join("spillway.yaml");
        let yaml = format!(
            "health:
  latency: {{ target: {TARGET}, percentile: 99 }}
proxy:
  upstream: {upstream}
  user: header:x-user
  timeout: 10s
  concurrency:
    {concurrency}
    queue: {{ max_wait: 500ms }}
rules:
  - name: users
    by: user
    limits:
      - gcra: {{ rate: 100000/1s, burst: 100000 }}
"
        );
        std::fs::write(&config, yaml).map_err(|e| format!("cannot write the config: {e}"))?;
        let listen = SocketAddr::from(([127, 0, 0, 1], spillway_testkit::free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], spillway_testkit::free_port()));
        let mut child = Command::new(bin)
            .arg("proxy")
            .arg("--config")
            .arg(&config)
            .args(["--listen", &listen.to_string()])
            .args(["--admin-listen", &admin.to_string()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(err) = child.stderr.take() {
            let keep = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let mut k = keep.lock().unwrap_or_else(|p| p.into_inner());
                    if k.len() == 40 {
                        k.remove(0);
                    }
                    k.push(line);
                }
            });
        }
        let mut proxy = Proxy {
            child,
            listen,
            admin,
            stderr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            proxy.check_alive()?;
            let ready = get(admin, "/readyz").is_some_and(|(status, _)| status == 200);
            if ready && TcpStream::connect(listen).is_ok() {
                return Ok(proxy);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "spillway proxy did not become ready on {admin} within 20 s; it printed:\n{}",
                    proxy.printed()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.listen)
    }

    fn printed(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n")
    }

    /// An error if the process has exited.
    fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                // Give the reader thread a moment to collect the last lines.
                std::thread::sleep(Duration::from_millis(200));
                Err(format!(
                    "spillway proxy exited ({status}); it printed:\n{}",
                    self.printed()
                ))
            }
            Err(e) => Err(format!("cannot watch spillway proxy: {e}")),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking `GET path` on loopback: the status and body, or `None`.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}

/// Reads the proxy's `spillway_concurrency_limit` every 250 ms on a thread
/// of its own.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(Duration, f64)>>>,
}

impl Poller {
    fn start(admin: Option<SocketAddr>) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = admin.map(|admin| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let began = Instant::now();
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Some(v) = get(admin, "/metrics").and_then(|(_, m)| limit_of(&m)) {
                        seen.push((began.elapsed(), v));
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                seen
            })
        });
        Poller { stop, thread }
    }

    fn stop(mut self) -> Vec<(Duration, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// The `spillway_concurrency_limit` gauge in a Prometheus text page.
fn limit_of(metrics: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix("spillway_concurrency_limit ")
            .and_then(|v| v.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rows_are_one_per_second_with_empty_cells_for_no_data() {
        let began = Instant::now();
        let sample = |sent, latency, status| Sample {
            sent_at: ms(sent),
            latency: ms(latency),
            status,
            class: 0,
        };
        let samples = [
            sample(100, 20, 200),
            sample(600, 40, 200),
            sample(700, 1, 503),
            sample(2100, 0, 0),
        ];
        let served = [
            Served {
                arrived: began + ms(100),
                latency: ms(20),
                status: 200,
            },
            Served {
                arrived: began + ms(600),
                latency: ms(40),
                status: 200,
            },
            // Past the run's seconds: left out.
            Served {
                arrived: began + ms(9000),
                latency: ms(40),
                status: 200,
            },
        ];
        let limits = [(ms(200), 16.0), (ms(900), 12.0)];
        let out = rows("x", 3, &samples, &served, began, &limits);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "x,0,3,2,20.0,40.0,1,20.0,40.0,0,12",
                "x,1,0,0,,,0,,,0,",
                "x,2,1,0,,,0,,,1,",
            ]
        );
        for l in lines {
            assert_eq!(l.split(',').count(), HEADER.split(',').count());
        }
    }

    #[test]
    fn arguments_are_checked() {
        let args = |a: &[&str]| parse_args(a.iter().map(|s| s.to_string()));
        let ok = args(&["--spillway", "bin", "--out", "o.csv", "--seconds", "10"]).unwrap();
        assert_eq!(ok.seconds, 10);
        assert!(
            args(&["--direct", "--out", "o.csv"])
                .unwrap()
                .spillway
                .is_none()
        );
        for (bad, want) in [
            (&["--direct"][..], "--out is required"),
            (&["--out", "o"], "--spillway PATH"),
            (&["--out", "o", "--direct", "--spillway", "b"], "exclude"),
            (&["--direct", "--out", "o", "--seconds", "99"], "5 to 40"),
            (&["--seconds"], "needs a value"),
            (&["--what"], "unknown argument"),
        ] {
            let e = args(bad).err().unwrap();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_limit_gauge_is_read_from_metrics() {
        let page = "# TYPE spillway_concurrency_limit gauge\nspillway_concurrency_limit_x 3\nspillway_concurrency_limit 42\n";
        assert_eq!(limit_of(page), Some(42.0));
        assert_eq!(limit_of("nothing"), None);
    }
}
