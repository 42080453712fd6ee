//! Requests in flight on a connection handed to hyper, counted against the
//! process's [`Budget`](crate::Budget).
//!
//! Each request (an HTTP/2 stream, or an HTTP/1.1 request on hyper) holds
//! a [`StreamGuard`] from the moment hyper calls the service until its
//! answer's body has been sent or the stream is reset. The count tells the
//! connection's deadline what it waits for: with a request in flight,
//! bytes moving either way push the idle deadline on; with none, only a
//! new request does (a PING or SETTINGS flood keeps nothing open). At the
//! process's stream bound, a connection over its share is answered 503 at
//! once, which costs a few bytes instead of a held stream.
//!
//! A request's body is handed on as a [`RequestBody`]: while it has not
//! all arrived, the request waits on its client (a connection whose every
//! request does may be closed to make room, see [`Budget`]), and the body
//! has `body_timeout` in all from the request's head.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::budget::{Budget, ConnState, StreamGuard};

/// A request body read on hyper's path, as the handler's fallback service
/// receives it: hyper's body, bounded in time as a whole.
///
/// While it has not all arrived, its request counts as waiting on its
/// client: a connection whose every request in flight waits so may be
/// closed to make room like an idle one (a chunked body trickled a byte
/// at a time, or an HTTP/2 stream whose body never comes, no longer makes
/// its connection "busy"). The whole body must arrive within the
/// listener's `body_timeout` from its request's head; past it, the next
/// read fails with [`BodyError::TimedOut`] (the process's deadline sweeper
/// wakes a read that waits, so no timer is set per body). Bytes arriving
/// do not extend the deadline.
pub struct RequestBody {
    inner: Incoming,
    /// While the body is unfinished: what it is counted on, and its
    /// deadline.
    watch: Option<Watch>,
}

struct Watch {
    budget: Arc<Budget>,
    conn: Arc<ConnState>,
    /// In the budget's coarse milliseconds.
    deadline: u64,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("inner", &self.inner)
            .field("watched", &self.watch.is_some())
            .finish()
    }
}

impl RequestBody {
    /// `inner`, counted on `conn` and due `body` from now if unfinished.
    fn new(
        inner: Incoming,
        budget: &Arc<Budget>,
        conn: &Arc<ConnState>,
        body: Duration,
    ) -> RequestBody {
        let watch = (!inner.is_end_stream()).then(|| {
            let deadline = budget.clock.after(body);
            conn.body_begins(deadline);
            Watch {
                budget: budget.clone(),
                conn: conn.clone(),
                deadline,
            }
        });
        RequestBody { inner, watch }
    }

    fn finish(&mut self) {
        if let Some(w) = self.watch.take() {
            w.conn.body_ends();
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Why a request body could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum BodyError {
    /// hyper's: the client broke the body (cut short, bad framing, a
    /// reset stream).
    Hyper(hyper::Error),
    /// The body did not all arrive within the body timeout.
    TimedOut,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Hyper(e) => write!(f, "the request body failed: {e}"),
            BodyError::TimedOut => f.write_str("the request body did not arrive in time"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Hyper(e) => Some(e),
            BodyError::TimedOut => None,
        }
    }
}

impl BodyError {
    /// Whether `e`, or an error it wraps, is a body that timed out.
    pub fn timed_out_in(e: &(dyn std::error::Error + 'static)) -> bool {
        let mut next = Some(e);
        while let Some(err) = next {
            if matches!(err.downcast_ref::<BodyError>(), Some(BodyError::TimedOut)) {
                return true;
            }
            next = err.source();
        }
        false
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(w) = &this.watch
            && w.budget.clock.now() >= w.deadline
        {
            this.finish();
            return Poll::Ready(Some(Err(BodyError::TimedOut)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if let Some(w) = &this.watch {
                    w.conn.body_waits(w.deadline, cx.waker());
                }
                Poll::Pending
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish();
                Poll::Ready(Some(Err(BodyError::Hyper(e))))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The handler's fallback service, its requests counted.
pub(crate) struct Counted<S> {
    pub(crate) inner: S,
    pub(crate) budget: Arc<Budget>,
    pub(crate) conn: Arc<ConnState>,
    pub(crate) idle: Duration,
    /// `body_timeout`: each body's time in all.
    pub(crate) body: Duration,
    /// `write_timeout`: an answer's time to be taken.
    pub(crate) write: Duration,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Counted<S>
where
    S: hyper::service::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    S::Future: Unpin,
    B: Body + Unpin,
{
    type Response = Response<CountedBody<B>>;
    type Error = Infallible;
    type Future = CountedFuture<S::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        match self.budget.open_stream(&self.conn, self.idle) {
            Some(guard) => {
                // An HTTP/1.1 request yields once before its handler runs:
                // hyper answers up to 16 pipelined requests in one poll,
                // and a crowd's pipelines then held the workers while
                // every other connection waited. (An HTTP/2 stream is a
                // task of its own.)
                let yielded = req.version() == http::Version::HTTP_2;
                let req = req.map(|b| RequestBody::new(b, &self.budget, &self.conn, self.body));
                CountedFuture {
                    inner: Some(self.inner.call(req)),
                    guard: Some(guard),
                    write: self.write,
                    yielded,
                }
            }
            None => CountedFuture {
                inner: None,
                guard: None,
                write: self.write,
                yielded: true,
            },
        }
    }
}

/// The fallback's answer, its guard handed on to the body.
pub(crate) struct CountedFuture<F> {
    /// `None`: refused at the stream bound.
    inner: Option<F>,
    guard: Option<StreamGuard>,
    /// `write_timeout`: an answer's time to be taken.
    write: Duration,
    /// It has let the connection's task go once (see [`Counted::call`]).
    yielded: bool,
}

impl<F, B> Future for CountedFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>> + Unpin,
{
    type Output = Result<Response<CountedBody<B>>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(Ok(refused()));
        };
        if !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match Pin::new(inner).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(res)) => {
                let mut guard = this.guard.take();
                if let Some(g) = &mut guard {
                    // Answered: a client that has been served, and what
                    // is left waits on it.
                    g.answered(this.write);
                }
                Poll::Ready(Ok(res.map(|body| CountedBody::Body { body, guard })))
            }
        }
    }
}

/// 503 with `Retry-After`: the process holds as many requests in flight as
/// it allows and this connection holds its share.
fn refused<B>() -> Response<CountedBody<B>> {
    let text = "too many requests in flight on this server; retry\n";
    let mut res = Response::new(CountedBody::Refused(Some(Bytes::from_static(
        text.as_bytes(),
    ))));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = res.headers_mut();
    h.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    res
}

/// An answer's body holding its request's place until it ends.
pub(crate) enum CountedBody<B> {
    /// The fallback's body, and the guard dropped with it.
    Body { body: B, guard: Option<StreamGuard> },
    /// The refusal's text.
    Refused(Option<Bytes>),
}

impl<B> Body for CountedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.get_mut() {
            CountedBody::Body { body, guard } => {
                let r = Pin::new(body).poll_frame(cx);
                if let Poll::Ready(None) = r {
                    // Sent in full: the request is over even if hyper
                    // keeps the body a while.
                    guard.take();
                }
                r
            }
            CountedBody::Refused(text) => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            CountedBody::Body { body, .. } => body.is_end_stream(),
            CountedBody::Refused(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            CountedBody::Body { body, .. } => body.size_hint(),
            CountedBody::Refused(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}
