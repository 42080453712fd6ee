//! End-to-end: the gRPC listener's connections on the real binary, spoken
//! to with h2 directly (so the test sees each stream and the GOAWAY):
//! the maximum connection age and its grace (`GRPC_MAX_CONNECTION_AGE`),
//! a Unix socket (`GRPC_UDS`, `grpc_listen: unix:PATH`), and the settings
//! refused with where they came from.

use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;
use spillway_server::grpc::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, SHOULD_RATE_LIMIT,
};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::util::{Server, TempDir, spillway};

/// One domain, `conn`, with 3 calls a minute per user.
const RULES: &str = r#"
rules: []
domains:
  - domain: conn
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 3 }
"#;

/// A call for `user`, framed for gRPC (flag 0, length, message).
fn framed(user: &str) -> Bytes {
    let msg = RateLimitRequest {
        domain: "conn".into(),
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
    .encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&msg);
    body.into()
}

fn head(path: &str) -> http::Request<()> {
    http::Request::post(format!("http://spillway{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

type Conn = (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
);

/// An HTTP/2 connection over `io`, its driver on a task of its own (it
/// ends when the server closes the connection).
async fn h2_over<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: T) -> Conn {
    let (send, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    (send, tokio::spawn(conn))
}

/// The answer to a stream: its status and trailers read, its message
/// decoded; `Err` with what went wrong.
async fn answer(res: h2::client::ResponseFuture) -> Result<RateLimitResponse, String> {
    let res = res.await.map_err(|e| format!("stream: {e}"))?;
    let status = res.headers().get("grpc-status").cloned();
    let mut body = res.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("body: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| format!("trailers: {e}"))?;
    let status = status.or_else(|| trailers.and_then(|t| t.get("grpc-status").cloned()));
    if status.as_ref().map(http::HeaderValue::as_bytes) != Some(b"0") {
        return Err(format!("grpc-status {status:?}"));
    }
    if data.len() < 5 {
        return Err(format!("no message: {data:?}"));
    }
    RateLimitResponse::decode(&data[5..]).map_err(|e| e.to_string())
}

/// One whole call for `user` on `send`.
async fn call(
    send: &mut h2::client::SendRequest<Bytes>,
    user: &str,
) -> Result<RateLimitResponse, String> {
    let mut ready = send
        .clone()
        .ready()
        .await
        .map_err(|e| format!("ready: {e}"))?;
    let (res, mut body) = ready
        .send_request(head(SHOULD_RATE_LIMIT), false)
        .map_err(|e| format!("open: {e}"))?;
    body.send_data(framed(user), true)
        .map_err(|e| format!("send: {e}"))?;
    answer(res).await
}

fn remaining(r: &RateLimitResponse) -> (i32, u32) {
    (r.statuses[0].code, r.statuses[0].limit_remaining)
}

/// After its age, a connection is told to go (GOAWAY: no new stream
/// opens on it), a call in flight on it still finishes within the grace,
/// the connection then closes, and a new connection is served. The
/// decisions are exact across the two connections.
#[tokio::test]
async fn connections_past_their_age_go_away_and_calls_in_flight_finish() {
    let dir = TempDir::new("grpc-age");
    let rules =
        format!("envoy: {{ max_connection_age: 1s, max_connection_age_grace: 60s }}\n{RULES}");
    let file = dir.write("rules.yaml", &rules);
    let s = Server::start(&[
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let addr = s.listener("gRPC");
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut send, driver) = h2_over(tcp).await;
    let first = call(&mut send, "ann")
        .await
        .expect("a call on a young connection");
    assert_eq!(remaining(&first), (Code::Ok as i32, 2));
    // A call in flight: its head and half its message sent.
    let whole = framed("ann");
    let mut ready = send.clone().ready().await.unwrap();
    let (res, mut body) = ready.send_request(head(SHOULD_RATE_LIMIT), false).unwrap();
    body.send_data(whole.slice(..4), false).unwrap();
    // Past the age (1 s plus up to a tenth): no new stream opens.
    let started = Instant::now();
    loop {
        let opened = match send.clone().ready().await {
            Err(_) => false,
            Ok(mut r) => r.send_request(head("/nope"), true).is_ok(),
        };
        if !opened {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no GOAWAY 30 s after a connection age of 1 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The call in flight finishes, decided exactly.
    body.send_data(whole.slice(4..), true).unwrap();
    let second = answer(res)
        .await
        .expect("the call in flight finishes in the grace");
    assert_eq!(remaining(&second), (Code::Ok as i32, 1));
    // With nothing in flight, the connection closes (long before the grace).
    let closed = tokio::time::timeout(Duration::from_secs(30), driver).await;
    assert!(
        closed.is_ok(),
        "the connection stayed open after its last call"
    );
    // A new connection is served, and counts on.
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut send, _driver) = h2_over(tcp).await;
    let third = call(&mut send, "ann").await.expect("a new connection");
    assert_eq!(remaining(&third), (Code::Ok as i32, 0));
    let fourth = call(&mut send, "ann").await.unwrap();
    assert_eq!(fourth.statuses[0].code, Code::OverLimit as i32);
}

/// A call that does not finish within the grace is cut with its
/// connection: the age bounds every connection's life.
#[tokio::test]
async fn the_grace_ends_calls_that_outstay_it() {
    let dir = TempDir::new("grpc-grace");
    let file = dir.write("rules.yaml", RULES);
    let s = Server::start_env(
        &[
            "--config",
            file.to_str().unwrap(),
            "--grpc-listen",
            "127.0.0.1:0",
        ],
        &[
            ("GRPC_MAX_CONNECTION_AGE", "1s"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"),
        ],
    );
    // The body timeout (30 s by default) is not what ends it.
    let addr = s.listener("gRPC");
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (send, driver) = h2_over(tcp).await;
    let mut ready = send.ready().await.unwrap();
    let (res, mut body) = ready.send_request(head(SHOULD_RATE_LIMIT), false).unwrap();
    body.send_data(framed("bob").slice(..4), false).unwrap();
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(25), driver).await;
    assert!(
        closed.is_ok(),
        "the connection outlived its age and grace (2.2 s at most) by 25 s"
    );
    assert!(answer(res).await.is_err(), "a cut call has no answer");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

/// `GRPC_UDS`: the gRPC listener on a Unix socket, instead of its address,
/// with a stale socket file (a crashed process's) replaced; decisions
/// over it are exact; the file is removed at exit.
#[tokio::test]
async fn grpc_over_a_unix_socket_is_exact() {
    let dir = TempDir::new("grpc-uds");
    let file = dir.write("rules.yaml", RULES);
    let sock = dir.0.join("rl.sock");
    // A socket file nobody listens on, as a crash leaves it.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let sock_s = sock.to_str().unwrap().to_string();
    let mut s = Server::start_env(
        &["--config", file.to_str().unwrap()],
        &[("GRPC_UDS", &sock_s)],
    );
    let line = s.wait_line("gRPC (Envoy rate limit service) listening on");
    assert!(line.contains(&format!("unix:{sock_s}")), "{line}");
    let unix = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (mut send, _driver) = h2_over(unix).await;
    for left in [2, 1, 0] {
        let r = call(&mut send, "cat")
            .await
            .expect("a call over the socket");
        assert_eq!(remaining(&r), (Code::Ok as i32, left));
    }
    let over = call(&mut send, "cat").await.unwrap();
    assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    s.signal("TERM");
    assert_eq!(s.wait_exit(Duration::from_secs(30)), Some(0));
    assert!(!sock.exists(), "the socket file outlived the process");
}

/// `grpc_listen: unix:PATH` in the rules file; a path in use by a live
/// listener is refused, never taken over.
#[tokio::test]
async fn grpc_listen_takes_a_unix_path_and_never_steals_one_in_use() {
    let dir = TempDir::new("grpc-uds-file");
    let sock = dir.0.join("g.sock");
    let rules = format!("grpc_listen: \"unix:{}\"\n{RULES}", sock.display());
    let file = dir.write("rules.yaml", &rules);
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    s.wait_line("gRPC (Envoy rate limit service) listening on");
    let unix = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (mut send, _driver) = h2_over(unix).await;
    let r = call(&mut send, "dan").await.unwrap();
    assert_eq!(remaining(&r), (Code::Ok as i32, 2));
    // A second server on the same path stops with a clear error.
    let out = spillway(&[
        "serve",
        "--config",
        file.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("cannot listen for gRPC on unix:") && err.contains("another process listens"),
        "{err}"
    );
    // The first still answers on it.
    let r = call(&mut send, "dan").await.unwrap();
    assert_eq!(remaining(&r), (Code::Ok as i32, 1));
}

/// Bad settings stop the start, saying the file's line or the variable.
#[test]
fn bad_age_settings_and_addresses_are_refused_with_where_they_came_from() {
    let dir = TempDir::new("grpc-bad");
    let file = dir.write(
        "rules.yaml",
        &format!("envoy:\n  max_connection_age: 1d\ngrpc_listen: \"unix:\"\n{RULES}"),
    );
    let out = spillway(&["check-config", "--config", file.to_str().unwrap()]);
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("rules.yaml:2:") && err.contains("envoy.max_connection_age"),
        "{err}"
    );
    assert!(
        err.contains("rules.yaml:3:") && err.contains("grpc_listen"),
        "{err}"
    );
    let good = dir.write("good.yaml", RULES);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args([
            "serve",
            "--config",
            good.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env("GRPC_MAX_CONNECTION_AGE_GRACE", "-5m")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("GRPC_MAX_CONNECTION_AGE_GRACE=\"-5m\""),
        "{err}"
    );
    let out = spillway(&["serve", "--grpc-listen", "unix", "--listen", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unix:/path/to.sock"),
        "{err}"
    );
}

/// Under the `ratelimit` entry (the image's `/bin/ratelimit`), `GRPC_UDS`
/// replaces `GRPC_HOST:GRPC_PORT`, as in envoyproxy/ratelimit.
#[tokio::test]
async fn bin_ratelimit_serves_grpc_on_grpc_uds_instead_of_its_port() {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    let dir = TempDir::new("grpc-uds-ratelimit");
    let config = dir.0.join("runtime").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("conn.yaml"),
        "domain: conn\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n",
    )
    .unwrap();
    let rules = dir.write("rules.yaml", "rules: []\n");
    let sock = dir.0.join("rl.sock");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .arg0("ratelimit")
        .env("RUNTIME_ROOT", dir.0.join("runtime"))
        .env("SPILLWAY_CONFIG", &rules)
        .env("HOST", "127.0.0.1")
        .env("PORT", "0")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("GRPC_UDS", &sock)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the spillway binary as ratelimit");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let line = loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.contains("gRPC (Envoy rate limit service) listening on") => break l,
            Ok(l) => seen.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("no gRPC listener; it printed {seen:#?}");
            }
        }
    };
    // Killed however the test ends.
    let _child = KillOnDrop(child);
    assert!(line.contains(&format!("unix:{}", sock.display())), "{line}");
    let unix = tokio::net::UnixStream::connect(&sock).await.unwrap();
    let (mut send, _driver) = h2_over(unix).await;
    let r = call(&mut send, "eve").await.expect("a call over GRPC_UDS");
    assert_eq!(remaining(&r), (Code::Ok as i32, 2));
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
