//! What a connection's bytes travel over: plain TCP, or TLS on top of it.
//!
//! [`crate::serve_on`] is generic over an [`Accept`]or, which turns each
//! accepted socket into a [`Stream`]; the connection code is generic over
//! the stream, so plain TCP is compiled apart from TLS and pays nothing for
//! it. Handlers see neither: they write through [`crate::ClientConn`],
//! which holds the plain socket, or a stream that buffers what is written
//! (TLS seals bytes into records), and writes and flushes accordingly.
//!
//! With the `tls` feature, `Tls` accepts TLS connections with a
//! `tokio_rustls::TlsAcceptor` (whose configuration may pick its
//! certificate per handshake, which is how a certificate is reloaded
//! without touching the listener).

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A connection's byte stream, as the server reads and writes it.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// How a direct-path answer is written to this stream.
    fn writer(&mut self) -> Writer<'_>;
}

/// How a direct-path answer reaches the client: straight to the socket, or
/// through a stream that buffers (and so must be flushed).
#[derive(Debug)]
pub struct Writer<'a>(pub(crate) WriterKind<'a>);

pub(crate) enum WriterKind<'a> {
    Tcp(&'a mut TcpStream),
    Buffered(&'a mut dyn Buffered),
}

impl std::fmt::Debug for WriterKind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WriterKind::Tcp(_) => "Tcp",
            WriterKind::Buffered(_) => "Buffered",
        })
    }
}

impl<'a> Writer<'a> {
    /// Answers go to the socket itself (written without a timer when the
    /// socket takes them at once).
    pub fn tcp(tcp: &'a mut TcpStream) -> Writer<'a> {
        Writer(WriterKind::Tcp(tcp))
    }

    /// Answers go through `stream`, which holds what is written until it
    /// is flushed (a TLS session).
    pub fn buffered(stream: &'a mut dyn Buffered) -> Writer<'a> {
        Writer(WriterKind::Buffered(stream))
    }

    /// The socket under the stream.
    pub(crate) fn socket(&self) -> &TcpStream {
        match &self.0 {
            WriterKind::Tcp(t) => t,
            WriterKind::Buffered(b) => b.socket(),
        }
    }
}

/// A stream that buffers what is written (TLS), over a TCP socket.
pub trait Buffered: AsyncWrite + Unpin + Send {
    /// The socket under it: watching it tells whether the client left.
    fn socket(&self) -> &TcpStream;
}

impl Stream for TcpStream {
    fn writer(&mut self) -> Writer<'_> {
        Writer::tcp(self)
    }
}

/// Turns an accepted socket into a connection's stream.
pub trait Accept: Send + Sync + 'static {
    /// The stream connections are served over.
    type Stream: Stream;

    /// Whether [`Accept::accept`] waits for the client (a handshake): the
    /// server then bounds it by the head timeout, where a plain connection
    /// that sends nothing is bounded by the idle timeout.
    const HANDSHAKE: bool;

    /// The stream for `tcp`; an error closes the connection (and is
    /// logged at debug level: a client that cannot handshake is the
    /// client's problem).
    fn accept(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

/// Plain TCP: the socket is the stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainTcp;

impl Accept for PlainTcp {
    type Stream = TcpStream;
    const HANDSHAKE: bool = false;

    fn accept(&self, tcp: TcpStream) -> impl Future<Output = io::Result<TcpStream>> + Send {
        std::future::ready(Ok(tcp))
    }
}

#[cfg(feature = "tls")]
pub use self::tls::Tls;

#[cfg(feature = "tls")]
mod tls {
    use std::io;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    use tokio_rustls::server::TlsStream;

    use super::{Accept, Buffered, Stream, Writer};

    /// TLS on every connection, with `tokio_rustls`. A client that sends
    /// plain HTTP instead of a TLS handshake is told so in a plain 400
    /// answer, then closed.
    #[derive(Clone)]
    pub struct Tls(pub tokio_rustls::TlsAcceptor);

    impl std::fmt::Debug for Tls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Tls")
        }
    }

    /// The answer to plain HTTP on a TLS port (nginx answers 400 too).
    const PLAIN_ON_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
content-type: application/problem+json\r\n\
content-length: 105\r\n\
connection: close\r\n\r\n\
{\"type\":\"about:blank\",\"title\":\"bad request\",\"status\":400,\"detail\":\"this port speaks HTTPS: use https://\"}";

    /// The first byte of a TLS record that starts a handshake.
    const HANDSHAKE_RECORD: u8 = 0x16;

    impl Accept for Tls {
        type Stream = TlsStream<TcpStream>;
        const HANDSHAKE: bool = true;

        async fn accept(&self, mut tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
            let mut first = [0u8; 1];
            let n = tcp.peek(&mut first).await?;
            if n == 1 && first[0] != HANDSHAKE_RECORD {
                // An uppercase letter starts every HTTP method: say why
                // nothing will be answered; anything else just closes.
                if first[0].is_ascii_uppercase() {
                    let _ = tcp.write_all(PLAIN_ON_TLS).await;
                    let _ = tcp.shutdown().await;
                }
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not a TLS handshake",
                ));
            }
            self.0.accept(tcp).await
        }
    }

    impl Stream for TlsStream<TcpStream> {
        fn writer(&mut self) -> Writer<'_> {
            Writer::buffered(self)
        }
    }

    impl Buffered for TlsStream<TcpStream> {
        fn socket(&self) -> &TcpStream {
            self.get_ref().0
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_plain_http_answer_has_its_length() {
            let text = std::str::from_utf8(super::PLAIN_ON_TLS).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
        }
    }
}
