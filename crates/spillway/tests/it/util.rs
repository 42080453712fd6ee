//! Fixtures: the real `spillway` binary on a free port, temp dirs, an HTTP client.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `spillway serve`, killed on drop.
pub struct Server {
    child: Child,
    pub addr: String,
    pub logs: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `spillway serve --listen 127.0.0.1:0` with extra args and waits
    /// for the line that says where it listens.
    pub fn start(args: &[&str]) -> Server {
        Server::start_cmd("serve", args)
    }

    /// Starts `spillway <sub> --listen 127.0.0.1:0 ARGS...`.
    pub fn start_cmd(sub: &str, args: &[&str]) -> Server {
        Server::start_wrapped(&[], sub, args)
    }

    /// Starts the binary under a wrapper command (e.g. `faketime -f +90s`).
    pub fn start_wrapped(wrapper: &[&str], sub: &str, args: &[&str]) -> Server {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Server::spawn(wrapper, sub, &all)
    }

    /// Starts `spillway <sub> ARGS...` with no `--listen` of its own (the
    /// rules file says where).
    pub fn start_as_configured(sub: &str, args: &[&str]) -> Server {
        Server::spawn(&[], sub, args)
    }

    /// Starts `spillway serve --listen 127.0.0.1:0 ARGS...` with these
    /// environment variables set (admin tokens, `${NAME}` values).
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Server::spawn_env(&[], "serve", &all, env)
    }

    /// Starts `spillway <sub> --listen 127.0.0.1:0 ARGS...` with these
    /// environment variables set.
    pub fn start_env_cmd(sub: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Server::spawn_env(&[], sub, &all, env)
    }

    fn spawn(wrapper: &[&str], sub: &str, args: &[&str]) -> Server {
        Server::spawn_env(wrapper, sub, args, &[])
    }

    fn spawn_env(wrapper: &[&str], sub: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        let bin = env!("CARGO_BIN_EXE_spillway");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(bin),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
        };
        cmd.arg(sub).args(args);
        Server::spawn_command(cmd, env)
    }

    /// Starts the binary as envoyproxy/ratelimit's image starts it: under
    /// the name `ratelimit` (a link to it), with no arguments, only
    /// `env`; waits for the line that says where it listens.
    pub fn start_ratelimit(env: &[(&str, &str)]) -> Server {
        static LINK: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        let link = LINK.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("spillway-it-bin-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let link = dir.join("ratelimit");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_spillway"), &link).unwrap();
            link
        });
        Server::spawn_command(Command::new(link), env)
    }

    fn spawn_command(mut cmd: Command, env: &[(&str, &str)]) -> Server {
        // Its own process group, so a wrapper's child (faketime forks) is
        // signalled and killed with it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the spillway binary");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    if let Some(rest) = listening_on(&line) {
                        break rest.split_whitespace().next().unwrap().to_string();
                    }
                    seen.push(line);
                }
                Err(_) => panic!("spillway did not say where it listens; it printed: {seen:#?}"),
            }
        };
        Server {
            child,
            addr,
            logs: rx,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The process's id (a wrapper such as `prlimit` execs the binary).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal to the process (and a wrapper's child).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), "--", &format!("-{}", self.child.id())])
            .status()
            .expect("run kill");
        assert!(status.success());
        // A stop takes each thread as it is next scheduled: on a busy
        // machine the server may still answer for a moment after `kill`
        // returns. What follows a STOP assumes it holds: wait until every
        // thread shows stopped.
        if sig == "STOP" {
            let tasks = format!("/proc/{}/task", self.child.id());
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let stopped = std::fs::read_dir(&tasks).is_ok_and(|dir| {
                    dir.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                            stat.rsplit_once(") ")
                                .is_some_and(|(_, rest)| rest.starts_with('T'))
                        })
                    })
                });
                if stopped {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the server never stopped"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Waits for the process to exit and returns its status code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Waits for a log line containing `needle` and returns it.
    /// The address a listener named in the log (`what`: "admin API",
    /// "gRPC") took, e.g. with `--admin-listen 127.0.0.1:0`.
    pub fn listener(&self, what: &str) -> String {
        let line = self.wait_line(what);
        listening_on(&line)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string()
    }

    pub fn wait_line(&self, needle: &str) -> String {
        let mut seen = Vec::new();
        loop {
            match self.logs.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("no log line with {needle:?}; saw {seen:#?}"),
            }
        }
    }

    /// Log lines printed so far.
    pub fn drain_logs(&self) -> Vec<String> {
        self.logs.try_iter().collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// Kills `child` and its process group (it was started in a group of its
/// own), and reaps it.
pub fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

/// What follows `listening on http://` (or `https://`) in a log line,
/// up to a closing quote (a `--log-format json` line).
fn listening_on(line: &str) -> Option<&str> {
    ["listening on http://", "listening on https://"]
        .iter()
        .find_map(|p| line.split(p).nth(1))
        .and_then(|r| r.split('"').next())
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("spillway-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        // Write then rename so a watcher never sees half a file.
        let tmp = self.0.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the `spillway` binary with `args` to completion.
pub fn spillway(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .output()
        .expect("run the spillway binary")
}

/// A blocking-free HTTP client.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Sends `req` and parses the JSON answer.
pub async fn json(req: reqwest::RequestBuilder) -> serde_json::Value {
    req.send()
        .await
        .expect("send")
        .json()
        .await
        .expect("a JSON body")
}

/// Sends `req` and returns the body as text (e.g. `/metrics`).
pub async fn text(req: reqwest::RequestBuilder) -> String {
    req.send()
        .await
        .expect("send")
        .text()
        .await
        .expect("a text body")
}

/// POSTs a check and returns status, headers and JSON body.
pub async fn check(
    c: &reqwest::Client,
    s: &Server,
    body: serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let r = c.post(s.url("/v1/check")).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let json = r.json().await.unwrap();
    (status, headers, json)
}

pub fn header(h: &reqwest::header::HeaderMap, name: &str) -> String {
    h.get(name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .to_str()
        .unwrap()
        .to_string()
}

/// Polls `f` every 50 ms until it is true, for at most 30 s (a reload's
/// quiet period, a health refresh, a report going stale), then fails
/// naming `what`.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `ShouldRateLimit` request for `user` in domain `edge`: one
/// descriptor, `user` = `user`.
pub fn edge_request(user: &str) -> spillway_server::grpc::proto::RateLimitRequest {
    use spillway_server::grpc::proto::{Entry, RateLimitDescriptor, RateLimitRequest};
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

/// One `ShouldRateLimit` call for `user` in domain `edge` on `endpoint`
/// (plain or TLS), on a new connection.
pub async fn should_rate_limit(
    endpoint: tonic::transport::Endpoint,
    user: &str,
) -> Result<spillway_server::grpc::proto::RateLimitResponse, Box<dyn std::error::Error>> {
    should_rate_limit_as(endpoint, user, None).await
}

/// [`should_rate_limit`], with `authorization: Bearer TOKEN` metadata
/// when `token` is given.
pub async fn should_rate_limit_as(
    endpoint: tonic::transport::Endpoint,
    user: &str,
    token: Option<&str>,
) -> Result<spillway_server::grpc::proto::RateLimitResponse, Box<dyn std::error::Error>> {
    let ch = endpoint.connect().await?;
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await?;
    let mut req = tonic::Request::new(edge_request(user));
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse()?);
    }
    let path =
        http::uri::PathAndQuery::from_static(spillway_server::grpc::proto::SHOULD_RATE_LIMIT);
    let r = grpc
        .unary(req, path, tonic_prost::ProstCodec::default())
        .await?;
    Ok(r.into_inner())
}

/// A gRPC endpoint on `addr` over TLS, trusting the PEM certificate `ca`
/// for the name localhost.
pub fn tls_endpoint(addr: &str, ca: &str) -> tonic::transport::Endpoint {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    let port = addr.rsplit(':').next().unwrap();
    tonic::transport::Endpoint::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .tls_config(tls)
        .unwrap()
}
