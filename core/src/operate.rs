//! Per-key operations for operators: read a key's state without charging
//! it, and forget it. They go to the store directly — no breaker, no
//! failure mode, no blocked-key cache: an operator's call reports a store
//! failure rather than deciding around it.

use crate::context::Context;
use crate::decision::{Decision, LayerDecision, Source};
use crate::error::Error;
use crate::limiter::{Limiter, Requests};
use crate::store::LayerRequest;

impl Limiter {
    /// Every layer's verdict for a request of `cost` units for `ctx`, as
    /// [`check`](Limiter::check) would decide it now, with nothing charged:
    /// what a client has left, for a dashboard or a support question.
    ///
    /// Fails with [`Error::Store`] when the store fails or cannot peek
    /// ([`StoreError::UnsupportedOperation`](crate::StoreError::UnsupportedOperation)),
    /// and as `check` does for a missing subject or a bad cost.
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use tollgate_limiter::{Context, Subject};
    /// let ctx = Context::for_subject(Subject::new("user-7")?);
    /// let decision = limiter.peek(&ctx, 1).await?;
    /// for layer in decision.layers() {
    ///     println!("{}: {} left", layer.policy(), layer.remaining);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, ctx: &Context, cost: u64) -> Result<Decision, Error> {
        let requests = self.requests(ctx, cost)?;
        let verdicts = self.store().peek(&requests).await?;
        Ok(Decision::new(self.layers().iter().zip(verdicts).map(
            |(layer, verdict)| LayerDecision::new(layer, verdict, Source::Store),
        )))
    }

    /// Forget the state of every layer for `ctx`, atomically: its next
    /// request is decided as a new client's (after a password reset, a
    /// support ticket). A key holding data Tollgate did not write is left
    /// as it was and the call fails with
    /// [`StoreError::Conflict`](crate::StoreError::Conflict), removing
    /// nothing.
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use tollgate_limiter::{Context, Subject};
    /// limiter.reset(&Context::for_subject(Subject::new("user-7")?)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, ctx: &Context) -> Result<(), Error> {
        let requests = self.requests(ctx, 1)?;
        self.store().reset(&requests).await?;
        Ok(())
    }

    /// Every layer's request of `cost` for `ctx`.
    fn requests<'a>(&'a self, ctx: &'a Context, cost: u64) -> Result<Requests<'a>, Error> {
        let mut requests = Requests::new();
        for layer in self.layers().iter() {
            layer.policy.check_cost(cost)?;
            let key = ctx.key_for(layer).ok_or_else(|| Error::MissingSubject {
                layer: layer.name.to_string(),
                scope: layer.scope.label().to_string(),
            })?;
            requests.push(LayerRequest {
                key,
                policy: &layer.policy,
                cost,
            });
        }
        Ok(requests)
    }
}
