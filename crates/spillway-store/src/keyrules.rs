//! Per-key rules: an operator's override or a tenant's plan puts a rule
//! of its own in place of the rule a key matched, and a watcher sees
//! every decision with its key.

use std::collections::HashMap;
use std::sync::Arc;

use spillway_core::{Outcome, Rule};

use crate::Key;

/// The seed of the hash that files keys in [`KeyRules`]: fixed, since the
/// table is rebuilt whole and never shared outside the process.
const SEED: u64 = 0x5eed_4b65_7952_756c;

/// Which keys decide under a rule of their own instead of the rule they
/// matched: built whole by the owner (the admin plane) and swapped into
/// the [`Limiter`](crate::Limiter) with
/// [`set_key_rules`](crate::Limiter::set_key_rules).
///
/// Entries are filed by the matched rule's fingerprint, so a reload that
/// changes a rule's key or limits leaves its old entries unreachable until
/// the owner files them again under the new rule.
///
/// Cloning shares every entry (two reference counts each): the owner can
/// keep a copy, change one key of it and publish it, without building
/// the table again.
#[derive(Debug, Default, Clone)]
pub struct KeyRules {
    by_rule: HashMap<u64, HashMap<u64, Entry>>,
}

#[derive(Debug, Clone)]
struct Entry {
    parts: Arc<[Box<str>]>,
    rule: Arc<Rule>,
}

impl KeyRules {
    /// No per-key rules.
    pub fn new() -> KeyRules {
        KeyRules::default()
    }

    /// Files `rule` for the key `parts` of the rule whose fingerprint is
    /// `matched` (replacing an earlier one for the same key).
    pub fn insert(&mut self, matched: u64, parts: &[&str], rule: Arc<Rule>) {
        let key = Key::from_parts(parts.iter().copied());
        let hash = key.hash(matched, SEED);
        self.by_rule.entry(matched).or_default().insert(
            hash,
            Entry {
                parts: key.parts().iter().map(|p| Box::from(*p)).collect(),
                rule,
            },
        );
    }

    /// Takes away the rule of its own of the key `parts` of the rule whose
    /// fingerprint is `matched`; whether it had one.
    pub fn remove(&mut self, matched: u64, parts: &[&str]) -> bool {
        let key = Key::from_parts(parts.iter().copied());
        let hash = key.hash(matched, SEED);
        let Some(keys) = self.by_rule.get_mut(&matched) else {
            return false;
        };
        let gone = keys.remove(&hash).is_some();
        if keys.is_empty() {
            self.by_rule.remove(&matched);
        }
        gone
    }

    /// The rule `key` decides under in place of `matched`, if it has one.
    pub fn find(&self, matched: &Rule, key: &Key<'_>) -> Option<&Rule> {
        self.get(matched, key).map(|r| &**r)
    }

    /// As [`find`](Self::find), the shared rule itself.
    pub fn get(&self, matched: &Rule, key: &Key<'_>) -> Option<&Arc<Rule>> {
        let keys = self.by_rule.get(&matched.fingerprint())?;
        let e = keys.get(&key.hash(matched.fingerprint(), SEED))?;
        let same = e.parts.len() == key.parts().len()
            && e.parts.iter().zip(key.parts()).all(|(a, b)| &**a == *b);
        same.then_some(&e.rule)
    }

    /// How many keys have a rule of their own.
    pub fn len(&self) -> usize {
        self.by_rule.values().map(HashMap::len).sum()
    }

    /// Whether no key has a rule of its own.
    pub fn is_empty(&self) -> bool {
        self.by_rule.is_empty()
    }
}

/// Sees every rule's decision for every request the [`Limiter`](crate::Limiter)
/// decides, with the client's key (for heavy-hitter counts). Called on the
/// hot path, after the decision: keep it cheap and never block.
pub trait Watch: Send + Sync + std::fmt::Debug + 'static {
    /// `rule` (the rule as the rule set has it, at `index` of the set
    /// numbered `version`) decided `outcome` for `key`.
    fn decided(&self, version: u64, index: usize, rule: &Rule, key: &Key<'_>, outcome: Outcome);
}

/// A shared watcher.
pub type SharedWatch = Arc<dyn Watch>;

#[cfg(test)]
mod tests {
    use spillway_core::{Gcra, KeySpec, Limit, Mode, Nanos, Rate};

    use super::*;

    fn rule(name: &str, rate: u64) -> Rule {
        Rule::new(
            name,
            None,
            KeySpec::parse("user+ip").unwrap(),
            vec![Limit::Gcra(
                Gcra::new(Rate::new(rate, Nanos::from_secs(1)).unwrap(), 1).unwrap(),
            )],
            Mode::Hard,
        )
        .unwrap()
    }

    #[test]
    fn finds_only_the_exact_key_of_the_matched_rule() {
        let base = rule("api", 1);
        let other = rule("other", 1);
        let raised = Arc::new(base.with_limits(rule("x", 100).limits().to_vec()).unwrap());
        let mut kr = KeyRules::new();
        assert!(kr.is_empty());
        kr.insert(base.fingerprint(), &["alice", "10.0.0.1"], raised.clone());
        assert_eq!(kr.len(), 1);
        let alice = Key::from_parts(["alice", "10.0.0.1"]);
        let found = kr.find(&base, &alice).expect("alice's rule");
        assert_eq!(found.limits(), raised.limits());
        // Another key, a respelling across parts, another rule: none.
        assert!(
            kr.find(&base, &Key::from_parts(["alice", "10.0.0.2"]))
                .is_none()
        );
        assert!(
            kr.find(&base, &Key::from_parts(["alice10.0.0.1"]))
                .is_none()
        );
        assert!(
            kr.find(&base, &Key::from_parts(["alic", "e10.0.0.1"]))
                .is_none()
        );
        assert!(kr.find(&other, &alice).is_none());
    }
}

/// A [`Hasher`](std::hash::Hasher) for maps keyed by a [`Watch`]'s key
/// hashes, which are well-mixed 64-bit hashes already: hashing them again
/// would only cost time (the admin plane's top keys, simulate's per-key
/// statistics).
#[derive(Debug, Default, Clone, Copy)]
pub struct AsIs(u64);

impl std::hash::Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are filed; anything else is folded in plainly.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
