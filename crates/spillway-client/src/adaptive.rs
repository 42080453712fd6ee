//! Adaptive client-side throttling (Google's SRE book, "Handling
//! Overload"): when a backend refuses much of what it is sent, the client
//! refuses requests itself, before they cost the backend anything, with
//! probability `max(0, (requests - K * accepts) / (requests + 1))` over a
//! sliding window. `requests` counts what the application asked for
//! (refused locally or not); `accepts`, what the backend accepted.
//!
//! With `K = 2` the client sends up to about twice what the backend
//! accepts: enough to notice at once when it recovers, and an overloaded
//! backend no longer spends its capacity refusing retries.
//!
//! Time and randomness come in as arguments, so the controller is a pure
//! state machine tests drive on a virtual clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;

use crate::events::{Events, NoEvents};

/// Buckets the window is kept in.
const BUCKETS: usize = 20;

/// The throttle's counters over a sliding window.
#[derive(Debug, Clone)]
pub struct AdaptiveThrottle {
    k: f64,
    /// Width of one bucket, ns.
    width: u64,
    /// Per bucket: its index (time / width), requests, accepts.
    buckets: [(u64, u64, u64); BUCKETS],
}

impl AdaptiveThrottle {
    /// A throttle with multiplier `k` (at least 1; 2 is the book's
    /// choice) over `window` (the book uses 2 minutes).
    pub fn new(k: f64, window: Duration) -> AdaptiveThrottle {
        let k = if k.is_finite() { k.max(1.0) } else { 2.0 };
        let width = (window.as_nanos() / BUCKETS as u128).clamp(1, u128::from(u64::MAX)) as u64;
        AdaptiveThrottle {
            k,
            width,
            buckets: [(u64::MAX, 0, 0); BUCKETS],
        }
    }

    /// Requests and accepts in the window ending at `now` (ns on any
    /// monotonic scale).
    pub fn counts(&self, now: u64) -> (u64, u64) {
        let current = now / self.width;
        self.buckets
            .iter()
            .filter(|(i, ..)| *i != u64::MAX && *i + (BUCKETS as u64) > current && *i <= current)
            .fold((0, 0), |(r, a), (_, br, ba)| (r + br, a + ba))
    }

    /// The probability of refusing a request now.
    pub fn reject_probability(&self, now: u64) -> f64 {
        let (requests, accepts) = self.counts(now);
        let requests = requests as f64;
        ((requests - self.k * accepts as f64) / (requests + 1.0)).max(0.0)
    }

    /// Whether to refuse a request now, given a uniform draw in `[0, 1)`.
    /// Counts the request either way.
    pub fn admit(&mut self, now: u64, uniform: f64) -> bool {
        let refuse = uniform < self.reject_probability(now);
        self.bucket(now).1 += 1;
        !refuse
    }

    /// Records the backend's answer to a request that was sent.
    pub fn answered(&mut self, now: u64, accepted: bool) {
        if accepted {
            self.bucket(now).2 += 1;
        }
    }

    fn bucket(&mut self, now: u64) -> &mut (u64, u64, u64) {
        let i = now / self.width;
        let b = &mut self.buckets[(i % BUCKETS as u64) as usize];
        if b.0 != i {
            *b = (i, 0, 0);
        }
        b
    }
}

/// Why a request through [`Adaptive`] got no answer from the backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum AdaptiveError<E> {
    /// The inner service failed.
    Inner(E),
    /// Refused here: the backend has been refusing most requests.
    Throttled,
}

impl<E: std::fmt::Display> std::fmt::Display for AdaptiveError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdaptiveError::Inner(e) => write!(f, "{e}"),
            AdaptiveError::Throttled => {
                f.write_str("refused locally: the backend is refusing most requests")
            }
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for AdaptiveError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AdaptiveError::Inner(e) => Some(e),
            AdaptiveError::Throttled => None,
        }
    }
}

/// The throttle as a tower layer over an HTTP client service: a 429 or
/// 503 answer, or a failed call, is a refusal by the backend; any other
/// answer an accept.
#[derive(Clone)]
pub struct AdaptiveLayer {
    state: Arc<Mutex<(AdaptiveThrottle, u64)>>,
    start: tokio::time::Instant,
    events: Arc<dyn Events>,
}

impl std::fmt::Debug for AdaptiveLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptiveLayer").finish_non_exhaustive()
    }
}

impl AdaptiveLayer {
    /// A layer with multiplier `k` over `window` (the book: 2, 2 minutes).
    pub fn new(k: f64, window: Duration) -> AdaptiveLayer {
        AdaptiveLayer {
            state: Arc::new(Mutex::new((
                AdaptiveThrottle::new(k, window),
                0x2545_f491_4f6c_dd1d,
            ))),
            start: tokio::time::Instant::now(),
            events: Arc::new(NoEvents),
        }
    }

    /// Reports local refusals to `events`.
    pub fn with_events(mut self, events: Arc<dyn Events>) -> AdaptiveLayer {
        self.events = events;
        self
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl<S> tower_layer::Layer<S> for AdaptiveLayer {
    type Service = Adaptive<S>;
    fn layer(&self, inner: S) -> Adaptive<S> {
        Adaptive {
            inner,
            layer: self.clone(),
        }
    }
}

/// A client service that refuses locally while the backend refuses much.
#[derive(Debug, Clone)]
pub struct Adaptive<S> {
    inner: S,
    layer: AdaptiveLayer,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for Adaptive<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = AdaptiveError<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<R>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(AdaptiveError::Inner)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let now = self.layer.now();
        let admitted = {
            let mut guard = self.layer.state.lock();
            let (throttle, seed) = &mut *guard;
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            let uniform = (*seed >> 11) as f64 / (1u64 << 53) as f64;
            throttle.admit(now, uniform)
        };
        if !admitted {
            self.layer.events.rejected_locally("adaptive throttling");
            return Box::pin(std::future::ready(Err(AdaptiveError::Throttled)));
        }
        let fut = self.inner.call(req);
        let layer = self.layer.clone();
        Box::pin(async move {
            let result = fut.await;
            let accepted = matches!(&result, Ok(r) if !matches!(
                r.status(),
                http::StatusCode::TOO_MANY_REQUESTS | http::StatusCode::SERVICE_UNAVAILABLE
            ));
            let now = layer.now();
            layer.state.lock().0.answered(now, accepted);
            result.map_err(AdaptiveError::Inner)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that accepts at most `capacity` requests per second.
    /// Offered 100 per second, it accepts 10 % of them; the client's sent
    /// rate falls to about `K` times what is accepted.
    #[test]
    fn the_sent_rate_falls_to_about_k_times_the_accepts() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(120));
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut uniform = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let capacity = 10;
        let (mut sent_late, mut accepted_late) = (0u64, 0u64);
        for second in 0..600u64 {
            let mut accepted_this_second = 0;
            for i in 0..100u64 {
                let now = second * 1_000_000_000 + i * 10_000_000;
                if t.admit(now, uniform()) {
                    let ok = accepted_this_second < capacity;
                    accepted_this_second += u64::from(ok);
                    t.answered(now, ok);
                    if second >= 300 {
                        sent_late += 1;
                        accepted_late += u64::from(ok);
                    }
                }
            }
        }
        let ratio = sent_late as f64 / accepted_late as f64;
        assert!(
            (1.7..=2.3).contains(&ratio),
            "sent {sent_late}, accepted {accepted_late}"
        );
        // The backend still gets all it can take.
        assert!(accepted_late as f64 >= 0.95 * 300.0 * capacity as f64);
    }

    #[test]
    fn a_healthy_backend_is_never_throttled() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(60));
        for i in 0..10_000u64 {
            assert!(t.admit(i * 1_000_000, 0.0));
            t.answered(i * 1_000_000, true);
        }
        assert_eq!(t.reject_probability(10_000_000_000), 0.0);
    }

    #[test]
    fn old_answers_leave_the_window() {
        let mut t = AdaptiveThrottle::new(2.0, Duration::from_secs(20));
        for i in 0..100 {
            t.admit(i, 0.99);
            t.answered(i, false);
        }
        assert!(t.reject_probability(100) > 0.9);
        assert_eq!(t.counts(30_000_000_000), (0, 0));
        assert_eq!(t.reject_probability(30_000_000_000), 0.0);
    }

    /// The layer over a backend that answers 429 to everything: after a
    /// few refusals most requests never leave.
    #[tokio::test]
    async fn the_layer_stops_hammering_a_refusing_backend() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use tower::{Service, ServiceExt};
        let sent = Arc::new(AtomicU64::new(0));
        let s = sent.clone();
        let backend = tower::service_fn(move |_r: http::Request<()>| {
            s.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(429)
                        .body(())
                        .unwrap_or_default(),
                )
            }
        });
        let layer = AdaptiveLayer::new(2.0, Duration::from_secs(120));
        let mut svc = tower_layer::Layer::layer(&layer, backend);
        let mut throttled = 0;
        for _ in 0..1000 {
            match svc
                .ready()
                .await
                .unwrap()
                .call(http::Request::new(()))
                .await
            {
                Err(AdaptiveError::Throttled) => throttled += 1,
                Ok(_) => {}
                Err(AdaptiveError::Inner(e)) => match e {},
            }
        }
        let sent = sent.load(Ordering::SeqCst);
        assert_eq!(sent + throttled, 1000);
        // With no accepts, p = r / (r + 1): about ln(1000) sent.
        assert!(sent < 50, "{sent} sent to a backend refusing everything");
    }
}
