//! What cannot work is refused when a limiter is built, with an error that
//! names the layers at fault.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    BuildError, Fallback, Limit, Limiter, LimiterBuilder, OnStoreFailure, Policy, Scope,
};
use tollgate_testkit::DownStore;

fn policy(name: &str) -> Policy {
    Policy::new(
        name,
        Limit::fixed_window(5, Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
}

fn builder() -> LimiterBuilder {
    Limiter::builder(Arc::new(DownStore))
}

#[test]
fn limiters_that_cannot_work_are_refused_when_built() {
    assert_eq!(builder().build().unwrap_err(), BuildError::NoLayers);
    let twice = builder()
        .layer("a", Scope::Subject, policy("p"))
        .layer("a", Scope::Tenant, policy("q"))
        .build();
    assert_eq!(twice.unwrap_err(), BuildError::DuplicateLayer("a".into()));
    let shared = builder()
        .layer("a", Scope::Subject, policy("p"))
        .layer("b", Scope::Subject, policy("p"))
        .build()
        .unwrap_err();
    assert_eq!(
        shared,
        BuildError::SharedCounter {
            first: "a".into(),
            second: "b".into(),
            policy: "p".into()
        }
    );
    assert!(shared.to_string().contains("share one counter"), "{shared}");
    // Another scope, or another version, is another counter.
    assert!(builder()
        .layer("a", Scope::Subject, policy("p"))
        .layer("b", Scope::Tenant, policy("p"))
        .layer("c", Scope::Subject, policy("p").with_version(2))
        .build()
        .is_ok());
    let fallback = policy("p")
        .with_on_failure(OnStoreFailure::Fallback(Fallback::Share { instances: 2 }))
        .unwrap();
    assert_eq!(
        builder()
            .layer("a", Scope::Subject, fallback)
            .build()
            .unwrap_err(),
        BuildError::NoFallbackStore("a".into())
    );
}
