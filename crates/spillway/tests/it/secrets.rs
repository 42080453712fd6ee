//! `${NAME}` values are never printed (issue 28): every error that shows a
//! value, in every kind of field, shows the reference instead, in
//! `check-config`'s output, in `serve`'s stderr and log, and in
//! `/v1/status` (open without admin tokens). The value holds a line break,
//! since a message that shows only its second line leaked that line.

use std::time::{Duration, Instant};

use crate::util::{self, Server, TempDir, client};

/// Letters no message of spillway's own has; both lines of the value
/// start with them.
const MARK: &str = "XQZ";

/// The value of `${S}`: bad in every field below, two lines.
const SECRET: &str = "7 XQZSECRETONE\nXQZSECRETTWO";

/// One field of each kind that prints a value in its error, with
/// `${S}` as its value.
const CASES: &[(&str, &str)] = &[
    (
        "duration",
        "rules:\n  - name: a\n    limits: [ { fixed_window: { limit: 5, window: \"${S}\" } } ]\n",
    ),
    (
        "count",
        "rules:\n  - name: a\n    limits: [ { fixed_window: { limit: \"${S}\", window: 1m } } ]\n",
    ),
    (
        "rate",
        "rules:\n  - name: a\n    limits: [ { gcra: { rate: \"${S}\" } } ]\n",
    ),
    (
        "rule name",
        "rules:\n  - name: \"${S}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    ),
    (
        "route",
        "rules:\n  - name: a\n    api: \"${S}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    ),
    (
        "key",
        "rules:\n  - name: a\n    by: \"header:${S}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    ),
    (
        "mode (enum)",
        "rules:\n  - name: a\n    mode: \"${S}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    ),
    ("policy (enum)", "on_store_error: \"${S}\"\nrules: []\n"),
    (
        "log format (enum)",
        "log: { format: \"${S}\" }\nrules: []\n",
    ),
    (
        "redis url",
        "store: { redis: { url: \"${S}\" } }\nrules: []\n",
    ),
    ("upstream url", "proxy: { upstream: \"${S}\" }\nrules: []\n"),
    ("address", "listen: \"${S}\"\nrules: []\n"),
    ("timeout", "server: { head_timeout: \"${S}\" }\nrules: []\n"),
    (
        "size",
        "store: { memory: { max_keys: \"${S}\" } }\nrules: []\n",
    ),
    (
        "admin token name",
        "admin: { tokens: [ { name: \"${S}\", env: T } ] }\nrules: []\n",
    ),
    (
        "admin token variable",
        "admin: { tokens: [ { name: t, env: \"${S}\" } ] }\nrules: []\n",
    ),
    (
        "file path",
        "tls: { cert: \"/nonexistent/${S}\", key: \"/nonexistent/${S}\" }\nrules: []\n",
    ),
    ("section name", "rules: []\n\"${S}\": 1\n"),
    (
        "path matching",
        "path_matching: { trailing_slash: \"${S}\" }\nrules: []\n",
    ),
];

fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(MARK),
        "{what}: a `${{S}}` value was printed:\n{text}"
    );
}

/// `check-config` and `serve` refuse each file, and neither prints any
/// part of the value.
#[test]
fn no_error_prints_a_value_from_the_environment() {
    let dir = TempDir::new("secrets");
    for (i, (kind, text)) in CASES.iter().enumerate() {
        let file = dir.write(&format!("r{i}.yaml"), text);
        let path = file.to_str().unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
            .args(["check-config", path])
            .env("S", SECRET)
            .env("T", "a-token-of-32-characters-or-more-0123456789")
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{kind}: {all}");
        assert!(all.contains("${S}") || all.contains(path), "{kind}: {all}");
        assert_hidden(&format!("check-config, {kind}"), &all);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
            .args(["serve", "--config", path, "--listen", "127.0.0.1:0"])
            .env("S", SECRET)
            .env("T", "a-token-of-32-characters-or-more-0123456789")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "serve, {kind}: {err}");
        assert_hidden(&format!("serve, {kind}"), &err);
    }
}

/// A reload of each bad file: its error is in the log and on
/// `/v1/status`, and neither shows any part of the value; nor does a good
/// reload's log line naming the rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reload_error_or_status_field_prints_a_value() {
    let dir = TempDir::new("secrets-reload");
    let good = "rules:\n  - name: \"${N}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n";
    let file = dir.write("rules.yaml", good);
    let s = Server::start_env(
        &["--config", file.to_str().unwrap()],
        &[
            ("S", SECRET),
            ("N", "XQZRULENAME"),
            ("T", "a-token-of-32-characters-or-more-0123456789"),
        ],
    );
    let c = client();
    let mut log = Vec::new();
    // Certificates are read at start only: a reload does not check them.
    let cases = CASES.iter().filter(|(kind, _)| *kind != "file path");
    for (i, (kind, text)) in cases.enumerate() {
        dir.write("rules.yaml", text);
        s.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(30);
        let body = loop {
            let metrics = util::text(c.get(s.url("/metrics"))).await;
            let errors = metrics
                .lines()
                .find_map(|l| l.strip_prefix("spillway_rules_reload_errors_total "))
                .map(|n| n.trim().parse::<u64>().unwrap());
            if errors == Some(i as u64 + 1) {
                break util::text(c.get(s.url("/v1/status"))).await;
            }
            assert!(
                Instant::now() < deadline,
                "{kind}: the reload was not refused"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(status["last_reload_error"].is_string(), "{kind}: {status}");
        assert_hidden(&format!("/v1/status, {kind}"), &body);
        log.extend(s.drain_logs());
    }
    dir.write("rules.yaml", good);
    s.signal("HUP");
    let line = s.wait_line("rules reloaded");
    assert!(line.contains("${N}"), "{line}");
    log.push(line);
    let log = log.join("\n");
    assert!(log.contains("rules file rejected"), "{log}");
    assert_hidden("the log", &log);
    assert_hidden("/v1/status", &util::text(c.get(s.url("/v1/status"))).await);
}
