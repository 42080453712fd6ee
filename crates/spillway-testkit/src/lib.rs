//! Test fixtures: real `redis-server` processes on free loopback ports,
//! stopped when dropped, a three-master Redis Cluster, fake HTTP
//! upstreams for the proxy's tests ([`upstream`]), and a TCP [`Relay`]
//! that slows, cuts or stalls a link for failure tests ([`relay`]), a
//! headless Chromium driven over WebDriver ([`browser`]), an upstream whose
//! latency grows with its load ([`queueing`]) and an open-loop load driver
//! ([`load`]), and the [`attack`] battery every listener is tested with,
//! and the [`legit`] client that must still be answered meanwhile.
//!
//! A missing `redis-server` is a test failure that says how to install it,
//! never a silent skip.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod attack;
pub mod browser;
pub mod legit;
pub mod load;
pub mod queueing;
pub mod relay;
pub mod sentinel;
pub mod upstream;

/// A one-thread runtime with timers and I/O, for this crate's own tests.
#[cfg(test)]
fn test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub use relay::Relay;
pub use sentinel::SentinelSet;

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port")
}

fn require(program: &str) {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "{program} is not installed: run scripts/setup.sh (it installs Debian's redis-server package)"
    );
}

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory under the system temp dir.
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("spillway-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `redis-server` on a free port, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a plain server (no persistence) and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra arguments (e.g. cluster options).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        require("redis-server");
        let port = free_port();
        let dir = TempDir::new(&format!("redis-{port}"));
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    /// Like `start`, but on a given port (to bring a server back where clients expect it).
    pub fn start_on(port: u16) -> RedisServer {
        require("redis-server");
        let dir = TempDir::new(&format!("redis-{port}"));
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            extra: Vec::new(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir.0.to_str().expect("utf-8 temp dir"),
            ])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10));
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.try_cmd(&["PING"]).is_some_and(|r| r.contains("PONG")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Runs a command with redis-cli and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        require("redis-cli");
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sends one inline command over a raw socket; `None` if unreachable.
    fn try_cmd(&self, args: &[&str]) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).ok()?;
        Some(line)
    }

    /// Sends a signal (`KILL`, `STOP`, `CONT`) to the server.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status();
    }

    /// Kills the server (SIGKILL) and waits for it to go.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (after `kill`).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A stopped process must be continued to die promptly.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A Redis Cluster of three masters on free ports.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes.
    pub nodes: Vec<RedisServer>,
    /// In a cluster started with [`RedisCluster::start_tls`], each node's
    /// TLS port (its plain one stays for the tests' `redis-cli`).
    pub tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts three `--cluster-enabled yes` servers and joins them with
    /// `redis-cli --cluster create`, then waits until the cluster is ok.
    pub fn start() -> RedisCluster {
        RedisCluster::start_nodes(None)
    }

    /// As [`RedisCluster::start`], each node also on a TLS port, its
    /// cluster bus over TLS (`tls-cluster yes`), and a client certificate
    /// from `tls.ca` required of TLS clients. Redis names TLS ports to a
    /// client on TLS (`CLUSTER SLOTS`, redirections).
    pub fn start_tls(tls: &sentinel::TlsFiles) -> RedisCluster {
        RedisCluster::start_nodes(Some(tls))
    }

    fn start_nodes(tls: Option<&sentinel::TlsFiles>) -> RedisCluster {
        let mut tls_ports = Vec::new();
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-config-file",
                    "nodes.conf",
                ]
                .map(String::from)
                .to_vec();
                if let Some(t) = tls {
                    let port = free_port();
                    tls_ports.push(port);
                    args.extend(
                        [
                            "--tls-port".to_string(),
                            port.to_string(),
                            "--tls-cluster".into(),
                            "yes".into(),
                            "--tls-replication".into(),
                            "yes".into(),
                        ]
                        .into_iter()
                        .chain(t.server_args()),
                    );
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                RedisServer::start_with(&args)
            })
            .collect();
        require("redis-cli");
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { nodes, tls_ports }
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes' `rediss://` URLs (a cluster started with TLS).
    pub fn tls_urls(&self) -> Vec<String> {
        self.tls_ports
            .iter()
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect()
    }
}
