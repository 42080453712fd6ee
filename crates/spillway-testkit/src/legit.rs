//! The legitimate client of the attack matrix: it asks a listener what it
//! serves while an [`attack`] runs, on a fresh connection
//! each time or on one connection kept alive from before the attack, and
//! tallies how many of its requests got a real answer.
//!
//! It is strict where a forgiving client would hide what happened: a
//! kept-alive connection the server closed counts the request that found
//! it closed as unanswered (a browser would retry it; the server should
//! not have shed a connection it had served), and every request has one
//! deadline for everything (connect, TLS, answer, body).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_rustls::rustls;

use crate::attack::{self, Io, Proto, Req};

/// What counts as a real answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// One of these statuses (a decision: 200 or 429).
    Status(Vec<u16>),
    /// A gRPC call's: 200 and `grpc-status: 0`.
    Grpc,
}

/// A legitimate client of one listener.
#[derive(Debug, Clone)]
pub struct Legit {
    /// Where the listener is.
    pub addr: SocketAddr,
    /// The client's own address (not an attacker's).
    pub source: IpAddr,
    /// The host its requests name (and TLS's server name).
    pub authority: String,
    /// TLS that checks the server's certificate, with the ALPN of
    /// `proto`; `None` for plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// What it speaks.
    pub proto: Proto,
    /// What it asks.
    pub req: Req,
    /// What it takes for an answer.
    pub answer: Answer,
}

/// An open connection of the legitimate client.
#[derive(Debug)]
pub enum Conn {
    /// HTTP/1.1.
    H1(http1::SendRequest<Whole>),
    /// HTTP/2.
    H2(http2::SendRequest<Whole>),
}

/// How a legitimate client fared.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Requests asked.
    pub asked: u32,
    /// Requests that got a real answer.
    pub answered: u32,
    /// What went wrong, by kind, with how often.
    pub failures: BTreeMap<String, u32>,
    /// The slowest real answer.
    pub slowest: Duration,
}

impl Tally {
    /// The share of requests answered, 0 to 1 (0 when none was asked).
    pub fn share(&self) -> f64 {
        if self.asked == 0 {
            0.0
        } else {
            f64::from(self.answered) / f64::from(self.asked)
        }
    }

    /// Adds `other`'s requests (another client asking beside this one).
    pub fn merge(&mut self, other: &Tally) {
        self.asked += other.asked;
        self.answered += other.answered;
        for (k, n) in &other.failures {
            *self.failures.entry(k.clone()).or_default() += n;
        }
        self.slowest = self.slowest.max(other.slowest);
    }

    /// `5×timeout, 2×status 503`.
    pub fn summary(&self) -> String {
        self.failures
            .iter()
            .map(|(k, n)| format!("{n}×{k}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Legit {
    /// Opens a connection (TCP, TLS, the protocol's handshake); each step
    /// may take as long as the whole request may (the caller's deadline
    /// bounds them all).
    ///
    /// # Errors
    /// What failed, in a word or three (`no connection`, `tls`, ...).
    pub async fn connect(&self) -> Result<Conn, String> {
        let within = Duration::from_secs(60);
        let tcp = attack::connect_from(self.source, self.addr, false, within)
            .await
            .ok_or("no connection")?;
        let io: Box<dyn Io> = match &self.tls {
            Some(cfg) => Box::new(
                attack::tls_over(tcp, cfg.clone(), &self.authority, within)
                    .await
                    .ok_or("tls handshake")?,
            ),
            None => Box::new(tcp),
        };
        let io = TokioIo::new(io);
        match self.proto {
            Proto::H1 => {
                let (send, conn) = http1::handshake(io).await.map_err(|_| "h1 handshake")?;
                tokio::spawn(conn);
                Ok(Conn::H1(send))
            }
            Proto::H2 => {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(|_| "h2 handshake")?;
                tokio::spawn(conn);
                Ok(Conn::H2(send))
            }
        }
    }

    /// Asks once on `conn`.
    ///
    /// # Errors
    /// Why it was not a real answer (`closed`, `reset`, `status 503`, ...).
    pub async fn ask_on(&self, conn: &mut Conn) -> Result<(), String> {
        let r = &self.req;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut b = hyper::Request::builder().method(r.method.as_str());
        b = match conn {
            Conn::H1(_) => b.uri(r.path.as_str()).header("host", &self.authority),
            Conn::H2(_) => b.uri(format!("{scheme}://{}{}", self.authority, r.path)),
        };
        for (n, v) in &r.headers {
            b = b.header(n.as_str(), v.as_str());
        }
        let req = b
            .body(Whole(Some(Bytes::from(r.body.clone()))))
            .map_err(|e| format!("bad request: {e}"))?;
        let resp = match conn {
            Conn::H1(s) => {
                s.ready().await.map_err(|_| "closed before asking")?;
                s.send_request(req).await
            }
            Conn::H2(s) => {
                s.ready().await.map_err(|_| "closed before asking")?;
                s.send_request(req).await
            }
        }
        .map_err(|e| kind_of(&e))?;
        let status = resp.status().as_u16();
        let in_head = grpc_status(resp.headers());
        let trailers = read_to_end(resp.into_body()).await?;
        match &self.answer {
            Answer::Status(ok) if ok.contains(&status) => Ok(()),
            Answer::Grpc if status == 200 => {
                match in_head.or_else(|| trailers.as_ref().and_then(grpc_status)) {
                    Some(0) => Ok(()),
                    Some(n) => Err(format!("grpc-status {n}")),
                    None => Err("no grpc-status".into()),
                }
            }
            _ => Err(format!("status {status}")),
        }
    }

    /// Asks from `from` until `until`, one request after another with
    /// `pause` between, each within `deadline`: on a new connection each
    /// time, or on `kept` (opened and served before), reopened when lost.
    /// It goes on past `until` until it has asked `min` times (for at most
    /// two deadlines more): a slow server is not a failure, and a share
    /// needs a few requests (one slow answer at the window's end once made
    /// a share of 1 of 2).
    pub async fn keep_asking(
        &self,
        mut kept: Option<Conn>,
        (from, until): (Instant, Instant),
        min: u32,
        deadline: Duration,
        pause: Duration,
    ) -> Tally {
        let keep_alive = kept.is_some();
        let mut tally = Tally::default();
        tokio::time::sleep_until(from.into()).await;
        let more = |t: &Tally| {
            let now = Instant::now();
            now < until || (t.asked < min && now < until + 2 * deadline)
        };
        while more(&tally) {
            let started = Instant::now();
            let once = async {
                let mut conn = match kept.take() {
                    Some(c) => c,
                    None => self.connect().await?,
                };
                let r = self.ask_on(&mut conn).await;
                if keep_alive && r.is_ok() {
                    kept = Some(conn);
                }
                r
            };
            let r = match tokio::time::timeout(deadline, once).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {deadline:?}")),
            };
            tally.asked += 1;
            match r {
                Ok(()) => {
                    tally.answered += 1;
                    tally.slowest = tally.slowest.max(started.elapsed());
                }
                Err(e) => *tally.failures.entry(e).or_default() += 1,
            }
            tokio::time::sleep(pause).await;
        }
        tally
    }
}

/// `grpc-status` as a number, when present.
fn grpc_status(h: &hyper::HeaderMap) -> Option<u32> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// hyper's error, in a word.
fn kind_of(e: &hyper::Error) -> String {
    if e.is_canceled() || e.is_closed() || e.is_incomplete_message() {
        "closed".into()
    } else if e.is_timeout() {
        "timeout".into()
    } else {
        let text = e.to_string();
        let source = std::error::Error::source(e).map(ToString::to_string);
        match source {
            Some(s) if s.contains("reset") => "reset".into(),
            Some(s) if s.contains("REFUSED_STREAM") => "stream refused".into(),
            Some(s) => format!("{text}: {s}"),
            None => text,
        }
    }
}

/// Reads a body to its end; its trailers, if any.
async fn read_to_end(mut body: Incoming) -> Result<Option<hyper::HeaderMap>, String> {
    let mut trailers = None;
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            None => return Ok(trailers),
            Some(Ok(f)) => {
                if let Ok(t) = f.into_trailers() {
                    trailers = Some(t);
                }
            }
            Some(Err(e)) => return Err(format!("body cut: {}", kind_of(&e))),
        }
    }
}

/// A request body sent whole.
#[derive(Debug)]
pub struct Whole(Option<Bytes>);

impl Body for Whole {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().0.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}
