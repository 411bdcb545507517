//! Per-key operations for operators: read a key's state without charging
//! it, and forget it. They go to the store directly — no breaker, no
//! failure mode, no blocked-key cache: an operator's call reports a store
//! failure rather than deciding around it.

use crate::context::Context;
use crate::decision::{Decision, LayerDecision, Source};
use crate::error::Error;
use crate::layer::{Layer, Scope};
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
        let requests = self.requests(ctx, cost, |_| true)?;
        let verdicts = self.store().peek(&requests).await?;
        if verdicts.len() != requests.len() {
            return Err(Error::Store(crate::StoreError::Protocol(format!(
                "the store peeked {} layers and answered {} verdicts",
                requests.len(),
                verdicts.len()
            ))));
        }
        Ok(Decision::new(self.layers().iter().zip(verdicts).map(
            |(layer, verdict)| LayerDecision::new(layer, verdict, Source::Store),
        )))
    }

    /// Forget the state of `ctx`'s own layers — those counted per subject
    /// ([`Scope::Subject`](crate::Scope::Subject)) — at once: its next
    /// request is decided as a new client's there (after a password reset,
    /// a support ticket). Layers other clients share (tenant, global,
    /// attribute) are left as they are. Atomic on one store call (the
    /// in-process store, Redis, one Cluster slot group); idempotent, so a
    /// reset that failed half-way on a Cluster can be sent again. A key
    /// holding data Tollgate did not write is left as it was and the call
    /// fails with [`StoreError::Conflict`](crate::StoreError::Conflict),
    /// removing nothing. A denial the blocked-key cache holds for the
    /// subject is not cleared: it lasts until its retry-after.
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use tollgate_limiter::{Context, Subject};
    /// limiter.reset(&Context::for_subject(Subject::new("user-7")?)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, ctx: &Context) -> Result<(), Error> {
        let requests = self.requests(ctx, 1, |l| l.scope == Scope::Subject)?;
        if requests.is_empty() {
            return Ok(());
        }
        self.store().reset(&requests).await?;
        Ok(())
    }

    /// The request of `cost` for `ctx` of every layer `which` picks.
    fn requests<'a>(
        &'a self,
        ctx: &'a Context,
        cost: u64,
        which: impl Fn(&Layer) -> bool,
    ) -> Result<Requests<'a>, Error> {
        let mut requests = Requests::new();
        for layer in self.layers().iter().filter(|l| which(l)) {
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
