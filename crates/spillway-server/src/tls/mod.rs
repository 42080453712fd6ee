//! HTTPS on the listeners: certificates read from PEM files, handed to each
//! new handshake from an [`ArcSwap`], and reloaded when the files change.
//!
//! One [`Certs`] per certificate and key pair is the rustls certificate
//! resolver of every listener that serves it: the rustls configuration is
//! built once, and a reload swaps only the certificate it resolves to. A
//! handshake that has begun keeps the certificate it got; connections
//! already open are not touched.
//!
//! The files are read every poll interval (they are small) and a change
//! applies once both files read the same on two polls in a row, so a pair
//! caught half-written (the certificate replaced, the key not yet) is not
//! tried. A new pair that does not load (unreadable, not PEM, a key that
//! does not match its certificate) is logged as an error and shown on
//! `/v1/status`; the pair in use stays in use, and the next change is
//! tried again.
//!
//! rustls runs on ring: aws-lc-rs would need cmake and a long C build.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde_json::json;
use tokio::sync::watch;

use crate::unix_ms;

/// The largest certificate or key file read: a chain is a few KiB.
const MAX_FILE: u64 = 1 << 20;

/// ALPN for the HTTP listeners: HTTP/1.1 first, so a client that speaks
/// both takes the direct path (HTTP/1.1 only); HTTP/2 for clients that
/// want only it.
pub const HTTP_ALPN: &[&[u8]] = &[b"http/1.1", b"h2"];

/// ALPN for the gRPC listener.
pub const GRPC_ALPN: &[&[u8]] = &[b"h2"];

/// A certificate or key file that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for TlsError {}

/// When a certificate stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// Seconds since the Unix epoch.
    pub unix: i64,
    /// As RFC 3339, UTC (`2027-01-31T12:00:00Z`).
    pub rfc3339: String,
}

/// What the status page and `check-config` show of a certificate: read
/// from its DER, `None` where that could not be read (rustls serves it
/// all the same).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertInfo {
    /// The serial number, in hex.
    pub serial: Option<String>,
    /// Its `notAfter`.
    pub not_after: Option<Expiry>,
}

/// A pair read and checked.
#[derive(Debug)]
pub struct Loaded {
    /// The chain and signing key, as rustls serves them.
    pub key: Arc<CertifiedKey>,
    /// The server certificate's serial and expiry.
    pub info: CertInfo,
    /// The files' contents when read (hashes), to tell a later change.
    stamp: Stamp,
}

/// Hashes of the certificate and key files' contents (`None`: unreadable).
type Stamp = (Option<u64>, Option<u64>);

fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Seconds since the Unix epoch, now, signed as certificate times are
/// ([`crate::os::unix_secs`]).
pub fn unix_secs() -> i64 {
    i64::try_from(crate::os::unix_secs()).unwrap_or(i64::MAX)
}

/// Reads and checks the pair `files` names.
///
/// # Errors
/// A file cannot be read or holds no certificate (or key), or the key
/// does not match the certificate; the error names the file at fault.
pub fn load(files: &TlsFiles) -> Result<Loaded, TlsError> {
    load_all_errors(files).map_err(|mut e| e.swap_remove(0))
}

/// As [`load`], with both files' errors when neither can be read.
///
/// # Errors
/// As [`load`]: one error, or two when both files cannot be read.
pub fn load_all_errors(files: &TlsFiles) -> Result<Loaded, Vec<TlsError>> {
    let pair = Pair::read(files);
    if let (Err(a), Err(b)) = (&pair.cert, &pair.key) {
        return Err(vec![a.clone(), b.clone()]);
    }
    pair.parse(files).map_err(|e| vec![e])
}

/// The two files' contents, as read at one time.
struct Pair {
    cert: Result<Vec<u8>, TlsError>,
    key: Result<Vec<u8>, TlsError>,
}

impl Pair {
    fn read(files: &TlsFiles) -> Pair {
        Pair {
            cert: read(&files.cert),
            key: read(&files.key),
        }
    }

    fn stamp(&self) -> Stamp {
        let hash = |r: &Result<Vec<u8>, TlsError>| {
            r.as_ref().ok().map(|b| {
                let mut h = DefaultHasher::new();
                b.hash(&mut h);
                h.finish()
            })
        };
        (hash(&self.cert), hash(&self.key))
    }

    fn parse(&self, files: &TlsFiles) -> Result<Loaded, TlsError> {
        let at = |path: &Path, message: String| TlsError {
            path: path.to_path_buf(),
            message,
        };
        let cert = self.cert.as_ref().map_err(Clone::clone)?;
        let key = self.key.as_ref().map_err(Clone::clone)?;
        let mut chain = Vec::new();
        for c in CertificateDer::pem_slice_iter(cert) {
            match c {
                Ok(c) => chain.push(c),
                Err(e) => {
                    return Err(at(
                        &files.cert,
                        format!("not a valid PEM certificate chain: {e}"),
                    ));
                }
            }
        }
        if chain.is_empty() {
            return Err(at(
                &files.cert,
                "no certificate in the file (expected PEM `-----BEGIN CERTIFICATE-----` blocks)"
                    .into(),
            ));
        }
        let key_der = match PrivateKeyDer::from_pem_slice(key) {
            Ok(k) => k,
            Err(pem::Error::NoItemsFound) if contains(key, b"ENCRYPTED PRIVATE KEY") => {
                return Err(at(
                    &files.key,
                    "an encrypted private key: spillway needs it unencrypted (`openssl pkey -in KEY -out PLAIN`), readable by its user only".into(),
                ));
            }
            Err(pem::Error::NoItemsFound) => {
                return Err(at(
                    &files.key,
                    "no private key in the file (expected PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`)".into(),
                ));
            }
            Err(e) => return Err(at(&files.key, format!("not a valid PEM private key: {e}"))),
        };
        let info = der::info(chain[0].as_ref());
        let certified =
            CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => at(
                    &files.key,
                    format!(
                        "the private key does not match the certificate in {}",
                        files.cert.display()
                    ),
                ),
                other => at(
                    &files.key,
                    format!(
                        "this key and the certificate in {} cannot be used: {other}",
                        files.cert.display()
                    ),
                ),
            })?;
        Ok(Loaded {
            key: Arc::new(certified),
            info,
            stamp: self.stamp(),
        })
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    let fail = |message: String| TlsError {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(fail(format!(
            "larger than {} KiB: not a certificate or key file",
            MAX_FILE / 1024
        )));
    }
    Ok(bytes)
}

/// One pair in service: what new handshakes get, and how its reloads went.
pub struct Certs {
    files: TlsFiles,
    current: ArcSwap<CertifiedKey>,
    /// With `client_ca`: the client certificates every handshake needs.
    client: Option<Arc<client::ClientAuth>>,
    /// Sessions clients may resume, emptied by a reload.
    sessions: Arc<Sessions>,
    state: Mutex<CertState>,
}

/// Sessions kept for resumption (how many at most).
const SESSIONS: usize = 4096;

/// The resumable sessions of one pair. A resumed session skips the
/// certificate (it was authenticated by the handshake that made it), so
/// a reload starts an empty cache: after a key is rotated, no session made
/// under the old one is resumed.
#[derive(Debug)]
struct Sessions(ArcSwap<rustls::server::ServerSessionMemoryCache>);

impl Sessions {
    fn new() -> Sessions {
        Sessions(ArcSwap::new(rustls::server::ServerSessionMemoryCache::new(
            SESSIONS,
        )))
    }

    fn forget(&self) {
        self.0
            .store(rustls::server::ServerSessionMemoryCache::new(SESSIONS));
    }
}

impl rustls::server::StoresServerSessions for Sessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.0.load().put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.load().get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.load().take(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

impl fmt::Debug for Certs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certs")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// What `/v1/status` shows of a pair.
#[derive(Debug, Clone)]
struct CertState {
    info: CertInfo,
    /// The files as last considered (loaded or refused).
    seen: Stamp,
    /// When the pair in use was loaded.
    loaded_unix_ms: u64,
    /// Why the last change was refused, and when; cleared by a good one.
    last_error: Option<(String, u64)>,
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl Certs {
    /// Loads `files` (as [`load`]).
    ///
    /// # Errors
    /// As [`load`].
    pub fn load(files: &TlsFiles) -> Result<Certs, TlsError> {
        let loaded = load(files)?;
        warn_if_expired(files, &loaded.info);
        let client = client::ClientAuth::load(files)?.map(Arc::new);
        Ok(Certs {
            files: files.clone(),
            current: ArcSwap::new(loaded.key),
            client,
            sessions: Arc::new(Sessions::new()),
            state: Mutex::new(CertState {
                info: loaded.info,
                seen: loaded.stamp,
                loaded_unix_ms: unix_ms(),
                last_error: None,
            }),
        })
    }

    /// A TLS acceptor serving this pair (as it is at each handshake), with
    /// `alpn` offered in that order of preference.
    ///
    /// # Errors
    /// rustls refuses the protocol versions (it does not with ring).
    pub fn acceptor(
        self: &Arc<Self>,
        alpn: &[&[u8]],
    ) -> std::io::Result<tokio_rustls::TlsAcceptor> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?;
        let builder = match &self.client {
            Some(c) => builder.with_client_cert_verifier(c.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(self.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config.session_storage = self.sessions.clone();
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    /// The pair's files.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The pair as `/v1/status` shows it.
    pub fn status_json(&self) -> serde_json::Value {
        let st = self.state.lock().clone();
        let mut out = json!({
            "cert": self.files.cert.display().to_string(),
            "key": self.files.key.display().to_string(),
            "serial": st.info.serial,
            "not_after": st.info.not_after.as_ref().map(|t| t.rfc3339.clone()),
            "not_after_unix": st.info.not_after.as_ref().map(|t| t.unix),
            "last_reload_unix_ms": st.loaded_unix_ms,
            "last_error": st.last_error.as_ref().map(|(e, _)| e.clone()),
            "last_error_unix_ms": st.last_error.as_ref().map(|(_, at)| *at),
        });
        if let (Some(c), Some(map)) = (&self.client, out.as_object_mut())
            && let serde_json::Value::Object(more) = c.status_json()
        {
            map.extend(more);
        }
        out
    }

    /// Reads the files every `every` and takes a changed pair in (see the
    /// module docs), until `stop` turns true.
    pub async fn watch(self: Arc<Self>, every: Duration, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // A changed pair seen once: it applies if the next read is the same.
        let mut pending: Option<Stamp> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if let Some(c) = &self.client {
                let c = c.clone();
                // A new CA: no session a client authenticated under the
                // old one may be resumed (resumption skips its check).
                if let Ok(true) = tokio::task::spawn_blocking(move || c.poll()).await {
                    self.sessions.forget();
                }
            }
            let files = self.files.clone();
            // File reads block: off the workers that answer requests.
            let Ok(pair) = tokio::task::spawn_blocking(move || Pair::read(&files)).await else {
                continue;
            };
            let stamp = pair.stamp();
            if stamp == self.state.lock().seen {
                pending = None;
                continue;
            }
            if pending != Some(stamp) {
                pending = Some(stamp);
                continue;
            }
            pending = None;
            self.apply(&pair);
        }
    }

    /// Takes `pair` in if it loads; else keeps the pair in use and says why.
    fn apply(&self, pair: &Pair) {
        let loaded = pair.parse(&self.files);
        let mut st = self.state.lock();
        st.seen = pair.stamp();
        match loaded {
            Ok(l) => {
                warn_if_expired(&self.files, &l.info);
                tracing::info!(
                    cert = %self.files.cert.display(),
                    serial = l.info.serial.as_deref().unwrap_or("?"),
                    not_after = l.info.not_after.as_ref().map_or("?", |t| t.rfc3339.as_str()),
                    "TLS certificate reloaded: new connections get it"
                );
                // Sessions first: once any handshake gets the new pair, no
                // session made under the old one may be resumed (a resumed
                // session presents the certificate it was made with). The
                // other order left a window, wide on a busy machine, where
                // the new pair was served and the old sessions still were.
                self.sessions.forget();
                self.current.store(l.key);
                st.info = l.info;
                st.loaded_unix_ms = unix_ms();
                st.last_error = None;
            }
            Err(e) => {
                tracing::error!(
                    cert = %self.files.cert.display(),
                    error = %e,
                    "TLS certificate not reloaded, the one in use stays: {e}"
                );
                st.last_error = Some((e.to_string(), unix_ms()));
            }
        }
    }
}

fn warn_if_expired(files: &TlsFiles, info: &CertInfo) {
    if let Some(t) = &info.not_after
        && t.unix < unix_secs()
    {
        tracing::warn!(
            cert = %files.cert.display(),
            not_after = %t.rfc3339,
            "the TLS certificate has expired: clients will refuse it"
        );
    }
}

/// The pairs a server runs with: one per listener that serves HTTPS (the
/// admin listener shares the others' unless `admin.tls` gives its own).
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// The decision or proxy port's and gRPC's pair.
    pub listeners: Option<Arc<Certs>>,
    /// The admin listener's pair (the same `Arc` when shared).
    pub admin: Option<Arc<Certs>>,
    /// The gRPC listener's pair (the same `Arc` as `listeners` unless
    /// `grpc_tls` gives its own).
    pub grpc: Option<Arc<Certs>>,
}

impl Tls {
    /// Loads every pair `settings` names.
    ///
    /// # Errors
    /// As [`load`].
    pub fn load(settings: &TlsSettings) -> Result<Tls, TlsError> {
        let listeners = match &settings.listeners {
            Some(f) => Some(Arc::new(Certs::load(f)?)),
            None => None,
        };
        let admin = match &settings.admin {
            Some(f) => Some(Arc::new(Certs::load(f)?)),
            None => listeners.clone(),
        };
        let grpc = match &settings.grpc {
            Some(f) => Some(Arc::new(Certs::load(f)?)),
            None => listeners.clone(),
        };
        Ok(Tls {
            listeners,
            admin,
            grpc,
        })
    }

    /// `/v1/status`'s `tls`: `null` without TLS; else the listeners' pair
    /// (`cert`, `key`, `serial`, `not_after`, `last_reload_unix_ms`,
    /// `last_error`...), with the admin listener's own under `admin`
    /// when it has one.
    pub fn status_json(&self) -> serde_json::Value {
        let mut out = match &self.listeners {
            Some(c) => c.status_json(),
            None if self.admin.is_none() && self.grpc.is_none() => {
                return serde_json::Value::Null;
            }
            None => json!({}),
        };
        for (name, own) in [("admin", &self.admin), ("grpc", &self.grpc)] {
            if let Some(a) = own
                && !self.listeners.as_ref().is_some_and(|l| Arc::ptr_eq(l, a))
            {
                out[name] = a.status_json();
            }
        }
        out
    }

    /// Starts a watcher per pair (see [`Certs::watch`]).
    pub(crate) fn watch(
        &self,
        every: Duration,
        stop: &watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut all: Vec<&Arc<Certs>> = self.listeners.iter().collect();
        for own in [&self.admin, &self.grpc].into_iter().flatten() {
            if !all.iter().any(|c| Arc::ptr_eq(c, own)) {
                all.push(own);
            }
        }
        all.into_iter()
            .map(|c| tokio::spawn(c.clone().watch(every, stop.clone())))
            .collect()
    }
}

mod client;
mod der;
mod outbound;
mod settings;
#[cfg(test)]
mod tests;

pub use outbound::{PemFiles, SYSTEM_CA_BUNDLE, client_config, read_pem_files};
pub use settings::{TlsFiles, TlsSettings};
