//! The bodies the hyper transport wraps around an upstream's answer: one
//! that charges a request's cost once the answer says it, and one cut
//! when the upstream stalls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;

use super::super::Proxy;
use super::Bounded;

/// What charging a request's cost after the answer needs: the request's
/// identity and headers (for the rules' keys), kept from before it went
/// upstream.
pub(super) struct Settle {
    pub(super) proxy: Arc<Proxy>,
    pub(super) method: String,
    pub(super) path: String,
    pub(super) who: super::super::Who,
    pub(super) headers: HeaderMap,
}

impl Settle {
    /// Charges what `read` finds to the rules that read their cost.
    async fn run(&self, read: &(dyn Fn(&str) -> Option<String> + Sync)) -> bool {
        self.proxy
            .settle(&self.method, &self.path, &self.who, &self.headers, read)
            .await
    }
}

/// A header's value as text, if it is sent once and is text.
pub(super) fn value(h: &HeaderMap, name: &str) -> Option<String> {
    let mut all = h.get_all(name).iter();
    let v = all.next()?;
    if all.next().is_some() {
        return None;
    }
    v.to_str().ok().map(str::to_string)
}

/// How the upstream call ended: its answer (the body ready for the
/// client), a failure, or no head within the timeout.
pub(super) type Called =
    Result<Result<Response<Body>, hyper_util::client::legacy::Error>, tokio::time::error::Elapsed>;

/// Most bytes of an answer read after its client left, looking for the
/// trailer that says what it cost: past them the reading stops and the
/// estimate charged at admission stands.
pub(super) const READ_AFTER_LEAVING: usize = 8 * 1024 * 1024;

/// The upstream call of a request whose cost comes from the answer, in a
/// task of its own so that the client leaving does not stop it: the cost
/// in the answer's head is charged before the head goes on; the body is
/// wrapped to charge a trailer's cost, even if the client goes (see
/// [`Settling`]). Sent on `tx`; a client already gone drops it there,
/// which reads on for the trailer.
pub(super) async fn call_settled(
    client: Client<Bounded, Body>,
    req: Request<Body>,
    timeout: Duration,
    settle: Arc<Settle>,
    tx: tokio::sync::oneshot::Sender<Called>,
) {
    let called = match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(resp)) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            Ok(Ok(resp.map(Body::new)))
        }
        Ok(Ok(resp)) => {
            let (parts, body) = resp.into_parts();
            let head = parts.headers.clone();
            settle.run(&|name| value(&head, name)).await;
            let body = Settling::new(IdleTimeout::new(body, timeout), settle, head, timeout);
            Ok(Ok(Response::from_parts(parts, Body::new(body))))
        }
        other => other.map(|r| r.map(|resp| resp.map(Body::new))),
    };
    // A client gone: what it would have read is dropped, and a
    // `Settling` body reads on for its trailer.
    let _ = tx.send(called);
}

/// A response body whose trailers may carry a rule's cost: when they
/// arrive, the cost of every rule whose field was not in the head is
/// charged before the trailers go on to the client. Dropped before them
/// (the client left: an HTTP/1.1 close, an HTTP/2 reset), it reads the
/// rest of the answer in a task of its own, within the proxy's timeout and
/// [`READ_AFTER_LEAVING`] bytes, and charges the trailer's cost if one
/// comes (if none does, the estimate charged at admission stands).
pub(super) struct Settling {
    /// The upstream's body (`None` once handed to the reading task).
    inner: Option<IdleTimeout<hyper::body::Incoming>>,
    /// Until the trailer's cost is charged (or the body ends without one).
    settle: Option<Arc<Settle>>,
    /// The answer's head: fields found there were charged already.
    head: HeaderMap,
    /// A charge under way, and the trailers frame held back until it ends.
    pending: Option<(Charging, hyper::body::Frame<Bytes>)>,
    /// How long the answer is read for once the client left.
    timeout: Duration,
}

/// A charge of a trailer's cost, under way.
type Charging = Pin<Box<dyn Future<Output = bool> + Send>>;

impl Settling {
    fn new(
        inner: IdleTimeout<hyper::body::Incoming>,
        settle: Arc<Settle>,
        head: HeaderMap,
        timeout: Duration,
    ) -> Settling {
        Settling {
            inner: Some(inner),
            settle: Some(settle),
            head,
            pending: None,
            timeout,
        }
    }

    /// The charge of the cost in `trailers` (fields not in `head`).
    fn charge(settle: Arc<Settle>, head: HeaderMap, trailers: HeaderMap) -> Charging {
        Box::pin(async move {
            let read = |name: &str| {
                if head.contains_key(name) {
                    None
                } else {
                    value(&trailers, name)
                }
            };
            settle.run(&read).await
        })
    }
}

impl hyper::body::Body for Settling {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if let Some((mut charge, frame)) = this.pending.take() {
            if charge.as_mut().poll(cx).is_pending() {
                this.pending = Some((charge, frame));
                return Poll::Pending;
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Pending => return Poll::Pending,
            other => {
                // The end, or an error: no trailer will come.
                this.settle = None;
                return other;
            }
        };
        let Some(trailers) = frame.trailers_ref() else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let Some(settle) = this.settle.take() else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let charge = Self::charge(settle, std::mem::take(&mut this.head), trailers.clone());
        this.pending = Some((charge, frame));
        self.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(hyper::body::SizeHint::default, |b| b.size_hint())
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        let pending = self.pending.take();
        let settle = self.settle.take();
        let inner = self.inner.take();
        if pending.is_none() && settle.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let head = std::mem::take(&mut self.head);
        let timeout = self.timeout;
        runtime.spawn(async move {
            if let Some((charge, _)) = pending {
                charge.await;
                return;
            }
            let (Some(settle), Some(body)) = (settle, inner) else {
                return;
            };
            let read = tokio::time::timeout(timeout, trailers_of(body, READ_AFTER_LEAVING));
            if let Ok(Some(trailers)) = read.await {
                Self::charge(settle, head, trailers).await;
            }
        });
    }
}

/// The trailers at the end of `body`, read and dropped up to `cap` bytes;
/// `None` if it ends without them, breaks, or is longer.
async fn trailers_of(
    mut body: IdleTimeout<hyper::body::Incoming>,
    cap: usize,
) -> Option<HeaderMap> {
    use hyper::body::Body as _;
    let mut read = 0usize;
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await?
            .ok()?;
        match frame.into_data() {
            Ok(data) => {
                read = read.saturating_add(data.len());
                if read > cap {
                    return None;
                }
            }
            Err(frame) => return frame.into_trailers().ok(),
        }
    }
}

/// An upstream's response body that must keep coming: no wait for its next
/// frame may last longer than `timeout`, else the body ends in an error
/// and the client's connection is cut (its framing cannot be finished), as
/// the direct path's relay does. Only waits count: a slow client that
/// leaves frames unread for a while is not the upstream's stall.
pub(super) struct IdleTimeout<B> {
    inner: B,
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// A wait for the next frame is under way (the deadline is set).
    waiting: bool,
}

impl<B> IdleTimeout<B> {
    pub(super) fn new(inner: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            waiting: false,
        }
    }
}

impl<B> hyper::body::Body for IdleTimeout<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                Poll::Ready(frame.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                if !this.waiting {
                    this.waiting = true;
                    let deadline = tokio::time::Instant::now() + this.timeout;
                    this.sleep.as_mut().reset(deadline);
                }
                match this.sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                        "the upstream's body stalled for {:?}",
                        this.timeout
                    )
                    .into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
