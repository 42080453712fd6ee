//! Tests of the service as a whole that belong to no way in.

use spillway_core::{Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule};
use spillway_store::{Charge, Key, Store};

/// Every await up the stack copies the store's future: the sync
/// store's lease path must not make every decision's future large.
#[test]
fn a_decision_future_stays_small() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in = rt.enter();
    let redis = spillway_redis::RedisStore::new(spillway_redis::RedisConfig::default()).unwrap();
    let store = crate::ServerStore::Sync(spillway_sync::SyncStore::new(
        spillway_sync::SyncConfig {
            mode: spillway_sync::SyncMode::Lease,
            ..Default::default()
        },
        redis,
        Vec::new(),
    ));
    let rule = Rule::new(
        "r",
        None,
        KeySpec::parse("user").unwrap(),
        vec![Limit::Gcra(
            Gcra::new(Rate::new(1, Nanos::from_secs(1)).unwrap(), 1).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap();
    let key = Key::from_parts(["a"]);
    let charges = [Charge {
        rule: &rule,
        key: &key,
    }];
    let size = std::mem::size_of_val(&store.decide(&charges, 1));
    assert!(size <= 512, "the decision future is {size} bytes");
}
