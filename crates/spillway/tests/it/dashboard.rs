//! The dashboard in a real browser: the real binary, headless Chromium
//! driven by chromedriver, traffic from a real client, and every effect
//! the page claims checked through the admin API.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/setup.sh). The
//! screenshot lands in `target/test-artefacts/dashboard.png`; with
//! `SPILLWAY_UPDATE_SCREENSHOT=1` also in `docs/dashboard.png`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_testkit::browser::Browser;

use crate::util::{Server, TempDir, check, client};

const OPS: &str = "ops-token-for-the-dashboard-test";
const VIEWER: &str = "read-token-for-the-dashboard-test";
/// Waits on real processes: generous, for two busy cores.
const WAIT: Duration = Duration::from_secs(30);

const RULES: &str = "\
admin:
  listen: 127.0.0.1:0
  show_keys: true
  tokens:
    - { name: ops, scope: write, env: SPILLWAY_TEST_OPS }
    - { name: viewer, scope: read, env: SPILLWAY_TEST_VIEW }
rules:
  - name: api
    by: header:X-Api-Key
    limits:
      - fixed_window: { limit: 5, window: 1h }
  - name: search
    api: GET /search
    by: user
    limits:
      - gcra: { rate: 2/s, burst: 4 }
";

/// A key chosen to be markup: the page must show it as text.
const HOSTILE: &str = "<img src=x id=pwned>";

/// GETs an admin API path with a token and answers status and JSON.
async fn admin_get(c: &reqwest::Client, base: &str, path: &str, token: &str) -> (u16, Value) {
    let r = c
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// `document.querySelector(css)` has text containing `needle`.
fn shows(b: &Browser, css: &str, needle: &str) -> Option<String> {
    let text = b.find(css).ok()?.text().ok()?;
    text.contains(needle).then_some(text)
}

/// The `data-key` of every top-keys row of rule `api`.
fn top_keys(b: &Browser) -> Vec<String> {
    let v = b
        .execute(
            "return Array.from(document.querySelectorAll('#top tr[data-rule=\"api\"]'))\
             .map(r => r.getAttribute('data-key'))",
            &[],
        )
        .unwrap_or(Value::Null);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// For the picture in the docs only: a few minutes of uneven traffic
/// from a crowd of users and API keys, so the chart has a shape and the
/// tables have rows. Paced by the clock: it stands for real users.
async fn docs_traffic(c: &reqwest::Client, s: &Server, length: Duration) {
    let start = Instant::now();
    let mut n: u64 = 0;
    while start.elapsed() < length {
        let t = start.elapsed().as_secs_f64();
        let burst = (8.0 + 6.0 * (t / 20.0).sin()) as u64;
        for _ in 0..burst {
            n += 1;
            // Users 0 and 1 are heavy; the rest call now and then.
            let user = if n.is_multiple_of(3) { n % 2 } else { n % 40 };
            let body = json!({"api": "GET /search", "user": format!("u-{user}")});
            check(c, s, body).await;
            if n.is_multiple_of(4) {
                // New API keys, and a few that keep calling past their quota.
                let key = if n.is_multiple_of(12) {
                    format!("k-{}", n % 5)
                } else {
                    format!("k-{n}")
                };
                check(c, s, json!({"headers": {"X-Api-Key": key}})).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn artefact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("test-artefacts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_traffic_and_resets_a_key_in_chromium() {
    let dir = TempDir::new("dashboard");
    let file = dir.write("rules.yaml", RULES);
    let s = Server::start_env(
        &["--config", file.to_str().unwrap()],
        &[("SPILLWAY_TEST_OPS", OPS), ("SPILLWAY_TEST_VIEW", VIEWER)],
    );
    let admin = format!("http://{}", s.listener("admin API"));
    let c = client();

    // The page itself: no token needed, locked down by its headers.
    let r = c.get(format!("{admin}/admin/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    let head = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
    assert_eq!(head("content-type"), "text/html; charset=utf-8");
    assert!(head("content-security-policy").contains("default-src 'none'"));
    assert!(head("content-security-policy").contains("connect-src 'self'"));
    assert_eq!(head("x-content-type-options"), "nosniff");
    assert_eq!(head("cache-control"), "no-store");
    let page = r.text().await.unwrap();
    assert!(page.len() < 40 * 1024, "the page is {} bytes", page.len());

    // Traffic: 5 of each key's requests fit in the hour.
    for (key, n) in [("k-mallory", 12), (HOSTILE, 8), ("k-alice", 2)] {
        for _ in 0..n {
            let body = json!({"headers": {"X-Api-Key": key}});
            let (status, _, j) = check(&c, &s, body).await;
            assert!(status == 200 || status == 429, "{status} {j}");
        }
    }
    let keys = "/admin/v1/keys/api/k-mallory";
    let (status, j) = admin_get(&c, &admin, keys, OPS).await;
    assert_eq!(status, 200, "{j}");
    assert_eq!(j["limits"][0]["remaining"], 0, "{j}");

    let b = Browser::start();
    b.set_viewport(1400, 1000).expect("a 1400x1000 viewport");
    b.navigate(&format!("{admin}/admin/"))
        .expect("load the page");

    // No token yet: the API's 401 is explained, not swallowed.
    b.wait_until("the page to ask for a token", WAIT, |b| {
        shows(b, "#message", "valid token")
    });

    // A read token: the page fills.
    b.find("#token").unwrap().send_keys(VIEWER).unwrap();
    b.find("#save-token").unwrap().click().unwrap();
    let stored = b
        .execute("return sessionStorage.getItem('spillway.admin.token')", &[])
        .unwrap();
    assert_eq!(stored, VIEWER, "the token lives in sessionStorage");
    assert_eq!(b.find("#token").unwrap().property("value").unwrap(), "");
    // The chart draws api's denials and admissions.
    b.wait_for(
        "#chart polyline[data-rule=\"api\"][data-outcome=\"denied\"]",
        WAIT,
    );
    b.find("#chart polyline[data-rule=\"api\"][data-outcome=\"allowed\"]")
        .expect("a chart line of api's admissions");
    let top = b.wait_until("k-mallory among the top denied keys", WAIT, |b| {
        let keys = top_keys(b);
        keys.iter().any(|k| k == "k-mallory").then_some(keys)
    });
    // The hostile key is listed as the text it is, and was not parsed.
    assert!(top.iter().any(|k| k == HOSTILE), "{top:?}");
    let pwned = b
        .execute("return document.getElementById('pwned') === null", &[])
        .unwrap();
    assert_eq!(pwned, true, "a key was inserted as markup");
    b.wait_until("the status", WAIT, |b| shows(b, "#status", "memory"));
    b.find("#rules tr[data-rule=\"api\"]")
        .expect("the active rule");
    b.find("#near tr[data-rule=\"api\"]")
        .expect("the rule's near-limit share");
    let msg = b.find("#message").unwrap().text().unwrap();
    assert!(!msg.contains("401"), "still refused: {msg}");

    // Look the key up through the page.
    assert_eq!(
        b.find("#key-rule").unwrap().property("value").unwrap(),
        "api"
    );
    let input = b.find("#key-value").unwrap();
    input.clear().unwrap();
    input.send_keys("k-mallory").unwrap();
    b.find("#key-lookup").unwrap().click().unwrap();
    // No room left under the limit.
    b.wait_for(
        "#key-result tr[data-remaining=\"0\"][data-size=\"5\"]",
        WAIT,
    );

    // A read token may not reset: the page says so, nothing changes.
    b.find("#key-reset").unwrap().click().unwrap();
    b.wait_until("the 403 to be explained", WAIT, |b| {
        shows(b, "#message", "write token")
    });
    let (_, j) = admin_get(&c, &admin, keys, OPS).await;
    assert_eq!(j["limits"][0]["remaining"], 0, "{j}");

    // The write token replaces it; the reset goes through.
    b.find("#token").unwrap().send_keys(OPS).unwrap();
    b.find("#save-token").unwrap().click().unwrap();
    b.find("#key-reset").unwrap().click().unwrap();
    b.wait_until("the reset to be confirmed", WAIT, |b| {
        shows(b, "#message", "Reset api / k-mallory")
    });
    // The page looks it up again: fresh.
    b.wait_for(
        "#key-result tr[data-remaining=\"5\"][data-size=\"5\"]",
        WAIT,
    );
    // Through the API: fresh; the other denied key untouched.
    let (status, j) = admin_get(&c, &admin, keys, OPS).await;
    assert_eq!(status, 200, "{j}");
    let limit = &j["limits"][0];
    assert_eq!(limit["remaining"], limit["size"], "not fresh: {j}");
    assert_eq!(limit["size"], 5, "{j}");
    let hostile = format!("/admin/v1/keys/api/{}", "%3Cimg%20src%3Dx%20id%3Dpwned%3E");
    let (status, j) = admin_get(&c, &admin, &hostile, OPS).await;
    assert_eq!(status, 200, "{j}");
    assert_eq!(j["limits"][0]["remaining"], 0, "{j}");
    let (status, _, j) = check(&c, &s, json!({"headers": {"X-Api-Key": "k-mallory"}})).await;
    assert_eq!(status, 200, "admitted again after the reset: {j}");

    // A temporary block through the page, picked from the top table.
    b.find("#top tr[data-key=\"k-mallory\"]")
        .unwrap()
        .click()
        .unwrap();
    b.find("#override-block").unwrap().click().unwrap();
    let ttl = b.find("#override-ttl").unwrap();
    ttl.clear().unwrap();
    ttl.send_keys("10m").unwrap();
    b.find("#override-reason")
        .unwrap()
        .send_keys("dashboard test")
        .unwrap();
    b.find("#override-save").unwrap().click().unwrap();
    b.wait_until("the override to be confirmed", WAIT, |b| {
        shows(b, "#message", "Saved an override of api / k-mallory")
    });
    let over = "/admin/v1/overrides/api/k-mallory";
    let (status, j) = admin_get(&c, &admin, over, OPS).await;
    assert_eq!(status, 200, "{j}");
    assert_eq!(j["block"], true, "{j}");
    assert_eq!(j["reason"], "dashboard test", "{j}");
    assert_eq!(j["by"], "ops", "{j}");
    let (status, _, j) = check(&c, &s, json!({"headers": {"X-Api-Key": "k-mallory"}})).await;
    assert_eq!(status, 429, "blocked: {j}");
    b.wait_until("the key's block to show", WAIT, |b| {
        shows(b, "#key-result", "blocked until")
    });

    // Nothing came from anywhere but this server.
    let loaded = b
        .execute(
            "return performance.getEntriesByType('resource').map(e => e.name)",
            &[],
        )
        .unwrap();
    let loaded = loaded.as_array().expect("a list");
    assert!(!loaded.is_empty(), "the page called no API");
    for url in loaded {
        let url = url.as_str().unwrap_or_default();
        assert!(
            url.starts_with(&format!("{admin}/")),
            "{url} is not same-origin"
        );
    }

    let update_docs = std::env::var("SPILLWAY_UPDATE_SCREENSHOT").as_deref() == Ok("1");
    if update_docs {
        docs_traffic(&c, &s, Duration::from_secs(150)).await;
    }
    // Let one more refresh land, then keep a picture of the page.
    b.wait_until("a refresh with the block in place", WAIT, |b| {
        shows(b, "#updated", "updated")
    });
    // The whole page in one picture: as tall as its content.
    let height = b
        .execute("return document.documentElement.scrollHeight", &[])
        .unwrap();
    let height = height.as_u64().unwrap_or(1000).clamp(1000, 2000);
    b.set_viewport(1400, u32::try_from(height).unwrap())
        .unwrap();
    b.execute("window.scrollTo(0, 0)", &[]).unwrap();
    let png = b.screenshot().expect("a screenshot");
    let dir = artefact_dir();
    std::fs::create_dir_all(&dir).expect("create target/test-artefacts");
    let path = dir.join("dashboard.png");
    std::fs::write(&path, &png).expect("write the screenshot");
    println!("screenshot: {}", path.display());
    if update_docs {
        assert!(png.len() < 1024 * 1024, "{} bytes: too big", png.len());
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard.png");
        std::fs::write(&docs, &png).expect("write docs/dashboard.png");
        println!("screenshot: {}", docs.display());
    }
}

/// A key longer than the list's cut (issue 28): picked from the top
/// table and blocked through the page, the block holds for the client's
/// whole key (the page used to send the cut form, another key, and the
/// client stayed admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_blocks_a_long_top_key_whole_in_chromium() {
    let dir = TempDir::new("dashboard-long");
    let file = dir.write("rules.yaml", RULES);
    let s = Server::start_env(
        &["--config", file.to_str().unwrap()],
        &[("SPILLWAY_TEST_OPS", OPS), ("SPILLWAY_TEST_VIEW", VIEWER)],
    );
    let admin = format!("http://{}", s.listener("admin API"));
    let c = client();
    let long = format!("k-{}", "L".repeat(400));
    for _ in 0..7 {
        check(&c, &s, json!({"headers": {"X-Api-Key": long}})).await;
    }
    let (status, top) = admin_get(
        &c,
        &admin,
        "/admin/v1/top?rule=api&by=denied&window=5m",
        OPS,
    )
    .await;
    assert_eq!(status, 200, "{top}");
    let k = &top["keys"][0];
    assert_eq!(k["cut"], true, "{k}");
    let hash = k["hash"].as_str().unwrap().to_string();

    let b = Browser::start();
    b.set_viewport(1400, 1000).expect("a 1400x1000 viewport");
    b.navigate(&format!("{admin}/admin/"))
        .expect("load the page");
    b.find("#token").unwrap().send_keys(OPS).unwrap();
    b.find("#save-token").unwrap().click().unwrap();
    let row = format!("#top tr[data-hash=\"{hash}\"]");
    b.wait_for(&row, WAIT);
    b.find(&row).unwrap().click().unwrap();
    // The key tool holds the whole key, not the cut one shown.
    b.wait_until("the whole key in the key tool", WAIT, |b| {
        let v = b.find("#key-value").ok()?.property("value").ok()?;
        (v == long).then_some(v)
    });
    b.find("#override-block").unwrap().click().unwrap();
    b.find("#override-reason")
        .unwrap()
        .send_keys("long key")
        .unwrap();
    b.find("#override-save").unwrap().click().unwrap();
    b.wait_until("the override to be confirmed", WAIT, |b| {
        shows(b, "#message", "Saved an override of api / k-LLL")
    });
    let (status, j) = admin_get(&c, &admin, &format!("/admin/v1/overrides/api/{long}"), OPS).await;
    assert_eq!(status, 200, "the whole key has the override: {j}");
    assert_eq!(j["block"], true, "{j}");
    // Reset the count: only the block can deny now.
    let r = c
        .delete(format!("{admin}/admin/v1/keys/api/{long}"))
        .bearer_auth(OPS)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, _, j) = check(&c, &s, json!({"headers": {"X-Api-Key": long}})).await;
    assert_eq!(status, 429, "the client is blocked: {j}");
}
