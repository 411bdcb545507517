//! Plans: each request decided under its customer's plan, found on the
//! server side only; a plan change keeps what the customer used.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    BuildError, Context, Limit, Limiter, ManualClock, Plan, PlanName, Plans, Policy, Scope,
    Subject, Timestamp,
};
use tollgate_memory::MemoryStore;

const HOUR: Duration = Duration::from_secs(3600);

fn clock() -> ManualClock {
    // A window boundary, so a test's window is whole.
    ManualClock::new(Timestamp::from_micros(
        1_800_000_000 / 3600 * 3600 * 1_000_000,
    ))
}

fn plan(name: &str) -> PlanName {
    PlanName::new(name).unwrap()
}

fn customer(name: &str) -> Context {
    Context::for_subject(Subject::new(name).unwrap())
}

/// One per-subject layer of policy `quota` under `limit`, with `plans`.
fn limiter(limit: Limit, plans: Plans, clock: &ManualClock) -> Limiter {
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    Limiter::builder(Arc::new(store))
        .layer("key", Scope::Subject, Policy::new("quota", limit).unwrap())
        .plans(plans)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap()
}

/// free: the policy's own 1,000 an hour; pro 5,000; small 500.
fn window_plans(window: fn(u64) -> Limit) -> Plans {
    Plans::new(Plan::new("free").unwrap())
        .plan(Plan::new("pro").unwrap().limit("quota", window(5_000)))
        .plan(Plan::new("small").unwrap().limit("quota", window(500)))
}

async fn admitted(limiter: &Limiter, ctx: &Context, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(limiter.check(ctx, 1).await.unwrap().is_allowed());
    }
    admitted
}

#[tokio::test]
async fn the_plan_comes_from_the_context_then_the_table_then_the_default() {
    let clock = clock();
    let plans = window_plans(|n| Limit::fixed_window(n, HOUR).unwrap())
        .assign(Subject::new("key-pro").unwrap(), plan("pro"));
    let limiter = limiter(Limit::fixed_window(1_000, HOUR).unwrap(), plans, &clock);
    let limit_of =
        |d: tollgate_limiter::Decision| (d.layers()[0].verdict().limit, d.layers()[0].plan());

    let unlisted = limiter.check(&customer("key-1"), 1).await.unwrap();
    assert_eq!(limit_of(unlisted), (1_000, Some("free")));
    let listed = limiter.check(&customer("key-pro"), 1).await.unwrap();
    assert_eq!(limit_of(listed), (5_000, Some("pro")));
    // The context's plan (set by the application's authentication) wins.
    let chosen = customer("key-pro").with_plan(plan("small"));
    assert_eq!(
        limit_of(limiter.check(&chosen, 1).await.unwrap()),
        (500, Some("small"))
    );
    // A plan the limiter does not know decides under the default.
    let unknown = customer("key-2").with_plan(plan("platinum"));
    assert_eq!(
        limit_of(limiter.check(&unknown, 1).await.unwrap()),
        (1_000, Some("free"))
    );
}

/// Used 800 of 1,000, upgraded to 5,000: 4,200 left; downgraded to 500:
/// denied until the window ends — on both window counters.
#[tokio::test]
async fn a_plan_change_keeps_a_windows_count() {
    for window in [
        (|n| Limit::fixed_window(n, HOUR).unwrap()) as fn(u64) -> Limit,
        |n| Limit::sliding_window(n, HOUR).unwrap(),
    ] {
        let clock = clock();
        let limiter = limiter(window(1_000), window_plans(window), &clock);
        let free = customer("key-1");
        assert_eq!(admitted(&limiter, &free, 800).await, 800);

        let pro = customer("key-1").with_plan(plan("pro"));
        let usage = limiter.usage(&pro).await.unwrap().layers[0];
        assert_eq!(
            (usage.used, usage.limit, usage.remaining),
            (800, 5_000, 4_200)
        );
        assert_eq!(usage.plan, Some("pro"));
        assert_eq!(admitted(&limiter, &pro, 4_300).await, 4_200);

        let small = customer("key-1").with_plan(plan("small"));
        assert_eq!(admitted(&limiter, &small, 10).await, 0);
        let denied = limiter.check(&small, 1).await.unwrap();
        assert!(denied.retry_after().unwrap() > Duration::from_secs(3500));
        // Back on the free plan the customer has used more than it allows.
        assert_eq!(admitted(&limiter, &free, 10).await, 0);
    }
}

/// A plan that changes the algorithm starts from no state, as every
/// algorithm swap does; plans without a limit for a policy keep its own.
#[tokio::test]
async fn a_plan_with_another_algorithm_starts_afresh() {
    let clock = clock();
    let plans = Plans::new(Plan::new("free").unwrap()).plan(
        Plan::new("burst")
            .unwrap()
            .limit("quota", Limit::gcra(10, HOUR, 10).unwrap()),
    );
    let limiter = limiter(Limit::fixed_window(10, HOUR).unwrap(), plans, &clock);
    assert_eq!(admitted(&limiter, &customer("k"), 10).await, 10);
    let burst = customer("k").with_plan(plan("burst"));
    assert_eq!(admitted(&limiter, &burst, 20).await, 10);
    assert_eq!(admitted(&limiter, &customer("k"), 1).await, 0);
}

#[tokio::test]
async fn usage_reports_each_layer_without_charging() {
    let clock = clock();
    let plans = Plans::new(Plan::new("free").unwrap());
    let limiter = limiter(Limit::gcra(10, HOUR, 10).unwrap(), plans, &clock);
    let ctx = customer("k");
    assert_eq!(admitted(&limiter, &ctx, 3).await, 3);
    for _ in 0..2 {
        let usage = limiter.usage(&ctx).await.unwrap().layers[0];
        assert_eq!((usage.used, usage.remaining, usage.limit), (3, 7, 10));
        // Three units of six minutes each to refill.
        assert_eq!(usage.resets_in, Duration::from_secs(3 * 360));
        assert_eq!(
            (usage.layer, usage.policy, usage.plan),
            ("key", "quota", Some("free"))
        );
    }
    clock.advance(Duration::from_secs(360));
    let usage = limiter.usage(&ctx).await.unwrap().layers[0];
    assert_eq!((usage.used, usage.resets_in), (2, Duration::from_secs(720)));
}

/// A plan that gives a policy another algorithm counts it under another
/// key; a block and a reset reach the customer's keys under every plan,
/// so a customer whose plan changes is still blocked (a plan source
/// failing over to the default, a downgrade), and a reset starts them
/// afresh everywhere.
#[tokio::test]
async fn blocks_and_resets_reach_every_plans_keys() {
    let clock = clock();
    let plans = Plans::new(Plan::new("free").unwrap()).plan(
        Plan::new("pro")
            .unwrap()
            .limit("quota", Limit::fixed_window(5_000, HOUR).unwrap()),
    );
    let limiter = limiter(Limit::gcra(1_000, HOUR, 1_000).unwrap(), plans, &clock);
    let pro = customer("k").with_plan(plan("pro"));
    let blocked = limiter.block(&pro, HOUR).await.unwrap();
    assert_eq!(blocked.layers().len(), 1, "the plan's own layers answer");
    assert_eq!(blocked.layers()[0].plan(), Some("pro"));
    assert!(!limiter.check(&pro, 1).await.unwrap().is_allowed());
    let free = customer("k");
    assert!(
        !limiter.check(&free, 1).await.unwrap().is_allowed(),
        "blocked under the default plan too"
    );
    limiter.reset(&free).await.unwrap();
    assert!(
        limiter.check(&pro, 1).await.unwrap().is_allowed(),
        "reset everywhere"
    );
    assert!(limiter.check(&free, 1).await.unwrap().is_allowed());
}

/// Each layer's reset is its own, when another layer denies: a bucket
/// that admits is full again one unit's time sooner than its peek says (as
/// if the unit were charged), whatever the other layer says.
#[tokio::test]
async fn usage_resets_are_each_layers_own_when_another_denies() {
    let clock = clock();
    let store = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let limiter = Limiter::builder(store)
        .layer(
            "burst",
            Scope::Subject,
            Policy::new("burst", Limit::gcra(10, HOUR, 10).unwrap()).unwrap(),
        )
        .layer(
            "daily",
            Scope::Subject,
            Policy::new("daily", Limit::fixed_window(1, 24 * HOUR).unwrap()).unwrap(),
        )
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let ctx = customer("k");
    assert_eq!(admitted(&limiter, &ctx, 1).await, 1);
    clock.advance(Duration::from_secs(360));
    let usage = limiter.usage(&ctx).await.unwrap();
    let burst = usage.layers[0];
    assert_eq!((burst.used, burst.remaining), (0, 10));
    assert_eq!(burst.resets_in, Duration::ZERO, "the bucket is full");
    let daily = usage.layers[1];
    assert_eq!((daily.used, daily.remaining), (1, 0));
}

/// A layer the context has no subject for is left out of its usage
/// (a per-tenant layer, for a context without a tenant).
#[tokio::test]
async fn usage_leaves_out_the_layers_a_context_cannot_name() {
    let store = Arc::new(MemoryStore::builder().build());
    let policy = |name| Policy::new(name, Limit::fixed_window(10, HOUR).unwrap()).unwrap();
    let limiter = Limiter::builder(store)
        .layer("key", Scope::Subject, policy("quota"))
        .layer("tenant", Scope::Tenant, policy("tenant"))
        .build()
        .unwrap();
    let usage = limiter.usage(&customer("k")).await.unwrap();
    let layers: Vec<_> = usage.layers.iter().map(|l| (l.layer, l.used)).collect();
    assert_eq!(layers, [("key", 0)]);
}

#[test]
fn plans_that_cannot_work_are_refused_when_built() {
    let clock = clock();
    let store = Arc::new(MemoryStore::builder().build());
    let build = |plans: Plans| {
        Limiter::builder(store.clone())
            .layer(
                "key",
                Scope::Subject,
                Policy::new("quota", Limit::fixed_window(10, HOUR).unwrap()).unwrap(),
            )
            .plans(plans)
            .build()
    };
    let typo = Plans::new(Plan::new("free").unwrap()).plan(
        Plan::new("pro")
            .unwrap()
            .limit("qouta", Limit::fixed_window(100, HOUR).unwrap()),
    );
    let err = build(typo).unwrap_err();
    assert!(
        matches!(&err, BuildError::Plan { plan, .. } if plan == "pro"),
        "{err}"
    );
    assert!(
        err.to_string().contains("\"qouta\", which no layer uses"),
        "{err}"
    );

    let unassignable =
        Plans::new(Plan::new("free").unwrap()).assign(Subject::new("k").unwrap(), plan("gold"));
    let err = build(unassignable).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("plan \"gold\": subject k is assigned"),
        "{err}"
    );
    let _ = clock;
}

/// 16 tasks on the same customers while the plan changes twice (1,000 →
/// 5,000 → 500): no request is admitted beyond the limit of the plan it
/// was decided under, and the store's count is what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_changes_under_load_admit_what_the_rule_allows() {
    plan_changes_under_load(|n| Limit::fixed_window(n, HOUR).unwrap()).await;
}

/// The same with GCRA (the clock still: its units are counts), which keeps
/// the units used across the changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_plan_changes_under_load_keep_the_units_used() {
    plan_changes_under_load(|n| Limit::gcra(n, HOUR, n).unwrap()).await;
}

/// The same with a token bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_plan_changes_under_load_keep_the_units_used() {
    plan_changes_under_load(|n| Limit::token_bucket(n, n, HOUR).unwrap()).await;
}

async fn plan_changes_under_load(window: fn(u64) -> Limit) {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    let clock = clock();
    let limiter = Arc::new(limiter(window(1_000), window_plans(window), &clock));
    let phase = Arc::new(AtomicUsize::new(0));
    let admitted_in = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let plans = ["free", "pro", "small"];
    let mut tasks = Vec::new();
    for task in 0..16 {
        let (limiter, phase, admitted_in) = (limiter.clone(), phase.clone(), admitted_in.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..500u64 {
                if task == 0 && (i == 100 || i == 300) {
                    phase.fetch_add(1, Ordering::SeqCst);
                }
                let p = phase.load(Ordering::SeqCst);
                let ctx = customer(["a", "b"][(i % 2) as usize]).with_plan(plan(plans[p]));
                let decision = limiter.check(&ctx, 1).await.unwrap();
                if decision.is_allowed() {
                    let layer = &decision.layers()[0];
                    // Admitted under the plan it was asked under.
                    assert_eq!(layer.plan(), Some(plans[p]));
                    assert_eq!(layer.verdict().limit, [1_000, 5_000, 500][p]);
                    admitted_in[p].fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total: u64 = admitted_in.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    let mut used = 0;
    for name in ["a", "b"] {
        // Read under the largest plan, so no count is above its limit.
        let ctx = customer(name).with_plan(plan("pro"));
        let usage = limiter.usage(&ctx).await.unwrap().layers[0];
        assert!(usage.used <= 5_000, "{usage:?}");
        used += usage.used;
    }
    assert_eq!(used, total, "the store counts exactly what was admitted");
    // 16 × 500 requests on two customers: 8,000, more than both can take
    // under any plan, so each count ends at a limit it reached.
    assert!(total <= 2 * 5_000);
    // Each plan admits only below its own limit: at most 1,000 a customer
    // while free, and while small only what takes a count below 500.
    assert!(admitted_in[0].load(Ordering::SeqCst) <= 2 * 1_000);
    assert!(admitted_in[2].load(Ordering::SeqCst) <= 2 * 500);
}

/// The plans' limiters share the blocked-key cache: a denial cached under
/// one plan does not answer the customer once their plan changed.
#[cfg(feature = "blocked-cache")]
#[tokio::test]
async fn a_cached_denial_does_not_outlive_a_plan_change() {
    let clock = clock();
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let plans = window_plans(|n| Limit::fixed_window(n, HOUR).unwrap());
    let limiter = Limiter::builder(Arc::new(store))
        .layer(
            "key",
            Scope::Subject,
            Policy::new("quota", Limit::fixed_window(1_000, HOUR).unwrap()).unwrap(),
        )
        .plans(plans)
        .blocked_cache(tollgate_limiter::BlockedCacheConfig::default())
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let small = customer("k").with_plan(plan("small"));
    assert_eq!(admitted(&limiter, &small, 501).await, 500);
    let cached = limiter.check(&small, 1).await.unwrap();
    assert_eq!(cached.layers()[0].source, tollgate_limiter::Source::Cache);
    let pro = customer("k").with_plan(plan("pro"));
    let upgraded = limiter.check(&pro, 1).await.unwrap();
    assert!(upgraded.is_allowed(), "{upgraded:?}");
    assert_eq!(upgraded.layers()[0].verdict().remaining, 5_000 - 501);
}

/// While the store is down, the emergency limit keeps each plan's units
/// too: a customer moved to a smaller plan mid-outage is not handed the
/// difference (the shared limit read a bucket's state as time, and 30
/// units used on pro's fast rate read as 3 on free's slow one).
#[tokio::test]
async fn a_plan_change_during_an_outage_keeps_the_units_used() {
    use tollgate_limiter::{Fallback, OnStoreFailure};
    use tollgate_testkit::RemoteStore;
    let minute = Duration::from_secs(60);
    for (own, pro) in [
        (
            Limit::gcra(60, minute, 60).unwrap(),
            Limit::gcra(600, minute, 60).unwrap(),
        ),
        (
            Limit::token_bucket(60, 60, minute).unwrap(),
            Limit::token_bucket(60, 600, minute).unwrap(),
        ),
    ] {
        let clock = clock();
        let memory = |clock: &ManualClock| {
            Arc::new(
                MemoryStore::builder()
                    .clock(Arc::new(clock.clone()))
                    .build(),
            )
        };
        let store = Arc::new(RemoteStore::new(memory(&clock)));
        let policy = Policy::new("quota", own)
            .unwrap()
            .with_on_failure(OnStoreFailure::Fallback(Fallback::Share { instances: 2 }))
            .unwrap();
        let plans = Plans::new(Plan::new("free").unwrap())
            .plan(Plan::new("pro").unwrap().limit("quota", pro));
        let limiter = Limiter::builder(store.clone())
            .layer("key", Scope::Subject, policy)
            .plans(plans)
            .fallback_store(memory(&clock))
            .clock(Arc::new(clock.clone()))
            .build()
            .unwrap();
        store.set_down(true);
        let on_pro = customer("k").with_plan(plan("pro"));
        // Each of two processes has half of pro's burst in an outage.
        assert_eq!(admitted(&limiter, &on_pro, 40).await, 30);
        assert_eq!(
            admitted(&limiter, &customer("k"), 10).await,
            0,
            "on free, the 30 units used fill its half-burst of 30"
        );
    }
}

/// A plan's token bucket whose rate its state cannot record (more than
/// `MAX_RECORDED_REFILL` in lowest terms) would lose the units used at a
/// plan change: refused when built, naming the plan and what to change.
#[test]
fn a_plan_whose_bucket_cannot_keep_its_units_is_refused() {
    let store = Arc::new(MemoryStore::builder().build());
    let plans = Plans::new(Plan::new("free").unwrap()).plan(Plan::new("burst").unwrap().limit(
        "quota",
        Limit::token_bucket(9_999, 9_999, Duration::from_secs(1)).unwrap(),
    ));
    let err = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("quota", Limit::token_bucket(10, 10, HOUR).unwrap()).unwrap(),
        )
        .plans(plans)
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, BuildError::Plan { plan, .. } if plan == "burst"),
        "{err}"
    );
    assert!(err.to_string().contains("9999 per 1000000 µs"), "{err}");
    // The policy's own rate, when a plan changes it: the default plan's.
    let odd = Limit::token_bucket(9_999, 9_999, Duration::from_secs(1)).unwrap();
    let build = |plans: Plans| {
        Limiter::builder(Arc::new(MemoryStore::builder().build()))
            .layer(
                "key",
                Scope::Subject,
                Policy::new("quota", odd.clone()).unwrap(),
            )
            .plans(plans)
            .build()
    };
    let pro = Plan::new("pro")
        .unwrap()
        .limit("quota", Limit::token_bucket(10, 10, HOUR).unwrap());
    let err = build(Plans::new(Plan::new("free").unwrap()).plan(pro)).unwrap_err();
    assert!(
        matches!(&err, BuildError::Plan { plan, .. } if plan == "free"),
        "{err}"
    );
    // No plan changes it: every customer keeps one rate, nothing to keep.
    let unchanged = Plans::new(Plan::new("free").unwrap()).plan(Plan::new("pro").unwrap());
    assert!(build(unchanged).is_ok());
}

/// The in-process store, recording the keys it is told are about to be
/// decided.
#[derive(Debug)]
struct Hinted {
    store: MemoryStore,
    hints: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl tollgate_limiter::Store for Hinted {
    fn kind(&self) -> &'static str {
        "hinted"
    }
    fn is_in_process(&self) -> bool {
        true
    }
    fn prefetch(&self, key: &tollgate_limiter::StoreKey<'_>) {
        self.hints.lock().unwrap().push(key.render());
        self.store.prefetch(key);
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [tollgate_limiter::LayerRequest<'a>],
        verdicts: &'a mut tollgate_limiter::Verdicts,
    ) -> tollgate_limiter::Decide<'a> {
        self.store.decide(layers, verdicts)
    }
}

/// Under plans, the store hears of the first layer's key before the plan
/// is looked up (its state is fetched meanwhile), and the hint decides
/// nothing: the counts are those of the customer's plan. Without plans
/// there is nothing to overlap, and no hint.
#[tokio::test]
async fn the_store_hears_of_the_first_key_while_the_plan_is_found() {
    let clock = clock();
    let hinted = Arc::new(Hinted {
        store: MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
        hints: Default::default(),
    });
    let plans = window_plans(|n| Limit::fixed_window(n, HOUR).unwrap())
        .assign(Subject::new("big").unwrap(), plan("pro"));
    let limiter = |plans: Option<Plans>| {
        let builder = Limiter::builder(hinted.clone())
            .layer(
                "key",
                Scope::Subject,
                Policy::new("quota", Limit::fixed_window(1_000, HOUR).unwrap()).unwrap(),
            )
            .layer(
                "all",
                Scope::Global,
                Policy::new("all", Limit::fixed_window(1_000_000, HOUR).unwrap()).unwrap(),
            )
            .clock(Arc::new(clock.clone()));
        match plans {
            Some(plans) => builder.plans(plans),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let planned = limiter(Some(plans));
    assert_eq!(admitted(&planned, &customer("big"), 1_200).await, 1_200);
    assert_eq!(admitted(&planned, &customer("small"), 1_200).await, 1_000);
    let hints = std::mem::take(&mut *hinted.hints.lock().unwrap());
    assert_eq!(hints.len(), 2_400, "one hint per decision");
    assert!(hints[0].starts_with("{big}:quota:"), "{}", hints[0]);
    assert!(
        hints[2_399].starts_with("{small}:quota:"),
        "{}",
        hints[2_399]
    );
    let fixed = limiter(None);
    assert_eq!(admitted(&fixed, &customer("other"), 10).await, 10);
    assert!(hinted.hints.lock().unwrap().is_empty(), "no plans, no hint");
}
