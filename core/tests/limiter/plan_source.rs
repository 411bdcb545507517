//! Plans from the application's own source: asked once per customer and
//! cached, under a deadline; a source that fails or hangs leaves the
//! request to the default plan, within the deadline.
#![cfg(feature = "plan-source")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    async_trait, Context, Limit, Limiter, Plan, PlanCacheConfig, PlanName, PlanSource,
    PlanSourceError, Plans, Policy, Scope, Subject,
};
use tollgate_memory::MemoryStore;

const MINUTE: Duration = Duration::from_secs(60);

/// Answers `pro` for `key-pro`, the default for anyone else, or, as told,
/// fails or never answers; counts how often it is asked.
#[derive(Debug)]
struct Accounts {
    asked: AtomicU64,
    behaviour: Behaviour,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Behaviour {
    Answers,
    Fails,
    Hangs,
}

#[async_trait]
impl PlanSource for Accounts {
    async fn plan_of(&self, customer: &Subject) -> Result<Option<PlanName>, PlanSourceError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        match self.behaviour {
            Behaviour::Answers => {
                Ok((customer.as_str() == "key-pro").then(|| PlanName::new("pro").unwrap()))
            }
            Behaviour::Fails => Err(PlanSourceError::new("the accounts database is down")),
            Behaviour::Hangs => std::future::pending().await,
        }
    }
}

fn setup(behaviour: Behaviour) -> (Arc<Accounts>, Limiter) {
    setup_waiting(behaviour, Duration::from_millis(20))
}

/// As [`setup`], each question to the source given `deadline`.
fn setup_waiting(behaviour: Behaviour, deadline: Duration) -> (Arc<Accounts>, Limiter) {
    let accounts = Arc::new(Accounts {
        asked: AtomicU64::new(0),
        behaviour,
    });
    let plans = Plans::new(Plan::new("free").unwrap())
        .plan(
            Plan::new("pro")
                .unwrap()
                .limit("per-key", Limit::fixed_window(600, MINUTE).unwrap()),
        )
        .source(
            accounts.clone(),
            PlanCacheConfig::default()
                .ttl(Duration::from_secs(30))
                .deadline(deadline),
        );
    let limiter = Limiter::builder(Arc::new(MemoryStore::builder().build()))
        .layer(
            "key",
            Scope::Subject,
            Policy::new("per-key", Limit::fixed_window(60, MINUTE).unwrap()).unwrap(),
        )
        .plans(plans)
        .build()
        .unwrap();
    (accounts, limiter)
}

fn customer(name: &str) -> Context {
    Context::for_subject(Subject::new(name).unwrap())
}

async fn limit_of(limiter: &Limiter, ctx: &Context) -> u64 {
    limiter.check(ctx, 1).await.unwrap().layers()[0]
        .verdict()
        .limit
}

#[tokio::test(start_paused = true)]
async fn the_source_is_asked_once_per_customer_then_its_answer_is_cached() {
    let (accounts, limiter) = setup(Behaviour::Answers);
    for _ in 0..5 {
        assert_eq!(limit_of(&limiter, &customer("key-pro")).await, 600);
        assert_eq!(limit_of(&limiter, &customer("key-1")).await, 60);
    }
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 2);
    // Usage and per-key operations decide under the same plan.
    let usage = limiter.usage(&customer("key-pro")).await.unwrap();
    assert_eq!((usage.layers[0].limit, usage.layers[0].used), (600, 5));
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failing_source_leaves_the_request_to_the_default_plan() {
    let (accounts, limiter) = setup(Behaviour::Fails);
    assert_eq!(limit_of(&limiter, &customer("key-pro")).await, 60);
    // The failure is remembered for a while: the source is not hammered.
    assert_eq!(limit_of(&limiter, &customer("key-pro")).await, 60);
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_source_is_given_up_at_the_deadline() {
    let (accounts, limiter) = setup(Behaviour::Hangs);
    let started = tokio::time::Instant::now();
    let decision = limiter.check(&customer("key-pro"), 1).await.unwrap();
    assert!(decision.is_allowed());
    assert_eq!(decision.layers()[0].plan(), Some("free"));
    assert_eq!(started.elapsed(), Duration::from_millis(20));
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 1);
}

/// A deadline longer than the clock holds ("as long as it takes") waits
/// for the source's answer (before, every question panicked: the time now
/// plus `Duration::MAX` overflowed).
#[tokio::test(start_paused = true)]
async fn a_deadline_of_any_length_waits_for_the_answer() {
    let (accounts, limiter) = setup_waiting(Behaviour::Answers, Duration::MAX);
    assert_eq!(limit_of(&limiter, &customer("key-pro")).await, 600);
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 1);
}

/// Requests of one customer that miss the cache together ask the source
/// once: the others wait for that answer, within their own deadline
/// (before, a hanging source was asked by every request in each
/// deadline, 100 times here).
#[tokio::test(start_paused = true)]
async fn one_question_per_customer_at_a_time() {
    for behaviour in [Behaviour::Hangs, Behaviour::Fails, Behaviour::Answers] {
        let (accounts, limiter) = setup(behaviour);
        let limiter = Arc::new(limiter);
        let started = tokio::time::Instant::now();
        let mut checks = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let limiter = limiter.clone();
            checks.spawn(async move { limit_of(&limiter, &customer("key-pro")).await });
        }
        let expected = if behaviour == Behaviour::Answers {
            600
        } else {
            60
        };
        while let Some(limit) = checks.join_next().await {
            assert_eq!(limit.unwrap(), expected, "{behaviour:?}");
        }
        assert!(
            started.elapsed() <= Duration::from_millis(20),
            "{behaviour:?}"
        );
        assert_eq!(accounts.asked.load(Ordering::SeqCst), 1, "{behaviour:?}");
    }
}

/// A request that waited for another's question, which was dropped, asks
/// with what is left of its own deadline: a timeout then is not kept (it
/// says nothing of the source), and the next request asks again.
#[tokio::test(start_paused = true)]
async fn a_timeout_after_a_dropped_question_is_not_kept() {
    let (accounts, limiter) = setup(Behaviour::Hangs);
    let limiter = Arc::new(limiter);
    let check = |limiter: &Arc<Limiter>| {
        let limiter = limiter.clone();
        tokio::spawn(async move { limit_of(&limiter, &customer("key-pro")).await })
    };
    let first = check(&limiter);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = check(&limiter);
    tokio::time::sleep(Duration::from_millis(10)).await;
    first.abort();
    assert_eq!(second.await.unwrap(), 60, "the default, at its deadline");
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 2);
    assert_eq!(limit_of(&limiter, &customer("key-pro")).await, 60);
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 3, "asked again");
}

/// The context's plan (from the application's authentication) and the
/// static table come before the source, which is not asked for them.
#[tokio::test(start_paused = true)]
async fn the_source_is_asked_only_for_customers_nothing_else_places() {
    let (accounts, limiter) = setup(Behaviour::Hangs);
    let chosen = customer("key-1").with_plan(PlanName::new("pro").unwrap());
    assert_eq!(limit_of(&limiter, &chosen).await, 600);
    assert_eq!(accounts.asked.load(Ordering::SeqCst), 0);
}
