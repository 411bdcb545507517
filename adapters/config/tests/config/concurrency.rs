//! Concurrency limits in the configuration file: a route with a rate layer
//! and a concurrency layer, decided with `acquire`, and the mistakes a
//! file can make reported with their field path.

use std::sync::Arc;

use tollgate_config::{Config, LiveConfig};
use tollgate_limiter::{Context, ManualClock, ReloadableRoute as _, Subject, Timestamp};

const FILE: &str = r#"
[policies.per_minute]
algorithm = "fixed_window"
limit = 60
window = "1m"

[policies.exports]
algorithm = "concurrency"
limit = 2
lease = "30s"

[routes.export]
layers = [
    { name = "minute", scope = "subject", policy = "per_minute" },
    { name = "in-flight", scope = "subject", policy = "exports" },
]
"#;

#[tokio::test]
async fn a_route_holds_two_exports_in_flight_per_customer() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let live = LiveConfig::new(Config::from_toml_str(FILE).unwrap(), Arc::new(clock))
        .await
        .unwrap();
    let route = live.route("export").unwrap().current();
    let limiter = route.limiter();
    assert!(limiter.has_concurrency());
    let ctx = Context::for_subject(Subject::new("acme").unwrap());
    let first = limiter.acquire(&ctx, 1).await.unwrap();
    let second = limiter.acquire(&ctx, 1).await.unwrap();
    assert!(first.permit.is_some() && second.permit.is_some());
    let third = limiter.acquire(&ctx, 1).await.unwrap();
    assert!(!third.decision.is_allowed());
    let denied = third.decision.denied_layers().next().unwrap();
    assert_eq!(denied.layer(), "in-flight");
    first.permit.unwrap().release().await.unwrap();
    assert!(limiter
        .acquire(&ctx, 1)
        .await
        .unwrap()
        .decision
        .is_allowed());
}

#[test]
fn a_bad_concurrency_policy_names_its_field() {
    for (bad, field) in [
        ("limit = 0\nlease = \"30s\"", "limit"),
        ("limit = 2\nlease = \"10ms\"", "lease"),
        ("limit = 2", "lease"),
        ("limit = 2\nlease = \"30s\"\nwindow = \"1m\"", "window"),
    ] {
        let file = format!(
            "[policies.exports]\nalgorithm = \"concurrency\"\n{bad}\n\n\
             [routes.export]\nlayers = [{{ name = \"in-flight\", scope = \"subject\", policy = \"exports\" }}]\n"
        );
        let error = Config::from_toml_str(&file).unwrap_err().to_string();
        assert!(error.contains(field), "{bad}: {error}");
    }
}

/// A reload may change a concurrency limit's places, and its lease only
/// with its version: places held now live in the same keys, and a shorter
/// lease would count them as gone.
#[tokio::test]
async fn a_reload_changes_a_lease_only_with_the_version() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let live = LiveConfig::new(Config::from_toml_str(FILE).unwrap(), Arc::new(clock))
        .await
        .unwrap();
    let edited = |from: &str, to: &str| Config::from_toml_str(&FILE.replace(from, to)).unwrap();
    let refused = live
        .reload_with(edited("lease = \"30s\"", "lease = \"10s\""))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("policies.exports.lease"),
        "{refused}"
    );
    let more_places = edited("limit = 2", "limit = 3");
    live.reload_with(more_places)
        .await
        .expect("places may change");
    let bumped = edited("lease = \"30s\"", "lease = \"10s\"\nversion = 2");
    live.reload_with(bumped)
        .await
        .expect("a new version may change the lease");
    // Version 1 removed, then back with another lease: its places may
    // still be in the store, under the lease it had.
    let elsewhere = FILE
        .replace("policy = \"exports\"", "policy = \"others\"")
        .replace("[policies.exports]", "[policies.others]");
    live.reload_with(Config::from_toml_str(&elsewhere).unwrap())
        .await
        .expect("exports removed");
    let back = live
        .reload_with(edited("lease = \"30s\"", "lease = \"5s\""))
        .await
        .unwrap_err();
    assert!(
        back.to_string().contains("policies.exports.lease"),
        "{back}"
    );
}
