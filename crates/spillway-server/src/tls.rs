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

use crate::config::{TlsFiles, TlsSettings};
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

/// Seconds since the Unix epoch, now.
pub fn unix_secs() -> i64 {
    i64::try_from(unix_ms() / 1000).unwrap_or(i64::MAX)
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
        Ok(Certs {
            files: files.clone(),
            current: ArcSwap::new(loaded.key),
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
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
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
        json!({
            "cert": self.files.cert.display().to_string(),
            "key": self.files.key.display().to_string(),
            "serial": st.info.serial,
            "not_after": st.info.not_after.as_ref().map(|t| t.rfc3339.clone()),
            "not_after_unix": st.info.not_after.as_ref().map(|t| t.unix),
            "last_reload_unix_ms": st.loaded_unix_ms,
            "last_error": st.last_error.as_ref().map(|(e, _)| e.clone()),
            "last_error_unix_ms": st.last_error.as_ref().map(|(_, at)| *at),
        })
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
        Ok(Tls { listeners, admin })
    }

    /// `/v1/status`'s `tls`: `null` without TLS; else the listeners' pair
    /// (`cert`, `key`, `serial`, `not_after`, `last_reload_unix_ms`,
    /// `last_error`...), with the admin listener's own under `admin`
    /// when it has one.
    pub fn status_json(&self) -> serde_json::Value {
        let mut out = match &self.listeners {
            Some(c) => c.status_json(),
            None if self.admin.is_none() => return serde_json::Value::Null,
            None => json!({}),
        };
        if let Some(a) = &self.admin
            && !self.listeners.as_ref().is_some_and(|l| Arc::ptr_eq(l, a))
        {
            out["admin"] = a.status_json();
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
        if let Some(a) = &self.admin
            && !all.iter().any(|c| Arc::ptr_eq(c, a))
        {
            all.push(a);
        }
        all.into_iter()
            .map(|c| tokio::spawn(c.clone().watch(every, stop.clone())))
            .collect()
    }
}

/// Just enough DER to read a certificate's serial number and expiry
/// (RFC 5280: Certificate, TBSCertificate, Validity). Every length is
/// checked: a certificate that does not parse gives `None`s, not a panic.
mod der {
    use super::{CertInfo, Expiry};

    /// One TLV: its tag, contents, and what follows it.
    fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = b.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return None;
        }
        Some((tag, &rest[..len], &rest[len..]))
    }

    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const VERSION: u8 = 0xa0;
    const UTC_TIME: u8 = 0x17;
    const GENERALIZED_TIME: u8 = 0x18;

    pub(super) fn info(cert: &[u8]) -> CertInfo {
        parse(cert).unwrap_or_default()
    }

    fn parse(cert: &[u8]) -> Option<CertInfo> {
        let (SEQUENCE, cert, _) = tlv(cert)? else {
            return None;
        };
        let (SEQUENCE, mut tbs, _) = tlv(cert)? else {
            return None;
        };
        let (mut tag, mut value, mut rest) = tlv(tbs)?;
        if tag == VERSION {
            tbs = rest;
            (tag, value, rest) = tlv(tbs)?;
        }
        let serial = (tag == INTEGER).then(|| hex(value));
        // The signature algorithm, the issuer, then the validity.
        let (_, _, rest) = tlv(rest)?;
        let (_, _, rest) = tlv(rest)?;
        let (SEQUENCE, validity, _) = tlv(rest)? else {
            return Some(CertInfo {
                serial,
                not_after: None,
            });
        };
        let (_, _, validity) = tlv(validity)?;
        let (tag, text, _) = tlv(validity)?;
        Some(CertInfo {
            serial,
            not_after: time(tag, text),
        })
    }

    fn hex(bytes: &[u8]) -> String {
        // Leading zero bytes (one keeps the number positive) say nothing.
        let skip = bytes
            .iter()
            .take(bytes.len().saturating_sub(1))
            .take_while(|&&b| b == 0)
            .count();
        let bytes = &bytes[skip..];
        bytes.iter().map(|b| format!("{b:02X}")).collect()
    }

    /// An RFC 5280 time: UTCTime `YYMMDDHHMMSSZ` (years 1950 to 2049) or
    /// GeneralizedTime `YYYYMMDDHHMMSSZ`.
    pub(super) fn time(tag: u8, text: &[u8]) -> Option<Expiry> {
        let digits = match (tag, text) {
            (UTC_TIME, [d @ .., b'Z']) if d.len() == 12 => d,
            (GENERALIZED_TIME, [d @ .., b'Z']) if d.len() == 14 => d,
            _ => return None,
        };
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let num = |s: &[u8]| s.iter().fold(0i64, |a, &d| a * 10 + i64::from(d - b'0'));
        let (year, rest) = if tag == UTC_TIME {
            let yy = num(&digits[..2]);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        } else {
            (num(&digits[..4]), &digits[4..])
        };
        let (month, day) = (num(&rest[0..2]), num(&rest[2..4]));
        let (h, m, s) = (num(&rest[4..6]), num(&rest[6..8]), num(&rest[8..10]));
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
            return None;
        }
        let unix = days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s;
        Some(Expiry {
            unix,
            rfc3339: format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z"),
        })
    }

    /// Days from 1970-01-01 to a proleptic Gregorian date (Howard
    /// Hinnant's algorithm).
    fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = if y >= 0 { y } else { y - 399 } / 400;
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn times_read_as_rfc_5280_says() {
            let t = time(UTC_TIME, b"700101000000Z").unwrap();
            assert_eq!((t.unix, t.rfc3339.as_str()), (0, "1970-01-01T00:00:00Z"));
            let t = time(UTC_TIME, b"491231235959Z").unwrap();
            assert_eq!(t.rfc3339, "2049-12-31T23:59:59Z");
            assert_eq!(t.unix, 2_524_607_999);
            let t = time(GENERALIZED_TIME, b"20240229120000Z").unwrap();
            assert_eq!(t.unix, 1_709_208_000);
            for bad in [
                &b"7001010000Z"[..],
                b"700101000000",
                b"70a101000000Z",
                b"701301000000Z",
            ] {
                assert_eq!(time(UTC_TIME, bad), None, "{bad:?}");
            }
        }

        #[test]
        fn garbage_gives_nothing_and_no_panic() {
            for bytes in [
                &[][..],
                &[0x30],
                &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
                &[0x30, 0x03, 0x30, 0x01],
                &[0x30, 0x02, 0x02, 0x00],
            ] {
                assert_eq!(info(bytes), CertInfo::default());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str, serial: u64) -> TlsFiles {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        params.not_after = rcgen::date_time_ymd(2040, 6, 30);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            named_by: "tls".into(),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    fn temp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("spillway-tls-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn a_pair_loads_with_its_serial_and_expiry() {
        let dir = temp("load");
        let files = pair(&dir, "a", 0x1234_abcd);
        let l = load(&files).unwrap();
        assert_eq!(l.info.serial.as_deref(), Some("1234ABCD"));
        let t = l.info.not_after.unwrap();
        assert!(t.rfc3339.starts_with("2040-06-30T"), "{}", t.rfc3339);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_files_say_which_and_why() {
        let dir = temp("bad");
        let a = pair(&dir, "a", 1);
        let b = pair(&dir, "b", 2);
        // A key that is not the certificate's.
        let mixed = TlsFiles {
            key: b.key.clone(),
            ..a.clone()
        };
        let e = load(&mixed).unwrap_err();
        assert_eq!(e.path, b.key);
        assert!(e.message.contains("does not match"), "{e}");
        // The files swapped.
        let swapped = TlsFiles {
            cert: a.key.clone(),
            key: a.cert.clone(),
            named_by: "tls".into(),
        };
        let e = load(&swapped).unwrap_err();
        assert_eq!(e.path, a.key);
        assert!(e.message.contains("no certificate"), "{e}");
        // A key cut short, an encrypted key, an empty one.
        let text = std::fs::read_to_string(&a.key).unwrap();
        for (body, says) in [
            (&text[..text.len() / 2], "not a valid PEM"),
            (
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
                "encrypted",
            ),
            ("", "no private key"),
        ] {
            let k = dir.join("k.pem");
            std::fs::write(&k, body).unwrap();
            let e = load(&TlsFiles {
                key: k.clone(),
                ..a.clone()
            })
            .unwrap_err();
            assert!(
                e.message.contains(says) || e.message.contains("no private key"),
                "{says}: {e}"
            );
            assert_eq!(e.path, k);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_changed_pair_is_taken_a_broken_one_refused() {
        let dir = temp("watch");
        let files = pair(&dir, "live", 1);
        let certs = Arc::new(Certs::load(&files).unwrap());
        let first = certs.current.load_full();
        // A new pair, read twice the same: taken.
        let next = pair(&dir, "next", 2);
        std::fs::copy(&next.cert, &files.cert).unwrap();
        std::fs::copy(&next.key, &files.key).unwrap();
        let read = Pair::read(&files);
        certs.apply(&read);
        assert!(!Arc::ptr_eq(&first, &certs.current.load_full()));
        assert_eq!(certs.status_json()["serial"], "02");
        assert_eq!(certs.status_json()["last_error"], serde_json::Value::Null);
        // A broken key: the pair in use stays, the error shows.
        std::fs::write(&files.key, "junk").unwrap();
        let in_use = certs.current.load_full();
        certs.apply(&Pair::read(&files));
        assert!(Arc::ptr_eq(&in_use, &certs.current.load_full()));
        let st = certs.status_json();
        assert!(
            st["last_error"]
                .as_str()
                .unwrap()
                .contains("no private key"),
            "{st}"
        );
        assert_eq!(st["serial"], "02");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
