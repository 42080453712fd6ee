//! An upstream that saturates like a real service: a fixed number of
//! workers, a FIFO line in front of them, so its latency grows with the
//! concurrency it is sent.
//!
//! Why a queueing server rather than a fixed delay: overload protection is
//! about what happens past capacity. A service with `workers` workers that
//! each take `service` per request answers at most `workers / service`
//! requests a second; send it more concurrent requests than workers and the
//! extra ones wait in line, so latency is `service` while it has room and
//! `service * in_flight / workers` once it has not. That is the curve an
//! adaptive concurrency limit must find the knee of, and the one a fixed
//! limit set too high runs far past.
//!
//! Every request is answered `200 ok` (or `500 error` for a share set with
//! [`QueueingUpstream::set_error_share`]), whatever its method and path. A
//! request whose client goes away is dropped where it is: its place in line
//! or its worker is given to the next.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//!
//! use spillway_testkit::queueing::QueueingUpstream;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let up = QueueingUpstream::start(8, Duration::from_millis(20)).await;
//! // 8 workers of 20 ms each: 400 answers a second at most.
//! assert_eq!(up.capacity(), 400.0);
//! assert_eq!(up.served(), 0);
//! # });
//! ```

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The most answers [`QueueingUpstream::take_log`] keeps between two calls
/// (the oldest go first): a run that never reads its log stays bounded.
pub const LOG_CAPACITY: usize = 1 << 20;

/// The longest service time kept (`set_service` clamps to it), so the
/// nanoseconds fit the atomic that holds them.
const MAX_SERVICE: Duration = Duration::from_secs(3600);

/// One answer, as the upstream saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// When the request's head arrived.
    pub arrived: Instant,
    /// From arrival to the answer: time in line plus service time. This is
    /// the upstream's own latency, without any proxy's queue before it.
    pub latency: Duration,
    /// 200, or 500 for the error share.
    pub status: u16,
}

#[derive(Debug)]
struct State {
    /// The workers; tokio's semaphore is fair, so waiting is first come,
    /// first served.
    slots: Semaphore,
    /// How many workers there are (for [`QueueingUpstream::capacity`]).
    workers: usize,
    /// Service time in nanoseconds, read by each request when it gets a
    /// worker (so a change applies to the next ones, not those already
    /// being served).
    service_nanos: AtomicU64,
    /// Requests answered.
    served: AtomicU64,
    /// Requests arrived and not yet answered or dropped (waiting or served).
    in_flight: AtomicUsize,
    /// The highest `in_flight` ever seen.
    max_in_flight: AtomicUsize,
    /// The error share and what it has owed so far, and the answers'
    /// log: one lock, taken once per answer.
    books: Mutex<Books>,
}

#[derive(Debug)]
struct Books {
    /// Share of answers that are 500, in `[0, 1]`.
    error_share: f64,
    /// Error answers owed: grows by the share with each answer, and one
    /// error is sent each time it reaches 1. Exact shares, no randomness:
    /// 0.25 is every fourth answer.
    owed: f64,
    log: VecDeque<Served>,
}

impl State {
    fn books(&self) -> MutexGuard<'_, Books> {
        // A panic while holding the lock leaves plain numbers behind: keep
        // going with them.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A saturating HTTP/1.1 upstream (see the module docs). Clones share one
/// server.
#[derive(Debug, Clone)]
pub struct QueueingUpstream {
    addr: SocketAddr,
    state: Arc<State>,
}

impl QueueingUpstream {
    /// Starts one on a free port of 127.0.0.1, on the current runtime, with
    /// `workers` workers (at least one) taking `service` per request.
    ///
    /// # Panics
    /// No free port on 127.0.0.1.
    pub async fn start(workers: usize, service: Duration) -> QueueingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the queueing upstream");
        let addr = listener.local_addr().expect("its address");
        let workers = workers.clamp(1, Semaphore::MAX_PERMITS);
        let state = Arc::new(State {
            slots: Semaphore::new(workers),
            workers,
            service_nanos: AtomicU64::new(nanos(service)),
            served: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            books: Mutex::new(Books {
                error_share: 0.0,
                owed: 0.0,
                log: VecDeque::new(),
            }),
        });
        crate::upstream::serve_http1(listener, state.clone(), answer);
        QueueingUpstream { addr, state }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the service time of the requests that get a worker from now
    /// on (to slow the service down, or let it recover). Clamped to an hour.
    pub fn set_service(&self, service: Duration) {
        self.state
            .service_nanos
            .store(nanos(service), Ordering::Relaxed);
    }

    /// The service time now.
    pub fn service(&self) -> Duration {
        Duration::from_nanos(self.state.service_nanos.load(Ordering::Relaxed))
    }

    /// Answers this share of requests (0 to 1; outside, clamped; NaN is 0)
    /// with 500 instead of 200, evenly spread: 0.25 is every fourth answer.
    /// A failed request takes its worker for the service time like any
    /// other.
    pub fn set_error_share(&self, share: f64) {
        let share = if share.is_nan() {
            0.0
        } else {
            share.clamp(0.0, 1.0)
        };
        let mut books = self.state.books();
        books.error_share = share;
        books.owed = 0.0;
    }

    /// The most answers a second it can give: workers / service time
    /// (infinite for a zero service time).
    pub fn capacity(&self) -> f64 {
        self.state.workers as f64 / self.service().as_secs_f64()
    }

    /// Requests answered so far (200 or 500).
    pub fn served(&self) -> u64 {
        self.state.served.load(Ordering::Relaxed)
    }

    /// Requests arrived and not yet answered: in line or with a worker.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::Relaxed)
    }

    /// The most requests it ever held at once (in line and with workers):
    /// what a proxy's concurrency limit in front of it bounds.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::Relaxed)
    }

    /// Starts counting [`max_in_flight`](Self::max_in_flight) afresh from
    /// what is in flight now (to measure one phase of a test).
    pub fn reset_max_in_flight(&self) {
        let now = self.in_flight();
        self.state.max_in_flight.store(now, Ordering::Relaxed);
    }

    /// The answers given since the last call, oldest first (at most
    /// [`LOG_CAPACITY`]; older ones are dropped).
    pub fn take_log(&self) -> Vec<Served> {
        self.state.books().log.drain(..).collect()
    }
}

fn nanos(d: Duration) -> u64 {
    // At most an hour: always fits.
    u64::try_from(d.min(MAX_SERVICE).as_nanos()).unwrap_or(u64::MAX)
}

/// Counts a request in flight while it lives.
struct InFlight<'a>(&'a State);

impl<'a> InFlight<'a> {
    fn enter(state: &'a State) -> InFlight<'a> {
        let now = state.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        state.max_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(state)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn answer(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Text>, Infallible> {
    let arrived = Instant::now();
    let _counted = InFlight::enter(&state);
    // The request's body is not read: the answer does not depend on it,
    // and hyper discards what is left after the answer.
    drop(req);
    let status = {
        // Never closed, so `acquire` cannot fail; were it to, the request
        // is answered without a worker rather than panicking.
        let _worker = state.slots.acquire().await.ok();
        let service = Duration::from_nanos(state.service_nanos.load(Ordering::Relaxed));
        tokio::time::sleep(service).await;
        let mut books = state.books();
        books.owed += books.error_share;
        let status = if books.owed >= 1.0 - 1e-9 {
            books.owed -= 1.0;
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        if books.log.len() == LOG_CAPACITY {
            books.log.pop_front();
        }
        books.log.push_back(Served {
            arrived,
            latency: arrived.elapsed(),
            status: status.as_u16(),
        });
        status
    };
    state.served.fetch_add(1, Ordering::Relaxed);
    let body = if status.is_success() { "ok" } else { "error" };
    let mut resp = Response::new(Text(Some(Bytes::from_static(body.as_bytes()))));
    *resp.status_mut() = status;
    Ok(resp)
}

/// A whole body with a length (`Text(None)`: an empty one).
#[derive(Debug)]
pub(crate) struct Text(pub(crate) Option<Bytes>);

impl Body for Text {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{self, LoadPlan};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    use crate::test_runtime as rt;

    /// Six requests at once to two workers of 50 ms: they are answered in
    /// three waves, so the last waits for two services before its own.
    /// (Lower bounds only: a busy machine makes everything later.)
    #[test]
    fn latency_grows_with_concurrency() {
        rt().block_on(async {
            let up = QueueingUpstream::start(2, ms(50)).await;
            assert_eq!(up.capacity(), 40.0);
            let plan = LoadPlan::new(&up.url(), ms(6)).unwrap().constant(1000.0);
            let samples = load::drive(plan).await;
            let n = samples.len();
            assert!(n >= 5, "{samples:?}");
            assert!(samples.iter().all(|s| s.status == 200), "{samples:?}");
            assert_eq!(up.served(), n as u64);
            assert!(up.max_in_flight() > 2, "{}", up.max_in_flight());
            assert_eq!(up.in_flight(), 0);
            let log = up.take_log();
            assert_eq!(log.len(), n);
            assert!(up.take_log().is_empty());
            // From the first arrival to the last answer: every wave's
            // service, one after the other.
            let first = log.iter().map(|s| s.arrived).min().unwrap();
            let last = log.iter().map(|s| s.arrived + s.latency).max().unwrap();
            let waves = n.div_ceil(2) as u32;
            assert!(last - first >= ms(50) * waves, "{log:?}");
            assert!(log.iter().all(|s| s.latency >= ms(50)), "{log:?}");
            let slowest = log.iter().map(|s| s.latency).max().unwrap();
            assert!(slowest >= ms(50) * (waves - 1), "{log:?}");
        });
    }

    #[test]
    fn errors_are_the_share_asked_and_the_service_time_changes_live() {
        rt().block_on(async {
            let up = QueueingUpstream::start(4, ms(1)).await;
            up.set_error_share(0.25);
            let plan = LoadPlan::new(&up.url(), ms(400)).unwrap().constant(100.0);
            let samples = load::drive(plan.clone()).await;
            let statuses = load::by_status(&samples);
            let errors = statuses.get(&500).copied().unwrap_or(0);
            assert_eq!(errors, samples.len() as u64 / 4, "{statuses:?}");
            assert_eq!(statuses.len(), 2, "{statuses:?}");

            up.set_error_share(f64::NAN);
            up.set_service(ms(30));
            assert_eq!(up.service(), ms(30));
            let _ = up.take_log();
            let samples = load::drive(plan.constant(10.0)).await;
            assert!(
                samples
                    .iter()
                    .all(|s| s.status == 200 && s.latency >= ms(30))
            );
            assert!(up.take_log().iter().all(|s| s.latency >= ms(30)));

            up.set_service(Duration::MAX);
            assert_eq!(up.service(), MAX_SERVICE);
        });
    }

    #[test]
    fn a_client_that_leaves_frees_its_place() {
        rt().block_on(async {
            let up = QueueingUpstream::start(1, ms(300)).await;
            let plan = LoadPlan::new(&up.url(), ms(20))
                .unwrap()
                .constant(200.0)
                .timeout(ms(50));
            let samples = load::drive(plan).await;
            assert!(samples.iter().all(|s| s.status == 0));
            // The server notices the closed connections promptly.
            let deadline = Instant::now() + Duration::from_secs(5);
            while up.in_flight() > 0 && Instant::now() < deadline {
                tokio::time::sleep(ms(10)).await;
            }
            assert_eq!(up.in_flight(), 0);
            assert_eq!(up.served(), 0);
        });
    }
}
