//! Rules made over the admin API, shared by every instance on one Redis
//! (see `lua/rules.lua`): a hash of rules by name, a version bumped by
//! every change, and a change log (a sorted set of names by the version
//! of their last change) that each instance pulls from by version, so a
//! change costs every instance one read of what changed, not of every
//! rule.
//!
//! Like the admin maps, these calls go straight to Redis, bounded by the
//! store's timeout, and neither ask nor feed the circuit breaker.

use redis::Cmd;
use spillway_store::StoreError;

use crate::{RULES_LUA, RedisStore, err};

/// What a write asks of the rule's state before it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Nothing.
    None,
    /// The rule exists (`If-Match: *`).
    Exists,
    /// The rule does not exist (`If-None-Match: *`).
    Absent,
    /// The rule exists at this version (`If-Match` with its ETag).
    Version(u64),
}

impl Precondition {
    fn arg(self) -> String {
        match self {
            Precondition::None => String::new(),
            Precondition::Exists => "*".into(),
            Precondition::Absent => "-".into(),
            Precondition::Version(v) => v.to_string(),
        }
    }
}

/// A write's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleWrite {
    /// Made: the new version (the rule's own, and the log's).
    Done(u64),
    /// Refused: the rule exists (at this version) and must not.
    Exists(u64),
    /// Refused: the rule is not at the version asked (its own, 0 when it
    /// does not exist).
    Mismatch(u64),
    /// Refused: as many rules are held as allowed.
    Full,
    /// A delete of a rule that does not exist.
    Absent,
}

/// One change pulled from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleChange {
    /// The rule's name.
    pub name: String,
    /// The version of this change.
    pub version: u64,
    /// The rule as JSON; `None` when it was deleted.
    pub json: Option<String>,
}

/// `<prefix>{rules}:<what>`: every key of the API rules carries the hash
/// tag `{rules}` right after the prefix (one cluster slot).
fn key(prefix: &str, what: &str) -> String {
    format!("{prefix}{{rules}}:{what}")
}

impl RedisStore {
    /// Sets the rule `name` to `json` if `pre` holds and fewer than `max`
    /// rules are held (a replacement always fits).
    ///
    /// # Errors
    /// Redis cannot be reached or did not answer within the store's
    /// timeout (transient), or refused the call.
    pub async fn rules_put(
        &self,
        name: &str,
        json: &str,
        pre: Precondition,
        max: usize,
    ) -> Result<RuleWrite, StoreError> {
        let cmd = self.rules_cmd("put", &[name, json, &pre.arg(), &max.to_string()]);
        let (status, v): (String, u64) = self.query(&cmd).await?;
        Ok(write(&status, v))
    }

    /// Deletes the rule `name` if `pre` holds.
    ///
    /// # Errors
    /// As [`rules_put`](Self::rules_put).
    pub async fn rules_delete(
        &self,
        name: &str,
        pre: Precondition,
    ) -> Result<RuleWrite, StoreError> {
        let cmd = self.rules_cmd("delete", &[name, &pre.arg()]);
        let (status, v): (String, u64) = self.query(&cmd).await?;
        Ok(write(&status, v))
    }

    /// The changes after `version`, at most `max` of them in version
    /// order, and the current version (all of them were read when fewer
    /// than `max` came: resume after the last one's version otherwise).
    /// `rules_since(0, ..)` reads every rule held.
    ///
    /// # Errors
    /// As [`rules_put`](Self::rules_put); and, not transient, a name or
    /// rule that is not UTF-8 (written by something else than this store).
    pub async fn rules_since(
        &self,
        version: u64,
        max: usize,
    ) -> Result<(u64, Vec<RuleChange>), StoreError> {
        let cmd = self.rules_cmd("since", &[&version.to_string(), &max.to_string()]);
        let flat: Vec<redis::Value> = self.query(&cmd).await?;
        let bad = || {
            err(
                false,
                "redis: the API rules' change log holds something this store did not write",
            )
        };
        let mut it = flat.into_iter();
        let now: u64 = it
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(bad)?;
        let mut out = Vec::new();
        while let (Some(n), Some(v), Some(j)) = (it.next(), it.next(), it.next()) {
            let name: String = redis::from_redis_value(n).map_err(|_| bad())?;
            let version: u64 = redis::from_redis_value(v).map_err(|_| bad())?;
            let json: Option<String> = redis::from_redis_value(j).map_err(|_| bad())?;
            out.push(RuleChange {
                name,
                version,
                json,
            });
        }
        Ok((now, out))
    }

    /// The API rules' version: bumped by every change; 0 when none was
    /// ever made. Cheap (one `GET`): an instance polls it to learn when
    /// to pull.
    ///
    /// # Errors
    /// As [`rules_put`](Self::rules_put).
    pub async fn rules_version(&self) -> Result<u64, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key(&self.inner.config.prefix, "version"));
        let v: Option<u64> = self.query(&cmd).await?;
        Ok(v.unwrap_or(0))
    }

    /// The call of `lua/rules.lua` doing `op` with `args`.
    fn rules_cmd(&self, op: &str, args: &[&str]) -> Cmd {
        let prefix = &self.inner.config.prefix;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RULES_LUA)
            .arg(3)
            .arg(key(prefix, "rules"))
            .arg(key(prefix, "version"))
            .arg(key(prefix, "log"))
            .arg(op);
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }
}

fn write(status: &str, v: u64) -> RuleWrite {
    match status {
        "ok" => RuleWrite::Done(v),
        "exists" => RuleWrite::Exists(v),
        "full" => RuleWrite::Full,
        "absent" => RuleWrite::Absent,
        _ => RuleWrite::Mismatch(v),
    }
}
