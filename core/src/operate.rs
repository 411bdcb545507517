//! Per-key operations for operators: read a key's state without charging
//! it, and forget it. They go to the store directly — no breaker, no
//! failure mode, no blocked-key cache: an operator's call reports a store
//! failure rather than deciding around it.

use std::time::Duration;

use crate::adjustment::Adjustment;
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
    ///     println!("{}: {} left", layer.policy(), layer.remaining());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peek(&self, ctx: &Context, cost: u64) -> Result<Decision, Error> {
        let this = self.planned(ctx).await;
        // A shadow layer that cannot take part is left out, as `check`
        // leaves it out.
        let left_out = |l: &Layer| crate::limiter::undecidable(l, ctx, cost);
        if this.layers().iter().any(left_out) {
            let kept = match this.subset(&left_out) {
                Some(subset) => Some(Box::pin(subset.peek(ctx, cost)).await?),
                None => None,
            };
            return Ok(this.with_left_out(kept, &left_out));
        }
        let requests = this.requests(ctx, cost, |_| true)?;
        let verdicts = this.store().peek(&requests).await?;
        if verdicts.len() != requests.len() {
            return Err(Error::Store(crate::StoreError::Protocol(format!(
                "the store peeked {} layers and answered {} verdicts",
                requests.len(),
                verdicts.len()
            ))));
        }
        Ok(Decision::new(this.layers().iter().zip(verdicts).map(
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
    /// removing nothing. A denial the blocked-key cache holds for `ctx` is
    /// forgotten, so the reset shows at once. With plans, the keys of every
    /// plan go (a plan giving a policy another algorithm counts it under
    /// another key).
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use tollgate_limiter::{Context, Subject};
    /// limiter.reset(&Context::for_subject(Subject::new("user-7")?)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, ctx: &Context) -> Result<(), Error> {
        self.reset_in(ctx, &Scope::Subject).await
    }

    /// [`reset`](Limiter::reset) on `ctx`'s layers counted per `scope`,
    /// under every plan.
    pub(crate) async fn reset_in(&self, ctx: &Context, scope: &Scope) -> Result<(), Error> {
        let this = self.planned(ctx).await;
        let mut requests = this.requests(ctx, 1, |l| l.scope == *scope)?;
        self.add_other_plans(this, ctx, scope, &mut requests)?;
        if requests.is_empty() {
            return Ok(());
        }
        this.store().reset(&requests).await?;
        this.forget_cached();
        Ok(())
    }

    /// Charge `ctx`'s own layers `units` without an admission check — a
    /// failed login costs extra — saturating at empty: what a layer cannot
    /// hold is dropped (`units` above a layer's capacity count as its
    /// capacity). Answers each of those layers' verdict for a request of
    /// one unit afterwards (`remaining` is what is left).
    ///
    /// Like [`reset`](Limiter::reset) it changes only the layers counted
    /// per subject ([`Scope::Subject`](crate::Scope::Subject)): layers other
    /// clients share are never charged for one client's misdeed. Atomic on
    /// one store call; fails with [`Error::Operation`] for no units or a
    /// limiter without a per-subject layer, and with [`Error::Store`] when
    /// the store fails or cannot ([`StoreError::UnsupportedOperation`](crate::StoreError::UnsupportedOperation)).
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use tollgate_limiter::{Context, Subject};
    /// let ctx = Context::for_subject(Subject::new("user-7")?);
    /// let after = limiter.penalize(&ctx, 3).await?;
    /// if !after.is_allowed() {
    ///     println!("user-7 is out of attempts for {:?}", after.retry_after());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn penalize(&self, ctx: &Context, units: u64) -> Result<Decision, Error> {
        self.adjust_in(ctx, units, Adjustment::Penalize, &Scope::Subject)
            .await
    }

    /// Give `ctx`'s own layers `units` back, never above full — a request
    /// that turned out not to count. Answers as
    /// [`penalize`](Limiter::penalize) does, on the same layers, with the
    /// same errors. A blocked layer stays blocked.
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use tollgate_limiter::{Context, Subject};
    /// let ctx = Context::for_subject(Subject::new("user-7")?);
    /// limiter.reward(&ctx, 1).await?;
    /// # Ok(()) }
    /// ```
    pub async fn reward(&self, ctx: &Context, units: u64) -> Result<Decision, Error> {
        self.adjust_in(ctx, units, Adjustment::Reward, &Scope::Subject)
            .await
    }

    /// Deny every request of `ctx` for `duration` (1 ms to
    /// [`MAX_RECOVERY`](crate::MAX_RECOVERY), 14 days) on its own layers,
    /// whatever their algorithm: each answers denied with the block's end
    /// as its retry-after, exactly, and starts full when it ends. A block
    /// never shortens a longer one already in place;
    /// [`reset`](Limiter::reset) lifts it. With plans, the keys of every
    /// plan are blocked, so a customer whose plan changes stays blocked.
    /// Answers the blocked verdicts of `ctx`'s plan; the same layers and
    /// errors as [`penalize`](Limiter::penalize).
    ///
    /// ```no_run
    /// # async fn f(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use std::time::Duration;
    /// use tollgate_limiter::{Context, Subject};
    /// let ctx = Context::for_subject(Subject::new("user-7")?);
    /// let blocked = limiter.block(&ctx, Duration::from_secs(600)).await?;
    /// assert_eq!(blocked.retry_after(), Some(Duration::from_secs(600)));
    /// # Ok(()) }
    /// ```
    pub async fn block(&self, ctx: &Context, duration: Duration) -> Result<Decision, Error> {
        self.block_in(ctx, duration, &Scope::Subject).await
    }

    /// [`block`](Limiter::block) on `ctx`'s layers counted per `scope`.
    pub(crate) async fn block_in(
        &self,
        ctx: &Context,
        duration: Duration,
        scope: &Scope,
    ) -> Result<Decision, Error> {
        let block = Adjustment::Block(duration);
        if let Err(e) = block.check() {
            return Err(Error::Operation {
                operation: "block",
                reason: e.to_string(),
            });
        }
        self.adjust_in(ctx, 1, block, scope).await
    }

    /// Apply `adjustment` of `units` to `ctx`'s layers counted per `scope`.
    pub(crate) async fn adjust_in(
        &self,
        ctx: &Context,
        units: u64,
        adjustment: Adjustment,
        scope: &Scope,
    ) -> Result<Decision, Error> {
        let operation = adjustment.name();
        if units == 0 {
            return Err(Error::Operation {
                operation,
                reason: "units must be at least 1".into(),
            });
        }
        let this = self.planned(ctx).await;
        let mut requests = this.requests(ctx, 1, |l| l.scope == *scope)?;
        let own = requests.len();
        if matches!(adjustment, Adjustment::Block(_)) {
            self.add_other_plans(this, ctx, scope, &mut requests)?;
        }
        if requests.is_empty() {
            let reason = match scope {
                Scope::Subject => "the limiter has no per-subject layer (Scope::Subject); only a client's own layers are changed".into(),
                other => format!("the limiter has no layer counted per {other:?}"),
            };
            return Err(Error::Operation { operation, reason });
        }
        for r in requests.iter_mut() {
            r.cost = units.min(r.policy.limit().capacity());
        }
        let verdicts = this.store().adjust(&requests, adjustment).await?;
        if verdicts.len() != requests.len() {
            return Err(Error::Store(crate::StoreError::Protocol(format!(
                "the store adjusted {} layers and answered {} verdicts",
                requests.len(),
                verdicts.len()
            ))));
        }
        this.forget_cached();
        // The plan's own layers answer (other plans' keys come after).
        Ok(Decision::new(
            this.layers()
                .iter()
                .filter(|l| l.scope == *scope)
                .zip(verdicts.into_iter().take(own))
                .map(|(layer, verdict)| LayerDecision::new(layer, verdict, Source::Store)),
        ))
    }

    /// Add to `requests` (those of `this`, `ctx`'s plan) the keys of
    /// `ctx`'s layers counted per `scope` under every other plan: a plan
    /// that gives a policy another algorithm counts it under another key.
    /// A block or a reset reaches them all, so a customer whose plan
    /// changes (a plan source failing over to the default, a downgrade)
    /// is still blocked, and starts afresh everywhere. Penalties and
    /// rewards stay with the plan that counts them.
    fn add_other_plans<'a>(
        &'a self,
        this: &'a Limiter,
        ctx: &'a Context,
        scope: &Scope,
        requests: &mut Requests<'a>,
    ) -> Result<(), Error> {
        for other in self.plan_limiters().filter(|l| !std::ptr::eq(*l, this)) {
            for request in other.requests(ctx, 1, |l| l.scope == *scope)? {
                if !requests.iter().any(|r| r.key == request.key) {
                    requests.push(request);
                }
            }
        }
        Ok(())
    }

    /// Forget the denials the blocked-key cache holds: every one, since
    /// an operation's context may name fewer layers than the requests it
    /// affects.
    fn forget_cached(&self) {
        #[cfg(feature = "blocked-cache")]
        if let Some(cache) = self.blocked_cache() {
            cache.forget_all();
        }
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
