//! What operators give single keys: temporary overrides of a key's
//! limits (a raise or a block) and tenants' plans.
//!
//! With the memory store they live in this process, and in
//! `admin.state_file` when one is set (written whole, atomically, on every
//! change; read at start). With Redis they live in Redis, shared by every
//! instance: a write goes to Redis first, and each instance reads them
//! again whenever the admin version Redis keeps has moved (checked every
//! second), so a change reaches every instance within about a second.
//!
//! Either way they are kept apart from the rules, so they survive a
//! reload, and compiled into the limiter's [`KeyRules`] after every change
//! and every reload.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use spillway_core::{Limit, Nanos, Rule};
use spillway_redis::RedisStore;
use spillway_store::{KeyRules, RuleSet};

use super::settings::PlanBook;

/// Reads an override's limits for a rule with the given queue.
pub type ParseLimits = fn(&serde_json::Value, Option<Nanos>) -> Result<Vec<Limit>, String>;

/// The most overrides held: each is compiled into the limiter on every
/// change.
pub const MAX_OVERRIDES: usize = 100_000;

/// The most plan assignments held.
pub const MAX_PLANS: usize = 1_000_000;

/// Redis admin map of overrides.
const OVERRIDES: &str = "overrides";
/// Redis admin map of plan assignments.
const PLANS: &str = "plans";
/// Redis admin counter of key resets.
const RESETS: &str = "resets";

/// Which of the two maps.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Overrides,
    Plans,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Overrides => OVERRIDES,
            Kind::Plans => PLANS,
        }
    }
}

/// What each map holds.
trait Held: Sized {
    fn map(a: &Assignments) -> &Mutex<BTreeMap<Id, Self>>;
}

impl Held for Override {
    fn map(a: &Assignments) -> &Mutex<BTreeMap<Id, Override>> {
        &a.overrides
    }
}

impl Held for PlanAssignment {
    fn map(a: &Assignments) -> &Mutex<BTreeMap<Id, PlanAssignment>> {
        &a.plans
    }
}

/// A temporary override of one key's limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Override {
    /// The rule.
    pub rule: String,
    /// The key's parts.
    pub key: Vec<String>,
    /// The limits as given (a list like a rule's `limits:`), unless a block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<serde_json::Value>,
    /// Refuse every request of the key.
    #[serde(default)]
    pub block: bool,
    /// When it ends, in milliseconds since the Unix epoch.
    pub expires_unix_ms: u64,
    /// When it was given.
    pub created_unix_ms: u64,
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// The token that gave it.
    #[serde(default)]
    pub by: String,
}

/// A key's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanAssignment {
    /// The rule.
    pub rule: String,
    /// The key's parts.
    pub key: Vec<String>,
    /// The plan's name.
    pub plan: String,
    /// The token that assigned it.
    #[serde(default)]
    pub by: String,
    /// Since when.
    pub since_unix_ms: u64,
}

/// The state file's contents.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    #[serde(default)]
    overrides: Vec<Override>,
    #[serde(default)]
    plans: Vec<PlanAssignment>,
    /// The rules made over the admin API (see `crate::rules_api`), kept
    /// here as that module writes them. Absent from files written before
    /// they existed, and left out while there are none, so such files
    /// still load (and an older spillway still reads a newer file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_rules: Option<serde_json::Value>,
}

/// A rule's name and a key's parts.
pub type Id = (String, Vec<String>);

/// Overrides and plans by rule and key.
#[derive(Debug, Default)]
pub struct Assignments {
    overrides: Mutex<BTreeMap<Id, Override>>,
    plans: Mutex<BTreeMap<Id, PlanAssignment>>,
    file: Option<PathBuf>,
    /// The Redis admin version last read.
    version: AtomicU64,
    /// The Redis reset counter last read.
    resets: AtomicU64,
    /// Serialises writes (file saves, Redis round trips with the reading
    /// that follows).
    writing: tokio::sync::Mutex<()>,
    /// The state file's section of API rules, saved with the rest.
    api_rules: Mutex<Option<serde_json::Value>>,
}

/// Why a write failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// Too many entries already.
    Full(String),
    /// The store could not keep it.
    Store(String),
}

impl Assignments {
    /// Assignments kept in memory, and in `file` if given (read now).
    ///
    /// # Errors
    /// The file exists and cannot be read: refusing to start beats
    /// overwriting what it holds.
    pub fn open(file: Option<&Path>) -> Result<Assignments, String> {
        let a = Assignments {
            file: file.map(Path::to_path_buf),
            ..Assignments::default()
        };
        if let Some(path) = file {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let state: StateFile = serde_json::from_slice(&bytes).map_err(|e| {
                        format!(
                            "admin.state_file {}: not a state file spillway wrote ({e}); move it away to start empty",
                            path.display()
                        )
                    })?;
                    a.replace(state.overrides, state.plans);
                    *a.api_rules.lock() = state.api_rules;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(format!("admin.state_file {}: {e}", path.display()));
                }
            }
        }
        Ok(a)
    }

    fn replace(&self, overrides: Vec<Override>, plans: Vec<PlanAssignment>) {
        *self.overrides.lock() = overrides
            .into_iter()
            .map(|o| ((o.rule.clone(), o.key.clone()), o))
            .collect();
        *self.plans.lock() = plans
            .into_iter()
            .map(|p| ((p.rule.clone(), p.key.clone()), p))
            .collect();
    }

    /// The override of a key, if one is in force at `now_ms`.
    pub fn override_of(&self, rule: &str, key: &[String], now_ms: u64) -> Option<Override> {
        self.overrides
            .lock()
            .get(&(rule.to_string(), key.to_vec()))
            .filter(|o| o.expires_unix_ms > now_ms)
            .cloned()
    }

    /// Every override in force at `now_ms`.
    pub fn overrides(&self, now_ms: u64) -> Vec<Override> {
        self.overrides
            .lock()
            .values()
            .filter(|o| o.expires_unix_ms > now_ms)
            .cloned()
            .collect()
    }

    /// The overrides in force at `now_ms` after `after` (by rule, then
    /// key), at most `limit`, and whether more follow.
    pub fn overrides_page(
        &self,
        now_ms: u64,
        after: Option<&Id>,
        limit: usize,
    ) -> (Vec<Override>, bool) {
        page(&self.overrides.lock(), after, limit, |o| {
            o.expires_unix_ms > now_ms
        })
    }

    /// The plan assignments after `after` (by rule, then key), at most
    /// `limit`, and whether more follow.
    pub fn plans_page(&self, after: Option<&Id>, limit: usize) -> (Vec<PlanAssignment>, bool) {
        page(&self.plans.lock(), after, limit, |_| true)
    }

    /// A key's assigned plan.
    pub fn plan_of(&self, rule: &str, key: &[String]) -> Option<PlanAssignment> {
        self.plans
            .lock()
            .get(&(rule.to_string(), key.to_vec()))
            .cloned()
    }

    /// Every plan assignment.
    pub fn plans(&self) -> Vec<PlanAssignment> {
        self.plans.lock().values().cloned().collect()
    }

    /// Gives a key an override (replacing its earlier one).
    ///
    /// # Errors
    /// Too many overrides, or the store failed (nothing changed then).
    pub async fn put_override(
        &self,
        redis: Option<&RedisStore>,
        o: Override,
    ) -> Result<(), WriteError> {
        let id = (o.rule.clone(), o.key.clone());
        let full = || format!("{MAX_OVERRIDES} overrides are held already: delete some first");
        self.put(redis, Kind::Overrides, id, o, MAX_OVERRIDES, full)
            .await
    }

    /// Takes a key's override away; whether it had one.
    ///
    /// # Errors
    /// The store failed.
    pub async fn delete_override(
        &self,
        redis: Option<&RedisStore>,
        rule: &str,
        key: &[String],
    ) -> Result<bool, WriteError> {
        let id = (rule.to_string(), key.to_vec());
        self.delete(redis, Kind::Overrides, id, &self.overrides)
            .await
    }

    /// Assigns a key's plan.
    ///
    /// # Errors
    /// Too many assignments, or the store failed.
    pub async fn put_plan(
        &self,
        redis: Option<&RedisStore>,
        p: PlanAssignment,
    ) -> Result<(), WriteError> {
        let id = (p.rule.clone(), p.key.clone());
        let full = || format!("{MAX_PLANS} plan assignments are held already");
        self.put(redis, Kind::Plans, id, p, MAX_PLANS, full).await
    }

    /// Takes a key's plan away (back to the rule's default); whether it
    /// had one.
    ///
    /// # Errors
    /// The store failed.
    pub async fn delete_plan(
        &self,
        redis: Option<&RedisStore>,
        rule: &str,
        key: &[String],
    ) -> Result<bool, WriteError> {
        let id = (rule.to_string(), key.to_vec());
        self.delete(redis, Kind::Plans, id, &self.plans).await
    }

    /// Stores `value` under `id` in `kind`'s map: in Redis first if the
    /// store is Redis, then here and in the state file. A write the file
    /// cannot take is undone here and refused.
    async fn put<T: Serialize + Clone + Held>(
        &self,
        redis: Option<&RedisStore>,
        kind: Kind,
        id: Id,
        value: T,
        max: usize,
        full: impl FnOnce() -> String,
    ) -> Result<(), WriteError> {
        let _w = self.writing.lock().await;
        let map = T::map(self);
        {
            let held = map.lock();
            if held.len() >= max && !held.contains_key(&id) {
                return Err(WriteError::Full(full()));
            }
        }
        if let Some(r) = redis {
            let text = serde_json::to_string(&value).unwrap_or_default();
            r.admin_put(kind.name(), &field(&id), &text)
                .await
                .map_err(|e| WriteError::Store(e.to_string()))?;
        }
        let before = map.lock().insert(id.clone(), value);
        self.save().inspect_err(|_| {
            let mut held = map.lock();
            match before {
                Some(b) => held.insert(id, b),
                None => held.remove(&id),
            };
        })
    }

    /// Removes `id` from `kind`'s map, as [`put`](Self::put) stores;
    /// whether it was there.
    async fn delete<T>(
        &self,
        redis: Option<&RedisStore>,
        kind: Kind,
        id: Id,
        map: &Mutex<BTreeMap<Id, T>>,
    ) -> Result<bool, WriteError> {
        let _w = self.writing.lock().await;
        let mut had = false;
        if let Some(r) = redis {
            had = r
                .admin_delete(kind.name(), &field(&id))
                .await
                .map_err(|e| WriteError::Store(e.to_string()))?
                .0;
        }
        let before = map.lock().remove(&id);
        had |= before.is_some();
        if let Err(e) = self.save() {
            if let Some(b) = before {
                map.lock().insert(id, b);
            }
            return Err(e);
        }
        Ok(had)
    }

    /// Tells every instance that a key was reset in Redis (they forget
    /// what their over-limit caches learned): a counter of its own, so a
    /// reset does not make every instance read the maps again.
    ///
    /// # Errors
    /// Redis failed.
    pub async fn announce_reset(&self, redis: &RedisStore) -> Result<(), String> {
        redis
            .admin_incr(RESETS)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Reads everything from Redis again if its admin version moved, and
    /// forgets cached refusals if another instance reset a key; whether
    /// the maps were read.
    ///
    /// # Errors
    /// Redis failed (what is held stays).
    pub async fn refresh(&self, redis: &RedisStore) -> Result<bool, String> {
        let resets = redis
            .admin_counter(RESETS)
            .await
            .map_err(|e| e.to_string())?;
        if resets != self.resets.swap(resets, Ordering::AcqRel) {
            redis.forget_refusals();
        }
        let v = redis.admin_version().await.map_err(|e| e.to_string())?;
        if v == self.version.load(Ordering::Acquire) {
            return Ok(false);
        }
        let _w = self.writing.lock().await;
        let (overrides, v1) = redis
            .admin_all(OVERRIDES)
            .await
            .map_err(|e| e.to_string())?;
        let (plans, v2) = redis.admin_all(PLANS).await.map_err(|e| e.to_string())?;
        let overrides: Vec<Override> = overrides
            .iter()
            .filter_map(|(_, v)| serde_json::from_str(v).ok())
            .collect();
        let plans: Vec<PlanAssignment> = plans
            .iter()
            .filter_map(|(_, v)| serde_json::from_str(v).ok())
            .collect();
        self.replace(overrides, plans);
        // A write between the two readings is read at the next check.
        self.version.store(v1.min(v2), Ordering::Release);
        Ok(true)
    }

    /// Drops overrides that ended by `now_ms` here; the ended ones, to
    /// sweep from Redis with [`sweep`](Self::sweep) (after the limiter
    /// has been recompiled: an ended override never waits on Redis).
    pub fn expire(&self, now_ms: u64) -> Vec<Id> {
        let ended: Vec<Id> = {
            let mut held = self.overrides.lock();
            let ended: Vec<Id> = held
                .iter()
                .filter(|(_, o)| o.expires_unix_ms <= now_ms)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ended {
                held.remove(id);
            }
            ended
        };
        if !ended.is_empty()
            && let Err(WriteError::Store(e)) = self.save()
        {
            tracing::warn!("{e}");
        }
        ended
    }

    /// Removes ended overrides from Redis, each only if what Redis holds
    /// has ended too (another instance may have renewed it meanwhile).
    /// Best effort: what fails is swept at a later tick.
    pub async fn sweep(&self, redis: &RedisStore, ended: &[Id], now_ms: u64) {
        for id in ended {
            if let Err(e) = redis.admin_expire(OVERRIDES, &field(id), now_ms).await {
                tracing::debug!("ended overrides not swept from redis yet: {e}");
                return;
            }
        }
    }

    /// The state file's section of API rules as read at start (or as
    /// last saved).
    pub fn api_rules_section(&self) -> Option<serde_json::Value> {
        self.api_rules.lock().clone()
    }

    /// Whether a state file is kept.
    pub fn has_file(&self) -> bool {
        self.file.is_some()
    }

    /// Saves `section` as the state file's API rules, with everything
    /// else; what was there before stays if the file cannot be written.
    ///
    /// # Errors
    /// The file cannot be written (nothing changed then).
    pub async fn save_api_rules(&self, section: serde_json::Value) -> Result<(), WriteError> {
        let _w = self.writing.lock().await;
        let before = self.api_rules.lock().replace(section);
        self.save().inspect_err(|_| *self.api_rules.lock() = before)
    }

    /// Writes the state file, if one is set.
    fn save(&self) -> Result<(), WriteError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let state = StateFile {
            overrides: self.overrides.lock().values().cloned().collect(),
            plans: self.plans.lock().values().cloned().collect(),
            api_rules: self.api_rules.lock().clone(),
        };
        let text = serde_json::to_vec_pretty(&state).unwrap_or_default();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".spillway-{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            // The rename itself reaches the disk with the directory.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| {
            WriteError::Store(format!(
                "admin.state_file {}: cannot write: {e}",
                path.display()
            ))
        })
    }

    /// The limiter's per-key rules for the rules in `set`: each key's
    /// plan (unless it is its rule's default), then each override in
    /// force at `now_ms` (which wins). Entries for rules the set lacks,
    /// plans the book lacks or limits that no longer read are skipped.
    pub fn compile(
        &self,
        set: &RuleSet,
        book: &PlanBook,
        now_ms: u64,
        parse: ParseLimits,
    ) -> KeyRules {
        use std::collections::HashMap;
        use std::sync::Arc;
        let mut kr = KeyRules::new();
        let by_name: HashMap<&str, &Rule> = set.rules().iter().map(|r| (r.name(), r)).collect();
        // One rule per (rule, plan) and per (rule, limits given), shared
        // by every key on it: many keys share a plan or an override.
        let mut planned: HashMap<(&str, &str), Option<Arc<Rule>>> = HashMap::new();
        let plans = self.plans.lock();
        for p in plans.values() {
            let Some(rule) = by_name.get(p.rule.as_str()) else {
                continue;
            };
            let Some(rp) = book.rules.get(&p.rule) else {
                continue;
            };
            if rp.default.as_deref() == Some(p.plan.as_str()) {
                continue;
            }
            let own = planned
                .entry((p.rule.as_str(), p.plan.as_str()))
                .or_insert_with(|| {
                    let limits = rp.limits.get(&p.plan)?;
                    rule.with_limits(limits.clone()).ok().map(Arc::new)
                });
            if let Some(own) = own {
                let parts: Vec<&str> = p.key.iter().map(String::as_str).collect();
                kr.insert(rule.fingerprint(), &parts, own.clone());
            }
        }
        drop(plans);
        let mut given: HashMap<(&str, String), Option<Arc<Rule>>> = HashMap::new();
        let overrides = self.overrides.lock();
        for o in overrides.values() {
            if o.expires_unix_ms <= now_ms {
                continue;
            }
            let Some(rule) = by_name.get(o.rule.as_str()) else {
                continue;
            };
            let own = if o.block {
                given
                    .entry((rule.name(), String::new()))
                    .or_insert_with(|| Some(Arc::new(rule.blocked())))
                    .clone()
            } else {
                let Some(limits) = o.limits.as_ref() else {
                    continue;
                };
                given
                    .entry((rule.name(), limits.to_string()))
                    .or_insert_with(|| {
                        let max_wait = book.rules.get(&o.rule).and_then(|rp| rp.max_wait);
                        let l = parse(limits, max_wait).ok()?;
                        rule.with_limits(l).ok().map(Arc::new)
                    })
                    .clone()
            };
            if let Some(own) = own {
                let parts: Vec<&str> = o.key.iter().map(String::as_str).collect();
                kr.insert(rule.fingerprint(), &parts, own);
            }
        }
        kr
    }

    /// Brings `kr` (compiled from these assignments by [`compile`] under
    /// the same rule set and plan book) up to date for one key after its
    /// override or plan changed: only that key's rule is built again, so
    /// a change costs the same with 10 overrides or 10,000.
    ///
    /// [`compile`]: Self::compile
    pub fn compile_key(
        &self,
        kr: &mut KeyRules,
        set: &RuleSet,
        book: &PlanBook,
        now_ms: u64,
        parse: ParseLimits,
        (rule, key): (&str, &[String]),
    ) {
        use std::sync::Arc;
        let Some(matched) = set.rules().iter().find(|r| r.name() == rule) else {
            return;
        };
        let parts: Vec<&str> = key.iter().map(String::as_str).collect();
        kr.remove(matched.fingerprint(), &parts);
        let id = (rule.to_string(), key.to_vec());
        // An override in force wins over a plan, as in `compile`.
        let over = self
            .overrides
            .lock()
            .get(&id)
            .filter(|o| o.expires_unix_ms > now_ms)
            .cloned();
        let own = match over {
            Some(o) if o.block => Some(Arc::new(matched.blocked())),
            Some(o) => o.limits.as_ref().and_then(|limits| {
                let max_wait = book.rules.get(rule).and_then(|rp| rp.max_wait);
                let l = parse(limits, max_wait).ok()?;
                matched.with_limits(l).ok().map(Arc::new)
            }),
            None => None,
        }
        .or_else(|| {
            let plan = self.plans.lock().get(&id).map(|p| p.plan.clone())?;
            let rp = book.rules.get(rule)?;
            if rp.default.as_deref() == Some(plan.as_str()) {
                return None;
            }
            let limits = rp.limits.get(&plan)?;
            matched.with_limits(limits.clone()).ok().map(Arc::new)
        });
        if let Some(own) = own {
            kr.insert(matched.fingerprint(), &parts, own);
        }
    }
}

/// The entries of `map` that `keep` keeps after `after`, at most `limit`,
/// and whether more follow.
fn page<T: Clone>(
    map: &BTreeMap<Id, T>,
    after: Option<&Id>,
    limit: usize,
    keep: impl Fn(&T) -> bool,
) -> (Vec<T>, bool) {
    use std::ops::Bound;
    let start = after.map_or(Bound::Unbounded, Bound::Excluded);
    let mut out: Vec<T> = map
        .range((start, Bound::Unbounded))
        .map(|(_, v)| v)
        .filter(|v| keep(v))
        .take(limit + 1)
        .cloned()
        .collect();
    let more = out.len() > limit;
    out.truncate(limit);
    (out, more)
}

/// A page's cursor: the rule and key of its last entry, as JSON.
pub fn cursor(rule: &str, key: &[String]) -> String {
    field(&(rule.to_string(), key.to_vec()))
}

/// A cursor read back.
pub fn read_cursor(s: &str) -> Option<Id> {
    serde_json::from_str(s).ok()
}

/// A Redis field naming a rule and key: their JSON (unambiguous
/// whatever the parts hold).
fn field(id: &Id) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

#[cfg(test)]
mod tests;
