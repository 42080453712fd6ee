//! What the process is and uses: `spillway_build_info`, and the standard
//! Prometheus process metrics, read from `/proc/self` on Linux (absent
//! elsewhere, rather than made up).

use std::fmt::Write as _;

/// The compiler that built the binary, as `build.rs` found it.
const RUSTC: &str = match option_env!("SPILLWAY_RUSTC_VERSION") {
    Some(v) => v,
    None => "unknown",
};

/// `spillway_build_info`: which build this is, as labels on a constant 1.
pub fn build_info(out: &mut String) {
    let name = "spillway_build_info";
    let _ = writeln!(
        out,
        "# HELP {name} The running build: crate version and compiler, as labels (the value is always 1).\n# TYPE {name} gauge\n{name}{{version=\"{}\",rustc=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        super::escape(RUSTC),
    );
}

/// What `/proc/self` says of the process, read at each scrape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors (sockets included).
    pub open_fds: u64,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// How long one read of `/proc/self` serves scrapes. Counting open
/// descriptors reads a directory with an entry per connection: scrapes
/// asked in a loop (an unread pipeline of `GET /metrics` on each of
/// hundreds of connections) made that most of the server's work, and a
/// scraper asks every few seconds at most.
const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// The process metrics (`process_*`), or nothing off Linux or when
/// `/proc` cannot be read.
pub fn process_metrics(out: &mut String) {
    let Some(u) = recent_usage() else {
        return;
    };
    let mut put = |name: &str, kind: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    put(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent, in seconds.",
        u.cpu_seconds,
    );
    put(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size, in bytes.",
        u.resident_bytes as f64,
    );
    put(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size, in bytes.",
        u.virtual_bytes as f64,
    );
    put(
        "process_open_fds",
        "gauge",
        "Open file descriptors (client connections included).",
        u.open_fds as f64,
    );
    if let Some(max) = u.max_fds {
        put(
            "process_max_fds",
            "gauge",
            "The limit on open file descriptors (soft RLIMIT_NOFILE).",
            max as f64,
        );
    }
    put(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process, in seconds since the Unix epoch.",
        u.start_time_seconds,
    );
}

/// The process's usage as read at most [`FRESH`] ago; `None` off Linux.
fn recent_usage() -> Option<Usage> {
    static LAST: std::sync::Mutex<Option<(std::time::Instant, Usage)>> =
        std::sync::Mutex::new(None);
    // Scrapes at the same moment wait for one read rather than each do it.
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cached(&mut last, std::time::Instant::now(), usage)
}

/// `last`'s usage if it was read less than [`FRESH`] before `now`, else
/// a new one from `read`, kept in `last`.
fn cached(
    last: &mut Option<(std::time::Instant, Usage)>,
    now: std::time::Instant,
    read: impl FnOnce() -> Option<Usage>,
) -> Option<Usage> {
    if let Some((at, u)) = *last
        && now.saturating_duration_since(at) < FRESH
    {
        return Some(u);
    }
    let u = read()?;
    *last = Some((now, u));
    Some(u)
}

/// The process's usage now; `None` off Linux.
#[cfg(target_os = "linux")]
pub fn usage() -> Option<Usage> {
    // SAFETY: sysconf only reads a system setting.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let mut u = from_proc(
        &stat,
        &boot,
        u64::try_from(ticks).ok()?,
        u64::try_from(page).ok()?,
    )?;
    u.open_fds = open_fds;
    u.max_fds = crate::descriptor_limit().map(|n| n as u64);
    Some(u)
}

/// The process's usage now; `None` off Linux.
#[cfg(not(target_os = "linux"))]
pub fn usage() -> Option<Usage> {
    None
}

/// Usage from the text of `/proc/self/stat` and `/proc/stat`, with the
/// clock ticks per second and page size (file descriptors left at 0).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn from_proc(stat: &str, proc_stat: &str, ticks: u64, page: u64) -> Option<Usage> {
    if ticks == 0 {
        return None;
    }
    // The command name (field 2) is in parentheses and may hold spaces
    // or parentheses itself: the fields that follow start after the last
    // `)`, at field 3 (the state).
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let (utime, stime) = (field(14)?, field(15)?);
    let start_ticks = field(22)?;
    let (vsize, rss_pages) = (field(23)?, field(24)?);
    let boot: u64 = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(Usage {
        cpu_seconds: (utime + stime) as f64 / ticks as f64,
        resident_bytes: rss_pages.saturating_mul(page),
        virtual_bytes: vsize,
        open_fds: 0,
        max_fds: None,
        start_time_seconds: boot as f64 + start_ticks as f64 / ticks as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_within_a_second_share_one_read_of_proc() {
        let u = |open_fds| Usage {
            cpu_seconds: 0.0,
            resident_bytes: 0,
            virtual_bytes: 0,
            open_fds,
            max_fds: None,
            start_time_seconds: 0.0,
        };
        let t0 = std::time::Instant::now();
        let mut last = None;
        let mut reads = 0;
        let mut at = |ms: u64, fds: u64, last: &mut Option<_>| {
            cached(last, t0 + std::time::Duration::from_millis(ms), || {
                reads += 1;
                Some(u(fds))
            })
            .map(|u| u.open_fds)
        };
        assert_eq!(at(0, 10, &mut last), Some(10));
        // Within the second: the first read, not a new one.
        assert_eq!(at(500, 60, &mut last), Some(10));
        assert_eq!(at(999, 70, &mut last), Some(10));
        // A second on: read again.
        assert_eq!(at(1000, 80, &mut last), Some(80));
        assert_eq!(at(1500, 90, &mut last), Some(80));
        assert_eq!(reads, 2);
    }

    #[test]
    fn proc_stat_fields_are_read_after_the_command_name() {
        // A command name with a space and a parenthesis in it.
        let stat = "4242 (spill way) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 50 0 0 20 0 9 0 12345 987654321 2048 18446744073709551615 1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let u = from_proc(stat, boot, 100, 4096).unwrap();
        assert_eq!(u.cpu_seconds, 3.0);
        assert_eq!(u.virtual_bytes, 987_654_321);
        assert_eq!(u.resident_bytes, 2048 * 4096);
        assert_eq!(u.start_time_seconds, 1_700_000_000.0 + 123.45);
        assert_eq!(from_proc("garbage", boot, 100, 4096), None);
        assert_eq!(from_proc(stat, "no btime", 100, 4096), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_plausible() {
        let u = usage().expect("/proc/self");
        assert!(u.resident_bytes > 1 << 20, "{u:?}");
        assert!(u.virtual_bytes >= u.resident_bytes, "{u:?}");
        assert!(u.open_fds >= 3, "{u:?}");
        let now = crate::os::unix_ms() as f64 / 1000.0;
        assert!(
            u.start_time_seconds <= now + 1.0 && u.start_time_seconds > now - 86_400.0,
            "{u:?}"
        );
    }
}
