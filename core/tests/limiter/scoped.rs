//! The per-key operations on another scope than the client's own
//! (`Limiter::on_scope`): only that scope's layers change, exactly as the
//! per-subject operations change a client's own.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    Context, Error, Limit, Limiter, ManualClock, Policy, Scope, Subject, Timestamp,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::ready;

fn limiter() -> Limiter {
    let clock = ManualClock::new(Timestamp::from_micros(1_800_000_000_000_000));
    let store = Arc::new(MemoryStore::builder().clock(Arc::new(clock)).build());
    let window = |n| Limit::fixed_window(n, Duration::from_secs(60)).unwrap();
    Limiter::builder(store)
        .layer(
            "user",
            Scope::Subject,
            Policy::new("per-user", window(5)).unwrap(),
        )
        .layer(
            "tenant",
            Scope::Tenant,
            Policy::new("per-tenant", window(8)).unwrap(),
        )
        .build()
        .unwrap()
}

fn ctx(user: &str) -> Context {
    Context::for_subject(Subject::new(user).unwrap()).with_tenant(Subject::new("acme").unwrap())
}

/// What each layer has left for `user`, in layer order.
fn left(limiter: &Limiter, user: &str) -> Vec<u64> {
    let peeked = ready(limiter.peek(&ctx(user), 1)).unwrap();
    peeked
        .layers()
        .iter()
        .map(|l| l.verdict().remaining)
        .collect()
}

#[test]
fn a_penalty_and_a_reward_change_only_the_scopes_layers() {
    let limiter = limiter();
    let tenant = limiter.on_scope(&Scope::Tenant);
    let after = ready(tenant.penalize(&ctx("u1"), 3)).unwrap();
    assert_eq!(after.layers().len(), 1, "the tenant's layer alone");
    assert_eq!(after.layers()[0].verdict().remaining, 5);
    assert_eq!(
        left(&limiter, "u1"),
        [5, 5],
        "the user's own layer is untouched"
    );
    assert_eq!(
        left(&limiter, "u2"),
        [5, 5],
        "every user of the tenant sees it"
    );
    ready(tenant.reward(&ctx("u2"), 2)).unwrap();
    assert_eq!(left(&limiter, "u1"), [5, 7]);
}

#[test]
fn a_block_of_a_tenant_denies_its_users_until_a_reset() {
    let limiter = limiter();
    let tenant = limiter.on_scope(&Scope::Tenant);
    let blocked = ready(tenant.block(&ctx("u1"), Duration::from_secs(600))).unwrap();
    assert_eq!(blocked.retry_after(), Some(Duration::from_secs(600)));
    let d = ready(limiter.check(&ctx("u3"), 1)).unwrap();
    assert!(!d.is_allowed(), "another user of the blocked tenant");
    ready(tenant.reset(&ctx("u3"))).unwrap();
    assert!(ready(limiter.check(&ctx("u3"), 1)).unwrap().is_allowed());
    assert_eq!(
        left(&limiter, "u3"),
        [4, 7],
        "the reset left the user's layer alone"
    );
}

#[test]
fn a_scope_without_layers_is_an_operation_error_naming_it() {
    let limiter = limiter();
    let error = ready(limiter.on_scope(&Scope::Global).penalize(&ctx("u1"), 1)).unwrap_err();
    match error {
        Error::Operation { operation, reason } => {
            assert_eq!(operation, "penalize");
            assert!(reason.contains("Global"), "{reason}");
        }
        other => panic!("expected an operation error, got {other:?}"),
    }
}
