//! The rules of whole spillway rules files: what is read, what is
//! ignored, and where each error is.

use spillway_core::{FailPolicy, Limit, Mode, PathMatching};
use spillway_rules::{Errors, parse};

/// The server's built-in example, as `spillway serve` loads it.
const EXAMPLE: &str = include_str!("../../../examples/rules.yaml");

fn errors(text: &str) -> Errors {
    parse("r.yaml", text).expect_err("the file should be refused")
}

#[test]
fn the_example_file_gives_its_rules() {
    let f = parse("example", EXAMPLE).unwrap();
    let names: Vec<&str> = f.rules.iter().map(|r| r.name()).collect();
    assert_eq!(names, ["login", "default", "uploads", "search"]);
    assert_eq!(f.descriptors, ["tenant"]);
    assert_eq!(f.path_matching, PathMatching::default());
    assert_eq!(f.on_store_error, FailPolicy::Allow);

    let login = &f.rules[0];
    assert_eq!(login.route().map(|r| r.as_str()), Some("POST /v1/login"));
    assert_eq!(login.by().to_string(), "ip");
    assert!(matches!(login.limits(), [Limit::SlidingLog(l)] if l.limit() == 5));
    assert_eq!(login.mode(), Mode::Hard);

    let default = &f.rules[1];
    assert!(default.route().is_none());
    assert!(matches!(
        default.limits(),
        [Limit::SlidingCounter(a), Limit::FixedWindow(b)] if a.limit() == 10 && b.limit() == 500
    ));

    let uploads = &f.rules[2];
    assert_eq!(uploads.by().to_string(), "user+ip");
    assert_eq!(uploads.mode(), Mode::Soft { percent: 10 });
    assert!(matches!(
        uploads.limits(),
        [Limit::TokenBucket(_), Limit::LeakyBucket(_)]
    ));

    let search = &f.rules[3];
    assert_eq!(search.mode(), Mode::Shadow);
    assert_eq!(
        search.path_matching(),
        Some(PathMatching {
            trailing_slash: false,
            ..PathMatching::default()
        })
    );
    assert!(matches!(search.limits(), [Limit::Gcra(_)]));
}

/// A whole server file is accepted: its other sections are not this
/// crate's, whatever they hold.
#[test]
fn sections_that_are_not_rules_are_ignored() {
    let text = "\
store: { redis: { url: redis://127.0.0.1:6379/0, bogus: 1 } }
listen: [not, an, address]
proxy: { upstream: http://127.0.0.1:9000 }
admin: { tokens: [] }
domains: [ { domain: d } ]
rules:
  - name: a
    limits: [ { gcra: { rate: 1/s } } ]
";
    let f = parse("r.yaml", text).unwrap();
    assert_eq!(f.rules.len(), 1);
    // A file without `rules:` limits nothing: an error, not an empty set.
    assert!(parse("r.yaml", "store: memory\n").is_err());
    assert!(parse("r.yaml", "").is_err());
}

#[test]
fn what_is_read_is_read_as_the_server_reads_it() {
    let text = "\
on_store_error: share
descriptors: [tenant, plan]
path_matching: { head_as_get: false }
plans:
  free: { limits: [ { fixed_window: { limit: 10, window: 1m } } ] }
rules:
  - name: t
    by: tenant+user
    plan: { default: free }
  - name: u
    on_store_error: deny
    limits: [ { gcra: { rate: 1/s } } ]
";
    let f = parse("r.yaml", text).unwrap();
    assert_eq!(f.on_store_error, FailPolicy::Share);
    assert_eq!(f.descriptors, ["tenant", "plan"]);
    let matching = PathMatching {
        head_as_get: false,
        ..PathMatching::default()
    };
    assert_eq!(f.path_matching, matching);
    assert_eq!(f.rules[0].by().to_string(), "tenant+user");
    assert!(matches!(f.rules[0].limits(), [Limit::FixedWindow(w)] if w.limit() == 10));
    assert_eq!(f.rules[0].path_matching(), Some(matching));
    assert_eq!(f.rules[1].fail_policy(), Some(FailPolicy::Deny));
}

#[test]
fn errors_carry_file_line_and_column() {
    let e = errors(
        "rules:\n  - name: a\n    limits:\n      - fixed_window: { limit: 0, window: 1m }\n",
    );
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(
        (e.0[0].file.as_str(), e.0[0].line, e.0[0].column),
        ("r.yaml", 4, 32)
    );
    assert_eq!(
        e.to_string(),
        "r.yaml:4:32: limit must be at least 1, not 0"
    );

    let e = errors(
        "descriptors: [tenant]\nrules:\n  - name: r\n    by: tenat\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    );
    assert!(
        e.to_string()
            .starts_with("r.yaml:4:9: by: unknown key part `tenat` (did you mean `tenant`?)"),
        "{e}"
    );
    let e = errors("on_store_error: half\n");
    assert!(
        e.to_string()
            .starts_with("r.yaml:1:17: on_store_error \"half\""),
        "{e}"
    );
    let e = errors(
        "rules:\n  - name: a\n    limits: [ { gcra: { rate: 1/s } } ]\n  - name: a\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    );
    assert!(
        e.to_string()
            .contains("duplicate rule name \"a\" (first used at line 2)"),
        "{e}"
    );
}

/// A typo in rule 1 and a bad limit in rule 3: both, one per line, in
/// file order (the file is read again rule by rule).
#[test]
fn every_error_is_reported_one_per_line() {
    let text = "\
store: memory
rules:
  - name: one
    limts: [ { gcra: { rate: 1/s } } ]
  - name: two
    by: usr
    limits: [ { gcra: { rate: 1/s } } ]
  - name: three
    limits:
      - fixed_window: { limit: many, window: 1m }
";
    let e = errors(text);
    let shown = e.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert!(
        lines[0].starts_with("r.yaml:4:5: unknown field `limts`"),
        "{shown}"
    );
    assert!(
        lines[1].starts_with("r.yaml:6:9: by: unknown key part `usr`"),
        "{shown}"
    );
    assert!(lines[2].starts_with("r.yaml:10:32: "), "{shown}");
}

#[test]
fn a_file_that_cannot_be_read_is_one_error_naming_it() {
    let path = std::path::Path::new("/nonexistent/spillway-rules/rules.yaml");
    let e = spillway_rules::load(path).unwrap_err();
    assert_eq!(e.0.len(), 1);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/spillway-rules/rules.yaml: cannot read: "),
        "{e}"
    );
}

#[test]
fn a_file_is_loaded_from_disk() {
    let dir = std::env::temp_dir().join(format!("spillway-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.yaml");
    std::fs::write(&path, EXAMPLE).unwrap();
    let f = spillway_rules::load(&path).unwrap();
    assert_eq!(f.rules.len(), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

proptest::proptest! {
    /// Any text: rules or located errors, never a panic.
    #[test]
    fn any_text_is_read_or_refused_with_locations(text in "(?s).{0,400}") {
        if let Err(e) = parse("r.yaml", &text) {
            proptest::prop_assert!(!e.0.is_empty());
            for err in &e.0 {
                proptest::prop_assert_eq!(err.file.as_str(), "r.yaml");
            }
        }
    }

    /// The example with a few edits anywhere (numbers, units, brackets,
    /// anchors, odd characters): read or refused, never a panic.
    #[test]
    fn edited_example_files_are_read_or_refused(
        edits in proptest::collection::vec(
            (
                0usize..2048,
                0usize..4,
                proptest::sample::select(vec![
                    "", "0", "-1", "18446744073709551616", "99999999999d", "1e9", "/0s",
                    "ms", "%", "soft 1001%", "{", "}", "[", "]", ":", "- ", "\n", "\t",
                    "&a", "*a", "!!binary", "~", "\"", "'", "é", "\u{0}", "#",
                    "user+ip+user", "header:", "queue: { max_wait: 0s }",
                    "plan: { default: x }", "elastic 50%",
                ]),
            ),
            1..4,
        ),
    ) {
        let mut text = EXAMPLE.to_string();
        for (at, cut, insert) in edits {
            let mut at = at % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = (at + cut).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(at..end, insert);
        }
        if let Err(e) = parse("r.yaml", &text) {
            proptest::prop_assert!(!e.0.is_empty());
            for line in e.to_string().lines() {
                proptest::prop_assert!(line.starts_with("r.yaml"), "{}", line);
            }
        }
    }
}

/// `${NAME}` is read as the server reads it: an unset variable is an
/// error at its place, `$${` a literal `${`.
#[test]
fn environment_references_are_the_servers() {
    let text = "rules:\n  - name: a\n    by: header:${SPILLWAY_RULES_TEST_NEVER_SET}\n    limits: [ { gcra: { rate: 1/s } } ]\n";
    let e = errors(text);
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].line, 3, "{e}");
    assert!(
        e.0[0].message.contains("SPILLWAY_RULES_TEST_NEVER_SET"),
        "{e}"
    );
    let f = parse(
        "r.yaml",
        "rules:\n  - name: \"a$${b}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n",
    )
    .unwrap();
    assert_eq!(f.rules[0].name(), "a${b}");
}

/// Other sections are ignored, so a misspelt `rules:` would otherwise
/// read as a file that limits nothing.
#[test]
fn a_file_without_rules_is_an_error_and_an_empty_list_is_not() {
    let e = spillway_rules::parse("r.yaml", "store: memory\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "r.yaml: no `rules:` section: the file limits nothing"
    );
    let e = spillway_rules::parse("r.yaml", "rulez:\n  - name: x\n").unwrap_err();
    assert!(e.to_string().contains("unknown section `rulez`"), "{e}");
    assert!(
        spillway_rules::parse("r.yaml", "rules: []\n")
            .unwrap()
            .rules
            .is_empty()
    );
}

/// A misspelt section would be skipped as a server section is: an error,
/// with a suggestion.
#[test]
fn a_key_that_is_no_section_is_an_error() {
    let e = spillway_rules::parse("r.yaml", "on_store_eror: deny\nrules: []\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "r.yaml:1:1: unknown section `on_store_eror` (did you mean `on_store_error`?)"
    );
}

/// A server's file read for its rules needs no variable that only the
/// server's sections use (its Redis password, say); one in a rule does.
#[test]
fn only_the_sections_read_need_their_variables() {
    let text = "\
store: { redis: { url: \"redis://:${SPILLWAY_TEST_UNSET_PASSWORD}@127.0.0.1:6379/0\" } }
admin: { tokens: [ { name: ops, token: \"${SPILLWAY_TEST_UNSET_TOKEN}\" } ] }
rules:
  - name: a
    limits: [ { gcra: { rate: 1/s } } ]
";
    assert_eq!(
        spillway_rules::parse("r.yaml", text).unwrap().rules.len(),
        1
    );
    let block = "\
store:
  redis:
    url: \"redis://:${SPILLWAY_TEST_UNSET_PASSWORD}@127.0.0.1:6379/0\"
    sync: { mode: eventual }
rules:
  - name: a
    limits: [ { gcra: { rate: 1/s } } ]
health:
  stale_after: \"${SPILLWAY_TEST_UNSET_STALE}\"
";
    assert_eq!(
        spillway_rules::parse("r.yaml", block).unwrap().rules.len(),
        1
    );
    let in_a_rule = "rules:\n  - name: \"${SPILLWAY_TEST_UNSET_NAME}\"\n    limits: [ { gcra: { rate: 1/s } } ]\n";
    let e = spillway_rules::parse("r.yaml", in_a_rule)
        .unwrap_err()
        .to_string();
    assert!(e.contains("SPILLWAY_TEST_UNSET_NAME"), "{e}");
}

/// `max_debt:` bounds how long a charge past the limit keeps a key out:
/// one period by default, a duration of its own on any algorithm, and
/// refused with its place when zero, negative, or not a duration.
#[test]
fn max_debt_is_a_duration_per_limit_defaulting_to_one_period() {
    let f = parse(
        "r.yaml",
        "\
rules:
  - name: a
    limits:
      - gcra: { rate: 10/s, burst: 20, max_debt: 30s }
      - token_bucket: { capacity: 5, refill: 1/s }
      - fixed_window: { limit: 5, window: 1m, max_debt: 1h }
      - sliding_window_counter: { limit: 5, window: 1m, max_debt: 10s }
      - leaky_bucket: { capacity: 5, leak: 1/s, max_debt: 500ms }
",
    )
    .unwrap();
    let debts: Vec<u64> = f.rules[0]
        .limits()
        .iter()
        .map(|l| l.max_debt().as_u64() / 1_000_000)
        .collect();
    // GCRA 30 s; a bucket's default is its refill of the whole capacity
    // (5 s); a fixed window's debt ends with its window, whatever is set.
    assert_eq!(debts, [30_000, 5_000, 60_000, 10_000, 500]);

    for (value, message) in [
        ("0s", "r.yaml:4:38: max_debt must be longer than zero"),
        ("-1s", "r.yaml:4:38: max_debt: "),
        ("soon", "r.yaml:4:38: max_debt: "),
        (
            "60000d",
            "r.yaml:4:38: max_debt is longer than the longest accepted, 53375 days",
        ),
    ] {
        let e = errors(&format!(
            "rules:\n  - name: a\n    limits:\n      - gcra: {{ rate: 1/s, max_debt: {value} }}\n"
        ));
        assert_eq!(e.0.len(), 1, "{value}: {e}");
        assert!(e.to_string().starts_with(message), "{value}: {e}");
    }
}
