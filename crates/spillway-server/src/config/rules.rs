//! Rules as the server reads them: checked and built by
//! `spillway_rules::build`, which spillway-client reads the same files
//! with; these tests hold the server's messages and places to it.

#[cfg(test)]
mod tests {
    use super::super::parse;
    use spillway_core::PathMatching;

    fn by(by: &str, head: &str) -> String {
        format!(
            "{head}rules:\n  - name: r\n    by: {by}\n    limits: [ {{ gcra: {{ rate: 1/s }} }} ]\n"
        )
    }

    /// The issue "No way past a limit": `by: usr` passed and turned the
    /// rule off (read as a descriptor no request carries).
    #[test]
    fn a_misspelt_key_part_is_an_error_with_a_suggestion() {
        for (typo, want) in [
            ("usr", "`user`"),
            ("IP", "`ip`"),
            ("User+ip", "`user`"),
            ("rout", "`route`"),
            ("Header:X-Api-Key", "`header:X-Api-Key`"),
            ("heder:x", "`header:x`"),
            ("tenat", "`tenant`"),
        ] {
            let e = parse("r.yaml", &by(typo, "descriptors: [tenant]\n")).unwrap_err();
            assert_eq!(e.0.len(), 1, "{typo}: {e}");
            let shown = e.to_string();
            assert!(
                shown.starts_with("r.yaml:4:9: by: unknown key part"),
                "{shown}"
            );
            assert!(
                shown.contains(&format!("did you mean {want}?")),
                "{typo}: {shown}"
            );
        }
        let e = parse("r.yaml", &by("customer", "")).unwrap_err();
        assert!(!e.to_string().contains("did you mean"), "{e}");
    }

    #[test]
    fn a_declared_descriptor_may_be_used_bare() {
        for (spec, want) in [("tenant", "tenant"), ("user+plan", "user+plan")] {
            let c = parse("r.yaml", &by(spec, "descriptors: [tenant, plan]\n")).unwrap();
            assert_eq!(c.rules[0].by().to_string(), want);
            assert_eq!(c.descriptors, ["tenant", "plan"]);
        }
        for spec in ["user", "ip", "route", "header:X-Key", "user+ip+route"] {
            parse("r.yaml", &by(spec, "")).unwrap();
        }
    }

    #[test]
    fn bad_descriptor_names_are_errors() {
        for list in ["[user]", "[a, a]", "['a b']", "[a+b]", "['']"] {
            let e = parse("r.yaml", &format!("descriptors: {list}\nrules: []\n")).unwrap_err();
            assert_eq!(e.0[0].line, 1, "{list}: {e}");
        }
    }

    #[test]
    fn path_matching_at_the_top_and_per_rule() {
        let text = "\
path_matching: { trailing_slash: false }
rules:
  - name: plain
    api: GET /a
    limits: [ { gcra: { rate: 1/s } } ]
  - name: own
    api: GET /b
    path_matching: { head_as_get: false }
    limits: [ { gcra: { rate: 1/s } } ]
";
        let c = parse("r.yaml", text).unwrap();
        let global = PathMatching {
            trailing_slash: false,
            ..PathMatching::LENIENT
        };
        assert_eq!(c.path_matching, global);
        assert_eq!(c.rules[0].path_matching(), Some(global));
        assert_eq!(
            c.rules[1].path_matching(),
            Some(PathMatching {
                head_as_get: false,
                ..global
            })
        );
        // The default sets nothing on rules.
        let c = parse("r.yaml", &by("user", "")).unwrap();
        assert_eq!(c.path_matching, PathMatching::default());
        assert_eq!(c.rules[0].path_matching(), None);
        let e = parse("r.yaml", "path_matching: { trailing_slashes: false }\n").unwrap_err();
        assert!(
            e.to_string().contains("unknown field `trailing_slashes`"),
            "{e}"
        );
        // `case`: insensitive by default (issue 35: `/LOGIN` was a fresh
        // route), sensitive in the file or on one rule.
        assert!(PathMatching::default().case_insensitive);
        let c = parse(
            "r.yaml",
            "rules:\n  - name: a\n    limits: [ { gcra: { rate: 1/s } } ]\n",
        )
        .unwrap();
        assert!(c.path_matching.case_insensitive);
        assert_eq!(c.rules[0].path_matching(), None);
        let text = "path_matching: { case: sensitive }\nrules:\n  - name: a\n    limits: [ { gcra: { rate: 1/s } } ]\n  - name: b\n    path_matching: { case: insensitive }\n    limits: [ { gcra: { rate: 1/s } } ]\n";
        let c = parse("r.yaml", text).unwrap();
        assert!(!c.path_matching.case_insensitive);
        assert_eq!(c.rules[0].path_matching(), Some(c.path_matching));
        assert_eq!(
            c.rules[1].path_matching().map(|m| m.case_insensitive),
            Some(true)
        );
        let e = parse("r.yaml", "path_matching: { case: lower }\nrules: []\n").unwrap_err();
        assert!(e.to_string().contains("r.yaml:1:"), "{e}");
        assert!(e.to_string().contains("insensitive"), "{e}");
    }

    /// Issue 35: behind Express (which routes `/LOGIN` as `/login`),
    /// `/LOGIN` was a fresh, unlimited route. By default it counts with
    /// `/login`; `case: sensitive` (for an app that routes by case) keeps
    /// the two apart. The server and spillway-rules (the client's and
    /// simulate's reader) read the same default.
    #[test]
    fn login_in_capitals_counts_as_login_unless_case_sensitive() {
        use spillway_store::{Limiter, MemoryStore, Request, RuleSet, SimpleAttributes, block_on};
        let file = |top: &str| {
            format!(
                "{top}rules:\n  - name: login\n    api: POST /login\n    by: ip\n    limits: [ {{ fixed_window: {{ limit: 1, window: 1h }} }} ]\n"
            )
        };
        let admitted = |text: &str, paths: [&str; 2]| -> [bool; 2] {
            let c = parse("r.yaml", text).unwrap();
            let f = spillway_rules::parse("r.yaml", text).unwrap();
            assert_eq!(c.path_matching, f.path_matching, "server and rules agree");
            let store = MemoryStore::new(
                spillway_core::ManualClock::new(spillway_core::Nanos::from_secs(1)),
                Default::default(),
            );
            let l = Limiter::new(
                store,
                RuleSet::with_path_matching(c.rules.clone(), c.path_matching),
            );
            let attrs = SimpleAttributes {
                ip: Some("192.0.2.1"),
                ..Default::default()
            };
            paths.map(|path| {
                let req = Request {
                    method: Some("POST"),
                    path: Some(path),
                    attrs: &attrs,
                    cost: 1,
                };
                block_on(l.check(&req)).decision.allowed
            })
        };
        let default = file("");
        assert_eq!(admitted(&default, ["/login", "/LOGIN"]), [true, false]);
        assert_eq!(admitted(&default, ["/LOGIN", "/Login/"]), [true, false]);
        let sensitive = file("path_matching: { case: sensitive }\n");
        assert_eq!(admitted(&sensitive, ["/login", "/LOGIN"]), [true, true]);
        // A rule of its own.
        let own = default.replace(
            "    by: ip\n",
            "    by: ip\n    path_matching: { case: sensitive }\n",
        );
        assert_eq!(admitted(&own, ["/login", "/LOGIN"]), [true, true]);
    }

    #[test]
    fn reload_quiet() {
        let c = parse("r.yaml", "rules: []\n").unwrap();
        assert_eq!(c.reload_quiet, super::super::DEFAULT_RELOAD_QUIET);
        assert!(c.has_rules);
        let c = parse("r.yaml", "reload: { quiet: 300ms }\n").unwrap();
        assert_eq!(c.reload_quiet, std::time::Duration::from_millis(300));
        assert!(!c.has_rules);
        for bad in ["50ms", "0s", "soon"] {
            let e = parse("r.yaml", &format!("reload: {{ quiet: {bad} }}\n")).unwrap_err();
            assert!(
                e.to_string().starts_with("r.yaml:1:18: reload.quiet"),
                "{bad}: {e}"
            );
        }
    }

    /// `cost: { response_header, estimate }` is read into the rule; a name
    /// that is not a header name, or an estimate no request could pass,
    /// is an error at its line.
    #[test]
    fn a_cost_from_the_answer_is_read_and_checked() {
        let rule = |cost: &str| {
            format!(
                "rules:\n  - name: t\n    by: user\n    cost: {cost}\n    limits: [ {{ token_bucket: {{ capacity: 100, refill: 100/1h }} }} ]\n"
            )
        };
        let c = parse("r.yaml", &rule("{ response_header: X-Tokens-Used }")).unwrap();
        assert_eq!(
            c.rules[0].response_cost(),
            Some(&spillway_core::ResponseCost {
                header: "x-tokens-used".into(),
                estimate: 0
            })
        );
        let c = parse("r.yaml", &rule("{ response_header: x-t, estimate: 10 }")).unwrap();
        assert_eq!(c.rules[0].response_cost().unwrap().estimate, 10);
        for (bad, says) in [
            ("{ response_header: \"x t\" }", "is not a header name"),
            ("{ response_header: \"\" }", "is not a header name"),
            (
                "{ response_header: x, estimate: 101 }",
                "more than the limit's size 100",
            ),
            ("{ header: x }", "unknown field"),
        ] {
            let e = parse("r.yaml", &rule(bad)).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.contains("r.yaml:4"), "{bad}: {e}");
        }
    }
}
