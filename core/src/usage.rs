//! What a customer has used: per layer, used, limit, remaining and when it
//! resets, for a dashboard or a billing page.

use std::time::Duration;

use crate::context::Context;
use crate::error::Error;
use crate::limit::Limit;
use crate::limiter::Limiter;

/// One layer's usage ([`Limiter::usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerUsage {
    /// The layer's name.
    pub layer: &'static str,
    /// Its policy's name.
    pub policy: &'static str,
    /// The plan whose limit applies, when the limiter has plans.
    pub plan: Option<&'static str>,
    /// Units used: `limit − remaining` (so never above the limit: a
    /// customer moved to a smaller plan reads as having used all of it).
    pub used: u64,
    /// The limit (a window's limit, a bucket's capacity, a GCRA burst).
    pub limit: u64,
    /// Units a request could still take now.
    pub remaining: u64,
    /// Until the layer is back to full: a window's end (for a fixed
    /// window, when the count starts again), a bucket's time to refill.
    /// For a sliding log or a sliding window counter, an upper bound: when
    /// it would be full again had one more unit been used now (what it
    /// holds is read through a one-unit peek).
    pub resets_in: Duration,
}

/// A customer's usage, layer by layer in the limiter's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Every layer the request's context has a subject for (a layer
    /// counting per tenant is left out for a context without a tenant).
    pub layers: Vec<LayerUsage>,
}

impl Limiter {
    /// What `ctx` has used of every layer, under its plan, read from the
    /// store without charging anything (as [`peek`](Limiter::peek), which
    /// it is built on: a store that cannot peek cannot answer).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
    /// # let store = Arc::new(tollgate_memory::MemoryStore::builder().build());
    /// let month = Duration::from_secs(30 * 24 * 3600);
    /// let quota = Policy::new("quota", Limit::fixed_window(10_000, month)?)?;
    /// let limiter = Limiter::builder(store).layer("quota", Scope::Subject, quota).build()?;
    /// let ctx = Context::for_subject(Subject::new("key-7")?);
    /// limiter.check(&ctx, 3).await?;
    /// let usage = limiter.usage(&ctx).await?;
    /// assert_eq!((usage.layers[0].used, usage.layers[0].remaining), (3, 9_997));
    /// # Ok(()) }
    /// ```
    pub async fn usage(&self, ctx: &Context) -> Result<Usage, Error> {
        let this = self.planned(ctx).await;
        let Some(this) = this.subset(&|layer| ctx.key_for(layer).is_none()) else {
            return Ok(Usage { layers: Vec::new() });
        };
        let decision = this.peek(ctx, 1).await?;
        // A peek reports what a layer has now and, where the layer admits
        // the one-unit request (whatever the others say), when it would be
        // full again had that unit been charged: its reset is one unit's
        // time sooner. A layer that denies reports its own reset.
        let layers = this
            .layers()
            .iter()
            .zip(decision.layers())
            .map(|(layer, d)| {
                let verdict = d.verdict();
                let resets_in = if verdict.allowed {
                    verdict
                        .reset_after
                        .saturating_sub(unit_time(layer.policy().limit()))
                } else {
                    verdict.reset_after
                };
                LayerUsage {
                    layer: d.layer(),
                    policy: d.policy(),
                    plan: d.plan(),
                    used: verdict.limit.saturating_sub(verdict.remaining),
                    limit: verdict.limit,
                    remaining: verdict.remaining,
                    resets_in,
                }
            })
            .collect();
        Ok(Usage { layers })
    }
}

/// How much later a bucket is full again for one unit charged (rounded
/// down, so a reset stays an upper bound): windows end when they end,
/// whatever is charged.
fn unit_time(limit: &Limit) -> Duration {
    match (limit, limit.rate()) {
        (Limit::TokenBucket(_) | Limit::Gcra(_), Some((units, period))) => {
            Duration::from_micros(crate::duration_micros(period) / units.max(1))
        }
        _ => Duration::ZERO,
    }
}
