//! Admin state shared by every instance on one Redis: small maps
//! (overrides, plans) and a version bumped by each change (see
//! `lua/admin.lua`).
//!
//! The calls are rare (an operator's), so they go straight to Redis
//! rather than through the decision batcher, each bounded by the store's
//! timeout. They neither ask nor feed the circuit breaker: an operator
//! gets Redis's own answer even while decisions are refused, and an
//! admin call that fails does not make decisions follow the failure
//! policy.

use redis::{Cmd, FromRedisValue};
use spillway_store::StoreError;

use crate::fault::{self, Fault};
use crate::{ADMIN_LUA, Conn, RedisStore, err, keys};

impl RedisStore {
    /// Forgets every refusal this instance's over-limit cache learned:
    /// another instance reset a key in Redis (seen as a move of the admin
    /// version), and a refusal learned before may now be wrong.
    pub fn forget_refusals(&self) {
        if let Some(o) = &self.inner.over {
            o.clear();
        }
    }

    /// Sets `field` to `value` in the admin map `map` (e.g. "overrides",
    /// "plans"); returns the new admin version. The change and the
    /// version's bump are one atomic step. Field and value are stored as
    /// given (any UTF-8, binary-safe).
    ///
    /// The map is the hash `<prefix>{admin}:map:<map>` and the version
    /// the counter `<prefix>{admin}:version`: every admin key shares the
    /// hash tag `{admin}`, so on a cluster they all live in one slot.
    ///
    /// # Errors
    /// Redis cannot be reached or did not answer within the store's
    /// timeout (transient), or refused the call (a key under the prefix
    /// that holds something else: not transient).
    pub async fn admin_put(&self, map: &str, field: &str, value: &str) -> Result<u64, StoreError> {
        let cmd = self.admin_cmd(map, "put", &[field, value]);
        self.query(&cmd).await
    }

    /// Removes `field` from the admin map `map`; whether it was there,
    /// and the new admin version (bumped whether or not it was).
    ///
    /// # Errors
    /// As [`admin_put`](Self::admin_put).
    pub async fn admin_delete(&self, map: &str, field: &str) -> Result<(bool, u64), StoreError> {
        let cmd = self.admin_cmd(map, "delete", &[field]);
        let (gone, version): (u64, u64) = self.query(&cmd).await?;
        Ok((gone > 0, version))
    }

    /// Every field and value of the admin map `map`, sorted by field, and
    /// the admin version they were read at (one script call: atomically).
    /// A map never written is empty.
    ///
    /// # Errors
    /// As [`admin_put`](Self::admin_put); and, not transient, a field or
    /// value that is not UTF-8 (written by something else than this
    /// store).
    pub async fn admin_all(&self, map: &str) -> Result<(Vec<(String, String)>, u64), StoreError> {
        let cmd = self.admin_cmd(map, "all", &[]);
        let (flat, version): (Vec<Vec<u8>>, u64) = self.query(&cmd).await?;
        let text = |b: Vec<u8>| {
            String::from_utf8(b).map_err(|_| {
                err(
                    false,
                    format!(
                        "redis: the admin map {map:?} holds a field or value that is not UTF-8"
                    ),
                )
            })
        };
        let mut out = Vec::with_capacity(flat.len() / 2);
        let mut it = flat.into_iter();
        while let (Some(f), Some(v)) = (it.next(), it.next()) {
            out.push((text(f)?, text(v)?));
        }
        out.sort_unstable();
        Ok((out, version))
    }

    /// The admin version: bumped by every [`admin_put`](Self::admin_put)
    /// and [`admin_delete`](Self::admin_delete); 0 when none was ever
    /// made. Cheap (one `GET`): an instance polls it to learn when to
    /// read the maps again.
    ///
    /// # Errors
    /// As [`admin_put`](Self::admin_put).
    pub async fn admin_version(&self) -> Result<u64, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(keys::admin_version_key(&self.inner.config.prefix));
        let v: Option<u64> = self.query(&cmd).await?;
        Ok(v.unwrap_or(0))
    }

    /// The call of `lua/admin.lua` doing `op` on `map` with `args`.
    fn admin_cmd(&self, map: &str, op: &str, args: &[&str]) -> Cmd {
        let prefix = &self.inner.config.prefix;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(ADMIN_LUA)
            .arg(2)
            .arg(keys::admin_map_key(prefix, map))
            .arg(keys::admin_version_key(prefix))
            .arg(op);
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }

    /// Removes `field` from `map` only if its value (a JSON object) has an
    /// `expires_unix_ms` at or before `now_ms`; whether it did, and the
    /// admin version (bumped only if it did). For sweeping ended entries
    /// without deleting one that another instance just renewed.
    ///
    /// # Errors
    /// As [`admin_put`](Self::admin_put).
    pub async fn admin_expire(
        &self,
        map: &str,
        field: &str,
        now_ms: u64,
    ) -> Result<(bool, u64), StoreError> {
        let now = now_ms.to_string();
        let cmd = self.admin_cmd(map, "expire", &[field, &now]);
        let (gone, version): (u64, u64) = self.query(&cmd).await?;
        Ok((gone == 1, version))
    }

    /// Adds one to the admin counter `name` (apart from the admin version:
    /// a bump here does not make instances read the maps again); its new
    /// value.
    ///
    /// # Errors
    /// As [`admin_put`](Self::admin_put).
    pub async fn admin_incr(&self, name: &str) -> Result<u64, StoreError> {
        let cmd = self.admin_cmd(name, "incr", &[]);
        self.query(&cmd).await
    }

    /// The admin counter `name` (0 if never bumped).
    ///
    /// # Errors
    /// As [`admin_put`](Self::admin_put).
    pub async fn admin_counter(&self, name: &str) -> Result<u64, StoreError> {
        let cmd = self.admin_cmd(name, "get", &[]);
        self.query(&cmd).await
    }

    /// Sends one command straight to Redis (not through the batcher, nor
    /// past the circuit breaker) and reads its reply as a `T`, within the
    /// store's timeout.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let timeout = self.inner.config.timeout;
        let Some(conn) = self.inner.current() else {
            return Err(err(true, "not connected to redis yet"));
        };
        let call = async {
            match conn {
                Conn::Single(mut c) => cmd.query_async::<T>(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async::<T>(&mut c).await,
            }
        };
        let _due = spillway_store::due::Awaiting::new();
        match Box::pin(tokio::time::timeout(timeout, call)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let f = Fault::of(&e);
                let message = if f == Fault::Timeout {
                    format!("redis did not answer within {timeout:?}")
                } else {
                    format!("redis: {}", fault::said(&e))
                };
                Err(err(f.transient(), message))
            }
            Err(_) => Err(err(
                true,
                format!("redis did not answer within {timeout:?}"),
            )),
        }
    }
}
