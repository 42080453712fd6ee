//! Reads and writes under a connection's deadlines: answers written
//! through a buffering (TLS) stream, hyper's connections on the direct
//! path's deadlines, and reading more of a request.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Drain, Read};
use crate::budget::ConnState;
use crate::stream::Buffered;

/// Writes `bytes` into a stream that buffers (TLS) and flushes it, within
/// the write timeout; false if the client is gone or does not read.
pub(super) async fn write_buffered(s: &mut dyn Buffered, bytes: &[u8], timeout: Duration) -> bool {
    let n = match write_now(s, bytes) {
        Now::Done(ok) => return ok,
        Now::Wrote(n) => n,
    };
    let rest = &bytes[n..];
    let write = async {
        s.write_all(rest).await?;
        s.flush().await
    };
    matches!(tokio::time::timeout(timeout, write).await, Ok(Ok(())))
}

/// What [`write_now`] did.
enum Now {
    /// All written and flushed (true), or the stream broke (false).
    Done(bool),
    /// This many bytes were taken before the stream had to wait.
    Wrote(usize),
}

/// Writes and flushes what `s` takes without waiting: most answers are
/// sealed and taken by the socket at once, and then no timer is needed
/// (one would cost a timer wheel registration per answer).
fn write_now(s: &mut dyn Buffered, bytes: &[u8]) -> Now {
    use std::task::{Context, Poll, Waker};
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    while n < bytes.len() {
        match std::pin::Pin::new(&mut *s).poll_write(&mut cx, &bytes[n..]) {
            Poll::Ready(Ok(0) | Err(_)) => return Now::Done(false),
            Poll::Ready(Ok(k)) => n += k,
            Poll::Pending => return Now::Wrote(n),
        }
    }
    match std::pin::Pin::new(&mut *s).poll_flush(&mut cx) {
        Poll::Ready(r) => Now::Done(r.is_ok()),
        Poll::Pending => Now::Wrote(n),
    }
}

/// A connection handed to hyper, on the same coarse deadlines as the
/// direct path: while a request is in flight, every read or write that
/// moves bytes pushes its deadline `idle` ahead (with none in flight, the
/// deadline was set when the last one ended, and bytes that open no
/// request do not move it), and a write the client does not take within
/// `write` ends it. (A tokio timer reset on every pending read cost a timer-wheel
/// registration per request.)
pub(super) struct Timed<T> {
    pub(super) inner: T,
    pub(super) state: Arc<ConnState>,
    pub(super) drain: Arc<Drain>,
    pub(super) idle: Duration,
    pub(super) write: Duration,
    /// A write is waiting for the client (its deadline is set).
    pub(super) write_blocked: bool,
}

impl<T> Timed<T> {
    fn moved(&mut self) {
        self.write_blocked = false;
        if self.state.streams.load(Ordering::Relaxed) > 0 {
            self.state.waiting(&self.drain.budget.clock, self.idle);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Timed<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_ready() && buf.filled().len() > before {
            self.state.heard.store(true, Ordering::Relaxed);
            self.moved();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> Timed<T> {
    fn after_write(
        &mut self,
        r: std::task::Poll<io::Result<usize>>,
    ) -> std::task::Poll<io::Result<usize>> {
        match &r {
            // An answer's tail still going out to a slow reader after its
            // request ended (hyper queues a body's last bytes before they
            // are written): each write it takes gets the write timeout,
            // as on the direct path. A client that reads at once never
            // blocks a write, so PING answers move nothing.
            std::task::Poll::Ready(Ok(n))
                if *n > 0
                    && self.write_blocked
                    && self.state.streams.load(Ordering::Relaxed) == 0 =>
            {
                self.write_blocked = false;
                self.state.waiting(&self.drain.budget.clock, self.write);
            }
            std::task::Poll::Ready(Ok(n)) if *n > 0 => self.moved(),
            std::task::Poll::Pending if !self.write_blocked => {
                self.write_blocked = true;
                let ms = u64::try_from(self.write.as_millis()).unwrap_or(u64::MAX);
                let at = self.drain.budget.clock.now().saturating_add(ms);
                self.state.deadline.fetch_min(at, Ordering::Relaxed);
            }
            _ => {}
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Timed<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(r)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Reads more of a request (its deadline is the sweeper's).
pub(super) async fn read_more<S: AsyncRead + Unpin>(tcp: &mut S, buf: &mut BytesMut) -> Read {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(4096);
    }
    match tcp.read_buf(buf).await {
        Ok(n) if n > 0 => Read::More,
        _ => Read::Done,
    }
}

/// Completes when a connection of `max_age` (plus up to a tenth more, at
/// random) is due to go; never without one.
pub(super) async fn age_timer(max_age: Option<Duration>, id: u64) {
    let Some(age) = max_age else {
        return std::future::pending().await;
    };
    tokio::time::sleep(age + jitter(age, id)).await;
}

/// Up to a tenth of `age`, at random: connections opened in one burst
/// (every Envoy reconnecting after a deploy) leave spread out.
fn jitter(age: Duration, id: u64) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(id);
    let tenth = age / 10;
    let nanos = u64::try_from(tenth.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(h.finish() % nanos.saturating_add(1))
}

/// hyper's HTTP/2 connection, each wake-up put behind the tasks already
/// due on its worker (`on`: the gRPC listener's). hyper answers every
/// stream from a task of its own, and each answer wakes the connection
/// to write it: woken at once, the connection wrote (one `writev`) per
/// answer, and the system call was the largest cost of a gRPC call.
/// Deferred, it finds the answers of every stream that ran meanwhile and
/// writes them together.
pub(super) struct Gathered<F> {
    pub(super) inner: F,
    pub(super) on: bool,
    /// This wake-up has been deferred once: now poll.
    pub(super) yielded: bool,
}

impl<F: std::future::Future + Unpin> std::future::Future for Gathered<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = &mut *self;
        if this.on && !this.yielded {
            let mut later = std::pin::pin!(tokio::task::yield_now());
            if later.as_mut().poll(cx).is_pending() {
                this.yielded = true;
                return std::task::Poll::Pending;
            }
        }
        this.yielded = false;
        std::pin::Pin::new(&mut this.inner).poll(cx)
    }
}
