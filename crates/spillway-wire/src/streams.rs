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

/// The handler's fallback service, its requests counted.
pub(crate) struct Counted<S> {
    pub(crate) inner: S,
    pub(crate) budget: Arc<Budget>,
    pub(crate) conn: Arc<ConnState>,
    pub(crate) idle: Duration,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Counted<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    S::Future: Unpin,
    B: Body + Unpin,
{
    type Response = Response<CountedBody<B>>;
    type Error = Infallible;
    type Future = CountedFuture<S::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        match self.budget.open_stream(&self.conn, self.idle) {
            Some(guard) => CountedFuture {
                inner: Some(self.inner.call(req)),
                guard: Some(guard),
            },
            None => CountedFuture {
                inner: None,
                guard: None,
            },
        }
    }
}

/// The fallback's answer, its guard handed on to the body.
pub(crate) struct CountedFuture<F> {
    /// `None`: refused at the stream bound.
    inner: Option<F>,
    guard: Option<StreamGuard>,
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
        match Pin::new(inner).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(res)) => {
                let guard = this.guard.take();
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
