//! What the service asks of the operating system, in one place: the wall
//! clock (read nowhere else in the server), the descriptor limit, a spin
//! before a single-threaded runtime parks, and the shutdown signals.

use std::future::Future;

/// Milliseconds since the Unix epoch, by the wall clock: for what people
/// read (reload times, audit lines, certificate expiry, chart points),
/// never for a decision (decisions take the store's monotonic clock).
#[allow(clippy::disallowed_methods)] // the one place (crates/spillway-server/clippy.toml)
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Nanoseconds since the Unix epoch, by the wall clock: a traced span's
/// start (its end is the start plus a monotonic duration).
#[allow(clippy::disallowed_methods)] // the one place (crates/spillway-server/clippy.toml)
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The process's open-file limit (its soft `RLIMIT_NOFILE`), if known.
pub fn descriptor_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } == 0 {
            return usize::try_from(lim.rlim_cur).ok();
        }
    }
    None
}

/// Raises the open-file limit to its hard limit (systemd's default soft
/// limit is 1,024, a few hundred idle clients), and returns the new soft
/// limit. Called once at start, before the configuration is read.
pub fn raise_descriptor_limit() -> Option<usize> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write the struct given.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) == 0
                && lim.rlim_cur < lim.rlim_max
            {
                let raised = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised);
            }
        }
    }
    descriptor_limit()
}

/// How long [`before_park`] spins.
const PARK_SPIN: std::time::Duration = std::time::Duration::from_micros(2);

/// For a single-threaded runtime's `on_thread_park` hook: while answers
/// are due (proxied requests awaiting their upstream, decisions awaiting a
/// Redis script call; see [`spillway_store::due`]), spin a few microseconds
/// before the event loop sleeps, since the answer is likely to arrive
/// within that time (the loop then finds it without sleeping). Waking a
/// sleeping loop costs the waker's CPU an inter-processor interrupt and a
/// context switch; in the proxy benchmark, where the upstream and the load
/// generator share the other core, those wake-ups were what kept the proxy
/// below nginx's throughput (it slept about six times as often per request
/// as nginx). Nothing due, no spin: the deny path, the memory store and
/// idle servers never spin.
pub fn before_park() {
    if spillway_store::due::answers_due() {
        let start = std::time::Instant::now();
        while start.elapsed() < PARK_SPIN {
            std::hint::spin_loop();
        }
    }
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this
/// is called, not when the future is first polled: a SIGTERM that comes
/// right after the server says it listens shuts it down cleanly rather
/// than ending the process.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (int, term) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        let (ctrl_c, term) = {
            async fn recv(s: Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            (recv(int), recv(term))
        };
        #[cfg(not(unix))]
        let (ctrl_c, term) = (
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
            std::future::pending::<()>(),
        );
        tokio::select! {
            () = ctrl_c => tracing::info!("SIGINT: shutting down"),
            () = term => tracing::info!("SIGTERM: shutting down"),
        }
    }
}

/// Seconds since the Unix epoch, by the wall clock (see [`unix_ms`]).
pub fn unix_secs() -> u64 {
    unix_ms() / 1000
}
