//! A store error about one enforced policy (its key budget full, its key
//! holding data it cannot read) fails that policy's layers alone: they
//! answer by their failure mode, and the other layers are still decided
//! by the store. Failing every layer instead would let a request through
//! layers the store could decide (a subject rotating through addresses
//! whose budget is full, uncounted by its own failing-open layer).

use smallvec::SmallVec;

use super::check::Check;
use super::Limiter;
use crate::context::Context;
use crate::decision::{Decision, LayerDecision};
use crate::error::{Error, StoreError};
use crate::failure::OnStoreFailure;
use crate::layer::Layer;
use crate::store::LayerRequest;

impl Limiter {
    /// The enforced policy `error` is about, when its layers answer
    /// without the store (failing open, or to the emergency bucket) and
    /// other layers are left for the store. A policy failing closed denies
    /// the request whatever the other layers say: no need to ask them.
    pub(super) fn enforced_at_fault<'e>(&self, error: &'e StoreError) -> Option<&'e str> {
        let name = error.policy()?;
        let named = || self.layers.iter().filter(|l| l.policy.name() == name);
        let count = named().count();
        let answers_alone = named().all(|l| {
            !l.policy.is_shadow() && !matches!(l.policy.on_failure(), OnStoreFailure::FailClosed)
        });
        (count > 0 && count < self.layers.len() && answers_alone).then_some(name)
    }

    /// Decide the request of `requests` (one per layer) when the store
    /// failed for policy `name` alone: the other layers by the store, then,
    /// if they admit, `name`'s layers by their failure mode. When the
    /// emergency bucket then denies, the other layers stay charged
    /// (under-admission, never more).
    pub(super) async fn despite_fault(
        &self,
        ctx: &Context,
        cost: u64,
        requests: &[LayerRequest<'_>],
        name: &str,
        error: &StoreError,
    ) -> Result<Decision, Error> {
        let named = |l: &Layer| l.policy.name() == name;
        let others = self.subset(&named).expect("other layers remain");
        let theirs = Check::new(&others, ctx, cost).await?;
        let mine = self
            .own_answer(&named, requests, cost, error, theirs.is_allowed())
            .await;
        Ok(self.merged(&named, theirs, mine, error))
    }

    /// [`despite_fault`](Self::despite_fault) for `acquire`: the other
    /// layers acquire their places; they are given back when the failing
    /// policy's emergency bucket denies.
    #[cfg(feature = "concurrency")]
    pub(super) async fn acquire_despite_fault(
        &self,
        ctx: &Context,
        cost: u64,
        requests: &[LayerRequest<'_>],
        name: &str,
        error: &StoreError,
    ) -> Result<super::acquire::Acquired, Error> {
        let named = |l: &Layer| l.policy.name() == name;
        let others = self.subset(&named).expect("other layers remain");
        let theirs = Box::pin(others.acquire_here(ctx, cost)).await?;
        let allowed = theirs.decision.is_allowed();
        let mine = self
            .own_answer(&named, requests, cost, error, allowed)
            .await;
        let decision = self.merged(&named, theirs.decision, mine, error);
        // Dropped, the permit gives the places back.
        let permit = theirs.permit.filter(|_| decision.is_allowed());
        Ok(super::acquire::Acquired { decision, permit })
    }

    /// The failing policy's layers (`named`): decided by their failure
    /// mode when the other layers admitted, else not asked.
    async fn own_answer(
        &self,
        named: &(dyn Fn(&Layer) -> bool + Sync),
        requests: &[LayerRequest<'_>],
        cost: u64,
        error: &StoreError,
        others_admit: bool,
    ) -> Decision {
        let own = self.subset(&|l| !named(l)).expect("the policy has layers");
        if !others_admit {
            return Decision::new(own.layers.iter().map(not_asked));
        }
        let own_requests: SmallVec<[LayerRequest<'_>; 4]> = self
            .layers
            .iter()
            .zip(requests)
            .filter(|(l, _)| named(l))
            .map(|(_, r)| *r)
            .collect();
        let mine = own.degraded(&own_requests, error).await;
        own.recorded(&own_requests, cost, mine)
    }

    /// The whole decision: `mine` for the `named` layers, `theirs` for the
    /// others, in the limiter's order.
    fn merged(
        &self,
        named: &(dyn Fn(&Layer) -> bool + Sync),
        theirs: Decision,
        mine: Decision,
        error: &StoreError,
    ) -> Decision {
        let (mut theirs, _) = theirs.into_parts();
        let (mut mine, _) = mine.into_parts();
        let (mut theirs, mut mine) = (theirs.drain(..), mine.drain(..));
        let layers: SmallVec<[LayerDecision; 4]> = self
            .layers
            .iter()
            .map(|l| match named(l) {
                true => mine.next().expect("one decision per own layer"),
                false => theirs.next().expect("one decision per other layer"),
            })
            .collect();
        Decision::degraded(layers, error.class())
    }
}

/// A layer of the failing policy in a request other layers denied: not
/// charged, not asked, not counted (`FailOpen`: headers give it no
/// `RateLimit` item, where an emergency bucket's answer would announce a
/// full quota nothing counted).
fn not_asked(layer: &Layer) -> LayerDecision {
    super::degraded::fail_open(layer)
}
