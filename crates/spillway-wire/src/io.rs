//! Streams for the hand-off to hyper: bytes already read come first
//! ([`Rewind`]), and a connection that makes no progress is ended
//! ([`Timed`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A stream that first yields bytes already read from it.
pub(crate) struct Rewind<T> {
    pub(crate) pre: Bytes,
    pub(crate) inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream that fails with `TimedOut` when a read waits longer than
/// `idle` with nothing moving either way (an idle keep-alive connection,
/// a client trickling nothing), or a write waits longer than `write` (a
/// client that does not read its answers).
pub(crate) struct Timed<T> {
    inner: T,
    idle: Duration,
    write: Duration,
    /// When nothing has moved for `idle`.
    idle_at: Instant,
    /// Since when a write has been waiting, if one is.
    write_blocked: Option<Instant>,
    sleep: Pin<Box<Sleep>>,
}

impl<T> Timed<T> {
    pub(crate) fn new(inner: T, idle: Duration, write: Duration) -> Timed<T> {
        let idle_at = Instant::now() + idle;
        Timed {
            inner,
            idle,
            write,
            idle_at,
            write_blocked: None,
            sleep: Box::pin(tokio::time::sleep_until(idle_at)),
        }
    }

    fn progressed(&mut self) {
        self.idle_at = Instant::now() + self.idle;
    }

    /// Pending until `deadline`, then the timeout as an error.
    fn wait(&mut self, cx: &mut Context<'_>, deadline: Instant) -> Poll<io::Error> {
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection made no progress",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Timed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let deadline = this.idle_at;
                this.wait(cx, deadline).map(Err)
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> Timed<T> {
    fn write_with(
        &mut self,
        cx: &mut Context<'_>,
        f: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match f(Pin::new(&mut self.inner), cx) {
            Poll::Ready(r) => {
                self.write_blocked = None;
                if matches!(r, Ok(n) if n > 0) {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let since = *self.write_blocked.get_or_insert_with(Instant::now);
                self.wait(cx, since + self.write).map(Err)
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Timed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write_with(cx, |w, cx| w.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write_with(cx, |w, cx| w.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
