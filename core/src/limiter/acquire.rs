//! Deciding a request that holds places in concurrency layers: one store
//! call that decides every layer and takes the places, and the permit that
//! gives them back.

use super::detached::acquire_detached;
use super::shadow::{denied_only_by_shadow, past_shadow, undecidable, Passes};
use super::{Limiter, Requests};
use crate::context::Context;
use crate::decision::Decision;
use crate::error::{Error, StoreError};
use crate::failure::Admission;
use crate::layer::Layer;
use crate::observe;
use crate::permit::Permit;
use crate::verdicts::Verdicts;

/// A decision with the places it holds ([`Limiter::acquire`]).
#[derive(Debug)]
#[must_use = "dropping the permit gives its places back at once"]
pub struct Acquired {
    /// The decision, as [`Limiter::check`] would give it.
    pub decision: Decision,
    /// The places the request holds in its concurrency layers, given back
    /// when it is dropped: `Some` when the request was admitted by a store
    /// that holds places (a concurrency layer decided by a failure mode
    /// holds none).
    pub permit: Option<Permit>,
}

impl Limiter {
    /// Decide a request of `cost` units for `ctx`, as [`check`](Self::check)
    /// does, and take a place in every concurrency layer
    /// ([`Limit::concurrency`](crate::Limit::concurrency)) for as long as
    /// the returned [`Permit`] lives: one store call, all or nothing (a
    /// denied request holds nothing). Keep the permit until the work ends;
    /// dropping it gives the places back. A limiter without concurrency
    /// layers answers as `check` does, with no permit.
    ///
    /// A store failure is decided by each layer's failure mode, as for
    /// `check`; a concurrency layer then holds no place.
    pub async fn acquire(&self, ctx: &Context, cost: u64) -> Result<Acquired, Error> {
        let limiter = self.planned(ctx).await;
        if !limiter.has_concurrency {
            let decision = limiter.check(ctx, cost).await?;
            return Ok(Acquired {
                decision,
                permit: None,
            });
        }
        limiter.acquire_here(ctx, cost).await
    }

    /// [`acquire`](Self::acquire) under this limiter's own layers.
    pub(super) async fn acquire_here(&self, ctx: &Context, cost: u64) -> Result<Acquired, Error> {
        // A shadow layer never fails a request: one that cannot be decided
        // (a cost above its capacity, no subject for it) is left out.
        if self.has_shadow && self.layers.iter().any(|l| undecidable(l, ctx, cost)) {
            let left_out = |l: &Layer| undecidable(l, ctx, cost);
            return self.acquire_without(ctx, cost, &left_out).await;
        }
        let mut requests = Requests::new();
        self.requests_into(ctx, cost, &mut requests)?;
        let answer = match self.acquire_call(&requests).await {
            Ok((verdicts, _)) if denied_only_by_shadow(&requests, &verdicts) => {
                past_shadow(Passes::Acquire(self), &requests, verdicts).await
            }
            other => other,
        };
        match answer {
            Ok((verdicts, permit)) => {
                let decision = self.decision_of(&requests, cost, &verdicts);
                // A denied request holds nothing (a permit dropped here
                // gives back whatever it holds).
                let permit = permit.filter(|_| decision.is_allowed());
                Ok(Acquired { decision, permit })
            }
            Err(error) => {
                // As in `check`: an error about a shadow policy alone.
                if let Some(name) = self.shadow_at_fault(&error) {
                    let named = |l: &Layer| l.policy.name() == name;
                    return self.acquire_without(ctx, cost, &named).await;
                }
                // One about an enforced policy fails its layers alone.
                if let Some(name) = self.enforced_at_fault(&error) {
                    let fault = self.acquire_despite_fault(ctx, cost, &requests, name, &error);
                    return Box::pin(fault).await;
                }
                let decision = self.degraded(&requests, &error).await;
                Ok(Acquired {
                    decision: self.recorded(&requests, cost, decision),
                    permit: None,
                })
            }
        }
    }

    /// [`acquire_here`](Self::acquire_here) without the shadow layers
    /// `left_out` picks, which are reported as left out.
    async fn acquire_without(
        &self,
        ctx: &Context,
        cost: u64,
        left_out: &(dyn Fn(&Layer) -> bool + Sync),
    ) -> Result<Acquired, Error> {
        let (decided, permit) = match self.subset(left_out) {
            // Fewer shadow layers each time: the recursion ends.
            Some(subset) => {
                let acquired = Box::pin(subset.acquire_here(ctx, cost)).await?;
                (Some(acquired.decision), acquired.permit)
            }
            None => (None, None),
        };
        let decision = self.with_left_out(decided, left_out);
        Ok(Acquired { decision, permit })
    }

    /// The store's acquisition of `requests`, through the breaker, and
    /// the permit of the places it took (given back if this future is
    /// dropped before it answers: [`acquire_detached`]).
    async fn acquire_call(
        &self,
        requests: &Requests<'_>,
    ) -> Result<(Verdicts, Option<Permit>), StoreError> {
        let admission = self.breaker.admit();
        if let Admission::Skip(wait) = admission {
            observe::store_skipped(self.store.kind());
            return Err(StoreError::CircuitOpen(wait));
        }
        let call = acquire_detached(&self.store, &self.releases, requests);
        self.store_call(admission, call).await
    }
}
