//! The OpenAPI description says exactly what the server accepts:
//! schemathesis (PyPI, installed by `scripts/setup.sh`) generates requests
//! for every operation of docs/openapi.yaml, valid and invalid, and runs
//! them against the real `spillway serve` with the admin plane and a
//! write token. Any failure of its checks (a 5xx, an answer that breaks
//! its schema, a schema-valid request refused, a schema-violating one
//! accepted) fails this test, and so does an operation left untested.
//! Settings that the schema cannot carry (plan names and limit checks come
//! from the rules file) are in `tests/contract/schemathesis.toml`.

use std::process::Command;

use crate::util::{Server, TempDir};

const WRITE: &str = "contract-write-token-0123456789abcdef";

/// Plans and rules the generated calls can reach: a plan-keyed rule, a
/// user-keyed one, and a composite one (`by: user+ip`, whose admin key
/// paths take two segments: issue 35 found the description wrong there).
const RULES: &str = "admin:
  show_keys: true
  tokens:
    - { name: ops, scope: write, env: SPILLWAY_CONTRACT_WRITE }
plans:
  free: { limits: [ { fixed_window: { limit: 2, window: 1h } } ] }
  pro:  { limits: [ { fixed_window: { limit: 5, window: 1h } } ] }
rules:
  - name: api
    by: header:X-Api-Key
    plan: { default: free }
  - name: users
    by: user
    limits:
      - fixed_window: { limit: 3, window: 1h }
  - name: pair
    by: user+ip
    limits:
      - fixed_window: { limit: 3, window: 1h }
";

/// `python3 -m schemathesis.cli`, or a failure that says how to install it.
fn schemathesis() -> Command {
    let probe = Command::new("python3")
        .args(["-m", "schemathesis.cli", "--version"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {
            let mut c = Command::new("python3");
            c.args(["-m", "schemathesis.cli"]);
            c
        }
        _ => panic!(
            "schemathesis is not installed: run scripts/setup.sh \
             (or: python3 -m pip install --user 'schemathesis==4.32.5')"
        ),
    }
}

#[test]
fn the_server_does_what_docs_openapi_yaml_says() {
    let dir = TempDir::new("contract");
    let rules = dir.write("rules.yaml", RULES);
    let server = Server::start_env(
        &["--config", rules.to_str().unwrap()],
        &[("SPILLWAY_CONTRACT_WRITE", WRITE)],
    );
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = schemathesis()
        .args([
            "--config-file",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/contract/schemathesis.toml"
            ),
            "run",
            &format!("{root}/docs/openapi.yaml"),
            "--url",
            &format!("http://{}", server.addr),
            "-H",
            &format!("Authorization: Bearer {WRITE}"),
            // Bounded for a 2-core CI box (about 10 s), and repeatable:
            // the same seed generates the same requests.
            "--max-examples",
            "10",
            "--seed",
            "1",
            "--no-color",
        ])
        .env("SCHEMATHESIS_HOOKS", "")
        // Its cache (.schemathesis/) goes to the test's own folder.
        .current_dir(&dir.0)
        .output()
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&out.stdout);
    let tail: String = report
        .lines()
        .rev()
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success(),
        "schemathesis found disagreements between docs/openapi.yaml and the server:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every operation of the description was exercised.
    let spec = std::fs::read_to_string(format!("{root}/docs/openapi.yaml")).unwrap();
    let spec: serde_json::Value = serde_saphyr::from_str(&spec).unwrap();
    let operations: usize = spec["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|ops| ops.as_object().unwrap().len())
        .sum();
    assert!(
        report.contains(&format!("Tested: {operations}")),
        "not every one of the {operations} operations was exercised:\n{tail}"
    );
    assert!(
        !report.contains("[500]") && !report.contains("[502]"),
        "{tail}"
    );
    // What the schema cannot spell, said in its descriptions and checked
    // here: a composite key is one segment per part; an empty parameter is
    // absent; a count is decimal digits only.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let c = crate::util::client();
        let get = |path: &str| c.get(server.url(path)).bearer_auth(WRITE).send();
        for (path, want) in [
            ("/admin/v1/keys/pair/alice/203.0.113.7", 200),
            ("/admin/v1/keys/pair/alice", 400),
            ("/admin/v1/keys/pair/alice/203.0.113.7/x", 400),
            ("/admin/v1/plans/pair/alice/%3A%3Affff%3A10.0.0.1", 200),
            ("/admin/v1/audit?limit=", 200),
            ("/admin/v1/audit?limit=%2B5", 400),
            ("/admin/v1/audit?since=%20123", 400),
            ("/admin/v1/audit?since=1795514400000&cache=1", 200),
            ("/admin/v1/top?limit=", 200),
            ("/admin/v1/top?limit=%2B5", 400),
        ] {
            let r = get(path).await.unwrap();
            assert_eq!(r.status().as_u16(), want, "{path}");
        }
        let j: serde_json::Value = get("/admin/v1/keys/pair/alice/%3A%3Affff%3A10.0.0.1")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(j["key"], serde_json::json!(["alice", "10.0.0.1"]), "{j}");
    });
}
