//! Operations (issue 18): JSON logs, `${NAME}` in the rules file, the
//! process and Redis metrics, and the systemd unit, with the real binary
//! and a real redis-server.
//!
//! Nothing here waits a fixed time: each test polls with a generous
//! deadline, so a busy machine only makes it slower.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_testkit::RedisServer;

use crate::util::{self, Server, TempDir, check, client};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// Long enough for a loaded 2-core machine; only reached on failure.
const DEADLINE: Duration = Duration::from_secs(30);

/// `spillway ARGS...` with every stderr line kept (the first ones too,
/// which `Server` reads past), killed on drop.
struct Logged {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Logged {
    fn start(args: &[&str]) -> Logged {
        let mut cmd = Command::new(BIN);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the spillway binary");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Logged {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`; returns it.
    fn wait_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?}; saw {:#?}", self.seen),
            }
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to end; returns every line it printed.
    fn finish(mut self) -> (Option<i32>, Vec<String>) {
        let deadline = Instant::now() + DEADLINE;
        // The reader ends when the process closes stderr, at exit.
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        let code = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break s.code();
            }
            assert!(Instant::now() < deadline, "spillway did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        (code, std::mem::take(&mut self.seen))
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks that `line` is one JSON object with the fixed fields; returns it.
fn json_line(line: &str) -> Value {
    let v: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {line}"));
    let ts = obj["ts"]
        .as_str()
        .unwrap_or_else(|| panic!("no ts: {line}"));
    // 2025-11-24T22:28:01.123456Z
    let b = ts.as_bytes();
    assert!(
        ts.len() == 27
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[19] == b'.'
            && b[26] == b'Z'
            && ts
                .bytes()
                .enumerate()
                .all(|(i, c)| [4, 7, 10, 13, 16, 19, 26].contains(&i) || c.is_ascii_digit()),
        "ts {ts:?} is not RFC 3339 UTC with microseconds: {line}"
    );
    assert!(
        ["error", "warn", "info", "debug", "trace"].contains(&obj["level"].as_str().unwrap_or("")),
        "level: {line}"
    );
    assert!(
        obj["target"].as_str().is_some_and(|t| !t.is_empty()),
        "target: {line}"
    );
    assert!(obj["message"].is_string(), "message: {line}");
    v
}

const JSON_RULES: &str = "log: { format: json }
reload: { quiet: 100ms }
rules:
  - name: api
    api: /api
    by: user
    limits: [ { fixed_window: { limit: 2, window: 1m } } ]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_stable_names() {
    let dir = TempDir::new("jsonlog");
    // The file asks for JSON; no flag.
    let file = dir.write("rules.yaml", JSON_RULES);
    let f = file.to_str().unwrap();
    let mut p = Logged::start(&[
        "serve",
        "--config",
        f,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let line = p.wait_line("listening on http://");
    let v = json_line(&line);
    let addr = v["addr"].as_str().expect("an addr field").to_string();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("listening on http://{addr}")),
        "{line}"
    );
    let admin = json_line(&p.wait_line("admin API"));
    assert!(admin["addr"].is_string(), "{admin}");
    // Decisions log nothing at info; reloads do, with fields, and a
    // rejected file's message spans lines.
    let c = client();
    let r = c
        .post(format!("http://{addr}/v1/check"))
        .json(&json!({"api": "/api", "user": "u"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    dir.write("rules.yaml", "rules:\n  - name: api\n    limits: nope\n");
    p.signal("HUP");
    let rejected = json_line(&p.wait_line("rules file rejected"));
    assert_eq!(rejected["level"], "error", "{rejected}");
    assert!(
        rejected["message"].as_str().unwrap().contains('\n'),
        "{rejected}"
    );
    // A reload that changes the format: the log stays as it started, and
    // says the change waits for a restart.
    dir.write("rules.yaml", &JSON_RULES.replace("json", "text"));
    p.signal("HUP");
    let reloaded = json_line(&p.wait_line("rules reloaded"));
    assert!(reloaded["version"].is_number(), "{reloaded}");
    let waiting = json_line(&p.wait_line("apply only at start"));
    assert!(
        waiting["settings"].as_str().unwrap().contains("\"log\""),
        "{waiting}"
    );
    p.signal("TERM");
    let (code, lines) = p.finish();
    assert_eq!(code, Some(0), "{lines:#?}");
    assert!(lines.len() >= 6, "{lines:#?}");
    for l in &lines {
        json_line(l);
    }
    assert!(lines.iter().any(|l| l.contains("spillway stopped")));
}

#[test]
fn the_flag_wins_over_the_file_and_errors_are_json_too() {
    let dir = TempDir::new("logflag");
    let file = dir.write("rules.yaml", JSON_RULES);
    let f = file.to_str().unwrap();
    // The file says json, the flag (before the subcommand) says text.
    let mut p = Logged::start(&[
        "--log-format",
        "text",
        "serve",
        "--config",
        f,
        "--listen",
        "127.0.0.1:0",
    ]);
    p.wait_line("listening on http://");
    assert!(p.seen.iter().all(|l| !l.starts_with('{')), "{:#?}", p.seen);
    drop(p);

    // A file that does not load: with --log-format json, its errors are
    // error events too (exit 2), one per line of the report.
    let bad = dir.write(
        "bad.yaml",
        "rules:\n  - name: a\n    limits: nope\nlisten: x\n",
    );
    let p = Logged::start(&[
        "proxy",
        "--log-format",
        "json",
        "--upstream",
        "http://127.0.0.1:9",
        "--config",
        bad.to_str().unwrap(),
    ]);
    let (code, lines) = p.finish();
    assert_eq!(code, Some(2), "{lines:#?}");
    assert!(!lines.is_empty());
    for l in &lines {
        let v = json_line(l);
        assert_eq!(v["level"], "error", "{l}");
    }
    assert!(
        lines.iter().any(|l| l.contains("bad.yaml:3:")),
        "{lines:#?}"
    );

    // A format the binary does not know is refused by the flag parser, and
    // by the file's validation.
    let out = util::spillway(&["serve", "--log-format", "yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected text or json"));
    let odd = dir.write("odd.yaml", "log:\n  format: xml\nrules: []\n");
    let out = util::spillway(&["check-config", odd.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(":2:11:") && err.contains("log.format"),
        "{err}"
    );
}

/// A password with the characters that break URLs (`@ : #`) and YAML
/// (`: `, `#`, quotes).
const PASSWORD: &str = "s3cr@t:pa#ss w'o\"rd";

/// The rules file of the Redis tests: the password from the environment.
fn redis_rules(port: u16) -> String {
    format!(
        "store:
  redis:
    url: redis://:${{SPILLWAY_OPS_REDIS_PASSWORD:url}}@127.0.0.1:{port}/0
    timeout: 200ms
rules:
  - name: api-${{SPILLWAY_OPS_TENANT}}
    api: /api
    by: user
    limits: [ {{ fixed_window: {{ limit: 2, window: 1h }} }} ]
"
    )
}

/// `spillway check-config FILE` with these environment variables.
fn check_config(file: &str, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(["check-config", file])
        .env_remove("SPILLWAY_OPS_REDIS_PASSWORD")
        .env_remove("SPILLWAY_OPS_TENANT")
        .envs(env.iter().copied())
        .output()
        .expect("run the spillway binary");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The samples of `name` in a Prometheus exposition: (labels, value).
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (n == name).then(|| {
                let v = value
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: {value:?} is not a number"));
                (labels.to_string(), v)
            })
        })
        .collect()
}

/// The one unlabelled sample of `name`.
fn one(text: &str, name: &str) -> f64 {
    match samples(text, name).as_slice() {
        [(labels, v)] if labels.is_empty() => *v,
        other => panic!("{name}: {other:?}\n{text}"),
    }
}

/// Scrapes `/metrics` until `done` holds; returns the text.
async fn metrics_until(s: &Server, what: &str, done: impl Fn(&str) -> bool) -> String {
    let c = client();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = util::text(c.get(s.url("/metrics"))).await;
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_password_from_the_environment_connects_and_is_never_printed() {
    let redis = RedisServer::start();
    // Set after start: testkit's readiness check is an unauthenticated PING.
    assert_eq!(
        redis
            .cli(&["CONFIG", "SET", "requirepass", PASSWORD])
            .trim(),
        "OK"
    );
    let dir = TempDir::new("envpw");
    let file = dir.write("rules.yaml", &redis_rules(redis.port));
    let f = file.to_str().unwrap();
    let tenant = "tenant-secret-42";
    let pw_var = format!("SPILLWAY_OPS_REDIS_PASSWORD={PASSWORD}");
    let tenant_var = format!("SPILLWAY_OPS_TENANT={tenant}");
    let s = Server::start_wrapped(&["env", &pw_var, &tenant_var], "serve", &["--config", f]);
    metrics_until(&s, "connects with the password", |m| {
        m.contains("spillway_redis_connected 1")
    })
    .await;
    // Decisions are counted in Redis under the substituted rule name.
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (status, _, j) = check(&c, &s, json!({"api": "/api", "user": "u"})).await;
        assert_eq!(j["store_error"], false, "{j}");
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 429]);
    let keys = redis.cli(&["--no-auth-warning", "-a", PASSWORD, "DBSIZE"]);
    assert!(keys.trim().parse::<u64>().unwrap() > 0, "{keys}");
    let rules = util::json(c.get(s.url("/v1/rules"))).await;
    assert!(rules.to_string().contains(tenant), "{rules}");

    // check-config reaches Redis with it, and prints neither value.
    let env = [
        ("SPILLWAY_OPS_REDIS_PASSWORD", PASSWORD),
        ("SPILLWAY_OPS_TENANT", tenant),
    ];
    let (code, out, err) = check_config(f, &env);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains("not reachable"), "{out}");
    assert!(out.contains("api-${SPILLWAY_OPS_TENANT}"), "{out}");
    for secret in [PASSWORD, "s3cr%40t", tenant] {
        assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
    }
    // A wrong password: Redis refuses the probe.
    let (code, out, _) = check_config(
        f,
        &[
            ("SPILLWAY_OPS_REDIS_PASSWORD", "wrong password"),
            ("SPILLWAY_OPS_TENANT", tenant),
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("not reachable"), "{out}");
    // Unset: refused, naming the variable where the file uses it.
    let (code, out, err) = check_config(f, &[("SPILLWAY_OPS_TENANT", tenant)]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("rules.yaml:3:19:")
            && err.contains("environment variable SPILLWAY_OPS_REDIS_PASSWORD is not set"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_the_build_the_process_and_the_memory_store() {
    let s = Server::start(&[]);
    let text = metrics_until(&s, "process metrics", |m| m.contains("process_")).await;
    let build = samples(&text, "spillway_build_info");
    let [(labels, 1.0)] = build.as_slice() else {
        panic!("{build:?}");
    };
    assert!(
        labels.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{labels}"
    );
    let rustc = labels.split("rustc=\"").nth(1).unwrap_or("");
    assert!(
        rustc.starts_with(|c: char| c.is_ascii_digit()),
        "rustc label: {labels}"
    );
    let rss = one(&text, "process_resident_memory_bytes");
    assert!(rss > 1e6, "RSS {rss}");
    assert!(one(&text, "process_virtual_memory_bytes") >= rss);
    assert!(one(&text, "process_cpu_seconds_total") >= 0.0);
    let fds = one(&text, "process_open_fds");
    assert!(fds >= 3.0, "{fds}");
    assert!(one(&text, "process_max_fds") >= fds);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = one(&text, "process_start_time_seconds");
    // Whole seconds of clock ticks since boot: a little slack.
    assert!(
        start <= now + 2.0 && start > now - 600.0,
        "{start} vs {now}"
    );
    // The memory store counts its keys; Redis gauges are not there.
    assert!(one(&text, "spillway_keys") >= 0.0);
    assert!(!text.contains("spillway_redis_connected"), "{text}");
    // Keys appear as clients do.
    let c = client();
    for i in 0..20 {
        check(
            &c,
            &s,
            json!({"api": "GET /v1/search", "user": format!("u{i}")}),
        )
        .await;
    }
    let later = util::text(c.get(s.url("/metrics"))).await;
    assert!(one(&later, "spillway_keys") > 0.0, "{later}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_redis_connection_and_breaker() {
    let mut redis = RedisServer::start();
    let dir = TempDir::new("redismetrics");
    let file = dir.write(
        "rules.yaml",
        &format!(
            "store:
  redis:
    url: {}/0
    timeout: 100ms
    breaker_failures: 2
on_store_error: allow
rules:
  - name: api
    api: /api
    by: user
    limits: [ {{ fixed_window: {{ limit: 1000, window: 1h }} }} ]
",
            redis.url()
        ),
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let text = metrics_until(&s, "connected", |m| {
        m.contains("spillway_redis_connected 1")
    })
    .await;
    let mut states = samples(&text, "spillway_redis_breaker_state");
    states.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        states,
        [
            ("state=\"closed\"".to_string(), 1.0),
            ("state=\"half_open\"".to_string(), 0.0),
            ("state=\"open\"".to_string(), 0.0),
        ]
    );
    // No made-up key count: the series is left out, its HELP says why.
    assert!(samples(&text, "spillway_keys").is_empty(), "{text}");
    assert!(text.contains("# HELP spillway_keys "), "{text}");
    assert!(one(&text, "process_resident_memory_bytes") > 1e6);

    // Redis goes away: decisions fail, the breaker opens, the gauges say so.
    redis.kill();
    let c = client();
    let deadline = Instant::now() + DEADLINE;
    loop {
        check(&c, &s, json!({"api": "/api", "user": "u"})).await;
        let text = util::text(c.get(s.url("/metrics"))).await;
        let open = samples(&text, "spillway_redis_breaker_state")
            .iter()
            .any(|(l, v)| l == "state=\"open\"" && *v == 1.0);
        if open {
            assert_eq!(one(&text, "spillway_redis_connected"), 0.0, "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the breaker never opened:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_systemd_unit_verifies_and_its_command_line_parses() {
    let unit_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/spillway.service"
    );
    let unit = std::fs::read_to_string(unit_path).expect("examples/spillway.service");
    for line in [
        "ExecStart=/usr/local/bin/spillway serve --config /etc/spillway/rules.yaml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "DynamicUser=yes",
        "LimitNOFILE=1048576",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "RestrictNamespaces=yes",
        "LockPersonality=yes",
        "MemoryDenyWriteExecute=yes",
        "SystemCallFilter=@system-service",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "#AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "#LoadCredential=ops.token:/etc/spillway/ops.token",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line:?}");
    }
    assert!(unit.contains("${CREDENTIALS_DIRECTORY}"));
    // Every flag of every ExecStart (commented ones too) is one `serve`
    // takes.
    let help = util::spillway(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for exec in unit
        .lines()
        .filter_map(|l| l.trim_start_matches('#').strip_prefix("ExecStart="))
    {
        let mut words = exec.split_whitespace();
        assert_eq!(words.next(), Some("/usr/local/bin/spillway"));
        assert_eq!(words.next(), Some("serve"));
        for flag in words.filter(|w| w.starts_with("--")) {
            assert!(help.contains(flag), "`spillway serve` has no {flag}");
        }
    }
    // systemd's own check, with the binary where ExecStart says.
    let found = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "systemd-analyze is not installed: apt-get install systemd (scripts/setup.sh)"
    );
    let dir = TempDir::new("unit");
    let copy = dir.write(
        "spillway.service",
        &unit.replace("/usr/local/bin/spillway", BIN),
    );
    let out = Command::new("systemd-analyze")
        .args(["verify", copy.to_str().unwrap()])
        .output()
        .expect("run systemd-analyze");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {err}"
    );
}
