//! The admin maps (overrides, plans) shared through Redis, on a real
//! redis-server and a real cluster.

use super::*;

/// Fields and values as an operator may write them: any UTF-8, braces,
/// separators, line breaks and NUL included.
const ODD: [(&str, &str); 4] = [
    ("api/alice", r#"{"plan":"pro"}"#),
    ("api/{ключ}:1", "ü\n\"quoted\"\ttab"),
    ("api/a\0b", ""),
    ("", "an empty field"),
];

/// Two stores on the same Redis (and prefix) see each other's changes;
/// each change bumps the version by one; deletes say whether the field
/// was there; other maps and other prefixes are apart.
fn shared_between_two_stores(rt: &tokio::runtime::Runtime, a: &RedisStore, b: &RedisStore) {
    rt.block_on(async {
        assert_eq!(a.admin_version().await.unwrap(), 0, "never written");
        assert_eq!(a.admin_all("plans").await.unwrap(), (vec![], 0));
        let mut version = 0;
        for (i, (field, value)) in ODD.iter().enumerate() {
            let by = if i % 2 == 0 { a } else { b };
            let v = by.admin_put("plans", field, value).await.unwrap();
            assert_eq!(v, version + 1);
            version = v;
        }
        let mut expected: Vec<(String, String)> = ODD
            .iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect();
        expected.sort();
        for s in [a, b] {
            assert_eq!(
                s.admin_all("plans").await.unwrap(),
                (expected.clone(), version)
            );
            assert_eq!(s.admin_version().await.unwrap(), version);
        }
        // A put replaces the value.
        version = b.admin_put("plans", "api/alice", "free").await.unwrap();
        let (all, at) = a.admin_all("plans").await.unwrap();
        assert_eq!(at, version);
        assert!(all.contains(&("api/alice".to_string(), "free".to_string())));
        // Another map, same version counter.
        let v = a
            .admin_put("overrides", "api/alice", "block")
            .await
            .unwrap();
        assert_eq!(v, version + 1);
        assert_eq!(
            b.admin_all("overrides").await.unwrap(),
            (vec![("api/alice".to_string(), "block".to_string())], v)
        );
        // Deletes, whether or not the field is there, bump the version.
        assert_eq!(
            b.admin_delete("overrides", "api/alice").await.unwrap(),
            (true, v + 1)
        );
        assert_eq!(
            a.admin_delete("overrides", "api/alice").await.unwrap(),
            (false, v + 2)
        );
        assert_eq!(a.admin_all("overrides").await.unwrap(), (vec![], v + 2));
        for (field, _) in ODD {
            assert!(a.admin_delete("plans", field).await.unwrap().0, "{field:?}");
        }
        let (plans, at) = b.admin_all("plans").await.unwrap();
        assert!(plans.is_empty(), "{plans:?}");
        assert_eq!(at, v + 2 + ODD.len() as u64);
    });
}

#[test]
fn admin_maps_are_shared_by_every_store_on_one_redis() {
    let server = RedisServer::start();
    let rt = rt();
    let (a, b) = (
        rt.block_on(connected(server.url())),
        rt.block_on(connected(server.url())),
    );
    shared_between_two_stores(&rt, &a, &b);
    // Every admin key is under the prefix.
    let keys = server.cli(&["KEYS", "*"]);
    let mut keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["spillway:{admin}:version"], "the maps emptied");
    rt.block_on(a.admin_put("plans", "k", "v")).unwrap();
    assert!(
        server
            .cli(&["HGET", "spillway:{admin}:map:plans", "k"])
            .contains('v')
    );
    // Another prefix is another set of maps.
    let other = rt.block_on(async {
        let s = RedisStore::new(RedisConfig {
            prefix: "other:".to_string(),
            ..config(server.url())
        })
        .unwrap();
        assert!(s.wait_connected(Duration::from_secs(5)).await);
        s
    });
    assert_eq!(rt.block_on(other.admin_all("plans")).unwrap(), (vec![], 0));
}

#[test]
fn admin_maps_live_in_one_slot_of_a_cluster() {
    let cluster = RedisCluster::start();
    let rt = rt();
    let store = || {
        rt.block_on(async {
            let s = RedisStore::new(RedisConfig {
                cluster: cluster.urls(),
                timeout: TIMEOUT,
                // A brace in the prefix moves the hash tag, for every
                // admin key alike.
                prefix: "a{b:".to_string(),
                ..RedisConfig::default()
            })
            .unwrap();
            assert!(s.wait_connected(Duration::from_secs(10)).await);
            s
        })
    };
    let (a, b) = (store(), store());
    shared_between_two_stores(&rt, &a, &b);
    let slot = |key: &str| cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", key]);
    assert_eq!(
        slot("a{b:{admin}:version"),
        slot("a{b:{admin}:map:overrides")
    );
}

/// A value Redis holds that is not ours is an error, never a panic; a
/// store that cannot reach Redis says so, as a transient error.
#[test]
fn admin_errors_are_clear() {
    let mut server = RedisServer::start();
    let rt = rt();
    let redis = rt.block_on(connected_with(server.url(), Duration::from_millis(500)));
    server.cli(&["SET", "spillway:{admin}:version", "not a number"]);
    let e = rt.block_on(redis.admin_put("plans", "k", "v")).unwrap_err();
    assert!(!e.transient(), "{e}");
    assert!(rt.block_on(redis.admin_version()).is_err());
    server.cli(&["DEL", "spillway:{admin}:version"]);
    server.cli(&["HSET", "spillway:{admin}:map:plans", "k", "\u{ff}"]);
    // Written by redis-cli as UTF-8 (ÿ): still readable.
    let (all, _) = rt.block_on(redis.admin_all("plans")).unwrap();
    assert_eq!(all, [("k".to_string(), "\u{ff}".to_string())]);
    server.kill();
    let e = rt.block_on(redis.admin_version()).unwrap_err();
    assert!(e.transient(), "{e}");
    let e = rt.block_on(redis.admin_put("plans", "k", "v")).unwrap_err();
    assert!(e.transient(), "{e}");
}

/// A sweep deletes an entry only if what Redis holds has ended: one
/// another instance renewed stays. Counters stand apart from the version.
#[test]
fn an_expiry_sweep_never_deletes_a_renewed_entry() {
    let server = RedisServer::start();
    let rt = rt();
    let a = rt.block_on(connected(server.url()));
    rt.block_on(async {
        a.admin_put("overrides", "k", r#"{"expires_unix_ms": 1000}"#)
            .await
            .unwrap();
        // Not ended yet at 999: kept, version untouched.
        let v = a.admin_version().await.unwrap();
        assert_eq!(
            a.admin_expire("overrides", "k", 999).await.unwrap(),
            (false, v)
        );
        // Renewed (by another instance) before the sweep at 1000.
        a.admin_put("overrides", "k", r#"{"expires_unix_ms": 5000}"#)
            .await
            .unwrap();
        assert!(!a.admin_expire("overrides", "k", 1000).await.unwrap().0);
        assert_eq!(a.admin_all("overrides").await.unwrap().0.len(), 1);
        // Ended: gone, and the version moves.
        let v = a.admin_version().await.unwrap();
        assert_eq!(
            a.admin_expire("overrides", "k", 5000).await.unwrap(),
            (true, v + 1)
        );
        // Not JSON, or no end: never swept; a missing field: nothing.
        a.admin_put("overrides", "x", "not json").await.unwrap();
        a.admin_put("overrides", "y", r#"{"plan": "pro"}"#)
            .await
            .unwrap();
        assert!(
            !a.admin_expire("overrides", "x", u64::MAX / 2)
                .await
                .unwrap()
                .0
        );
        assert!(
            !a.admin_expire("overrides", "y", u64::MAX / 2)
                .await
                .unwrap()
                .0
        );
        assert!(!a.admin_expire("overrides", "gone", 1).await.unwrap().0);
        // A counter: bumped and read without moving the version.
        let v = a.admin_version().await.unwrap();
        assert_eq!(a.admin_counter("resets").await.unwrap(), 0);
        assert_eq!(a.admin_incr("resets").await.unwrap(), 1);
        assert_eq!(a.admin_incr("resets").await.unwrap(), 2);
        assert_eq!(a.admin_counter("resets").await.unwrap(), 2);
        assert_eq!(a.admin_version().await.unwrap(), v);
    });
}
