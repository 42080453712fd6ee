//! Redis Sentinel: the master of a watched set is found by asking the
//! sentinels (`SENTINEL get-master-addr-by-name`), its role checked
//! (`ROLE` says `master`), and found again when it fails.
//!
//! A watcher task owns the discovery. It asks the sentinels in the order
//! configured (the first that answers is believed, as Sentinel's client
//! guidelines say) every [`CHECK_INTERVAL`], and every [`SUSPECT_INTERVAL`]
//! while the store suspects the master: after a lost connection, a timeout
//! or `-READONLY` (a demoted master), until the sentinels name a master
//! that says it is one. The connection is then swapped whole: every call
//! after the swap goes to the new master, each one still a single atomic
//! script call. While the switch is under way calls fail as they would
//! against a single server that went away, so the circuit breaker and the
//! rules' `on_store_error` decide them, unchanged.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

/// How often the sentinels are asked whether the master moved while all
/// is well (a master cut off from the sentinels but not from us is left
/// within about this long).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How often they are asked while the master is suspected.
pub(crate) const SUSPECT_INTERVAL: Duration = Duration::from_millis(100);

/// The longest wait for one sentinel or one new master to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the master of a Sentinel-watched set is found, and how to log in
/// to it and to the sentinels.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The master's name, as in the sentinels' `sentinel monitor NAME ...`.
    pub master: String,
    /// The sentinels, `host:port` each, asked in this order.
    pub nodes: Vec<String>,
    /// The master's ACL user (`AUTH user password`), if any.
    pub username: Option<String>,
    /// The master's password (`requirepass` or the user's).
    pub password: Option<String>,
    /// The sentinels' ACL user, if any.
    pub sentinel_username: Option<String>,
    /// The sentinels' password (their own `requirepass`), if any.
    pub sentinel_password: Option<String>,
    /// TLS to the sentinels and the master (as `rediss://`: the server's
    /// certificate is verified, for the host the sentinels announce,
    /// against `certs`' CA or else the web PKI roots).
    pub tls: bool,
    /// With `tls`: a CA and a client certificate, for the sentinels and
    /// the master alike.
    pub certs: Option<crate::RedisTls>,
    /// The database number on the master.
    pub db: i64,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |p: &Option<String>| p.as_ref().map(|_| "***");
        f.debug_struct("SentinelConfig")
            .field("master", &self.master)
            .field("nodes", &self.nodes)
            .field("username", &self.username)
            .field("password", &hidden(&self.password))
            .field("sentinel_username", &self.sentinel_username)
            .field("sentinel_password", &hidden(&self.sentinel_password))
            .field("tls", &self.tls)
            .field("certs", &self.certs)
            .field("db", &self.db)
            .finish()
    }
}

/// Splits `host:port` (`[v6]:port` too).
///
/// # Errors
/// What is wrong with it.
pub fn parse_node(node: &str) -> Result<(String, u16), String> {
    let (host, port) = node
        .rsplit_once(':')
        .ok_or_else(|| format!("{node:?} is not host:port"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return Err(format!("{node:?} is not host:port"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{node:?}: the port must be 1 to 65535"))?;
    Ok((host.to_string(), port))
}

impl SentinelConfig {
    fn info(
        &self,
        host: String,
        port: u16,
        user: Option<&String>,
        password: Option<&String>,
        db: i64,
    ) -> redis::RedisResult<redis::ConnectionInfo> {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let mut login = RedisConnectionInfo::default().set_db(db);
        if let Some(u) = user {
            login = login.set_username(u);
        }
        if let Some(p) = password {
            login = login.set_password(p);
        }
        Ok(addr
            .into_connection_info()?
            .set_redis_settings(login)
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true)))
    }

    /// The client of the master at `host:port`.
    pub(crate) fn master_client(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        let info = self.info(
            host.to_string(),
            port,
            self.username.as_ref(),
            self.password.as_ref(),
            self.db,
        )?;
        crate::tls::client(info, self.certs.as_ref())
    }

    /// A client of the sentinel at `node` (`host:port`), logged in as a
    /// sentinel client.
    fn sentinel_client(&self, node: &str) -> Result<redis::Client, String> {
        let (host, port) = parse_node(node)?;
        let info = self
            .info(
                host,
                port,
                self.sentinel_username.as_ref(),
                self.sentinel_password.as_ref(),
                0,
            )
            .map_err(|e| e.to_string())?;
        crate::tls::client(info, self.certs.as_ref()).map_err(|e| e.to_string())
    }

    /// Asks one sentinel where the master is: `Ok(None)` when it knows no
    /// master of that name.
    async fn ask(&self, node: &str) -> Result<Option<(String, u16)>, String> {
        let client = self.sentinel_client(node)?;
        let call = async {
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master)
                .query_async::<Option<(String, String)>>(&mut c)
                .await
        };
        match tokio::time::timeout(ASK_TIMEOUT, call).await {
            Err(_) => Err(format!("no answer within {ASK_TIMEOUT:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(None)) => Ok(None),
            Ok(Ok(Some((host, port)))) => match port.parse::<u16>() {
                Ok(p) => Ok(Some((host, p))),
                Err(_) => Err(format!("answered a bad port {port:?}")),
            },
        }
    }

    /// The master's address, from the first sentinel that answers.
    ///
    /// # Errors
    /// [`Discovery::Unknown`] when every sentinel that answered knows no
    /// master of that name (and at least one answered), else
    /// [`Discovery::Unreachable`] with what each said.
    pub async fn discover(&self) -> Result<(String, u16), Discovery> {
        let mut why = Vec::new();
        let mut answered = 0;
        for node in &self.nodes {
            match self.ask(node).await {
                Ok(Some(at)) => return Ok(at),
                Ok(None) => answered += 1,
                Err(e) => why.push(format!("{node}: {e}")),
            }
        }
        if answered > 0 && why.is_empty() {
            return Err(Discovery::Unknown(format!(
                "no sentinel of {} knows a master named {:?} (SENTINEL get-master-addr-by-name answered nothing)",
                self.nodes.join(", "),
                self.master
            )));
        }
        if answered > 0 {
            why.push(format!("{answered} knew no master named {:?}", self.master));
        }
        Err(Discovery::Unreachable(format!(
            "no sentinel answered for master {:?}: {}",
            self.master,
            why.join("; ")
        )))
    }
}

impl SentinelConfig {
    /// Without a runtime (for `spillway check-config`): asks the sentinels
    /// in turn for the master, then PINGs it.
    ///
    /// # Errors
    /// What the sentinels said, or why the master did not answer.
    pub fn probe(&self, timeout: Duration) -> Result<(), String> {
        let mut why = Vec::new();
        for node in &self.nodes {
            let asked = self.sentinel_client(node).and_then(|client| {
                let mut c = client
                    .get_connection_with_timeout(timeout)
                    .map_err(|e| e.to_string())?;
                c.set_read_timeout(Some(timeout))
                    .map_err(|e| e.to_string())?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query::<Option<(String, String)>>(&mut c)
                    .map_err(|e| e.to_string())
            });
            match asked {
                Ok(Some((host, port))) => {
                    let port: u16 = port
                        .parse()
                        .map_err(|_| format!("sentinel {node}: a bad port {port:?}"))?;
                    let fail = |e: &dyn std::fmt::Display| format!("master {host}:{port}: {e}");
                    let client = self.master_client(&host, port).map_err(|e| fail(&e))?;
                    let mut c = client
                        .get_connection_with_timeout(timeout)
                        .map_err(|e| fail(&e))?;
                    c.set_read_timeout(Some(timeout)).map_err(|e| fail(&e))?;
                    redis::cmd("PING")
                        .query::<String>(&mut c)
                        .map_err(|e| fail(&e))?;
                    return Ok(());
                }
                Ok(None) => why.push(format!("{node}: knows no master named {:?}", self.master)),
                Err(e) => why.push(format!("{node}: {e}")),
            }
        }
        Err(format!("sentinels: {}", why.join("; ")))
    }
}

/// Why the master was not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// The sentinels answered, and none knows the master's name: a
    /// configuration error, not a passing fault.
    Unknown(String),
    /// No sentinel answered (or some did not and the others did not know
    /// the name).
    Unreachable(String),
}

impl std::fmt::Display for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Discovery::Unknown(m) | Discovery::Unreachable(m) => f.write_str(m),
        }
    }
}

/// The master's connection as it is now, swapped by the watcher.
pub(crate) struct Watch {
    current: Mutex<Option<(String, u16, ConnectionManager)>>,
    /// Woken by a call that failed in a way a failover explains.
    suspect: tokio::sync::Notify,
}

impl Watch {
    pub(crate) fn new() -> Watch {
        Watch {
            current: Mutex::new(None),
            suspect: tokio::sync::Notify::new(),
        }
    }

    /// The current master's connection (cheap: a handle's clone).
    pub(crate) fn current(&self) -> Option<ConnectionManager> {
        self.lock().as_ref().map(|(_, _, c)| c.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(String, u16, ConnectionManager)>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the watcher to look for the master now.
    pub(crate) fn suspect(&self) {
        self.suspect.notify_one();
    }

    fn at(&self) -> Option<(String, u16)> {
        self.lock().as_ref().map(|(h, p, _)| (h.clone(), *p))
    }
}

/// Connects to the master at `host:port` and checks that it says it is
/// one.
async fn connect_master(
    cfg: &SentinelConfig,
    host: &str,
    port: u16,
) -> Result<ConnectionManager, String> {
    let client = cfg.master_client(host, port).map_err(|e| e.to_string())?;
    let manager = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(ASK_TIMEOUT))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(300));
    let mut c = tokio::time::timeout(
        2 * ASK_TIMEOUT,
        ConnectionManager::new_with_config(client, manager),
    )
    .await
    .map_err(|_| format!("no connection within {:?}", 2 * ASK_TIMEOUT))?
    .map_err(|e| e.to_string())?;
    role_is_master(&mut c).await?;
    Ok(c)
}

/// `ROLE`'s first element is `master`.
async fn role_is_master(c: &mut ConnectionManager) -> Result<(), String> {
    let role = tokio::time::timeout(
        ASK_TIMEOUT,
        redis::cmd("ROLE").query_async::<redis::Value>(c),
    )
    .await
    .map_err(|_| format!("ROLE: no answer within {ASK_TIMEOUT:?}"))?
    .map_err(|e| format!("ROLE: {e}"))?;
    let first = match &role {
        redis::Value::Array(items) => items.first(),
        _ => None,
    };
    match first {
        Some(redis::Value::BulkString(b)) if b == b"master" => Ok(()),
        Some(redis::Value::BulkString(b)) => Err(format!(
            "it says it is a {} (ROLE)",
            String::from_utf8_lossy(b)
        )),
        _ => Err(format!("ROLE answered {role:?}")),
    }
}

/// One look: the master the sentinels name now, connected and checked
/// unless it is the one in use and it still says it is the master.
/// `Ok(Some)` is a new connection to swap in.
pub(crate) async fn look(
    cfg: &SentinelConfig,
    watch: &Watch,
) -> Result<Option<(String, u16, ConnectionManager)>, String> {
    let (host, port) = cfg.discover().await.map_err(|e| e.to_string())?;
    if watch.at().as_ref() == Some(&(host.clone(), port))
        && let Some(mut c) = watch.current()
    {
        role_is_master(&mut c)
            .await
            .map_err(|e| format!("master {host}:{port}: {e}"))?;
        return Ok(None);
    }
    let c = connect_master(cfg, &host, port)
        .await
        .map_err(|e| format!("master {host}:{port} named by the sentinels: {e}"))?;
    Ok(Some((host, port, c)))
}

/// Swaps in `next`; says whether it is the first connection.
pub(crate) fn swap(watch: &Watch, next: (String, u16, ConnectionManager)) -> bool {
    let mut slot = watch.lock();
    let first = slot.is_none();
    if let Some((h, p, _)) = slot.as_ref() {
        tracing::warn!(
            "redis sentinel: the master moved from {h}:{p} to {}:{}",
            next.0,
            next.1
        );
    } else {
        tracing::info!("redis sentinel: master at {}:{}", next.0, next.1);
    }
    *slot = Some(next);
    first
}

/// Waits for the next look: [`CHECK_INTERVAL`], or [`SUSPECT_INTERVAL`]
/// after a failed look or once a call failed.
pub(crate) async fn pause(watch: &Watch, suspicious: bool) {
    if suspicious {
        tokio::time::sleep(SUSPECT_INTERVAL).await;
        return;
    }
    tokio::select! {
        () = watch.suspect.notified() => {}
        () = tokio::time::sleep(CHECK_INTERVAL) => {}
    }
}

/// Finds the master, keeps it, and finds it again: the connect loop of a
/// store behind sentinels. Ends with the store.
pub(crate) async fn watcher(store: std::sync::Weak<crate::Inner>, cfg: SentinelConfig) {
    let mut suspicious;
    let mut said: Option<String> = None;
    loop {
        let Some(inner) = store.upgrade() else { return };
        let Some(watch) = inner.sentinel.as_ref() else {
            return;
        };
        match look(&cfg, watch).await {
            Ok(found) => {
                let first = found.map(|next| swap(watch, next));
                // A master replaced under calls in flight: what timed out
                // on the old one may not have run anywhere that lasts
                // (counted as a lost connection, so a share owes it).
                if first == Some(false) {
                    inner.breaker.link_lost();
                }
                if first == Some(true) {
                    if let Some(c) = watch.current() {
                        let _ = inner.conn.set(crate::Conn::Single(c));
                    }
                    *inner
                        .connect_error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                    inner.breaker.success();
                    inner.connected.notify_waiters();
                }
                if said.take().is_some() {
                    tracing::info!("redis sentinel: the master of {:?} answers", cfg.master);
                }
                suspicious = false;
            }
            Err(e) => {
                if said.as_deref() != Some(e.as_str()) {
                    tracing::warn!(
                        "redis sentinel: {e}; decisions follow on_store_error until a master answers"
                    );
                }
                if inner.conn.get().is_none() {
                    *inner
                        .connect_error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.clone());
                }
                said = Some(e);
                suspicious = true;
            }
        }
        // The pause holds the store (a second at most): it ends, and
        // this with it, at the next look after every other handle went.
        pause(watch, suspicious).await;
        drop(inner);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_node;

    #[test]
    fn nodes_are_host_and_port() {
        assert_eq!(
            parse_node("10.0.0.1:26379").unwrap(),
            ("10.0.0.1".into(), 26379)
        );
        assert_eq!(parse_node("[::1]:26379").unwrap(), ("::1".into(), 26379));
        assert_eq!(parse_node("s-0.svc:1").unwrap(), ("s-0.svc".into(), 1));
        for bad in [
            "",
            "host",
            "host:",
            ":1",
            "h:0",
            "h:65536",
            "redis://h:1",
            "h:x",
        ] {
            assert!(parse_node(bad).is_err(), "{bad}");
        }
    }
}
