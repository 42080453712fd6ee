//! The connection to the xDS management server: TCP, TLS (verifying the
//! server against `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`, or the system's
//! CA bundle; a client certificate for mutual TLS), HTTP/2, and tonic's
//! generic gRPC client over it.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;

use super::{ClientTls, Settings};

/// Where the system's CA bundle is, trusted when
/// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT` names none.
pub use crate::tls::SYSTEM_CA_BUNDLE;

/// The longest wait for a connection and its handshakes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP/2 request sender as a tower service, for tonic's client.
pub(crate) type Channel = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<hyper::body::Incoming>,
    hyper::Error,
>;

/// The TLS client settings, built once (the files are read at start: a
/// bad one stops the start).
///
/// # Errors
/// A file cannot be read or holds no certificate or key.
pub(crate) fn tls_config(tls: &ClientTls) -> Result<Arc<rustls::ClientConfig>, String> {
    let client = tls.client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let mut config = crate::tls::client_config("xDS server", tls.ca.as_deref(), client)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Connects to the server and speaks HTTP/2 on the connection; the
/// connection's task ends when the sender is dropped or the peer goes.
pub(crate) async fn connect(
    settings: &Settings,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(Channel, http::Uri), String> {
    let (host, _) = split_host(&settings.server)?;
    let io = tokio::time::timeout(CONNECT_TIMEOUT, async {
        let tcp = tokio::net::TcpStream::connect(&settings.server)
            .await
            .map_err(|e| format!("connect {}: {e}", settings.server))?;
        let _ = tcp.set_nodelay(true);
        match tls {
            None => Ok::<_, String>(Io::Plain(tcp)),
            Some(config) => {
                // The name verified: CONFIG_GRPC_XDS_SERVER_TLS_SAN, else the host.
                let name = settings
                    .tls
                    .as_ref()
                    .and_then(|t| t.san.clone())
                    .unwrap_or_else(|| host.to_string());
                let name = ServerName::try_from(name.clone())
                    .map_err(|e| format!("xDS server name {name:?}: {e}"))?;
                let s = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS with {}: {e}", settings.server))?;
                Ok(Io::Tls(Box::new(s)))
            }
        }
    })
    .await
    .map_err(|_| format!("connect {}: timed out", settings.server))??;
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let (sender, conn) = match io {
        Io::Plain(s) => {
            let (tx, c) = builder
                .handshake(TokioIo::new(s))
                .await
                .map_err(|e| format!("HTTP/2 with {}: {e}", settings.server))?;
            tokio::spawn(async move {
                let _ = c.await;
            });
            (tx, ())
        }
        Io::Tls(s) => {
            let (tx, c) = builder
                .handshake(TokioIo::new(*s))
                .await
                .map_err(|e| format!("HTTP/2 with {}: {e}", settings.server))?;
            tokio::spawn(async move {
                let _ = c.await;
            });
            (tx, ())
        }
    };
    let () = conn;
    let svc = tower::service_fn(move |req: http::Request<tonic::body::Body>| {
        let mut sender = sender.clone();
        async move { sender.send_request(req).await }
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let origin = format!("{scheme}://{}", settings.server)
        .parse::<http::Uri>()
        .map_err(|e| format!("xDS server {:?}: {e}", settings.server))?;
    Ok((tower::util::BoxCloneSyncService::new(svc), origin))
}

enum Io {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

/// `host:port` (IPv6 in brackets) split, as Go's `net.SplitHostPort`.
///
/// # Errors
/// No port, or a port that is not a number.
pub fn split_host(addr: &str) -> Result<(&str, u16), String> {
    let bad = || format!("{addr:?}: expected HOST:PORT");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    // An IPv6 address only in brackets, as Go requires.
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(h) => h,
        None if host.contains(':') => return Err(bad()),
        None => host,
    };
    if host.is_empty() || host.contains(['/', ' ', ',', '[', ']', '@']) {
        return Err(bad());
    }
    let port = port.parse::<u16>().map_err(|_| bad())?;
    Ok((host, port))
}
