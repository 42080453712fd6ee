//! The rules file end to end (the issue "No way past a limit"): typos and
//! structural errors reported all at once by `check-config`; a reload that
//! applies only complete files; path respellings counted through `serve`.
//!
//! No test here waits a fixed time for a reload: each polls the server's
//! state with a generous deadline, so a busy machine only makes it slower.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{self, Server, TempDir, check, client};

/// Long enough for a loaded 2-core machine; only reached on failure.
const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `/v1/status` until `done` holds for it; returns it.
async fn status_until(s: &Server, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let c = client();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let st: Value = util::json(c.get(s.url("/v1/status"))).await;
        if done(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "{what}: {st}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks about `body` again and again in the background, counting answers
/// that admit it, until the returned flag is set.
fn keep_checking(
    s: &Server,
    body: Value,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<(u64, u64)>) {
    let stop = Arc::new(AtomicBool::new(false));
    let url = s.url("/v1/check");
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let c = client();
        let (asked, admitted) = (AtomicU64::new(0), AtomicU64::new(0));
        while !flag.load(Ordering::Relaxed) {
            let r = c.post(&url).json(&body).send().await.unwrap();
            asked.fetch_add(1, Ordering::Relaxed);
            if r.status().as_u16() != 429 {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (asked.into_inner(), admitted.into_inner())
    });
    (stop, task)
}

/// Writes `parts` into `file` in place, the way a careless writer does:
/// truncate, then each part with a flush between.
fn write_in_place(file: &std::path::Path, parts: &[&str]) {
    let mut f = std::fs::File::create(file).unwrap();
    for p in parts {
        f.write_all(p.as_bytes()).unwrap();
        f.flush().unwrap();
        f.sync_data().unwrap();
    }
}

fn rule(name: &str, api: &str) -> String {
    format!(
        "  - name: {name}\n    api: {api}\n    by: user\n    limits:\n      - fixed_window: {{ limit: 1, window: 1h }}\n"
    )
}

#[test]
fn check_config_reports_three_errors_in_three_places() {
    let dir = TempDir::new("three");
    let text = "\
store: memory
listen: [127.0.0.1]
rules:
  - name: one
    by: usr
    limits: [ { gcra: { rate: 1/s } } ]
  - name: two
    by: user
    limts: [ { gcra: { rate: 1/s } } ]
  - name: three
    by: user
    limits:
      - fixed_window: { limit: 10, window: soon }
";
    let file = dir.write("rules.yaml", text);
    let out = util::spillway(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let f = file.display().to_string();
    for want in [
        format!("{f}:2:9: "),
        format!("{f}:5:9: by: unknown key part `usr` (did you mean `user`?)"),
        format!("{f}:9:5: unknown field `limts`"),
        format!("{f}:13:44: window:"),
    ] {
        assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    }
    assert_eq!(
        err.lines().filter(|l| l.starts_with(&f)).count(),
        4,
        "{err}"
    );
}

/// The issue's report: `by: IP` passed `check-config` and every request
/// skipped the rule.
#[test]
fn a_misspelt_by_fails_check_config_and_a_declared_descriptor_passes() {
    let dir = TempDir::new("typo");
    let with = |head: &str, by: &str| {
        format!(
            "{head}rules:\n  - name: r\n    by: {by}\n    limits: [ {{ gcra: {{ rate: 1/s }} }} ]\n"
        )
    };
    let file = dir.write("rules.yaml", &with("", "IP"));
    let out = util::spillway(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":3:9: by: unknown key part `IP` (did you mean `ip`?)"),
        "{err}"
    );
    let file = dir.write(
        "rules.yaml",
        &with("descriptors: [tenant, plan]\n", "tenant+plan"),
    );
    let out = util::spillway(&["check-config", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("by: tenant+plan"));
}

/// Truncate, then write: the empty file in between is refused (it has no
/// `rules:`), so the used-up limit is enforced throughout, and the
/// counter carries over to the complete file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_then_write_keeps_the_limit_enforced_throughout() {
    let dir = TempDir::new("truncate");
    let head = "reload: { quiet: 300ms }\nrules:\n";
    let file = dir.write("rules.yaml", &format!("{head}{}", rule("r", "/r")));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let body = json!({"api": "/r", "user": "u"});
    assert_eq!(check(&c, &s, body.clone()).await.0, 200);
    assert_eq!(check(&c, &s, body.clone()).await.0, 429);
    let (stop, checker) = keep_checking(&s, body.clone());
    write_in_place(&file, &[]);
    let st = status_until(&s, "the empty file was not refused", |st| {
        st["last_reload_error"].is_string()
    })
    .await;
    assert!(
        st["last_reload_error"]
            .as_str()
            .unwrap()
            .contains("no `rules:`"),
        "{st}"
    );
    assert_eq!(st["version"], 1);
    write_in_place(&file, &[head, &rule("r", "/r"), &rule("more", "/more")]);
    let st = status_until(&s, "the complete file did not apply", |st| {
        st["version"] == 2
    })
    .await;
    assert_eq!(st["rules"], 2);
    assert!(st["last_reload_error"].is_null(), "{st}");
    stop.store(true, Ordering::Relaxed);
    let (asked, admitted) = checker.await.unwrap();
    assert!(asked > 0);
    assert_eq!(admitted, 0, "admitted past the limit during the rewrite");
    assert_eq!(check(&c, &s, body).await.0, 429);
}

/// A file cut between two rules is a valid file with fewer limits; it
/// never applies, because the rest follows within the quiet period (the
/// default 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_cut_between_two_rules_never_applies() {
    let dir = TempDir::new("cut");
    let first = rule("one", "/one");
    let second = rule("two", "/two");
    let file = dir.write("rules.yaml", &format!("rules:\n{first}{second}"));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let body = json!({"api": "/two", "user": "u"});
    assert_eq!(check(&c, &s, body.clone()).await.0, 200);
    assert_eq!(check(&c, &s, body.clone()).await.0, 429);
    let (stop, checker) = keep_checking(&s, body.clone());
    // The cut (rule one alone) is on disk for as long as two writes take;
    // the whole new file (a third rule) after.
    let third = rule("three", "/three");
    write_in_place(&file, &["rules:\n", &first, &format!("{second}{third}")]);
    let st = status_until(&s, "the complete file did not apply", |st| {
        st["version"] != 1
    })
    .await;
    assert_eq!(st["version"], 2, "{st}");
    assert_eq!(st["rules"], 3, "{st}");
    stop.store(true, Ordering::Relaxed);
    let (asked, admitted) = checker.await.unwrap();
    assert!(asked > 0);
    assert_eq!(admitted, 0, "the cut file applied: rule two was off");
    let st: Value = util::json(c.get(s.url("/v1/status"))).await;
    assert_eq!(st["version"], 2, "{st}");
}

/// `rules: []` says "no rules" explicitly, and applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_empty_rules_list_applies() {
    let dir = TempDir::new("norules");
    let head = "reload: { quiet: 300ms }\n";
    let file = dir.write("rules.yaml", &format!("{head}rules:\n{}", rule("r", "/r")));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let body = json!({"api": "/r", "user": "u"});
    assert_eq!(check(&c, &s, body.clone()).await.0, 200);
    assert_eq!(check(&c, &s, body.clone()).await.0, 429);
    write_in_place(&file, &[head, "rules: []\n"]);
    let st = status_until(&s, "rules: [] did not apply", |st| st["version"] == 2).await;
    assert_eq!(st["rules"], 0, "{st}");
    assert_eq!(check(&c, &s, body).await.0, 200);
}

/// A quiet period of an hour: only SIGHUP applies a change, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_without_waiting_for_the_quiet_period() {
    let dir = TempDir::new("hup");
    let text = |r: &str| format!("reload: {{ quiet: 1h }}\nrules:\n{r}");
    let file = dir.write("rules.yaml", &text(&rule("r", "/r")));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    dir.write(
        "rules.yaml",
        &text(&format!("{}{}", rule("r", "/r"), rule("q", "/q"))),
    );
    s.signal("HUP");
    let st = status_until(&s, "SIGHUP did not reload", |st| st["version"] == 2).await;
    assert_eq!(st["rules"], 2, "{st}");
}

/// `HEAD /a` after `GET /a` is used up: denied by default (a `GET`
/// handler answers it upstream), admitted by a rule that turns
/// `head_as_get` off.
#[tokio::test]
async fn head_counts_against_a_used_up_get_through_serve() {
    let dir = TempDir::new("head");
    let text = "\
rules:
  - name: get-a
    api: GET /a
    by: user
    limits: [ { fixed_window: { limit: 1, window: 1h } } ]
  - name: get-b
    api: GET /b
    by: user
    path_matching: { head_as_get: false }
    limits: [ { fixed_window: { limit: 1, window: 1h } } ]
";
    let file = dir.write("rules.yaml", text);
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let ask = |api: &str| json!({"api": api, "user": "u"});
    assert_eq!(check(&c, &s, ask("GET /a")).await.0, 200);
    let (status, _, j) = check(&c, &s, ask("HEAD /a")).await;
    assert_eq!(status, 429, "{j}");
    assert_eq!(j["rule"], "get-a");
    for respelled in ["GET /a/", "GET /a;x=1", "GET /b%2F..%2Fa"] {
        assert_eq!(check(&c, &s, ask(respelled)).await.0, 429, "{respelled}");
    }
    assert_eq!(check(&c, &s, ask("GET /b")).await.0, 200);
    assert_eq!(check(&c, &s, ask("HEAD /b")).await.0, 200);
    assert_eq!(check(&c, &s, ask("GET /b")).await.0, 429);
}

/// Flags are not start-only changes: a proxy started with `--upstream`
/// (which its file does not name) reloads a rules change without warning
/// that the proxy section needs a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_does_not_mistake_flags_for_file_changes() {
    let dir = TempDir::new("reload-flags");
    let text = |n: u32| {
        format!(
            "reload: {{ quiet: 200ms }}\nrules:\n  - name: r\n    by: ip\n    limits: [ {{ fixed_window: {{ limit: {n}, window: 1h }} }} ]\n"
        )
    };
    let file = dir.write("rules.yaml", &text(5));
    let s = Server::start_cmd(
        "proxy",
        &[
            "--config",
            file.to_str().unwrap(),
            "--upstream",
            "http://127.0.0.1:9",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let _ = s.listener("admin API");
    // The watcher starts beside the listeners: a change written before it
    // read the file is no change to it, so write new limits until one is
    // reloaded (no deadline decides the outcome).
    let mut logs = Vec::new();
    let mut reloaded = false;
    for n in 6..40 {
        dir.write("rules.yaml", &text(n));
        let until = Instant::now() + Duration::from_secs(3);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match s.logs.recv_timeout(left) {
                Ok(line) => {
                    reloaded |= line.contains("rules reloaded");
                    logs.push(line);
                }
                Err(_) => break,
            }
        }
        if reloaded {
            break;
        }
    }
    assert!(reloaded, "{logs:#?}");
    assert!(
        !logs.iter().any(|l| l.contains("apply only at start")),
        "{logs:#?}"
    );
}

/// A reload that changes a start-only section says so where an operator
/// looks, `/v1/status`'s `restart_pending`, not only in the log; a
/// reload back clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_only_change_is_pending_in_the_status() {
    let dir = TempDir::new("reload-pending");
    let text = |n: u32, fa: &str| {
        format!(
            "reload: {{ quiet: 200ms }}\n{fa}rules:\n  - name: r\n    by: ip\n    limits: [ {{ fixed_window: {{ limit: {n}, window: 1h }} }} ]\n"
        )
    };
    let file = dir.write("rules.yaml", &text(5, ""));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = crate::util::client();
    let status = || {
        let c = c.clone();
        let url = format!("http://{}/v1/status", s.addr);
        async move { crate::util::json(c.get(url)).await }
    };
    assert_eq!(status().await["restart_pending"], serde_json::json!([]));
    // Written until a reload takes it (the watcher starts beside the
    // listeners: no deadline decides the outcome).
    let fa = "forward_auth: { trusted_proxies: [127.0.0.1/32] }\n";
    let mut n = 6;
    crate::util::eventually("the forward_auth change is pending", || {
        n += 1;
        dir.write("rules.yaml", &text(n, fa));
        let st = status();
        async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            st.await["restart_pending"] == serde_json::json!(["forward_auth"])
        }
    })
    .await;
    crate::util::eventually("back as started, nothing is pending", || {
        n += 1;
        dir.write("rules.yaml", &text(n, ""));
        let st = status();
        async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            st.await["restart_pending"] == serde_json::json!([])
        }
    })
    .await;
}

/// Runs the binary with `args`, `stdin` piped into it; (exit code,
/// stdout, stderr).
fn spillway_piped(args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Start-up is as strict as a reload (issue 28): an empty file, or one
/// with settings but no `rules:`, starts no server; `rules: []` does.
#[test]
fn serve_refuses_a_file_without_rules_as_a_reload_does() {
    let dir = TempDir::new("norules");
    for (name, text) in [
        ("empty.yaml", ""),
        ("comment.yaml", "# rules come later\n"),
        ("settings.yaml", "reload: { quiet: 300ms }\n"),
    ] {
        let file = dir.write(name, text);
        let out = util::spillway(&[
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("no `rules:` key"), "{name}: {err}");
        assert!(err.contains("rules: []"), "{name}: {err}");
    }
    let none = dir.write("none.yaml", "rules: []\n");
    let mut s = Server::start(&["--config", none.to_str().unwrap()]);
    assert!(s.url("/v1/status").starts_with("http"));
    s.signal("TERM");
    assert_eq!(s.wait_exit(DEADLINE), Some(0));
}

/// `check-config` reads `/dev/stdin` and pipes like files and refuses what
/// `serve` refuses: an empty pipe and `garbage: [` used to check as
/// "ok, 0 rules", so `check-config "$tmp" && mv` let them through.
#[test]
fn check_config_reads_pipes_and_refuses_what_serve_refuses() {
    let dir = TempDir::new("pipes");
    let empty = dir.write("empty.yaml", "");
    let out = util::spillway(&["check-config", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `rules:` key"));
    for (input, refused) in [
        ("", "no `rules:` key"),
        ("garbage: [\n", "/dev/stdin:1:"),
        (
            "rules:\n  - name: a\n    limits: [ { gcra: { rate: 0/s } } ]\n",
            "/dev/stdin:3:",
        ),
    ] {
        let (code, out, err) = spillway_piped(&["check-config", "/dev/stdin"], input);
        assert_eq!(code, Some(2), "{input:?}: {out}{err}");
        assert!(err.contains(refused), "{input:?}: {err}");
        assert!(!out.contains("ok"), "{input:?}: {out}");
    }
    let good = "rules:\n  - name: a\n    limits: [ { gcra: { rate: 1/s } } ]\n";
    let (code, out, err) = spillway_piped(&["check-config", "/dev/stdin"], good);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("/dev/stdin: ok, 1 rules"), "{out}");
    let (code, out, _) = spillway_piped(&["check-config", "/dev/stdin"], "rules: []\n");
    assert_eq!(code, Some(0));
    assert!(out.starts_with("/dev/stdin: ok, 0 rules"), "{out}");
    // An envoyproxy/ratelimit file through a pipe: read once, still found.
    let envoy = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let (code, out, err) = spillway_piped(&["check-config", "/dev/stdin"], envoy);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("domains [\"d\"]"), "{out}");
}

/// A process substitution (`<(...)`) is a pipe too: through bash, as the
/// documented guard is written.
#[test]
fn check_config_reads_a_process_substitution() {
    let bin = env!("CARGO_BIN_EXE_spillway");
    let run = |text: &str| {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("\"{bin}\" check-config <(printf '%s' \"$1\")"))
            .arg("bash")
            .arg(text)
            .output()
            .unwrap()
    };
    let out = run("");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run("rules:\n  - name: a\n    limits: [ { gcra: { rate: 0/s } } ]\n");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run("rules:\n  - name: a\n    limits: [ { gcra: { rate: 1/s } } ]\n");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok, 1 rules"));
}
