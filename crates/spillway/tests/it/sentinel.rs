//! End-to-end behind Redis Sentinel: the real `spillway serve` finds the
//! master by asking real sentinels, follows a failover, speaks TLS to
//! sentinels and master with a private CA and a client certificate, and
//! refuses to start with a master name no sentinel knows.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_testkit::SentinelSet;
use spillway_testkit::sentinel::MASTER_NAME;

use crate::util::{Server, TempDir, check, client};

fn rules(set: &SentinelSet, master: &str) -> String {
    let nodes: Vec<String> = set.nodes().iter().map(|n| format!("'{n}'")).collect();
    format!(
        r#"
store:
  redis:
    sentinel:
      master: {master}
      nodes: [ {} ]
    timeout: 5s
    probe_interval: 100ms
on_store_error: deny
rules:
  - name: exact
    api: /exact
    by: user
    limits:
      - fixed_window: {{ limit: 10, window: 1h }}
"#,
        nodes.join(", ")
    )
}

/// Checks `/exact` for `user` until Redis answers, then 15 times: how
/// many were admitted (every one must reach Redis).
async fn admitted(c: &reqwest::Client, s: &Server, user: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, _, j) = check(c, s, json!({"api": "/exact", "user": "probe", "cost": 0})).await;
        if j["store_error"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "redis never answered: {j}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut yes = 0;
    for _ in 0..15 {
        let (status, _, j) = check(c, s, json!({"api": "/exact", "user": user})).await;
        assert_eq!(j["store_error"], false, "{j}");
        yes += usize::from(status == 200);
    }
    yes
}

/// Sentinels on TLS only and a master reached over TLS
/// (`sentinel.tls: true`), every process requiring a client certificate
/// from a private CA (`store.redis.tls`): discovery and every decision
/// go over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_and_the_master_over_tls_with_a_private_ca() {
    use crate::certs::{Usage, ca, leaf};
    let dir = TempDir::new("sentinel-tls");
    let root = ca("sentinel test CA");
    // One certificate for every process, as server and as client (the
    // replica and the sentinels are clients of the master).
    let (cert, key) = leaf(&root, &["localhost", "127.0.0.1"], Usage::Any);
    let files = spillway_testkit::sentinel::TlsFiles {
        cert: dir.write("redis.pem", &cert),
        key: dir.write("redis.key", &key),
        ca: dir.write("ca.pem", &root.pem),
    };
    let (client_cert, client_key) = leaf(&root, &["spillway"], Usage::Client);
    let client_cert = dir.write("client.pem", &client_cert);
    let client_key = dir.write("client.key", &client_key);
    let set = tokio::task::block_in_place(|| SentinelSet::start_tls(&files));
    let rules = rules(&set, MASTER_NAME).replace(
        "    timeout: 5s\n",
        &format!(
            "    timeout: 5s\n    tls: {{ ca: {}, cert: {}, key: {} }}\n",
            files.ca.display(),
            client_cert.display(),
            client_key.display()
        ),
    );
    let rules = rules.replace("      nodes:", "      tls: true\n      nodes:");
    let file = dir.write("rules.yaml", &rules);
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    assert_eq!(admitted(&c, &s, "a").await, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_finds_the_master_through_sentinels_and_follows_failovers() {
    let mut set = SentinelSet::start();
    let first = set.master_port().unwrap();
    let dir = TempDir::new("sentinel");
    let file = dir.write("rules.yaml", &rules(&set, MASTER_NAME));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    assert_eq!(admitted(&c, &s, "a").await, 10);

    let moved = tokio::task::block_in_place(|| set.failover());
    assert_ne!(moved, first);
    assert_eq!(admitted(&c, &s, "b").await, 10);
    s.wait_line("the master moved");

    tokio::task::block_in_place(|| {
        set.server(moved).kill();
        set.wait_master_other_than(moved)
    });
    assert_eq!(admitted(&c, &s, "c").await, 10);
    // What was counted before the failovers is still counted.
    let (status, _, j) = check(&c, &s, json!({"api": "/exact", "user": "a"})).await;
    assert_eq!((status, &j["store_error"]), (429, &json!(false)), "{j}");
}

#[test]
fn a_master_name_no_sentinel_knows_stops_the_start() {
    let set = SentinelSet::start();
    let dir = TempDir::new("sentinel-name");
    let file = dir.write("rules.yaml", &rules(&set, "no-such-master"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run spillway");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("spillway served with a master name no sentinel knows");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("store.redis.sentinel.master")
            && stderr.contains("knows a master named \"no-such-master\""),
        "{stderr}"
    );
}
