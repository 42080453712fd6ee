//! A Redis Sentinel set on free loopback ports: a master, a replica and
//! three `redis-server --sentinel` processes watching them, with failover
//! timings small enough for a test (the master is held down after 500 ms
//! without an answer; a failover is retried after 3 s).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{RedisServer, TempDir, free_port, require};

/// The name the sentinels monitor.
pub const MASTER_NAME: &str = "spillway-master";

/// One `redis-server --sentinel`, killed on drop.
#[derive(Debug)]
pub struct Sentinel {
    child: Child,
    /// Its port on 127.0.0.1 (TLS only, in a set started with
    /// [`SentinelSet::start_tls`]).
    pub port: u16,
    _dir: TempDir,
}

/// The files of a TLS set: one certificate (for `localhost` and
/// `127.0.0.1`, good for a server and a client) and key for every
/// process, and the CA that signed it, which each process also requires
/// of its clients.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
}

impl TlsFiles {
    /// `redis-server`'s options naming the files.
    pub(crate) fn server_args(&self) -> Vec<String> {
        [
            ("--tls-cert-file", &self.cert),
            ("--tls-key-file", &self.key),
            ("--tls-ca-cert-file", &self.ca),
        ]
        .iter()
        .flat_map(|(k, v)| [(*k).to_string(), v.display().to_string()])
        .collect()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A master, a replica and three sentinels; every process is killed on
/// drop.
#[derive(Debug)]
pub struct SentinelSet {
    /// The two data servers (the first started as the master; after a
    /// failover, ask [`SentinelSet::master_port`]).
    pub servers: Vec<RedisServer>,
    /// The three sentinels.
    pub sentinels: Vec<Sentinel>,
    /// The password of every process of the set, if any.
    pub password: Option<String>,
    /// TLS for the sentinels and between every process, if any.
    pub tls: Option<TlsFiles>,
}

impl SentinelSet {
    /// Starts the set and waits until the sentinels see the replica and
    /// each other (a failover needs both), within 60 s.
    ///
    /// # Panics
    /// A program is missing or the set does not come together.
    pub fn start() -> SentinelSet {
        SentinelSet::start_with_password(None)
    }

    /// As [`SentinelSet::start`], with `password` required by the master,
    /// the replica and the sentinels (`requirepass`; `masterauth` and
    /// `sentinel auth-pass` so that they reach each other).
    ///
    /// # Panics
    /// As [`SentinelSet::start`].
    pub fn start_with_password(password: Option<&str>) -> SentinelSet {
        require("redis-server");
        let master = RedisServer::start();
        let port = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        if let Some(pw) = password {
            // Set once both run (RedisServer's readiness check asks
            // without a password); the replica first, so it keeps up.
            for s in [&replica, &master] {
                s.cli(&["CONFIG", "SET", "masterauth", pw]);
                s.cli(&["CONFIG", "SET", "requirepass", pw]);
            }
        }
        let sentinels = (0..3)
            .map(|_| Sentinel::start(master.port, password, None))
            .collect();
        let set = SentinelSet {
            servers: vec![master, replica],
            sentinels,
            password: password.map(str::to_string),
            tls: None,
        };
        set.wait_together();
        set
    }

    /// A set that speaks TLS: each data server on a TLS port besides its
    /// plain one (which only the tests' `redis-cli` uses), replicating
    /// over TLS and announcing its TLS port, so the sentinels watch and
    /// name TLS ports; the sentinels on TLS ports only. Every process
    /// requires a client certificate from `tls.ca`.
    ///
    /// # Panics
    /// As [`SentinelSet::start`].
    pub fn start_tls(tls: &TlsFiles) -> SentinelSet {
        require("redis-server");
        let files = tls.server_args();
        let tls_ports = [free_port(), free_port()];
        let server = |i: usize, replica_of: Option<u16>| {
            let port = tls_ports[i].to_string();
            let mut args: Vec<String> = vec![
                "--tls-port".into(),
                port.clone(),
                "--tls-replication".into(),
                "yes".into(),
                "--replica-announce-port".into(),
                port,
            ];
            args.extend(files.iter().cloned());
            if let Some(m) = replica_of {
                args.extend(["--replicaof".into(), "127.0.0.1".into(), m.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            RedisServer::start_with(&args)
        };
        let master = server(0, None);
        let replica = server(1, Some(tls_ports[0]));
        let sentinels = (0..3)
            .map(|_| Sentinel::start(tls_ports[0], None, Some(tls)))
            .collect();
        let set = SentinelSet {
            servers: vec![master, replica],
            sentinels,
            password: None,
            tls: Some(tls.clone()),
        };
        set.wait_together();
        set
    }

    /// Waits (60 s at most) until the sentinels see the replica and each
    /// other, and the replica is linked to the master.
    fn wait_together(&self) {
        let set = self;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = set.sentinels.iter().all(|s| {
                let replicas = set.cli(s.port, &["SENTINEL", "REPLICAS", MASTER_NAME]);
                let quorum = set.cli(s.port, &["SENTINEL", "CKQUORUM", MASTER_NAME]);
                replicas.contains("flags") && quorum.contains("3 usable")
            }) && cli(
                set.servers[1].port,
                set.password.as_deref(),
                None,
                &["INFO", "replication"],
            )
            .contains("master_link_status:up");
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel set did not come together: {}",
                set.cli(
                    set.sentinels[0].port,
                    &["SENTINEL", "CKQUORUM", MASTER_NAME]
                )
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The sentinels as `host:port`, for `store.redis.sentinel.nodes`.
    pub fn nodes(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let out = self.cli(
                s.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            );
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// The data server on `port`.
    ///
    /// # Panics
    /// None is.
    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .expect("a server of the set")
    }

    /// Asks a sentinel to fail over now (`SENTINEL FAILOVER`), then waits
    /// (up to 60 s) until every sentinel names another master, it says it
    /// is one, and the old master replicates from it as a replica every
    /// sentinel knows (so that the set can fail over again). Returns the
    /// new master's port.
    ///
    /// # Panics
    /// The failover does not complete.
    pub fn failover(&self) -> u16 {
        let old = self.master_port().expect("a master before the failover");
        let said = self.cli(
            self.sentinels[0].port,
            &["SENTINEL", "FAILOVER", MASTER_NAME],
        );
        assert!(said.contains("OK"), "SENTINEL FAILOVER: {said}");
        let new = self.wait_master_other_than(old);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let linked = self
                .cli(old, &["INFO", "replication"])
                .contains("master_link_status:up");
            let known = self.sentinels.iter().all(|s| {
                let r = self.cli(s.port, &["SENTINEL", "REPLICAS", MASTER_NAME]);
                let lines: Vec<&str> = r.lines().collect();
                // A flat list of field, value: the replica on `old` with
                // flags exactly `slave` (not down, not disconnected).
                lines
                    .windows(2)
                    .any(|w| w[0] == "port" && w[1] == old.to_string())
                    && lines.windows(2).any(|w| w[0] == "flags" && w[1] == "slave")
            });
            if linked && known {
                return new;
            }
            assert!(
                Instant::now() < deadline,
                "the old master on {old} did not become a healthy replica of {new}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (up to 60 s) until every sentinel names a master other than
    /// the one on `old` and that server says it is a master; its port.
    ///
    /// # Panics
    /// That does not happen in time.
    pub fn wait_master_other_than(&self, old: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| {
                    let out = self.cli(
                        s.port,
                        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
                    );
                    out.lines().nth(1)?.trim().parse().ok()
                })
                .collect();
            if let Some(Some(new)) = named.first()
                && *new != old
                && named.iter().all(|n| *n == Some(*new))
                && self.cli(*new, &["ROLE"]).starts_with("master")
            {
                return *new;
            }
            assert!(
                Instant::now() < deadline,
                "no failover from port {old}: the sentinels name {named:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Sentinel {
    fn start(master: u16, password: Option<&str>, tls: Option<&TlsFiles>) -> Sentinel {
        let port = free_port();
        let dir = TempDir::new(&format!("sentinel-{port}"));
        let conf = dir.0.join("sentinel.conf");
        let listen = match tls {
            None => format!("port {port}\n"),
            Some(t) => format!(
                "port 0\ntls-port {port}\ntls-replication yes\n\
                 tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
                t.cert.display(),
                t.key.display(),
                t.ca.display()
            ),
        };
        let text = format!(
            "{listen}bind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 500\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.0.display()
        );
        let text = match password {
            None => text,
            Some(pw) => {
                format!("{text}sentinel auth-pass {MASTER_NAME} \"{pw}\"\nrequirepass \"{pw}\"\n")
            }
        };
        std::fs::write(&conf, text).expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let s = Sentinel {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cli(port, password, tls, &["PING"]).contains("PONG") {
            assert!(
                Instant::now() < deadline,
                "redis-server --sentinel on port {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }
}

impl SentinelSet {
    /// `redis-cli` to a process of the set (with its password), over TLS
    /// in a TLS set but to a data server's plain port.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let plain = self.servers.iter().any(|s| s.port == port);
        let tls = if plain { None } else { self.tls.as_ref() };
        cli(port, self.password.as_deref(), tls, args)
    }
}

/// `redis-cli -p PORT [-a PASSWORD] [--tls ...] ARGS...`'s output (""
/// when it cannot run).
fn cli(port: u16, password: Option<&str>, tls: Option<&TlsFiles>, args: &[&str]) -> String {
    require("redis-cli");
    let mut c = Command::new("redis-cli");
    c.args(["-p", &port.to_string()]);
    if let Some(pw) = password {
        c.args(["--no-auth-warning", "-a", pw]);
    }
    if let Some(t) = tls {
        c.arg("--tls")
            .arg("--cert")
            .arg(&t.cert)
            .arg("--key")
            .arg(&t.key)
            .arg("--cacert")
            .arg(&t.ca);
    }
    c.args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
