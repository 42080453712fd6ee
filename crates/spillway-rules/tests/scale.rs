//! Files at scale: past the YAML reader's default node budget (250,000
//! nodes, about 14,000 rules), and the protections that stay against
//! hostile YAML, each refused with the limit it hit named.

use spillway_rules::parse;

/// `n` rules of two limits each: 17 nodes a rule.
fn rules(n: usize) -> String {
    let mut s = String::from("rules:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  - name: r{i}\n    api: GET /s/{i}\n    by: ip\n    limits:\n      - gcra: {{ rate: 10/s }}\n      - fixed_window: {{ limit: 100, window: 1h }}\n"
        ));
    }
    s
}

/// Issue 36: `budget breached: Nodes { nodes: 250001 }` at about 14,000
/// rules, a limit no flag could raise.
#[test]
fn a_file_past_the_readers_default_node_budget_is_read() {
    let text = rules(16_000);
    let f = parse("big.yaml", &text).unwrap_or_else(|e| panic!("{}", e.0[0]));
    assert_eq!(f.rules.len(), 16_000);
    assert_eq!(f.rules[12_345].name(), "r12345");
}

/// A duplicate name among many is found (by a map, not a scan) with
/// both places.
#[test]
fn a_duplicate_name_in_a_large_file_names_both_lines() {
    let mut text = rules(16_000);
    text.push_str("  - name: r5\n    limits: [ { gcra: { rate: 1/s } } ]\n");
    let e = parse("big.yaml", &text).unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].line, 16_000 * 6 + 2);
    assert!(
        e.0[0]
            .message
            .contains("duplicate rule name \"r5\" (first used at line 32)"),
        "{e}"
    );
}

#[test]
fn an_alias_bomb_is_refused_naming_the_limit() {
    // Each level twenty aliases of the one before: 20^7 values if
    // expanded.
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..7 {
        let p = i - 1;
        let list = vec![format!("*a{p}"); 20].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{list}]\n"));
    }
    text.push_str("rules: []\n");
    let e = parse("bomb.yaml", &text).unwrap_err();
    let shown = e.to_string();
    assert!(shown.starts_with("bomb.yaml:"), "{shown}");
    assert!(
        shown.contains("alias") || shown.contains("expan"),
        "says it is the aliases: {shown}"
    );
}

#[test]
fn deep_nesting_is_refused_naming_the_limit() {
    let text = format!("rules: []\nx: {}{}\n", "[".repeat(200), "]".repeat(200));
    let e = parse("deep.yaml", &text).unwrap_err();
    let shown = e.to_string();
    assert!(shown.starts_with("deep.yaml:2:"), "{shown}");
    assert!(
        shown.contains("nest") || shown.contains("deep") || shown.contains("depth"),
        "says it is the depth: {shown}"
    );
    let text = format!("rules: []\nx:\n{}", {
        let mut s = String::new();
        for d in 0..100 {
            s.push_str(&format!("{}k{d}:\n", " ".repeat(2 * d + 2)));
        }
        s
    });
    let e = parse("deep.yaml", &text).unwrap_err();
    assert!(e.to_string().contains("nested too deep"), "{e}");
}

/// A huge scalar is bounded by the file's size (`--max-file-bytes`,
/// tested on the binary); below it, a long value is just a long value
/// and its error is about what it is.
#[test]
fn a_huge_scalar_is_an_error_about_the_value() {
    let text = format!(
        "rules:\n  - name: {}\n    limits: [ {{ gcra: {{ rate: 1/s }} }} ]\n    by: {}\n",
        "n".repeat(100),
        "x".repeat(4 << 20)
    );
    let e = parse("huge.yaml", &text).unwrap_err();
    assert_eq!(e.0[0].line, 4, "{e}");
    assert!(e.to_string().len() < 4096, "the value is not echoed whole");
}

/// In a large file (read a chunk of rules at a time), a bomb inside the
/// rules is refused as in a small one, at its place.
#[test]
fn an_alias_bomb_among_many_rules_is_refused_at_its_place() {
    let mut text = rules(16_000);
    let mut bomb = String::from(
        "  - name: bomb\n    limits: [ { gcra: { rate: 1/s } } ]\n    x0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..7 {
        let list = vec![format!("*a{}", i - 1); 20].join(", ");
        bomb.push_str(&format!("    x{i}: &a{i} [{list}]\n"));
    }
    let at = text.find("  - name: r9000\n").unwrap();
    text.insert_str(at, &bomb);
    let line = text[..at].lines().count() + 3;
    let t = std::time::Instant::now();
    let e = parse("bomb.yaml", &text).unwrap_err();
    // Refused at once, at its place (the first thing wrong there is the
    // field it is under), never expanded.
    assert!(t.elapsed() < std::time::Duration::from_secs(30));
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("bomb.yaml:{line}:")),
        "{line}: {shown}"
    );
}

/// A server's main file with `rules_dir:` is refused, not read without
/// the directory's rules (fewer limits than the server enforces).
#[test]
fn a_rules_dir_is_refused_not_skipped() {
    let e = parse("main.yaml", "rules_dir: teams\nrules: []\n").unwrap_err();
    assert!(e.to_string().starts_with("main.yaml:1:"), "{e}");
    assert!(e.to_string().contains("rules_dir"), "{e}");
}
