//! A configuration in parts (issue 36, item 6): `--config DIR` and
//! `rules_dir:`. Every file is part of one rule set; a name used by two
//! files is refused with both places; a changed, added or removed file
//! applies alone, and a bad one keeps its last good version while the
//! others apply, as `/v1/status` says.
//!
//! No test waits a fixed time for a reload: each polls the server with a
//! generous deadline, so a busy machine only makes it slower.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{self, Server, TempDir, check, client};

/// Long enough for a loaded 2-core machine; only reached on failure.
const DEADLINE: Duration = Duration::from_secs(30);

/// Keeps the tests fast: each changed file applies 200 ms after its last
/// write.
const SETTINGS: &str = "reload: { quiet: 200ms }\n";

/// A rule admitting one request an hour per user on `api`.
fn rule(name: &str, api: &str) -> String {
    format!(
        "  - name: {name}\n    api: {api}\n    by: user\n    limits:\n      - fixed_window: {{ limit: 1, window: 1h }}\n"
    )
}

/// A rules file of `rules`: (name, api) each.
fn rules(list: &[(&str, &str)]) -> String {
    let mut s = String::from("rules:\n");
    for (name, api) in list {
        s.push_str(&rule(name, api));
    }
    s
}

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

/// The HTTP status of a check of `api` for `user`.
async fn decide(s: &Server, api: &str, user: &str) -> u16 {
    check(&client(), s, json!({"api": api, "user": user}))
        .await
        .0
}

/// Writes `text` into `dir/name` whole (written aside, then renamed in).
fn write_in(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Whether a rule limits `api` (one a user an hour): a fresh user is
/// admitted once, then refused.
async fn limited(s: &Server, api: &str, user: &str) -> bool {
    decide(s, api, user).await == 200 && decide(s, api, user).await == 429
}

/// The file names `/v1/status` lists as bad.
fn bad_files(st: &Value) -> Vec<String> {
    st["rules_files"]["bad"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| {
                    Path::new(b["file"].as_str().unwrap())
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Three files, one rule set: each file's rule decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_three_files_decides_by_each_files_rules() {
    let dir = TempDir::new("dir-three");
    dir.write(
        "00-settings.yaml",
        &format!("{SETTINGS}{}", rules(&[("s", "/s")])),
    );
    dir.write("billing.yaml", &rules(&[("b", "/b")]));
    dir.write("search.yml", &rules(&[("q", "/q"), ("q2", "/q2")]));
    let s = Server::start(&["--config", arg(&dir.0)]);
    for api in ["/s", "/b", "/q", "/q2"] {
        assert!(limited(&s, api, "u").await, "{api} is not limited");
    }
    assert_eq!(decide(&s, "/none", "u").await, 200);
    let st = status_until(&s, "the files are not in the status", |st| {
        st["rules_files"]["count"] == 3
    })
    .await;
    assert_eq!(st["rules"], 4, "{st}");
    assert_eq!(st["rules_files"]["bad_count"], 0, "{st}");
    assert!(st["last_reload_error"].is_null(), "{st}");
    let out = util::spillway(&["check-config", "--config", arg(&dir.0)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("ok, 4 rules from 3 files"), "{report}");
    assert!(report.contains("search.yml: 2 rules"), "{report}");
}

/// A name two files use is refused at start, by `serve` and by
/// `check-config`, at both places.
#[test]
fn a_name_in_two_files_is_refused_with_both_places() {
    let dir = TempDir::new("dir-dup");
    let a = dir.write("a.yaml", &rules(&[("one", "/1"), ("shared", "/a")]));
    let b = dir.write("b.yaml", &format!("# b\n{}", rules(&[("shared", "/b")])));
    dir.write(
        "c.yaml",
        "rules:\n  - name: bad\n    by: usr\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    );
    let (a, b) = (a.display().to_string(), b.display().to_string());
    let c = dir.0.join("c.yaml").display().to_string();
    let out = util::spillway(&["check-config", "--config", arg(&dir.0)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{b}:3:11: rule name \"shared\" is used by {a}:7:11 too"
        )),
        "{err}"
    );
    // Every file's errors, not only the first file's.
    assert!(
        err.contains(&format!("{c}:3:9: by: unknown key part `usr`")),
        "{err}"
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config", arg(&dir.0)])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let code = child.wait().unwrap().code();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("{b}:3:11")) && err.contains(&format!("{a}:7:11")),
        "{err}"
    );
}

/// An edit applies; a bad edit keeps that file's last good rules (its
/// counters too) while another file's edit applies, and the status names
/// the bad file until it is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_keeps_its_last_good_rules_and_the_others_apply() {
    let dir = TempDir::new("dir-bad");
    dir.write("00-settings.yaml", SETTINGS);
    dir.write("a.yaml", &rules(&[("a", "/a")]));
    dir.write("b.yaml", &rules(&[("b", "/b")]));
    let s = Server::start(&["--config", arg(&dir.0)]);
    assert!(limited(&s, "/a", "u").await);
    // An edit of b: a second rule.
    dir.write("b.yaml", &rules(&[("b", "/b"), ("b2", "/b2")]));
    let st = status_until(&s, "the edit of b did not apply", |st| st["rules"] == 3).await;
    assert_eq!(st["rules_files"]["bad_count"], 0, "{st}");
    assert!(limited(&s, "/b2", "u").await);
    // A bad edit of a, and another edit of b.
    dir.write(
        "a.yaml",
        "rules:\n  - name: a\n    api: /a\n    by: usr\n    limits: [ { fixed_window: { limit: 1, window: 1h } } ]\n",
    );
    dir.write(
        "b.yaml",
        &rules(&[("b", "/b"), ("b2", "/b2"), ("b3", "/b3")]),
    );
    let st = status_until(&s, "the bad file is not named, or b did not apply", |st| {
        st["rules"] == 4 && bad_files(st) == ["a.yaml"]
    })
    .await;
    let bad = &st["rules_files"]["bad"][0];
    assert_eq!(bad["last_good_in_force"], true, "{st}");
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("a.yaml:4:9: by: unknown key part `usr`"),
        "{st}"
    );
    assert!(
        st["last_reload_error"]
            .as_str()
            .unwrap()
            .contains("a.yaml:4:9"),
        "{st}"
    );
    // a's last good rule is in force, its used-up counter too.
    assert_eq!(decide(&s, "/a", "u").await, 429);
    assert!(limited(&s, "/a", "v").await);
    assert!(limited(&s, "/b3", "u").await);
    // Fixed: in force, and no longer named.
    dir.write("a.yaml", &rules(&[("a", "/a"), ("a2", "/a2")]));
    let st = status_until(&s, "the fix did not apply", |st| st["rules"] == 5).await;
    assert_eq!(st["rules_files"]["bad_count"], 0, "{st}");
    assert!(st["last_reload_error"].is_null(), "{st}");
    assert!(limited(&s, "/a2", "u").await);
    assert_eq!(decide(&s, "/a", "u").await, 429, "a's counter was reset");
}

/// A file that takes a name another file holds is refused (that file's
/// last good version stays), and applies once the name is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_taken_on_reload_waits_until_it_is_free() {
    let dir = TempDir::new("dir-clash");
    dir.write("00-settings.yaml", SETTINGS);
    dir.write("a.yaml", &rules(&[("a", "/a")]));
    dir.write("b.yaml", &rules(&[("b", "/b"), ("moving", "/m")]));
    let s = Server::start(&["--config", arg(&dir.0)]);
    dir.write("a.yaml", &rules(&[("a", "/a"), ("moving", "/m2")]));
    let st = status_until(&s, "the clash is not named", |st| {
        bad_files(st) == ["a.yaml"]
    })
    .await;
    let e = st["rules_files"]["bad"][0]["error"].as_str().unwrap();
    assert!(
        e.contains("rule name \"moving\" is used by") && e.contains("b.yaml:7:11"),
        "{e}"
    );
    assert!(limited(&s, "/m", "u").await, "b's rule left");
    dir.write("b.yaml", &rules(&[("b", "/b")]));
    status_until(&s, "a did not apply once the name was free", |st| {
        st["rules_files"]["bad_count"] == 0 && st["rules"] == 3
    })
    .await;
    // A user of its own: the rule's counters may carry over.
    assert!(limited(&s, "/m2", "w").await);
    assert_eq!(decide(&s, "/m", "w").await, 200);
}

/// A removed file takes its rules away, an added one brings its own; an
/// emptied directory (an unmounted volume) keeps every rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_and_added_files_and_an_emptied_directory() {
    let dir = TempDir::new("dir-rm");
    let root = TempDir::new("dir-rm-settings");
    let settings = root.write(
        "settings.yaml",
        &format!("{SETTINGS}rules_dir: {}\n", arg(&dir.0)),
    );
    let a = dir.write("a.yaml", &rules(&[("a", "/a")]));
    let b = dir.write("b.yaml", &rules(&[("b", "/b")]));
    let s = Server::start(&["--config", arg(&settings)]);
    assert!(limited(&s, "/a", "u").await);
    std::fs::remove_file(&a).unwrap();
    dir.write("c.yaml", &rules(&[("c", "/c")]));
    // main, b and c; a's rule gone, c's in force.
    let st = status_until(&s, "a was not removed or c not added", |st| {
        st["rules_files"]["count"] == 3 && st["version"].as_u64() >= Some(2) && st["rules"] == 2
    })
    .await;
    assert_eq!(st["rules_files"]["bad_count"], 0, "{st}");
    let mut n = 0;
    util::eventually("a's rule is still in force, or c's is not", || {
        n += 1;
        let user = format!("u{n}");
        let s = &s;
        async move {
            decide(s, "/a", &user).await == 200
                && decide(s, "/a", &user).await == 200
                && limited(s, "/c", &user).await
        }
    })
    .await;
    std::fs::remove_file(&b).unwrap();
    std::fs::remove_file(dir.0.join("c.yaml")).unwrap();
    let st = status_until(&s, "the empty directory is not reported", |st| {
        st["rules_files"]["directory_error"].is_string()
    })
    .await;
    assert!(
        st["rules_files"]["directory_error"]
            .as_str()
            .unwrap()
            .contains("no *.yaml"),
        "{st}"
    );
    assert_eq!(st["rules"], 2, "{st}");
    assert!(
        limited(&s, "/b", "u").await,
        "an empty directory dropped the rules"
    );
}

/// `rules_dir:` in a main file: the main file's rules, then the
/// directory's; a directory file holds only `rules:` (refused at start
/// with its place, and on reload with its last good version kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_main_file_with_a_rules_dir() {
    let root = TempDir::new("dir-main");
    let teams = root.0.join("teams");
    std::fs::create_dir_all(&teams).unwrap();
    let main = root.write(
        "spillway.yaml",
        &format!("{SETTINGS}rules_dir: teams\n{}", rules(&[("m", "/m")])),
    );
    write_in(&teams, "a.yaml", &rules(&[("a", "/a")]));
    write_in(
        &teams,
        "b.yaml",
        &format!("store: memory\n{}", rules(&[("b", "/b")])),
    );
    let b = root.0.join("teams/b.yaml").display().to_string();
    let out = util::spillway(&["check-config", arg(&main)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{b}:1:8: `store:` in a file of a rules_dir: its files hold only `rules:`"
        )),
        "{err}"
    );
    write_in(&teams, "b.yaml", &rules(&[("b", "/b")]));
    let s = Server::start(&["--config", arg(&main)]);
    for api in ["/m", "/a", "/b"] {
        assert!(limited(&s, api, "u").await, "{api}");
    }
    write_in(
        &teams,
        "b.yaml",
        &format!("proxy: {{}}\n{}", rules(&[("b", "/b"), ("b2", "/b2")])),
    );
    write_in(&teams, "a.yaml", &rules(&[("a", "/a"), ("a2", "/a2")]));
    let st = status_until(&s, "b is not named bad, or a did not apply", |st| {
        st["rules"] == 4 && bad_files(st) == ["b.yaml"]
    })
    .await;
    assert!(
        st["rules_files"]["bad"][0]["error"]
            .as_str()
            .unwrap()
            .contains("`proxy:` in a file of a rules_dir"),
        "{st}"
    );
    assert!(limited(&s, "/a2", "u").await);
    assert_eq!(decide(&s, "/b2", "u").await, 200);
    assert_eq!(decide(&s, "/b2", "u").await, 200);
    // The main file's own rules change too.
    root.write(
        "spillway.yaml",
        &format!(
            "{SETTINGS}rules_dir: teams\n{}",
            rules(&[("m", "/m"), ("m2", "/m2")])
        ),
    );
    status_until(&s, "the main file did not apply", |st| st["rules"] == 5).await;
    assert!(limited(&s, "/m2", "u").await);
}

/// With the default quiet period (2 s), a one-file change is in force
/// about 2 s after it is written: the figure is printed; the bound is
/// for a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_file_change_applies_after_the_default_quiet_period() {
    let dir = TempDir::new("dir-time");
    dir.write("a.yaml", &rules(&[("a", "/a")]));
    dir.write("b.yaml", &rules(&[("b", "/b")]));
    let s = Server::start(&["--config", arg(&dir.0)]);
    assert_eq!(decide(&s, "/new", "u").await, 200);
    let started = Instant::now();
    dir.write("b.yaml", &rules(&[("b", "/b"), ("new", "/new")]));
    // The used-up counter of the new rule says it is in force.
    let mut n = 0u32;
    loop {
        n += 1;
        if decide(&s, "/new", &format!("u{n}")).await == 200
            && decide(&s, "/new", &format!("u{n}")).await == 429
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not in force after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    eprintln!("a one-file change was in force after {took:?}");
    assert!(
        took >= Duration::from_millis(1900),
        "applied before the quiet period: {took:?}"
    );
}

/// A quiet period of an hour: SIGHUP reads every file at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_every_file_at_once() {
    let dir = TempDir::new("dir-hup");
    dir.write("00-settings.yaml", "reload: { quiet: 1h }\n");
    dir.write("a.yaml", &rules(&[("a", "/a")]));
    dir.write("b.yaml", &rules(&[("b", "/b")]));
    let s = Server::start(&["--config", arg(&dir.0)]);
    dir.write("a.yaml", &rules(&[("a", "/a"), ("a2", "/a2")]));
    std::fs::remove_file(dir.0.join("b.yaml")).unwrap();
    dir.write("c.yaml", &rules(&[("c", "/c")]));
    s.signal("HUP");
    let st = status_until(&s, "SIGHUP did not read every file", |st| {
        st["version"] == 2
    })
    .await;
    assert_eq!(st["rules"], 3, "{st}");
    assert_eq!(st["rules_files"]["count"], 3, "{st}");
    assert!(limited(&s, "/a2", "u").await);
    assert!(limited(&s, "/c", "u").await);
    assert_eq!(decide(&s, "/b", "u").await, 200);
    assert_eq!(decide(&s, "/b", "u").await, 200);
}
