//! Every structural error of a file, not just the first: the file is
//! read again section by section and rule by rule by
//! `spillway_rules::recover` (into the server's whole-file raw struct);
//! these tests hold the server's reports to it.

#[cfg(test)]
mod tests {
    use super::super::parse;

    /// The case: a typo in rule 1, a wrong type in a top-level
    /// section and a bad limit in rule 3, all reported with their places.
    #[test]
    fn three_errors_in_three_places_are_all_reported() {
        let text = "\
store: memory
listen: [1, 2]
rules:
  - name: one
    limts: [ { gcra: { rate: 1/s } } ]
  - name: two
    by: user
    limits: [ { gcra: { rate: 1/s } } ]
  - name: three
    limits:
      - fixed_window: { limit: many, window: 1m }
";
        let e = parse("r.yaml", text).unwrap_err();
        let shown: Vec<String> = e.0.iter().map(ToString::to_string).collect();
        assert_eq!(e.0.len(), 3, "{shown:#?}");
        assert!(shown[0].starts_with("r.yaml:2:9: "), "{shown:#?}");
        assert!(
            shown[1].starts_with("r.yaml:5:5: unknown field `limts`"),
            "{shown:#?}"
        );
        assert!(shown[2].starts_with("r.yaml:11:32: "), "{shown:#?}");
    }

    /// Structural errors and validation errors of the parts that parsed,
    /// in file order.
    #[test]
    fn structural_and_validation_errors_come_together_in_file_order() {
        let text = "\
rules:
  - name: a
    by: usr
    limits: [ { gcra: { rate: 1/s } } ]
  - name: b
    colour: red
    limits: [ { gcra: { rate: 1/s } } ]
  - name: c
    limits: [ { fixed_window: { limit: 0, window: 1m } } ]
";
        let e = parse("r.yaml", text).unwrap_err();
        let lines: Vec<u64> = e.0.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 6, 9], "{e}");
        assert!(e.0[0].message.contains("did you mean `user`?"), "{e}");
    }

    /// A file that cannot be split (an alias, flow style at the top) is
    /// reported as serde reports it: its first error.
    #[test]
    fn a_file_that_cannot_be_split_reports_its_first_error() {
        for text in [
            "x: &a 1\ny: *a\nrules: []\n",
            "{ rules: [], colour: red, size: big }\n",
        ] {
            let e = parse("r.yaml", text).unwrap_err();
            assert_eq!(e.0.len(), 1, "{text:?}: {e}");
        }
        let e = parse("r.yaml", "colour: red\nsize: big\nrules: []\n").unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
    }
}
