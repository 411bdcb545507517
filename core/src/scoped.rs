//! The per-key operations on the layers of one scope other than the
//! client's own: a tenant, a global layer, an attribute.

use std::time::Duration;

use crate::adjustment::Adjustment;
use crate::context::Context;
use crate::decision::Decision;
use crate::error::Error;
use crate::layer::Scope;
use crate::limiter::Limiter;

/// [`Limiter::reset`], [`penalize`](Limiter::penalize),
/// [`reward`](Limiter::reward) and [`block`](Limiter::block) on `ctx`'s
/// layers counted per one [`Scope`] instead of its own (per subject): an
/// abusive tenant blocked, a rate limit server's rule whose client layers
/// are counted per an attribute. Made by [`Limiter::on_scope`]; each
/// operation behaves as the limiter's, on those layers.
///
/// ```no_run
/// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
/// use std::time::Duration;
/// use tollgate_limiter::{Context, Scope, Subject};
/// let ctx = Context::new().with_tenant(Subject::new("acme")?);
/// limiter
///     .on_scope(&Scope::Tenant)
///     .block(&ctx, Duration::from_secs(3600))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ScopedOperations<'a> {
    limiter: &'a Limiter,
    scope: &'a Scope,
}

impl Limiter {
    /// The per-key operations on `ctx`'s layers counted per `scope`.
    pub fn on_scope<'a>(&'a self, scope: &'a Scope) -> ScopedOperations<'a> {
        ScopedOperations {
            limiter: self,
            scope,
        }
    }
}

impl ScopedOperations<'_> {
    /// [`Limiter::reset`] on these layers.
    pub async fn reset(&self, ctx: &Context) -> Result<(), Error> {
        self.limiter.reset_in(ctx, self.scope).await
    }

    /// [`Limiter::penalize`] on these layers.
    pub async fn penalize(&self, ctx: &Context, units: u64) -> Result<Decision, Error> {
        let penalty = Adjustment::Penalize;
        self.limiter
            .adjust_in(ctx, units, penalty, self.scope)
            .await
    }

    /// [`Limiter::reward`] on these layers.
    pub async fn reward(&self, ctx: &Context, units: u64) -> Result<Decision, Error> {
        let reward = Adjustment::Reward;
        self.limiter.adjust_in(ctx, units, reward, self.scope).await
    }

    /// [`Limiter::block`] on these layers.
    pub async fn block(&self, ctx: &Context, duration: Duration) -> Result<Decision, Error> {
        self.limiter.block_in(ctx, duration, self.scope).await
    }
}
