//! Rules made and changed over the admin API (`PUT /admin/v1/rules/{name}`),
//! beside the rules file's.
//!
//! A rule is given as JSON with the fields of a rules file's rule, and
//! read by the same reader (`spillway_rules::build`, JSON being YAML), so
//! both spell and check a rule alike. Where they live:
//!
//! - with a Redis store, in Redis (`spillway_redis::RedisStore::rules_put`
//!   and the rest): a hash of rules, a version and a change log, changed
//!   in one script call. Every instance polls the version every
//!   [`POLL_EVERY`] and pulls only the changes after the version it holds
//!   ([`follow`]), so a change applies everywhere within about that;
//! - with the memory store, in this process, and in `admin.state_file`
//!   when one is set (its `api_rules` section, written with the rest).
//!
//! Either way they survive a restart, and a reload of the rules file:
//! what is in force is the file's rules and these, composed by
//! [`swap_in`] (on every reload) and [`applied`] (on every change here).
//! A name the rules file uses is refused to the API; a file rule added
//! later under an API rule's name wins (the API rule is kept, unused, and
//! `/v1/status` counts it as shadowed).

#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use spillway_core::{PathMatching, Rule};
use spillway_redis::{Precondition, RedisStore, RuleWrite};
use spillway_store::RuleSet;
use tokio::sync::watch;

use super::AdminState;
use super::assign::{Assignments, WriteError};

mod json;
#[cfg(test)]
mod tests;

pub use json::build;

/// The most API rules held.
pub const MAX_RULES: usize = 1_000_000;

/// How often an instance asks Redis whether the API rules changed.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// The most changes read from Redis in one call.
const PULL_BATCH: usize = 5_000;

/// What an API rule is read against: the rules file's `descriptors:` and
/// `path_matching:`, as a rule of the file would be.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    /// Names `by:` may use bare.
    pub descriptors: Vec<String>,
    /// The file's path matching.
    pub path_matching: PathMatching,
}

/// One API rule.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The rule as given (with its `name`), as stored and shown.
    pub json: Value,
    /// The version of its last change: its ETag.
    pub version: u64,
    /// The rule as read here; the reason when it no longer reads (the
    /// file's `descriptors:` changed since).
    pub built: Result<Rule, String>,
}

impl Entry {
    /// Its ETag, quoted as the header carries it.
    pub fn etag(&self) -> String {
        etag(self.version)
    }
}

/// An ETag of a version.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

#[derive(Debug, Default)]
struct Held {
    /// The last version read or made: with Redis, the change log's
    /// version pulled up to.
    version: u64,
    rules: BTreeMap<String, Arc<Entry>>,
}

/// The state file's section.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Section {
    version: u64,
    rules: Vec<SectionRule>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SectionRule {
    version: u64,
    rule: Value,
}

/// Why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The rule does not read: what is wrong.
    Invalid(String),
    /// The rules file has a rule of that name.
    FileRule,
    /// `If-Match` did not hold: the rule's version now (0: absent).
    Mismatch(u64),
    /// `If-None-Match: *` and the rule exists at this version.
    Exists(u64),
    /// A delete of a rule that does not exist.
    NotFound,
    /// [`MAX_RULES`] are held.
    Full,
    /// The store failed; nothing changed.
    Store(String),
}

/// The API rules this instance holds, and the file's rules they are
/// composed with.
#[derive(Debug)]
pub struct ApiRules {
    held: RwLock<Held>,
    ctx: RwLock<Context>,
    /// How many of the rules in force are the rules file's: they come
    /// first, the API's after. Only a count: keeping the file's rule set
    /// beside the one in force would hold every rule twice.
    file_count: std::sync::atomic::AtomicUsize,
    /// How many API rules a file rule's name shadows, as of the last
    /// composition.
    shadowed: std::sync::atomic::AtomicUsize,
    /// Elastic rules read the service's health from it.
    health: Arc<spillway_core::HealthGauge>,
    /// The held version after every change (for whoever composes rules).
    changed: watch::Sender<u64>,
    /// Whether the rules were read from Redis once since start.
    pulled: std::sync::atomic::AtomicBool,
    /// Composing and swapping in, one at a time.
    applying: Mutex<()>,
    /// Writes and pulls, one at a time.
    writing: tokio::sync::Mutex<()>,
}

impl ApiRules {
    /// The API rules of the state file `assign` keeps (none without one
    /// or with Redis, which is read by [`follow`]).
    ///
    /// # Errors
    /// The file's section cannot be read: refusing to start beats
    /// overwriting what it holds.
    pub fn open(
        assign: &Assignments,
        ctx: Context,
        health: Arc<spillway_core::HealthGauge>,
    ) -> Result<ApiRules, String> {
        let mut held = Held::default();
        if let Some(section) = assign.api_rules_section() {
            let s: Section = serde_json::from_value(section).map_err(|e| {
                format!("admin.state_file: its api_rules section is not one spillway wrote ({e}); move the file away to start empty")
            })?;
            held.version = s.version;
            for r in s.rules {
                let Some(name) = r.rule.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let built = build(&ctx, &r.rule);
                held.rules.insert(
                    name.to_string(),
                    Arc::new(Entry {
                        json: r.rule,
                        version: r.version,
                        built,
                    }),
                );
            }
        }
        Ok(ApiRules {
            changed: watch::Sender::new(held.version),
            held: RwLock::new(held),
            ctx: RwLock::new(ctx),
            file_count: std::sync::atomic::AtomicUsize::new(0),
            shadowed: std::sync::atomic::AtomicUsize::new(0),
            health,
            pulled: std::sync::atomic::AtomicBool::new(false),
            applying: Mutex::new(()),
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// The version of the rules held.
    pub fn version(&self) -> u64 {
        self.held.read().version
    }

    /// Tells of every change, with the version held after it.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Every API rule that reads, in name order.
    pub fn rules(&self) -> Vec<Rule> {
        self.held
            .read()
            .rules
            .values()
            .filter_map(|e| e.built.as_ref().ok().cloned())
            .collect()
    }

    /// The API rule `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Entry>> {
        self.held.read().rules.get(name).cloned()
    }

    /// How many are held, how many of those do not read here, and how
    /// many a file rule's name shadows.
    pub fn counts(&self) -> (usize, usize, usize) {
        let held = self.held.read();
        let bad = held.rules.values().filter(|e| e.built.is_err()).count();
        let shadowed = self.shadowed.load(std::sync::atomic::Ordering::Relaxed);
        (held.rules.len(), bad, shadowed)
    }

    /// Whether the rules were read from Redis since start.
    pub fn pulled(&self) -> bool {
        self.pulled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How many of the rules in force are the rules file's (the first
    /// ones).
    pub fn file_count(&self) -> usize {
        self.file_count.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The rules file's rule `name` in `set` (the rules in force).
    pub fn file_rule<'s>(&self, set: &'s RuleSet, name: &str) -> Option<&'s Rule> {
        let n = self.file_count().min(set.rules().len());
        set.rules()[..n].iter().find(|r| r.name() == name)
    }

    /// The names of API rules from `after` on (excluded) that start with
    /// `prefix`, with their entries, in name order, at most `limit`.
    pub fn page(&self, prefix: &str, after: &str, limit: usize) -> Vec<(String, Arc<Entry>)> {
        use std::ops::Bound;
        let held = self.held.read();
        let start = if after >= prefix {
            Bound::Excluded(after)
        } else {
            Bound::Included(prefix)
        };
        held.rules
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(n, _)| n.starts_with(prefix))
            .take(limit)
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect()
    }

    /// Reads a rule's JSON against this instance's context.
    pub fn build(&self, json: &Value) -> Result<Rule, String> {
        build(&self.ctx.read(), json)
    }

    /// Makes or replaces the API rule `name` (its `json` already carries
    /// the name, and reads: see [`build`](Self::build)) if `pre` holds;
    /// the entry made, and whether it is new.
    ///
    /// # Errors
    /// What [`Refused`] lists.
    #[allow(clippy::too_many_arguments)]
    pub async fn put(
        &self,
        redis: Option<&RedisStore>,
        assign: &Assignments,
        in_force: &RuleSet,
        name: &str,
        json: Value,
        pre: Precondition,
    ) -> Result<(Arc<Entry>, bool), Refused> {
        let rule = self.build(&json).map_err(Refused::Invalid)?;
        if self.file_rule(in_force, name).is_some() {
            return Err(Refused::FileRule);
        }
        let _w = self.writing.lock().await;
        let before = self.get(name);
        let version = match redis {
            Some(r) => {
                let text = json.to_string();
                match r.rules_put(name, &text, pre, MAX_RULES).await {
                    Ok(RuleWrite::Done(v)) => v,
                    Ok(RuleWrite::Exists(v)) => return Err(Refused::Exists(v)),
                    Ok(RuleWrite::Mismatch(v)) => return Err(Refused::Mismatch(v)),
                    Ok(RuleWrite::Full) => return Err(Refused::Full),
                    Ok(RuleWrite::Absent) => return Err(Refused::NotFound),
                    Err(e) => return Err(Refused::Store(e.to_string())),
                }
            }
            None => {
                let now = before.as_ref().map_or(0, |e| e.version);
                check(pre, before.is_some(), now)?;
                if before.is_none() && self.held.read().rules.len() >= MAX_RULES {
                    return Err(Refused::Full);
                }
                self.held.read().version + 1
            }
        };
        let entry = Arc::new(Entry {
            json,
            version,
            built: Ok(rule),
        });
        {
            let mut held = self.held.write();
            held.rules.insert(name.to_string(), entry.clone());
            if redis.is_none() {
                held.version = version;
            }
        }
        if redis.is_none()
            && let Err(e) = self.save(assign).await
        {
            let mut held = self.held.write();
            match &before {
                Some(b) => held.rules.insert(name.to_string(), b.clone()),
                None => held.rules.remove(name),
            };
            held.version -= 1;
            return Err(Refused::Store(store_error(e)));
        }
        self.changed.send_replace(self.version());
        Ok((entry, before.is_none()))
    }

    /// Deletes the API rule `name` if `pre` holds; the version it had.
    ///
    /// # Errors
    /// What [`Refused`] lists.
    pub async fn delete(
        &self,
        redis: Option<&RedisStore>,
        assign: &Assignments,
        in_force: &RuleSet,
        name: &str,
        pre: Precondition,
    ) -> Result<u64, Refused> {
        if self.file_rule(in_force, name).is_some() {
            return Err(Refused::FileRule);
        }
        let _w = self.writing.lock().await;
        let before = self.get(name);
        match redis {
            Some(r) => match r.rules_delete(name, pre).await {
                Ok(RuleWrite::Done(_)) => {}
                Ok(RuleWrite::Mismatch(v)) => return Err(Refused::Mismatch(v)),
                Ok(RuleWrite::Exists(v)) => return Err(Refused::Exists(v)),
                Ok(RuleWrite::Absent) => {
                    // Gone from Redis: gone here too (another instance
                    // deleted it, and the pull has not come yet).
                    self.held.write().rules.remove(name);
                    return Err(Refused::NotFound);
                }
                Ok(RuleWrite::Full) => return Err(Refused::Full),
                Err(e) => return Err(Refused::Store(e.to_string())),
            },
            None => {
                let Some(b) = &before else {
                    return Err(Refused::NotFound);
                };
                check(pre, true, b.version)?;
            }
        }
        {
            let mut held = self.held.write();
            held.rules.remove(name);
            if redis.is_none() {
                held.version += 1;
            }
        }
        if redis.is_none()
            && let Err(e) = self.save(assign).await
        {
            let mut held = self.held.write();
            if let Some(b) = &before {
                held.rules.insert(name.to_string(), b.clone());
            }
            held.version -= 1;
            return Err(Refused::Store(store_error(e)));
        }
        self.changed.send_replace(self.version());
        Ok(before.map_or(0, |b| b.version))
    }

    /// Writes the state file's section (a no-op without a file).
    async fn save(&self, assign: &Assignments) -> Result<(), WriteError> {
        if !assign.has_file() {
            return Ok(());
        }
        let section = {
            let held = self.held.read();
            Section {
                version: held.version,
                rules: held
                    .rules
                    .values()
                    .map(|e| SectionRule {
                        version: e.version,
                        rule: e.json.clone(),
                    })
                    .collect(),
            }
        };
        let value = serde_json::to_value(&section).unwrap_or_default();
        assign.save_api_rules(value).await
    }

    /// Pulls what changed in Redis since the version held; whether
    /// anything did.
    ///
    /// # Errors
    /// Redis failed (what is held stays; the next pull resumes).
    pub async fn pull(&self, redis: &RedisStore) -> Result<bool, String> {
        let now = redis.rules_version().await.map_err(|e| e.to_string())?;
        let first = !self.pulled();
        if now == self.version() && !first {
            return Ok(false);
        }
        let _w = self.writing.lock().await;
        let ctx = self.ctx.read().clone();
        let mut cursor = self.version();
        let mut changed = false;
        loop {
            let (now, list) = redis
                .rules_since(cursor, PULL_BATCH)
                .await
                .map_err(|e| e.to_string())?;
            let full = list.len() >= PULL_BATCH;
            // Read off the async workers: a batch is thousands of rules.
            let ctx2 = ctx.clone();
            let read = tokio::task::spawn_blocking(move || {
                list.into_iter()
                    .map(|c| {
                        let entry = c.json.as_ref().map(|text| {
                            let json: Value = serde_json::from_str(text)
                                .unwrap_or_else(|e| Value::String(format!("unreadable: {e}")));
                            let built = build(&ctx2, &json);
                            Arc::new(Entry {
                                json,
                                version: c.version,
                                built,
                            })
                        });
                        (c.name, c.version, entry)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| e.to_string())?;
            let mut held = self.held.write();
            for (name, version, entry) in read {
                cursor = cursor.max(version);
                // A write made here may be newer than what the log said
                // when it was read.
                if held.rules.get(&name).is_some_and(|e| e.version > version) {
                    continue;
                }
                changed = true;
                match entry {
                    None => {
                        held.rules.remove(&name);
                    }
                    Some(e) => {
                        if let Err(why) = &e.built {
                            tracing::warn!(rule = %name, "an API rule in redis does not read here: {why}");
                        }
                        held.rules.insert(name, e);
                    }
                }
            }
            if !full {
                cursor = cursor.max(now);
                held.version = cursor;
                break;
            }
            held.version = cursor;
        }
        self.pulled
            .store(true, std::sync::atomic::Ordering::Release);
        if changed {
            self.changed.send_replace(cursor);
        }
        Ok(changed || first)
    }

    /// Takes up the rules file's context; the rules held are read again
    /// if it changed.
    fn set_context(&self, ctx: Context) {
        if *self.ctx.read() == ctx {
            return;
        }
        let mut held = self.held.write();
        for e in held.rules.values_mut() {
            let built = build(&ctx, &e.json);
            *e = Arc::new(Entry {
                json: e.json.clone(),
                version: e.version,
                built,
            });
        }
        *self.ctx.write() = ctx;
    }

    /// The rules `file` (the rules file's), then the API rules that
    /// read under a name the file does not use, numbered `version`; how
    /// many API rules the file shadows. `None` when there is no API rule:
    /// the file's set goes in force as it is, nothing copied.
    fn compose(&self, file: &[Rule], like: &RuleSet, version: u64) -> Option<(RuleSet, usize)> {
        let held = self.held.read();
        if held.rules.is_empty() {
            return None;
        }
        let names: HashSet<&str> = file.iter().map(Rule::name).collect();
        let mut rules = file.to_vec();
        let mut shadowed = 0;
        for e in held.rules.values() {
            if let Ok(r) = &e.built {
                if names.contains(r.name()) {
                    shadowed += 1;
                } else {
                    rules.push(r.clone().with_health(self.health.clone()));
                }
            }
        }
        let mut set = RuleSet::with_path_matching(rules, like.path_matching());
        set.on_store_error = like.on_store_error;
        set.version = version;
        Some((set, shadowed))
    }
}

/// Puts the rules file's rule set `file` in force with the API rules (at
/// start and on every reload): the reload path's one call, in place of
/// swapping `file` in alone.
pub fn swap_in(admin: &AdminState, file: RuleSet, ctx: Context) {
    use std::sync::atomic::Ordering;
    let api = &admin.rules_api;
    let _a = api.applying.lock();
    api.set_context(ctx);
    let count = file.rules().len();
    let (set, shadowed) = match api.compose(file.rules(), &file, file.version) {
        Some(composed) => composed,
        None => (file, 0),
    };
    api.file_count.store(count, Ordering::Release);
    api.shadowed.store(shadowed, Ordering::Relaxed);
    admin.shared.events.rules_changed(&set);
    admin.shared.limiter.replace_rules(set);
}

/// Puts the API rules held in force after they changed (here or in
/// Redis), with the rules file's rules now in force.
pub fn applied(admin: &AdminState) {
    use std::sync::atomic::Ordering;
    {
        let api = &admin.rules_api;
        let _a = api.applying.lock();
        let now = admin.shared.limiter.rules();
        let file = &now.rules()[..api.file_count().min(now.rules().len())];
        let version = now.version + 1;
        let (set, shadowed) = match api.compose(file, &now, version) {
            Some(composed) => composed,
            None => {
                let mut set = RuleSet::with_path_matching(file.to_vec(), now.path_matching());
                set.on_store_error = now.on_store_error;
                set.version = version;
                (set, 0)
            }
        };
        api.shadowed.store(shadowed, Ordering::Relaxed);
        drop(now);
        admin.shared.events.rules_changed(&set);
        admin.shared.limiter.replace_rules(set);
    }
    admin.top.rules_changed(&admin.shared.limiter.rules());
    admin.recompile();
}

/// With a Redis store, pulls the API rules' changes every [`POLL_EVERY`]
/// until `stop`, and puts them in force.
pub async fn follow(admin: Arc<AdminState>, mut stop: watch::Receiver<bool>) {
    if admin.redis().is_none() {
        return;
    }
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let Some(r) = admin.redis() else { return };
        match admin.rules_api.pull(r).await {
            Ok(true) => {
                // Composing copies every rule: off the async workers.
                let a = admin.clone();
                let _ = tokio::task::spawn_blocking(move || applied(&a)).await;
            }
            Ok(false) => {}
            Err(e) => tracing::debug!("API rules not read from redis: {e}"),
        }
    }
}

/// Whether `pre` holds for a rule that exists (or not) at `version`.
fn check(pre: Precondition, exists: bool, version: u64) -> Result<(), Refused> {
    match pre {
        Precondition::None => Ok(()),
        Precondition::Exists if exists => Ok(()),
        Precondition::Absent if !exists => Ok(()),
        Precondition::Absent => Err(Refused::Exists(version)),
        Precondition::Version(v) if exists && v == version => Ok(()),
        Precondition::Exists | Precondition::Version(_) => Err(Refused::Mismatch(version)),
    }
}

fn store_error(e: WriteError) -> String {
    match e {
        WriteError::Full(m) | WriteError::Store(m) => m,
    }
}
