//! Bytes per rule (issue 36: "memory proportional to what rules differ
//! in"), counted by a global allocator around building a rule set of
//! generated rules: the rules themselves, then the rule set (its route
//! index) over them. The figures are printed (`--nocapture`) and bounded.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use spillway_core::{
    FixedWindow, Gcra, KeySpec, Limit, Mode, Nanos, Rate, Route, Rule, TokenBucket,
};
use spillway_store::RuleSet;

/// The live heap bytes of the process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Rule `i` of the generated shapes (as scripts/gen-rules.sh writes them):
/// a route of its own, one of five keys, one or two limits.
fn rule(i: usize) -> Rule {
    let by = ["ip", "user", "user+ip", "header:X-Api-Key", "route"][i % 5];
    let method = if i.is_multiple_of(3) { "POST" } else { "GET" };
    let route = Route::parse(&format!("{method} /svc{}/v1/res{i}", i % 1000)).unwrap();
    let l = 10 * (1 + i as u64 % 10);
    let first = match i % 3 {
        0 => Limit::Gcra(Gcra::new(Rate::new(l, Nanos::from_secs(1)).unwrap(), 5).unwrap()),
        1 => Limit::TokenBucket(
            TokenBucket::new(l, Rate::new(5, Nanos::from_secs(1)).unwrap()).unwrap(),
        ),
        _ => Limit::FixedWindow(FixedWindow::new(l, Nanos::from_secs(3600)).unwrap()),
    };
    let mut limits = vec![first];
    if i % 2 == 1 {
        limits.push(Limit::FixedWindow(
            FixedWindow::new(1000 * (1 + i as u64 % 4), Nanos::from_secs(86_400)).unwrap(),
        ));
    }
    let mode = if i % 10 == 3 {
        Mode::Shadow
    } else {
        Mode::Hard
    };
    Rule::new(
        format!("svc{}-rule-{i}", i % 1000),
        Some(route),
        KeySpec::parse(by).unwrap(),
        limits,
        mode,
    )
    .unwrap()
}

#[test]
fn a_rule_set_costs_bytes_per_rule_not_kilobytes() {
    const N: usize = 50_000;
    let before = live();
    let mut pool = spillway_core::rule::RuleInterner::default();
    let rules: Vec<Rule> = (0..N).map(|i| rule(i).interned(&mut pool)).collect();
    drop(pool);
    let rules_bytes = (live() - before) as f64 / N as f64;
    let before_set = live();
    let set = RuleSet::new(rules.clone());
    let set_bytes = (live() - before_set) as f64 / N as f64;
    println!(
        "per rule: {rules_bytes:.0} B the rules, {set_bytes:.0} B a rule set over clones of them (index and slots)"
    );
    assert_eq!(set.rules().len(), N);
    // Today's figures, with room: a regression to the kilobytes of before
    // fails.
    assert!(rules_bytes < 1200.0, "{rules_bytes:.0} B a rule");
    assert!(set_bytes < 600.0, "{set_bytes:.0} B a rule in the set");
}
