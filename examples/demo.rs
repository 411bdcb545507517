//! Fires bursts at each algorithm on the in-process store and prints what was
//! admitted, with the headers an HTTP adapter would send.
//!
//! Run: `cargo run --example demo`
//!
//! Time comes from a manual clock, so the output is the same on every run.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    headers, Context, Decision, Limit, Limiter, ManualClock, MemoryStore, Policy, Scope, Subject,
    Timestamp,
};

fn show(label: &str, decisions: &[Decision]) {
    let marks: String = decisions
        .iter()
        .map(|d| if d.is_allowed() { '✓' } else { '✗' })
        .collect();
    let admitted = decisions.iter().filter(|d| d.is_allowed()).count();
    println!(
        "  {label:<28} {marks:<12} {admitted} of {} admitted",
        decisions.len()
    );
    if let Some(last) = decisions.last() {
        println!(
            "      RateLimit-Policy: {}",
            headers::rate_limit_policy(last)
        );
        println!("      RateLimit: {}", headers::rate_limit(last));
        if let Some(secs) = headers::retry_after_secs(last) {
            let exact = last.retry_after().unwrap_or_default();
            println!("      → 429, Retry-After: {secs}   (exact wait {exact:?})");
        }
    }
}

async fn burst(limiter: &Limiter, ctx: &Context, n: usize) -> Vec<Decision> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            limiter
                .check(ctx, 1)
                .await
                .expect("the in-process store always answers"),
        );
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let second = Duration::from_secs(1);
    let algorithms = [
        ("token bucket (5, 5/s)", Limit::token_bucket(5, 5, second)?),
        ("GCRA (5/s, burst 5)", Limit::gcra(5, second, 5)?),
        ("fixed window (5 per 1s)", Limit::fixed_window(5, second)?),
        (
            "sliding window (5 per 1s)",
            Limit::sliding_window(5, second)?,
        ),
        ("sliding log (5 per 1s)", Limit::sliding_log(5, second)?),
    ];
    println!("Tollgate demo: the in-process store, time moved by hand.\n");
    for (name, limit) in algorithms {
        let policy = Policy::new(limit.algorithm_name(), limit)?;
        let limiter = Limiter::builder(store.clone())
            .layer("client", Scope::Subject, policy)
            .build()?;
        let ctx = Context::subject(Subject::new("client-1")?);
        println!("{name}");
        show("burst of 8 at t=0", &burst(&limiter, &ctx, 8).await);
        clock.advance(Duration::from_millis(400));
        show("burst of 8 at t=400ms", &burst(&limiter, &ctx, 8).await);
        clock.advance(Duration::from_millis(1_600));
        show("burst of 8 at t=2s", &burst(&limiter, &ctx, 8).await);
        println!();
    }

    println!("Layers: per key 4/s, per tenant 6/s, all-or-nothing");
    let limiter = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new("per-key", Limit::gcra(4, second, 4)?)?,
        )
        .layer(
            "tenant",
            Scope::Tenant,
            Policy::new("per-tenant", Limit::fixed_window(6, second)?)?,
        )
        .build()?;
    let tenant = Subject::new("acme")?;
    let alice = Context::subject(Subject::new("alice")?).with_tenant(tenant.clone());
    let bob = Context::subject(Subject::new("bob")?).with_tenant(tenant);
    show("alice, 5 requests", &burst(&limiter, &alice, 5).await);
    show("bob, 5 requests", &burst(&limiter, &bob, 5).await);
    println!("  bob's 3rd-5th requests were denied by the tenant layer and charged nothing to bob's key.");
    Ok(())
}
