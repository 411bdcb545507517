//! Shadow layers never fail a request: not by denying, not by a cost above
//! their capacity, not by lacking the subject they count, not by a store
//! error about their own keys.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    Context, KeyBudget, Limit, Limiter, Policy, Scope, Source, Subject, WhenFull,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::ready;

fn window(n: u64) -> Limit {
    Limit::fixed_window(n, Duration::from_secs(60)).unwrap()
}

fn ctx(name: &str) -> Context {
    Context::for_subject(Subject::new(name).unwrap())
}

#[test]
fn a_shadow_layer_that_cannot_decide_is_left_out() {
    let store = Arc::new(MemoryStore::default());
    let limiter = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("api", window(10)).unwrap(),
        )
        // Capacity 2 < cost 3; and it counts per tenant, which requests lack.
        .layer(
            "trial",
            Scope::Tenant,
            Policy::new("trial", window(2)).unwrap().shadow(),
        )
        .build()
        .unwrap();
    let d = ready(limiter.check(&ctx("k"), 3)).unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(
        d.layers()[0].verdict().remaining,
        7,
        "the enforced layer decided"
    );
    assert_eq!(d.shadow_denied().count(), 1);
    assert_eq!(
        d.layers()[1].source,
        Source::FailClosed,
        "not decided by the store"
    );
    // Over the enforced layer's capacity is still an error.
    assert!(ready(limiter.check(&ctx("k"), 11)).is_err());
    // A peek leaves it out as a check does, charging nothing.
    let peeked = ready(limiter.peek(&ctx("k"), 3)).unwrap();
    assert_eq!(peeked.layers()[0].verdict().remaining, 7, "nothing charged");
    assert_eq!(peeked.layers()[1].source, Source::FailClosed);
    assert!(ready(limiter.peek(&ctx("k"), 11)).is_err());
}

#[test]
fn a_store_error_about_a_shadow_policy_leaves_the_enforced_layers_to_decide() {
    let store = Arc::new(MemoryStore::builder().when_full(WhenFull::Refuse).build());
    let trial = Policy::new("trial", window(5))
        .unwrap()
        .with_key_budget(KeyBudget::new(1, WhenFull::Refuse).unwrap())
        .shadow();
    let limiter = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("api", window(10)).unwrap(),
        )
        .layer("trial", Scope::Subject, trial)
        .build()
        .unwrap();
    assert!(ready(limiter.check(&ctx("a"), 1)).unwrap().is_allowed());
    // The trial policy's one-key budget is full: a new subject's trial key
    // cannot be stored, and the request is still decided by `api`.
    let d = ready(limiter.check(&ctx("b"), 1)).unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.store_error(), None);
    assert_eq!(d.layers()[0].verdict().remaining, 9);
    assert_eq!(d.shadow_denied().count(), 1);
}

#[test]
fn only_shadow_layers_admit_everything_and_count() {
    let store = Arc::new(MemoryStore::default());
    let limiter = Limiter::builder(store)
        .layer(
            "trial",
            Scope::Subject,
            Policy::new("trial", window(2)).unwrap().shadow(),
        )
        .build()
        .unwrap();
    let mut would_deny = 0;
    for _ in 0..5 {
        let d = ready(limiter.check(&ctx("k"), 1)).unwrap();
        assert!(d.is_allowed());
        would_deny += d.shadow_denied().count();
    }
    assert_eq!(would_deny, 3);
}

/// Only the shadow layer that cannot decide is left out: another shadow
/// layer of the same request is still decided and counted.
#[test]
fn only_the_undecidable_shadow_layer_is_left_out() {
    let store = Arc::new(MemoryStore::default());
    let per_tenant = Policy::new("trial-tenant", window(5)).unwrap().shadow();
    let per_key = Policy::new("trial-key", window(2)).unwrap().shadow();
    let limiter = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new("api", window(10)).unwrap(),
        )
        .layer("tenant-trial", Scope::Tenant, per_tenant)
        .layer("key-trial", Scope::Subject, per_key.clone())
        .build()
        .unwrap();
    for i in 0..3 {
        let d = ready(limiter.check(&ctx("k"), 1)).unwrap();
        assert!(d.is_allowed());
        assert_eq!(
            d.layers()[1].source,
            Source::FailClosed,
            "no tenant: left out"
        );
        assert_eq!(d.layers()[2].source, Source::Store, "decided");
        assert_eq!(d.layers()[2].verdict().allowed, i < 2, "request {i}");
    }
    // The per-key trial counted its two admissions.
    let twin = Limiter::builder(store)
        .layer("l", Scope::Subject, per_key.enforced())
        .build()
        .unwrap();
    assert!(!ready(twin.check(&ctx("k"), 1)).unwrap().is_allowed());
}
