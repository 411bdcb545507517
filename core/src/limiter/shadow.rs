//! Shadow layers: decided and counted, never deciding a request — set
//! aside when they alone deny it or cannot take part in it.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::check::Check;
use super::{ask, Limiter, Requests};
use crate::algorithm::Verdict;
use crate::context::Context;
use crate::decision::{Decision, LayerDecision, Source};
use crate::error::{Error, StoreError};
use crate::layer::Layer;
use crate::observe::LimiterMetrics;
use crate::store::{LayerRequest, Store};
use crate::verdicts::Verdicts;

impl Limiter {
    /// Decide without the shadow layers `left_out` picks (they could not
    /// take part: no subject for them, a cost above their capacity, a store
    /// error about their own keys); every other layer decides as usual,
    /// other shadow layers included. The layers left out report a would-be
    /// denial that no store made (`Source::FailClosed`).
    pub(super) async fn without(
        &self,
        ctx: &Context,
        cost: u64,
        left_out: &(dyn Fn(&Layer) -> bool + Sync),
    ) -> Result<Decision, Error> {
        let decided_kept = match self.subset(left_out) {
            // Fewer shadow layers each time: the recursion ends.
            Some(subset) => Some(Check::new(&subset, ctx, cost).await?),
            None => None,
        };
        Ok(self.with_left_out(decided_kept, left_out))
    }

    /// The shadow policy `error` is about, when it names one that only
    /// shadow layers use (its key holds foreign data, its key budget is
    /// full): such an error does not fail the enforced layers.
    pub(super) fn shadow_at_fault<'e>(&self, error: &'e StoreError) -> Option<&'e str> {
        if !self.has_shadow {
            return None;
        }
        let name = error.policy()?;
        let mut named = self
            .layers
            .iter()
            .filter(|l| l.policy.name() == name)
            .peekable();
        named.peek()?;
        named.all(|l| l.policy.is_shadow()).then_some(name)
    }

    /// This limiter without the layers `left_out` picks, with its own
    /// counters (its layers are fewer) and no cached denial of the whole
    /// request answering for it; `None` when no layer is kept.
    pub(crate) fn subset(&self, left_out: &(dyn Fn(&Layer) -> bool + Sync)) -> Option<Limiter> {
        let kept: Arc<[Layer]> = self
            .layers
            .iter()
            .filter(|l| !left_out(l))
            .cloned()
            .collect();
        if kept.is_empty() {
            return None;
        }
        Some(Limiter {
            metrics: Arc::new(LimiterMetrics::new(&kept)),
            #[cfg(feature = "blocked-cache")]
            blocked: None,
            ..self.with_layers(kept)
        })
    }

    /// The decision of every layer: the kept layers' from `decided_kept`
    /// (the [`subset`](Self::subset)'s), the layers `left_out` picks
    /// reporting a would-be denial that no store made
    /// (`Source::FailClosed`).
    pub(crate) fn with_left_out(
        &self,
        decided_kept: Option<Decision>,
        left_out: &(dyn Fn(&Layer) -> bool + Sync),
    ) -> Decision {
        let (decided_layers, store_error) =
            decided_kept.map(Decision::into_parts).unwrap_or_default();
        let mut kept_layers = decided_layers.into_iter();
        let layers: Vec<LayerDecision> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                if left_out(layer) {
                    let none = Verdict {
                        allowed: false,
                        limit: layer.policy.capacity(),
                        remaining: 0,
                        reset_after: Duration::ZERO,
                        retry_after: None,
                    };
                    let d = LayerDecision::new(layer, none, Source::FailClosed);
                    // The layers kept were counted by their own decision.
                    self.metrics.layer(i, &d);
                    d
                } else {
                    kept_layers.next().expect("one decision per layer kept")
                }
            })
            .collect();
        match store_error {
            Some(class) => Decision::degraded(layers, class),
            None => Decision::new(layers),
        }
    }
}

/// Whether `layer` is a shadow layer this request cannot be decided by (a
/// cost above its capacity, no subject for it).
pub(crate) fn undecidable(layer: &Layer, ctx: &Context, cost: u64) -> bool {
    layer.policy.is_shadow()
        && (layer.policy.check_cost(cost).is_err() || ctx.key_for(layer).is_none())
}

/// Whether the store denied `requests` and every denying layer is in
/// shadow mode.
#[inline]
pub(super) fn denied_only_by_shadow(requests: &[LayerRequest<'_>], verdicts: &[Verdict]) -> bool {
    let mut denied = requests.iter().zip(verdicts).filter(|(_, v)| !v.allowed);
    let first = denied.next();
    first.is_some_and(|(r, _)| r.policy.is_shadow()) && denied.all(|(r, _)| r.policy.is_shadow())
}

/// How each pass of [`past_shadow`] asks the store.
pub(super) enum Passes<'s> {
    /// Decide, as `check` does, holding nothing: on a store that answers
    /// at once (in-process, or from leased batches, which call no store),
    /// neither timed nor told to the breaker.
    Decide(&'s dyn Store),
    /// Decide on the limiter's store, each pass timed and counted as the
    /// first was (a store that waits: `tollgate_store_latency_seconds`,
    /// its errors) and told to the breaker, without asking it again
    /// ([`Limiter::timed`]).
    Timed(&'s Limiter),
    /// Acquire on the limiter's store as `acquire` does, the call on a
    /// task of its own: a pass abandoned while the store takes its places
    /// gives them back; timed and told to the breaker as a `Timed` pass
    /// is.
    #[cfg(feature = "concurrency")]
    Acquire(&'s Limiter),
}

/// The places a pass holds: the permit of an acquisition's.
#[cfg(feature = "concurrency")]
pub(super) type Held = Option<crate::permit::Permit>;
/// The places a pass holds: none without the `concurrency` feature.
#[cfg(not(feature = "concurrency"))]
pub(super) type Held = Option<std::convert::Infallible>;

/// Decide a request its shadow layers alone denied: again, without the
/// shadow layers that denied, so the enforced layers (and the shadow
/// layers that admit) are charged exactly as if those had admitted. A
/// shadow layer that denies in a later pass is left out of the next one;
/// a denial by an enforced layer denies the request. The shadow layers
/// left out keep the verdict that left them out (they charged nothing).
/// When acquiring, the answer carries the permit of the pass that
/// charged; otherwise none.
pub(super) async fn past_shadow(
    passes: Passes<'_>,
    requests: &[LayerRequest<'_>],
    mut verdicts: Verdicts,
) -> Result<(Verdicts, Held), StoreError> {
    let mut included: SmallVec<[bool; 4]> = verdicts.iter().map(|v| v.allowed).collect();
    loop {
        let slots: SmallVec<[usize; 4]> = (0..requests.len()).filter(|&i| included[i]).collect();
        let batch: Requests<'_> = slots.iter().map(|&i| requests[i]).collect();
        if batch.is_empty() {
            // Only shadow layers, all denying: admitted, nothing to charge.
            return Ok((verdicts, None));
        }
        let (again, permit) = match &passes {
            #[cfg(feature = "concurrency")]
            Passes::Acquire(limiter) => {
                let pass =
                    super::detached::acquire_detached(&limiter.store, &limiter.releases, &batch);
                limiter.timed(pass).await?
            }
            Passes::Timed(limiter) => (limiter.timed(ask(&*limiter.store, &batch)).await?, None),
            Passes::Decide(store) => (ask(*store, &batch).await?, None),
        };
        for (&i, v) in slots.iter().zip(&again) {
            verdicts[i] = *v;
        }
        if !denied_only_by_shadow(&batch, &again) {
            // Admitted (and charged), or denied by an enforced layer
            // (nothing charged): the answer.
            return Ok((verdicts, permit));
        }
        for (&i, v) in slots.iter().zip(&again) {
            if !v.allowed {
                included[i] = false;
            }
        }
    }
}
