//! Redis over TLS with a private CA and a client certificate, end to
//! end: the real binary against a real `redis-server` that speaks only
//! TLS to clients and requires their certificates (`tls-auth-clients
//! yes`), configured by the rules file's `store.redis.tls` and by
//! ratelimit's `REDIS_TLS_*` variables; without the client certificate
//! nothing is decided by Redis; a Redis Cluster over TLS; files that
//! could not be used stop the start.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_testkit::{RedisServer, free_port};

use crate::certs::{Usage, ca, leaf};
use crate::util::{Server, TempDir, check, client, eventually};

/// A TLS-only Redis (its plain port is for the tests' `redis-cli`) and
/// the files a client needs.
struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn tls_redis(dir: &TempDir) -> TlsRedis {
    let root = ca("redis test CA");
    let (server_cert, server_key) = leaf(&root, &["localhost"], Usage::Server);
    let (cert, key) = leaf(&root, &["spillway"], Usage::Client);
    let ca_file = dir.write("ca.pem", &root.pem);
    let server_cert = dir.write("redis.pem", &server_cert);
    let server_key = dir.write("redis.key", &server_key);
    let tls_port = free_port();
    let port = tls_port.to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &port,
        "--tls-cert-file",
        server_cert.to_str().unwrap(),
        "--tls-key-file",
        server_key.to_str().unwrap(),
        "--tls-ca-cert-file",
        ca_file.to_str().unwrap(),
        "--tls-auth-clients",
        "yes",
    ]);
    TlsRedis {
        server,
        tls_port,
        ca: ca_file,
        cert: dir.write("client.pem", &cert),
        key: dir.write("client.key", &key),
    }
}

fn rules(r: &TlsRedis, client_cert: bool) -> String {
    let client = if client_cert {
        format!(", cert: {}, key: {}", r.cert.display(), r.key.display())
    } else {
        String::new()
    };
    format!(
        r#"
store:
  redis:
    url: rediss://localhost:{}
    tls: {{ ca: {}{client} }}
    timeout: 5s
    probe_interval: 100ms
on_store_error: deny
rules:
  - name: exact
    by: user
    limits:
      - fixed_window: {{ limit: 3, window: 1h }}
"#,
        r.tls_port,
        r.ca.display()
    )
}

/// Waits (30 s at most) until a check of `s` is decided by Redis.
async fn redis_answers(c: &reqwest::Client, s: &Server, what: &str) {
    eventually(&format!("{what} answering"), || async {
        let (_, _, j) = check(c, s, json!({"user": "probe", "cost": 0})).await;
        j["store_error"] == false
    })
    .await;
}

/// Of `n` checks for `user`, each decided by Redis, how many were
/// admitted.
async fn admitted(c: &reqwest::Client, s: &Server, user: &str, n: usize) -> usize {
    let mut yes = 0;
    for _ in 0..n {
        let (status, _, j) = check(c, s, json!({ "user": user })).await;
        assert_eq!(j["store_error"], false, "{user}: {j}");
        yes += usize::from(status == 200);
    }
    yes
}

/// The rules file's `store.redis.tls`: with the client certificate every
/// decision is Redis's (3 of 5 admitted, the counts in Redis); without
/// it the handshake is refused and no decision is Redis's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_file_tls_with_a_private_ca_and_a_client_certificate() {
    let dir = TempDir::new("redis-tls");
    let r = tls_redis(&dir);
    let file = dir.write("rules.yaml", &rules(&r, true));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    redis_answers(&c, &s, "Redis over TLS").await;
    assert_eq!(admitted(&c, &s, "alice", 5).await, 3);
    let keys: u64 = r.server.cli(&["DBSIZE"]).trim().parse().unwrap();
    assert!(keys > 0, "nothing counted in Redis");
    drop(s);

    // The CA alone: Redis asks for a certificate, none is given.
    let file = dir.write("no-client.yaml", &rules(&r, false));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let (status, _, j) = check(&c, &s, json!({"user": "bob"})).await;
        assert_eq!((status, &j["store_error"]), (429, &json!(true)), "{j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Redis Cluster over TLS (client connections and its bus), each node
/// requiring a client certificate: the seed nodes' `rediss://` URLs and
/// `store.redis.tls`; Redis names TLS ports to TLS clients, so slot maps
/// and redirections stay on TLS. Keys spread over the nodes' slots are
/// each exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_a_private_ca() {
    let dir = TempDir::new("redis-tls-cluster");
    let root = ca("cluster test CA");
    // The nodes' certificate serves them as servers and as clients of
    // each other's bus; the cluster names its nodes by address.
    let (cert, key) = leaf(&root, &["localhost", "127.0.0.1"], Usage::Any);
    let files = spillway_testkit::sentinel::TlsFiles {
        cert: dir.write("node.pem", &cert),
        key: dir.write("node.key", &key),
        ca: dir.write("ca.pem", &root.pem),
    };
    let (client_cert, client_key) = leaf(&root, &["spillway"], Usage::Client);
    let client_cert = dir.write("client.pem", &client_cert);
    let client_key = dir.write("client.key", &client_key);
    let cluster = tokio::task::block_in_place(|| spillway_testkit::RedisCluster::start_tls(&files));
    let nodes: Vec<String> = cluster
        .tls_urls()
        .iter()
        .map(|u| format!("'{u}'"))
        .collect();
    let file = dir.write(
        "rules.yaml",
        &format!(
            r#"
store:
  redis:
    cluster: [ {} ]
    tls: {{ ca: {}, cert: {}, key: {} }}
    timeout: 5s
    probe_interval: 100ms
on_store_error: deny
rules:
  - name: exact
    by: user
    limits:
      - fixed_window: {{ limit: 3, window: 1h }}
"#,
            nodes.join(", "),
            files.ca.display(),
            client_cert.display(),
            client_key.display()
        ),
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    redis_answers(&c, &s, "the TLS cluster").await;
    for user in ["u1", "u2", "u3", "u4", "u5", "u6"] {
        assert_eq!(admitted(&c, &s, user, 5).await, 3, "{user}");
    }
    let keys: u64 = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["DBSIZE"]).trim().parse::<u64>().unwrap_or(0))
        .sum();
    assert!(keys > 0, "nothing counted in the cluster");
}

/// ratelimit's variables, as Envoy Gateway's users set them for a TLS
/// Redis: `REDIS_TLS`, `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and
/// `REDIS_TLS_CLIENT_KEY` through `/bin/ratelimit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimit_tls_variables_reach_a_tls_redis() {
    let dir = TempDir::new("redis-tls-rl");
    let r = tls_redis(&dir);
    let config = dir.0.join("runtime").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n",
    )
    .unwrap();
    let spillway_rules = dir.write("rules.yaml", "rules: []\n");
    let runtime = dir.0.join("runtime").display().to_string();
    let url = format!("localhost:{}", r.tls_port);
    let env = [
        ("RUNTIME_ROOT", runtime.as_str()),
        ("SPILLWAY_CONFIG", spillway_rules.to_str().unwrap()),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", r.ca.to_str().unwrap()),
        ("REDIS_TLS_CLIENT_CERT", r.cert.to_str().unwrap()),
        ("REDIS_TLS_CLIENT_KEY", r.key.to_str().unwrap()),
        ("REDIS_TIMEOUT", "5s"),
    ];
    let s = Server::start_ratelimit(&env);
    let grpc = s.listener("gRPC");
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap();
    // Until Redis answers (ratelimit's failure mode allows: OK then).
    let deadline = Instant::now() + Duration::from_secs(30);
    while r.server.cli(&["DBSIZE"]).trim() == "0" {
        crate::util::should_rate_limit(endpoint.clone(), "probe")
            .await
            .unwrap();
        assert!(Instant::now() < deadline, "nothing reached Redis over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut codes = Vec::new();
    for _ in 0..5 {
        let resp = crate::util::should_rate_limit(endpoint.clone(), "alice")
            .await
            .unwrap();
        codes.push(resp.overall_code);
    }
    // OK is 1, OVER_LIMIT 2.
    assert_eq!(codes, [1, 1, 1, 2, 2]);
}

/// Files that could not be used stop the start, naming them: TLS files
/// for a `redis://` URL, half a client pair, a CA file without a
/// certificate; and ratelimit's CA with `REDIS_TLS` off.
#[test]
fn tls_files_that_cannot_be_used_stop_the_start() {
    let dir = TempDir::new("redis-tls-bad");
    let r = tls_redis(&dir);
    let (ca_file, cert, key) = (r.ca.display(), r.cert.display(), r.key.display());
    for (store, says) in [
        (
            format!("url: redis://localhost:1\n    tls: {{ ca: {ca_file} }}"),
            "is not rediss://",
        ),
        (
            format!("url: rediss://localhost:1\n    tls: {{ cert: {cert} }}"),
            "needs its key",
        ),
        (
            format!("url: rediss://localhost:1\n    tls: {{ ca: {key} }}"),
            "no certificate in the file",
        ),
        (
            format!(
                "sentinel: {{ master: m, nodes: ['localhost:1'] }}\n    tls: {{ ca: {ca_file} }}"
            ),
            "sentinel.tls: true",
        ),
    ] {
        let file = dir.write(
            "bad.yaml",
            &format!("store:\n  redis:\n    {store}\nrules: []\n"),
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{store}: started");
        assert!(
            err.contains("redis.tls") && err.contains(says),
            "{store}: {err}"
        );
    }
    let runtime = dir.0.join("runtime");
    std::fs::create_dir_all(runtime.join("config")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .arg0_ratelimit()
        .env("SPILLWAY_CONFIG", dir.write("rules.yaml", "rules: []\n"))
        .env("RUNTIME_ROOT", &runtime)
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", "localhost:1")
        .env("REDIS_TLS_CACERT", r.ca.to_str().unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {err}");
    assert!(
        err.contains("REDIS_TLS_CACERT") && err.contains("TLS is off"),
        "{err}"
    );
}

/// Starts a command under the name `ratelimit`.
trait AsRatelimit {
    fn arg0_ratelimit(&mut self) -> &mut Self;
}

impl AsRatelimit for std::process::Command {
    fn arg0_ratelimit(&mut self) -> &mut Self {
        std::os::unix::process::CommandExt::arg0(self, "ratelimit")
    }
}
