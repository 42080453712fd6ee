use std::path::{Path, PathBuf};

use super::*;

/// A directory removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("spillway-parts-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rule(name: &str) -> String {
    format!("  - name: {name}\n    by: ip\n    limits: [ {{ gcra: {{ rate: 5/s }} }} ]\n")
}

fn rules(names: &[&str]) -> String {
    format!(
        "rules:\n{}",
        names.iter().map(|n| rule(n)).collect::<String>()
    )
}

fn names(files: &RuleFiles) -> Vec<String> {
    files
        .config()
        .unwrap()
        .rules
        .iter()
        .map(|r| r.name().to_string())
        .collect()
}

fn open(source: &Source) -> (RuleFiles, Vec<ConfigError>) {
    RuleFiles::open(source, &Preread::default()).expect("in parts")
}

fn bad(files: &RuleFiles) -> Vec<String> {
    files
        .status()
        .bad
        .iter()
        .map(|b| {
            Path::new(&b.file)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

const NONE: &dyn Fn(&Path) -> bool = &|_| false;

#[test]
fn a_directory_is_one_rule_set_in_file_name_order() {
    let d = Dir::new("order");
    d.write("b.yaml", &rules(&["b1", "b2"]));
    d.write("a.yml", &rules(&["a1"]));
    d.write("c.yaml", "store: memory\nreload: { quiet: 300ms }\n");
    d.write(".hidden.yaml", "not: valid: yaml: [");
    d.write("notes.txt", "ignored");
    let (files, errors) = open(&Source::Dir(d.0.clone()));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&files), ["a1", "b1", "b2"]);
    let c = files.config().unwrap();
    assert_eq!(c.reload_quiet, std::time::Duration::from_millis(300));
    assert_eq!(files.status().count, 3);
    assert!(files.status().bad.is_empty());
}

/// A name used by two files is refused at start, at the second file's
/// place, naming the first's.
#[test]
fn a_name_in_two_files_names_both_places() {
    let d = Dir::new("dup");
    d.write("a.yaml", &rules(&["x", "shared"]));
    d.write("b.yaml", &format!("# team b\n{}", rules(&["shared", "y"])));
    let (_, errors) = open(&Source::Dir(d.0.clone()));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = errors[0].to_string();
    let a = d.0.join("a.yaml").display().to_string();
    let b = d.0.join("b.yaml").display().to_string();
    assert!(
        e.starts_with(&format!("{b}:3:11: rule name \"shared\"")),
        "{e}"
    );
    assert!(e.contains(&format!("used by {a}:5:11 too")), "{e}");
    // As `serve` and `check-config` load it.
    let e = load(&Source::Dir(d.0.clone()), &Preread::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&b) && e.contains(&a), "{e}");
}

/// A reload reads only the files named: another file broken on disk
/// meanwhile is not read, so it keeps its rules and is not listed.
#[test]
fn a_reload_reads_only_the_changed_files() {
    let d = Dir::new("only");
    let a = d.write("a.yaml", &rules(&["a1"]));
    let b = d.write("b.yaml", &rules(&["b1"]));
    let (mut files, errors) = open(&Source::Dir(d.0.clone()));
    assert!(errors.is_empty());
    d.write("a.yaml", "rules: [ this is not a rule ]\n");
    d.write("b.yaml", &rules(&["b1", "b2"]));
    let r = files.refresh(Some(std::slice::from_ref(&b)), NONE);
    assert!(r.changed && !r.settings_changed);
    assert_eq!(names(&files), ["a1", "b1", "b2"]);
    assert!(bad(&files).is_empty());
    // Now a is read: its last good version stays, and the status says so.
    let r = files.refresh(Some(std::slice::from_ref(&a)), NONE);
    assert!(!r.changed);
    assert_eq!(names(&files), ["a1", "b1", "b2"]);
    assert_eq!(bad(&files), ["a.yaml"]);
    let st = files.status();
    assert!(st.bad[0].last_good_in_force);
    assert!(st.bad[0].error.contains("a.yaml:1:"), "{}", st.bad[0].error);
    // Fixed: in force, no longer listed.
    d.write("a.yaml", &rules(&["a2"]));
    files.refresh(Some(&[a]), NONE);
    assert_eq!(names(&files), ["a2", "b1", "b2"]);
    assert!(bad(&files).is_empty());
}

/// A file whose new version takes a name another file holds keeps its
/// last good version; once the other file lets the name go, the new
/// version applies without being saved again.
#[test]
fn a_clash_on_reload_keeps_the_last_good_version_until_it_clears() {
    let d = Dir::new("clash");
    let a = d.write("a.yaml", &rules(&["a1"]));
    let b = d.write("b.yaml", &rules(&["b1", "moving"]));
    let (mut files, _) = open(&Source::Dir(d.0.clone()));
    d.write("a.yaml", &rules(&["a1", "moving"]));
    files.refresh(Some(&[a]), NONE);
    assert_eq!(names(&files), ["a1", "b1", "moving"]);
    assert_eq!(bad(&files), ["a.yaml"]);
    let e = &files.status().bad[0].error;
    assert!(e.contains("b.yaml:5:11 too"), "{e}");
    d.write("b.yaml", &rules(&["b1"]));
    files.refresh(Some(&[b]), NONE);
    assert_eq!(names(&files), ["a1", "moving", "b1"]);
    assert!(bad(&files).is_empty());
}

/// A rule moved from one file to another, both saved at once, applies.
#[test]
fn a_rule_moved_between_files_at_once_applies() {
    let d = Dir::new("move");
    let a = d.write("a.yaml", &rules(&["a1"]));
    let b = d.write("b.yaml", &rules(&["b1", "moving"]));
    let (mut files, _) = open(&Source::Dir(d.0.clone()));
    d.write("a.yaml", &rules(&["a1", "moving"]));
    d.write("b.yaml", &rules(&["b1"]));
    files.refresh(Some(&[a, b]), NONE);
    assert_eq!(names(&files), ["a1", "moving", "b1"]);
    assert!(bad(&files).is_empty());
}

/// A removed file drops its rules; an added one brings them. A
/// directory that is gone, or empty, keeps every rule.
#[test]
fn removed_added_and_a_directory_gone() {
    let d = Dir::new("gone");
    let a = d.write("a.yaml", &rules(&["a1"]));
    let b = d.write("b.yaml", &rules(&["b1"]));
    let (mut files, _) = open(&Source::Dir(d.0.clone()));
    std::fs::remove_file(&a).unwrap();
    let c = d.write("c.yaml", &rules(&["c1"]));
    let r = files.refresh(Some(&[a.clone(), c.clone()]), NONE);
    assert!(r.changed);
    assert_eq!(names(&files), ["b1", "c1"]);
    assert_eq!(files.status().count, 2);
    std::fs::remove_file(&b).unwrap();
    std::fs::remove_file(&c).unwrap();
    files.refresh(Some(&[b.clone(), c.clone()]), NONE);
    assert_eq!(
        names(&files),
        ["b1", "c1"],
        "an empty directory dropped every rule"
    );
    let st = files.status();
    assert!(st.dir_problem.unwrap().contains("no *.yaml"));
    std::fs::remove_dir_all(&d.0).unwrap();
    files.refresh(Some(&[b.clone(), c.clone()]), NONE);
    assert_eq!(
        names(&files),
        ["b1", "c1"],
        "a directory gone dropped every rule"
    );
    assert!(
        files
            .status()
            .dir_problem
            .unwrap()
            .contains("cannot read the directory")
    );
    std::fs::create_dir_all(&d.0).unwrap();
    d.write("b.yaml", &rules(&["b2"]));
    files.refresh(Some(&[b, c]), NONE);
    assert_eq!(names(&files), ["b2"]);
    assert_eq!(files.status().dir_problem, None);
}

/// The settings file's `descriptors:` are what every file's `by:` is
/// checked against: declaring one makes a file that uses it valid, and
/// only the settings file's change had to be named.
#[test]
fn a_settings_change_builds_every_file_again() {
    let d = Dir::new("settings");
    let s = d.write("00-settings.yaml", "descriptors: [tenant]\n");
    d.write(
        "a.yaml",
        "rules:\n  - name: t\n    by: tenant\n    limits: [ { gcra: { rate: 5/s } } ]\n",
    );
    let b = d.write(
        "b.yaml",
        "rules:\n  - name: p\n    by: plan\n    limits: [ { gcra: { rate: 5/s } } ]\n",
    );
    let (mut files, errors) = open(&Source::Dir(d.0.clone()));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("b.yaml:3:9"), "{errors:?}");
    files.refresh(Some(&[b]), NONE);
    assert_eq!(names(&files), ["t"]);
    d.write("00-settings.yaml", "descriptors: [tenant, plan]\n");
    let r = files.refresh(Some(&[s]), NONE);
    assert!(r.changed && r.settings_changed);
    assert_eq!(names(&files), ["t", "p"]);
    assert!(bad(&files).is_empty());
}

/// Settings found late (a file read as rules only first) build the
/// files read before them again.
#[test]
fn settings_after_the_rules_files_in_name_order() {
    let d = Dir::new("late");
    d.write(
        "a.yaml",
        "rules:\n  - name: t\n    by: tenant\n    limits: [ { gcra: { rate: 5/s } } ]\n",
    );
    // Not at the left margin: read as rules only at first.
    d.write("z.yaml", "{ descriptors: [tenant], rules: [] }\n");
    let (files, errors) = open(&Source::Dir(d.0.clone()));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&files), ["t"]);
}

/// One file of a directory gives the settings; a second is refused,
/// naming both.
#[test]
fn two_settings_files_are_refused() {
    let d = Dir::new("two");
    d.write("a.yaml", "store: memory\nrules: []\n");
    d.write("b.yaml", "rules: []\nreload: { quiet: 1s }\n");
    let (_, errors) = open(&Source::Dir(d.0.clone()));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = errors[0].to_string();
    assert!(e.contains("b.yaml:2:"), "{e}");
    assert!(e.contains("a.yaml:1:") && e.contains("one file"), "{e}");
}

/// An empty file is not a request for nothing; a `--config` directory
/// cannot name another directory.
#[test]
fn empty_files_and_nested_directories_are_refused() {
    let d = Dir::new("empty");
    d.write("a.yaml", &rules(&["a1"]));
    d.write("b.yaml", "");
    d.write("c.yaml", "rules_dir: more\nrules: []\n");
    let (_, errors) = open(&Source::Dir(d.0.clone()));
    let shown = ConfigErrors(errors).to_string();
    assert!(shown.contains("b.yaml: no section at all"), "{shown}");
    assert!(
        shown.contains("c.yaml:1:12: rules_dir: not in a file"),
        "{shown}"
    );
    let empty = Dir::new("none");
    let e = load(&Source::Dir(empty.0.clone()), &Preread::default()).unwrap_err();
    assert!(e.to_string().contains("holds no *.yaml"), "{e}");
}

/// `rules_dir:` in a main file: its rules first, then the directory's;
/// a directory file holds only rules.
#[test]
fn a_main_file_and_its_rules_dir() {
    let d = Dir::new("main");
    std::fs::create_dir_all(d.0.join("teams")).unwrap();
    let main = d.write(
        "spillway.yaml",
        &format!(
            "rules_dir: teams\ndescriptors: [tenant]\n{}",
            rules(&["m1"])
        ),
    );
    d.write(
        "teams/a.yaml",
        "rules:\n  - name: t\n    by: tenant\n    limits: [ { gcra: { rate: 5/s } } ]\n",
    );
    d.write("teams/b.yaml", &rules(&["b1"]));
    let (files, errors) = open(&Source::File(main.clone()));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&files), ["m1", "t", "b1"]);
    assert_eq!(files.config().unwrap().rules_dir, Some(d.0.join("teams")));
    assert!(files.holds(&main) && files.holds(&d.0.join("teams/z.yaml")));
    assert!(!files.holds(&d.0.join("other.yaml")));
    d.write(
        "teams/c.yaml",
        &format!("store: memory\n{}", rules(&["c1"])),
    );
    let (_, errors) = open(&Source::File(main));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = errors[0].to_string();
    assert!(
        e.contains("teams/c.yaml:1:8: `store:` in a file of a rules_dir"),
        "{e}"
    );
}

/// A main file read in parts gives what the same file read alone gives.
#[test]
fn a_main_file_alone_reads_as_a_single_file() {
    let text = "# rules_dir is not set here\nplans:\n  free: { limits: [ { gcra: { rate: 1/s } } ] }\nrules:\n  - name: p\n    by: user\n    plan: { default: free }\n  - name: q\n    by: ip\n    limits: [ { gcra: { rate: 5/s } } ]\n";
    let d = Dir::new("alone");
    let main = d.write("r.yaml", text);
    let single = super::super::parse("r.yaml", text).unwrap();
    let (files, errors) = open(&Source::File(main));
    assert!(errors.is_empty(), "{errors:?}");
    let c = files.config().unwrap();
    let n = |c: &Config| {
        c.rules
            .iter()
            .map(|r| r.name().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(n(&c), n(&single));
    assert_eq!(c.plans, single.plans);
    assert_eq!(c.rules_dir, None);
}

/// The claims resolver alone: a settings claim is one more name.
#[test]
fn two_new_settings_versions_one_wins() {
    let d = Dir::new("claims");
    let (files, _) = {
        d.write("a.yaml", "store: memory\nrules: []\n");
        open(&Source::Dir(d.0.clone()))
    };
    let v = files.slots[0].good.as_ref().unwrap();
    let out = names::resolve(&[
        names::Versions {
            good: None,
            new: Some(v),
        },
        names::Versions {
            good: None,
            new: Some(v),
        },
    ]);
    assert_eq!(out.accepted, [true, false]);
    assert_eq!(out.refused[1].1, 1);
    assert_eq!(out.refused[1].0[0].name, None);
}

/// A settings file removed gives every section its default, and every
/// other file is built again against them.
#[test]
fn a_settings_file_removed_builds_the_others_against_the_defaults() {
    let d = Dir::new("unset");
    let s = d.write(
        "00-settings.yaml",
        "descriptors: [tenant]\nreload: { quiet: 1s }\n",
    );
    d.write(
        "a.yaml",
        "rules:\n  - name: t\n    by: tenant\n    limits: [ { gcra: { rate: 5/s } } ]\n",
    );
    d.write("b.yaml", &rules(&["b1"]));
    let (mut files, errors) = open(&Source::Dir(d.0.clone()));
    assert!(errors.is_empty(), "{errors:?}");
    std::fs::remove_file(&s).unwrap();
    let r = files.refresh(Some(&[s]), NONE);
    assert!(r.changed && r.settings_changed);
    let c = files.config().unwrap();
    assert_eq!(c.reload_quiet, crate::config::DEFAULT_RELOAD_QUIET);
    // `tenant` is no longer declared: a keeps its last good version.
    assert_eq!(names(&files), ["t", "b1"]);
    assert_eq!(bad(&files), ["a.yaml"]);
}

/// An edit of the settings file that leaves what rules are built against
/// as it was (its own rules, a setting, plans moved down a line) reads no
/// other file: one broken on disk meanwhile is not read.
#[test]
fn a_settings_edit_that_changes_no_rule_reads_no_other_file() {
    let d = Dir::new("same");
    let plans = "plans:\n  free: { limits: [ { gcra: { rate: 1/s } } ] }\n";
    let s = d.write("00-settings.yaml", &format!("{plans}rules: []\n"));
    d.write(
        "a.yaml",
        "rules:\n  - name: p\n    by: user\n    plan: { default: free }\n",
    );
    let (mut files, errors) = open(&Source::Dir(d.0.clone()));
    assert!(errors.is_empty(), "{errors:?}");
    d.write("a.yaml", "rules: [ broken");
    d.write(
        "00-settings.yaml",
        &format!("reload: {{ quiet: 1s }}\n\n{plans}{}", rules(&["s1"])),
    );
    let r = files.refresh(Some(std::slice::from_ref(&s)), NONE);
    assert!(r.changed && r.settings_changed);
    assert_eq!(names(&files), ["s1", "p"]);
    assert!(bad(&files).is_empty(), "a was read again");
    // A plan's limit changed: every file again.
    d.write(
        "00-settings.yaml",
        "plans:\n  free: { limits: [ { gcra: { rate: 2/s } } ] }\nrules: []\n",
    );
    files.refresh(Some(&[s]), NONE);
    assert_eq!(bad(&files), ["a.yaml"]);
}
