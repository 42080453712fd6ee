//! envoyproxy/ratelimit's configuration files, read as ratelimit reads
//! them: each config of its repository written again under tests/envoy/
//! and accepted or refused as ratelimit accepts or refuses it; wildcards
//! anywhere in a value, `share_threshold`, several limits on one
//! descriptor, a missing `requests_per_unit`, and a config directory taken
//! up on reload, end to end through the real binary with a real gRPC
//! client.

use std::path::{Path, PathBuf};

use spillway_server::config::{self, ConfigErrors};
use spillway_server::grpc::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, SHOULD_RATE_LIMIT, Unit,
};
use spillway_server::grpc::{Action, Domain, Domains, find};
use tonic::transport::Channel;

use crate::util::{self, Server, TempDir, eventually};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/envoy")
        .join(rel)
}

fn load(files: &[&str], merge: bool) -> Result<Vec<Domain>, ConfigErrors> {
    let paths: Vec<PathBuf> = files.iter().map(|f| fixture(f)).collect();
    config::load_envoy_all(&paths, merge)
}

/// What ratelimit does with a case: loads it, or refuses it with (a part of
/// spillway's message, line, column) in the last file.
enum Verdict {
    Accept,
    Reject(&'static str, u64, u64),
}

/// Every config in envoyproxy/ratelimit's repository (test/config,
/// examples/ratelimit/config, test/integration/runtime), and the file
/// combinations its config tests load, each with its fixture here and what
/// ratelimit does with it: spillway does the same. (The table is in
/// docs/ENVOY.md.)
#[test]
fn ratelimit_repository_configs_are_accepted_and_refused_as_ratelimit_does() {
    use Verdict::{Accept, Reject};
    let cases: &[(&str, &[&str], bool, Verdict)] = &[
        (
            "test/config/basic_config.yaml",
            &["accept/nested_defaults.yaml"],
            false,
            Accept,
        ),
        (
            "test/config/duplicate_domain.yaml (alone)",
            &["accept/domain_without_descriptors.yaml"],
            false,
            Accept,
        ),
        (
            "basic_config.yaml + duplicate_domain.yaml",
            &[
                "accept/nested_defaults.yaml",
                "accept/domain_without_descriptors.yaml",
            ],
            false,
            Reject("duplicate domain \"shop\"", 3, 9),
        ),
        (
            "basic_config.yaml + duplicate_domain.yaml, merged",
            &[
                "accept/nested_defaults.yaml",
                "accept/domain_without_descriptors.yaml",
            ],
            true,
            Accept,
        ),
        (
            "merge_domain_key1.yaml + merge_domain_key2.yaml",
            &["accept/merge_first.yaml", "accept/merge_second.yaml"],
            false,
            Reject("duplicate domain \"split\"", 2, 9),
        ),
        (
            "merge_domain_key1.yaml + merge_domain_key2.yaml, merged",
            &["accept/merge_first.yaml", "accept/merge_second.yaml"],
            true,
            Accept,
        ),
        (
            "merge_domain_key1.yaml twice, merged",
            &["accept/merge_first.yaml", "accept/merge_first.yaml"],
            true,
            Reject("duplicate descriptor composite key 'split.color_red'", 4, 5),
        ),
        (
            "test/config/metadata.yaml",
            &["accept/metadata.yaml"],
            false,
            Accept,
        ),
        (
            "test/config/shadowmode_config.yaml",
            &["accept/shadow.yaml"],
            false,
            Accept,
        ),
        (
            "test/config/share_threshold.yaml",
            &["accept/share_threshold.yaml"],
            false,
            Accept,
        ),
        (
            "test/config/wildcard.yaml",
            &["accept/wildcards.yaml"],
            false,
            Accept,
        ),
        (
            "examples/ratelimit/config/config.yaml",
            &["accept/document_marker.yaml"],
            false,
            Accept,
        ),
        (
            "examples/ratelimit/config/example.yaml",
            &["accept/everything.yaml"],
            false,
            Accept,
        ),
        (
            "both examples/ratelimit/config files, one directory",
            &["accept/document_marker.yaml", "accept/everything.yaml"],
            false,
            Accept,
        ),
        (
            "test/integration/.../config/another.yaml",
            &["accept/integration_many_keys.yaml"],
            false,
            Accept,
        ),
        (
            "test/integration/.../config/basic.yaml",
            &["accept/integration_basic.yaml"],
            false,
            Accept,
        ),
        (
            "test/integration/.../config/share_threshold.yaml",
            &["accept/integration_share.yaml"],
            false,
            Accept,
        ),
        (
            "test/integration/runtime/current/ratelimit/reload.yaml",
            &["accept/integration_reload.yaml"],
            false,
            Accept,
        ),
        (
            "test/config/bad_limit_unit.yaml",
            &["reject/bad_unit.yaml"],
            false,
            Reject("unit \"fortnight\": expected second, minute", 6, 13),
        ),
        (
            "test/config/bad_yaml.yaml",
            &["reject/not_yaml.yaml"],
            false,
            Reject("quoted scalar", 4, 1),
        ),
        (
            "test/config/duplicate_key.yaml",
            &["reject/duplicate_composite.yaml"],
            false,
            Reject(
                "duplicate descriptor composite key 'd.k_v' (first at line 3)",
                6,
                10,
            ),
        ),
        (
            "test/config/empty_domain.yaml",
            &["reject/no_domain.yaml"],
            false,
            Reject("no `domain:`", 0, 0),
        ),
        (
            "test/config/empty_key.yaml",
            &["reject/no_key.yaml"],
            false,
            Reject("descriptor without a `key:`", 3, 5),
        ),
        (
            "test/config/misspelled_key.yaml",
            &["reject/misspelled_rate_limit.yaml"],
            false,
            Reject("unknown field `ratelimit`", 5, 5),
        ),
        (
            "test/config/misspelled_key2.yaml",
            &["reject/misspelled_requests_per_unit.yaml"],
            false,
            Reject("unknown field `requestsperunit`", 7, 7),
        ),
        (
            "test/config/non_map_list.yaml",
            &["reject/list_of_strings.yaml"],
            false,
            Reject("expected a map", 3, 5),
        ),
        (
            "test/config/non_string_key.yaml",
            &["reject/number_key.yaml"],
            false,
            Reject("unknown field `1.5`", 1, 1),
        ),
        (
            "test/config/replaces_empty.yaml",
            &["reject/replaces_empty.yaml"],
            false,
            Reject("a `replaces` entry needs a name", 10, 15),
        ),
        (
            "test/config/replaces_self.yaml",
            &["reject/replaces_self.yaml"],
            false,
            Reject("a limit cannot replace itself: \"me\"", 10, 21),
        ),
        (
            "test/config/unlimited_with_unit.yaml",
            &["reject/unlimited_with_unit.yaml"],
            false,
            Reject("no unit with `unlimited: true`", 6, 13),
        ),
    ];
    for (ratelimit, files, merge, verdict) in cases {
        let got = load(files, *merge);
        match (verdict, got) {
            (Accept, Ok(domains)) => assert!(!domains.is_empty(), "{ratelimit}"),
            (Accept, Err(e)) => panic!("{ratelimit}: ratelimit accepts it, spillway said {e}"),
            (Reject(..), Ok(_)) => panic!("{ratelimit}: ratelimit refuses it, spillway accepted"),
            (Reject(want, line, column), Err(e)) => {
                assert_eq!(e.0.len(), 1, "{ratelimit}: {e}");
                let err = &e.0[0];
                assert!(err.message.contains(want), "{ratelimit}: {e}");
                assert_eq!((err.line, err.column), (*line, *column), "{ratelimit}: {e}");
                let last = files.last().unwrap();
                assert!(err.file.ends_with(last), "{ratelimit}: {e}");
            }
        }
    }
    // Every fixture stands for a case above, and no file is left out.
    for dir in ["accept", "reject"] {
        for f in std::fs::read_dir(fixture(dir)).unwrap() {
            let name = format!("{dir}/{}", f.unwrap().file_name().to_string_lossy());
            assert!(
                cases
                    .iter()
                    .any(|(_, files, _, _)| files.contains(&name.as_str())),
                "{name} is in no case"
            );
        }
    }
}

fn parse(text: &str) -> Result<Domain, ConfigErrors> {
    config::parse_envoy("f.yaml", text)
}

/// ratelimit reads its files leniently where YAML leaves a field out, and
/// only the first document; spillway reads them the same way.
#[test]
fn missing_fields_are_empty_and_only_the_first_document_counts() {
    let d = parse(
        "domain: d\ndescriptors:\n  - key: ip\n    value: 6.6.6.6\n    rate_limit:\n      unit: hour\n  - key: any\n    value: ''\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n  - key: nothing\n    rate_limit: ~\n---\nthis: [is never read\n",
    )
    .unwrap();
    assert!(
        matches!(
            &d.nodes[0].action,
            Action::Ban {
                unit: Unit::Hour,
                shadow: false,
                ..
            }
        ),
        "no requests_per_unit is 0: {:?}",
        d.nodes[0].action
    );
    assert_eq!(d.nodes[1].value, None, "an empty value is the key alone");
    assert!(matches!(d.nodes[2].action, Action::None));
    // Only what ratelimit's first document holds: a second domain in the
    // same file is not read either.
    let d = parse("domain: one\n---\ndomain: two\n").unwrap();
    assert_eq!(d.name, "one");
    // Scalars that YAML types as numbers or booleans are text, as in
    // ratelimit's loader.
    let d = parse("domain: 7\ndescriptors:\n  - key: status\n    value: 404\n  - key: flag\n    value: true\n").unwrap();
    assert_eq!(d.name, "7");
    assert_eq!(d.nodes[0].value.as_deref(), Some("404"));
    assert_eq!(d.nodes[1].value.as_deref(), Some("true"));
    // Flags and metadata are kept.
    let d = parse(
        "domain: d\ndescriptors:\n  - key: q\n    value: x*\n    share_threshold: true\n    quota_mode: true\n    detailed_metric: true\n    metadata: { team: { name: a } }\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    )
    .unwrap();
    let n = &d.nodes[0];
    assert!(n.share_threshold && n.quota_mode && n.detailed_metric);
    assert_eq!(
        n.metadata.as_deref().unwrap()["team"]["name"],
        serde_json::json!("a")
    );
}

/// Refusals of spillway's own: each located, each saying what to do.
#[test]
fn refusals_name_line_column_and_cause() {
    for (text, want, line, column) in [
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: plain\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
            "share_threshold needs a wildcard value",
            5,
            22,
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    limits: []\n",
            "limits: list at least one limit",
            4,
            13,
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n    limits: [ { gcra: { rate: 1/s } } ]\n",
            "give one of rate_limit",
            3,
            5,
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    limits:\n      - fixed_window: { limit: 0, window: 1m }\n",
            "limit must be at least 1",
            5,
            32,
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: -1 }\n",
            "requests_per_unit -1 must be 0 to 4294967295",
            4,
            52,
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { requests_per_unit: 5 }\n",
            "rate_limit needs a unit",
            4,
            17,
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    value: w\n",
            "duplicate key `value`",
            5,
            5,
        ),
        (
            "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n",
            "duplicate descriptor composite key 'd.a_b'",
            4,
            10,
        ),
        ("domain: ''\n", "domain must not be empty", 1, 9),
        ("", "no `domain:`", 0, 0),
        ("# nothing\n", "no `domain:`", 0, 0),
    ] {
        let e = parse(text).unwrap_err();
        let first = &e.0[0];
        assert!(first.message.contains(want), "{text:?}: {e}");
        assert_eq!((first.line, first.column), (line, column), "{text:?}: {e}");
    }
    // An unlimited limit ignores a unit it could not read anyway, as
    // ratelimit does.
    assert!(parse("domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: never }\n").is_ok());
    // Several errors: all of them.
    let e = parse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: eon }\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: 1, name: x, replaces: [ { name: x } ] }\n").unwrap_err();
    assert_eq!(e.0.len(), 2, "{e}");
}

fn key_of(domains: &Domains, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
    find(&domains.get(domain)?.nodes, entries).map(|m| m.key)
}

/// Matching cases of ratelimit's config tests, on the fixtures that stand
/// for its wildcard and share_threshold files: which values match, and
/// which share a counter.
#[test]
fn wildcards_and_shared_thresholds_match_as_ratelimit_matches() {
    let domains = Domains::new(
        load(
            &["accept/wildcards.yaml", "accept/share_threshold.yaml"],
            false,
        )
        .unwrap(),
    );
    let k = |e: &[(&str, &str)]| key_of(&domains, "wild", e);
    // A key alone: every value matches, each its own counter.
    assert!(k(&[("any", "x")]).is_some());
    assert_ne!(k(&[("any", "x")]), k(&[("any", "y")]));
    // A trailing star: the prefix and anything after it.
    for v in ["pre", "pre1", "prefix/2"] {
        assert!(k(&[("tail", v)]).is_some(), "{v}");
    }
    assert!(k(&[("tail", "pr")]).is_none());
    // Without a star, only the value itself.
    assert!(k(&[("exact", "pre")]).is_some());
    assert!(k(&[("exact", "pre1")]).is_none());
    // In the middle: a prefix and a suffix; the star may be empty, and may
    // span a slash.
    for v in ["/api/1/action", "/api//action", "/api/a/b/action"] {
        assert!(k(&[("middle", v)]).is_some(), "{v}");
    }
    for v in ["/api/1/other", "/api/action", "x/api/1/action"] {
        assert!(k(&[("middle", v)]).is_none(), "{v}");
    }
    // Several: each piece in order.
    for v in ["abc", "a1b2c", "abbc"] {
        assert!(k(&[("many", v)]).is_some(), "{v}");
    }
    for v in ["acb", "ab", "bac"] {
        assert!(k(&[("many", v)]).is_none(), "{v}");
    }
    // Nested under an exact value.
    assert!(k(&[("outer", "x"), ("inner", "in2")]).is_some());
    assert!(k(&[("outer", "y"), ("inner", "in2")]).is_none());
    // Without share_threshold, each matching value is its own counter.
    assert_ne!(
        k(&[("middle", "/api/1/action")]),
        k(&[("middle", "/api/2/action")])
    );

    let s = |e: &[(&str, &str)]| key_of(&domains, "shared", e).unwrap();
    assert_eq!(s(&[("doc", "docs/a")]), s(&[("doc", "docs/b")]));
    assert_ne!(s(&[("doc_own", "docs/a")]), s(&[("doc_own", "docs/b")]));
    // The exact value beats the shared wildcard, on its own counter.
    let readme = find(
        &domains.get("shared").unwrap().nodes,
        &[("doc", "docs/readme")],
    )
    .unwrap();
    assert_eq!(readme.node.value.as_deref(), Some("docs/readme"));
    assert_ne!(readme.key, s(&[("doc", "docs/a")]));
    // Both levels shared.
    assert_eq!(
        s(&[("area", "top/1"), ("area", "sub/1")]),
        s(&[("area", "top/2"), ("area", "sub/2")])
    );
    // A shared parent, an unshared wildcard child: the child's values
    // count apart, the parent's together; the key-only grandchild by value.
    let b = |bucket, object, verb| s(&[("bucket", bucket), ("object", object), ("verb", verb)]);
    assert_eq!(b("b/1", "o/1", "get"), b("b/2", "o/1", "get"));
    assert_ne!(b("b/1", "o/1", "get"), b("b/1", "o/2", "get"));
    assert_ne!(b("b/1", "o/1", "get"), b("b/1", "o/1", "put"));
    // Wildcards in the middle and several, shared.
    assert_eq!(
        s(&[("route", "/v1/a/items")]),
        s(&[("route", "/v1/b/items")])
    );
    assert_eq!(
        s(&[("rpc", "svcAmethodBcall")]),
        s(&[("rpc", "svcmethodcall")])
    );
    assert!(key_of(&domains, "shared", &[("route", "/v1/a/other")]).is_none());
}

/// `replaces` names limits by the names written; the service compares
/// internal names, which the domains resolve to.
#[test]
fn replaces_name_every_limit_so_named() {
    let domains = Domains::new(load(&["accept/everything.yaml"], false).unwrap());
    let d = domains.get("all").unwrap();
    let m = find(&d.nodes, &[("category", "account")]).unwrap();
    // per_user (a.b_carol) and nobody_has_this_name (from.proxy.to_other).
    assert_eq!(
        m.node.replaces,
        ["all.a.b_carol", "all.from_proxy.to_other"]
    );
    let unban = find(&d.nodes, &[("from", "proxy"), ("to", "unban")]).unwrap();
    assert_eq!(unban.node.replaces, ["all.a.b_mallory"]);
    let banned = find(&d.nodes, &[("a", "x"), ("b", "mallory")]).unwrap();
    assert!(matches!(&banned.node.action, Action::Ban { name, .. } if name == "all.a.b_mallory"));
    assert_eq!(banned.node.name, "blocked");
}

// --- End to end: the real binary, a real gRPC client. ---

async fn connect(s: &Server) -> Channel {
    let addr = s.listener("gRPC");
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// `spillway serve` with the rules file `rules` and these extra args.
async fn start(dir: &TempDir, rules: &str, args: &[&str]) -> (Server, Channel) {
    let file = dir.write("rules.yaml", rules);
    let mut all = vec![
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    let s = Server::start(&all);
    let ch = connect(&s).await;
    (s, ch)
}

async fn call(ch: &Channel, req: RateLimitRequest) -> RateLimitResponse {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT);
    grpc.unary(
        tonic::Request::new(req),
        path,
        tonic_prost::ProstCodec::default(),
    )
    .await
    .unwrap()
    .into_inner()
}

fn req(domain: &str, entries: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            limit: None,
            hits_addend: None,
        }],
        // The request's cost (a descriptor's own is a charge after the
        // answer, which the service counts whatever the verdict).
        hits_addend: hits,
    }
}

/// The one descriptor's code, after one call.
async fn code(ch: &Channel, domain: &str, entries: &[(&str, &str)]) -> Code {
    let r = call(ch, req(domain, entries, 1)).await;
    Code::try_from(r.statuses[0].code).unwrap()
}

/// `n` calls answered OK, then one over the limit.
async fn allows(ch: &Channel, domain: &str, entries: &[(&str, &str)], n: usize) {
    for i in 0..n {
        assert_eq!(
            code(ch, domain, entries).await,
            Code::Ok,
            "{entries:?} call {i}"
        );
    }
    assert_eq!(
        code(ch, domain, entries).await,
        Code::OverLimit,
        "{entries:?} call {n}"
    );
}

const RULES: &str = "rules: []\n";

/// ratelimit's README example 11 and its share-threshold integration test,
/// on the fixture that stands for its share_threshold.yaml.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_values_share_one_counter_end_to_end() {
    let dir = TempDir::new("envoy-share");
    let file = fixture("accept/share_threshold.yaml");
    let (_s, ch) = start(&dir, RULES, &["--envoy-config", file.to_str().unwrap()]).await;
    let d = "shared";
    // Three for every docs/* value together.
    for v in ["docs/a", "docs/b", "docs/c"] {
        assert_eq!(code(&ch, d, &[("doc", v)]).await, Code::Ok, "{v}");
    }
    assert_eq!(code(&ch, d, &[("doc", "docs/d")]).await, Code::OverLimit);
    // The exact value has its own counter, untouched by the wildcard's.
    allows(&ch, d, &[("doc", "docs/readme")], 1).await;
    // Without the flag, three for each value.
    allows(&ch, d, &[("doc_own", "docs/a")], 3).await;
    allows(&ch, d, &[("doc_own", "docs/b")], 3).await;
    // A shared parent over an unshared child.
    let b = |bucket: &'static str, object: &'static str| {
        [("bucket", bucket), ("object", object), ("verb", "get")]
    };
    assert_eq!(code(&ch, d, &b("b/1", "o/1")).await, Code::Ok);
    assert_eq!(code(&ch, d, &b("b/2", "o/1")).await, Code::Ok);
    assert_eq!(code(&ch, d, &b("b/3", "o/1")).await, Code::OverLimit);
    assert_eq!(code(&ch, d, &b("b/3", "o/2")).await, Code::Ok);
    // In the middle.
    assert_eq!(code(&ch, d, &[("route", "/v1/a/items")]).await, Code::Ok);
    assert_eq!(code(&ch, d, &[("route", "/v1/b/items")]).await, Code::Ok);
    assert_eq!(
        code(&ch, d, &[("route", "/v1/c/items")]).await,
        Code::OverLimit
    );
    let r = call(&ch, req(d, &[("route", "/v1/c/other")], 1)).await;
    assert!(r.statuses[0].current_limit.is_none(), "no match: {r:?}");
}

/// README example 9 and ratelimit's wildcard tests: a star in the middle,
/// several stars; each matching value its own counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_in_the_middle_match_end_to_end() {
    let dir = TempDir::new("envoy-wild");
    let file = fixture("accept/wildcards.yaml");
    let (_s, ch) = start(&dir, RULES, &["--envoy-config", file.to_str().unwrap()]).await;
    let d = "wild";
    allows(&ch, d, &[("middle", "/api/123/action")], 2).await;
    allows(&ch, d, &[("middle", "/api/user-id/action")], 2).await;
    let r = call(&ch, req(d, &[("middle", "/api/123/other")], 1)).await;
    assert!(r.statuses[0].current_limit.is_none(), "{r:?}");
    allows(&ch, d, &[("many", "a-b-c")], 2).await;
    allows(&ch, d, &[("many", "abc")], 2).await;
    let r = call(&ch, req(d, &[("many", "acb")], 1)).await;
    assert!(r.statuses[0].current_limit.is_none(), "{r:?}");
    allows(&ch, d, &[("outer", "x"), ("inner", "in-1")], 2).await;
    let lim = call(&ch, req(d, &[("tail", "prefix")], 1)).await.statuses[0]
        .current_limit
        .clone()
        .unwrap();
    assert_eq!((lim.requests_per_unit, lim.unit), (2, Unit::Minute as i32));
}

/// Beyond ratelimit: several limits on one descriptor, of any algorithm.
/// The limit that decides is reported, under the name written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_on_one_descriptor_end_to_end() {
    let dir = TempDir::new("envoy-limits");
    let rules = r#"
rules: []
domains:
  - domain: multi
    descriptors:
      - key: user
        name: per_user
        limits:
          - fixed_window: { limit: 2, window: 1m }
          - gcra: { rate: 100/1h, burst: 50 }
      - key: tokens
        limits:
          - fixed_window: { limit: 10, window: 1h }
          - sliding_window_log: { limit: 4, window: 1m }
"#;
    let (_s, ch) = start(&dir, rules, &[]).await;
    // The tighter limit decides, and is what current_limit shows.
    for remaining in [1, 0] {
        let r = call(&ch, req("multi", &[("user", "ann")], 1)).await;
        let st = &r.statuses[0];
        assert_eq!(st.code, Code::Ok as i32, "{r:?}");
        let lim = st.current_limit.as_ref().unwrap();
        assert_eq!((lim.requests_per_unit, lim.unit), (2, Unit::Minute as i32));
        assert_eq!(lim.name, "per_user");
        assert_eq!(st.limit_remaining, remaining);
    }
    assert_eq!(
        code(&ch, "multi", &[("user", "ann")]).await,
        Code::OverLimit
    );
    // The other limit decides a cost past its burst.
    let r = call(&ch, req("multi", &[("user", "bob")], 60)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    // Costs: 3 of the sliding log's 4, then 3 more would pass the log and
    // are refused by it. The unnamed limit reports an empty name.
    let r = call(&ch, req("multi", &[("tokens", "t")], 3)).await;
    let st = &r.statuses[0];
    let lim = st.current_limit.as_ref().unwrap();
    assert_eq!((lim.requests_per_unit, lim.unit), (4, Unit::Minute as i32));
    assert_eq!((st.code, st.limit_remaining), (Code::Ok as i32, 1));
    assert_eq!(lim.name, "");
    let r = call(&ch, req("multi", &[("tokens", "t")], 3)).await;
    let st = &r.statuses[0];
    assert_eq!(st.code, Code::OverLimit as i32, "{r:?}");
    let lim = st.current_limit.as_ref().unwrap();
    assert_eq!((lim.requests_per_unit, lim.unit), (4, Unit::Minute as i32));
}

/// A `rate_limit` without `requests_per_unit` is 0 per unit: every call
/// over the limit, as in ratelimit; a second YAML document is not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_requests_per_unit_is_a_ban_end_to_end() {
    let dir = TempDir::new("envoy-ban");
    let file = dir.write(
        "ban.yaml",
        "domain: ban\ndescriptors:\n  - key: ip\n    value: 6.6.6.6\n    rate_limit:\n      unit: hour\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 100 }\n---\nnot: [ read\n",
    );
    let (_s, ch) = start(&dir, RULES, &["--envoy-config", file.to_str().unwrap()]).await;
    for _ in 0..3 {
        let r = call(&ch, req("ban", &[("ip", "6.6.6.6")], 1)).await;
        let st = &r.statuses[0];
        assert_eq!(st.code, Code::OverLimit as i32, "{r:?}");
        let lim = st.current_limit.as_ref().unwrap();
        assert_eq!((lim.requests_per_unit, lim.unit), (0, Unit::Hour as i32));
    }
    assert_eq!(code(&ch, "ban", &[("ip", "1.1.1.1")]).await, Code::Ok);
}

/// `--envoy-config DIR`: its *.yaml and *.yml files; a file added is taken
/// up on reload, a file removed takes its domain away, a broken one keeps
/// the last good configuration; other files are not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_directory_takes_files_added_and_removed_on_reload() {
    let dir = TempDir::new("envoy-dir");
    let conf = TempDir::new("envoy-dir-conf");
    conf.write(
        "first.yml",
        "domain: first\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    conf.write("notes.txt", "domain: [ not a config, not read\n");
    conf.write(".hidden.yaml", "domain: [ not read either\n");
    let (s, ch) = start(
        &dir,
        "reload: { quiet: 100ms }\nrules: []\n",
        &["--envoy-config", conf.0.to_str().unwrap()],
    )
    .await;
    allows(&ch, "first", &[("k", "a")], 1).await;
    let r = call(&ch, req("later", &[("stop", "x")], 1)).await;
    assert!(ok_unlimited(&r), "no such domain yet: {r:?}");

    conf.write(
        "later.yaml",
        &std::fs::read_to_string(fixture("accept/integration_reload.yaml")).unwrap(),
    );
    eventually("the added file's domain applies", || {
        let ch = ch.clone();
        async move { code(&ch, "later", &[("stop", "x")]).await == Code::OverLimit }
    })
    .await;
    allows(&ch, "later", &[("once_a_minute", "x")], 1).await;

    // A broken file: rejected whole, the domains stay.
    conf.write(
        "broken.yaml",
        "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight }\n",
    );
    s.wait_line("fortnight");
    assert_eq!(code(&ch, "later", &[("stop", "x")]).await, Code::OverLimit);

    std::fs::remove_file(conf.0.join("broken.yaml")).unwrap();
    std::fs::remove_file(conf.0.join("first.yml")).unwrap();
    eventually("the removed file's domain is gone", || {
        let ch = ch.clone();
        async move { ok_unlimited(&call(&ch, req("first", &[("k", "a")], 1)).await) }
    })
    .await;
    assert_eq!(code(&ch, "later", &[("stop", "x")]).await, Code::OverLimit);
    let line = s.wait_line("gRPC domains changed");
    assert!(line.contains("first"), "{line}");
}

fn ok_unlimited(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32 && r.statuses[0].current_limit.is_none()
}

fn spillway_with_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"));
    cmd.args(args).env_remove("MERGE_DOMAIN_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the spillway binary")
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Two files of one domain: refused at start, as ratelimit refuses them,
/// unless merging is asked for (`--merge-domains`, or ratelimit's
/// MERGE_DOMAIN_CONFIG); merged, both halves limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_in_two_files_is_refused_unless_merged() {
    let (a, b) = (
        fixture("accept/merge_first.yaml"),
        fixture("accept/merge_second.yaml"),
    );
    let out = spillway_with_env(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--envoy-config",
            path_str(&a),
            "--envoy-config",
            path_str(&b),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("merge_second.yaml:2:9: duplicate domain \"split\"")
            && err.contains("--merge-domains"),
        "{err}"
    );
    // The same domain twice, merged: a composite key given twice is refused.
    let out = spillway_with_env(
        &[
            "check-config",
            "--merge-domains",
            path_str(&a),
            path_str(&a),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("duplicate descriptor composite key 'split.color_red'"),
        "{out:?}"
    );
    // check-config with ratelimit's environment variable.
    let out = spillway_with_env(
        &["check-config", path_str(&a), path_str(&b)],
        &[("MERGE_DOMAIN_CONFIG", "true")],
    );
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("color=red") && stdout.contains("color=blue"),
        "{stdout}"
    );

    let dir = TempDir::new("envoy-merge");
    let (_s, ch) = start(
        &dir,
        RULES,
        &[
            "--merge-domains",
            "--envoy-config",
            path_str(&a),
            "--envoy-config",
            path_str(&b),
        ],
    )
    .await;
    allows(&ch, "split", &[("color", "red")], 3).await;
    allows(&ch, "split", &[("color", "blue")], 5).await;
}

/// `check-config DIR` checks a directory as `serve --envoy-config DIR`
/// loads it, and names every file's errors.
#[test]
fn check_config_reads_a_directory() {
    let conf = TempDir::new("envoy-check-dir");
    for f in ["document_marker.yaml", "everything.yaml"] {
        conf.write(
            f,
            &std::fs::read_to_string(fixture(&format!("accept/{f}"))).unwrap(),
        );
    }
    let out = util::spillway(&["check-config", path_str(&conf.0)]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in [
        "domain db (gRPC):",
        "domain all (gRPC):",
        "name \"blocked\"",
        "quota_mode",
        "replaces [\"per_user\", \"nobody_has_this_name\"]",
    ] {
        assert!(stdout.contains(want), "{want}: {stdout}");
    }
    conf.write(
        "bad.yaml",
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: day }\n",
    );
    conf.write("zz_again.yml", "domain: db\n");
    let out = util::spillway(&["check-config", path_str(&conf.0)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:4:42: no unit with `unlimited: true`"),
        "{err}"
    );
    assert!(
        err.contains("zz_again.yml:1:9: duplicate domain \"db\""),
        "{err}"
    );
}

/// A named `--envoy-config FILE` removed drops its domain on reload; a
/// directory gone (an unmounted volume, say) keeps the last good domains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_file_drops_its_domain_and_a_vanished_directory_does_not() {
    let dir = TempDir::new("envoy-gone");
    let conf = TempDir::new("envoy-gone-conf");
    let file = dir.write(
        "alone.yaml",
        "domain: alone\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 0 }\n",
    );
    conf.write(
        "kept.yaml",
        "domain: kept\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour }\n",
    );
    let (s, ch) = start(
        &dir,
        "reload: { quiet: 100ms }\nrules: []\n",
        &[
            "--envoy-config",
            path_str(&file),
            "--envoy-config",
            path_str(&conf.0),
        ],
    )
    .await;
    assert_eq!(code(&ch, "alone", &[("k", "x")]).await, Code::OverLimit);
    std::fs::remove_file(&file).unwrap();
    eventually("the removed file's domain is gone", || {
        let ch = ch.clone();
        async move { ok_unlimited(&call(&ch, req("alone", &[("k", "x")], 1)).await) }
    })
    .await;
    s.wait_line("envoy config file is gone");
    let moved = conf.0.with_extension("moved");
    std::fs::rename(&conf.0, &moved).unwrap();
    s.wait_line("cannot read the directory");
    assert_eq!(code(&ch, "kept", &[("k", "x")]).await, Code::OverLimit);
    std::fs::rename(&moved, &conf.0).unwrap();
}
