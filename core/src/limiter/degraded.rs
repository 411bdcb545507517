//! The answers of a limiter whose store failed: every layer by its
//! policy's failure mode (fail closed, fail open, or the emergency store).

use std::time::Duration;

use super::shadow::{denied_only_by_shadow, past_shadow, Passes};
use super::{ask, Limiter};
use crate::algorithm::Verdict;
use crate::decision::{Decision, LayerDecision, Source};
use crate::error::StoreError;
use crate::failure::OnStoreFailure;
use crate::layer::Layer;
use crate::observe;
use crate::store::LayerRequest;
use crate::verdicts::Verdicts;

impl Limiter {
    /// Decide without the store, which failed with `error`: every layer by
    /// its policy's failure mode.
    pub(super) async fn degraded(
        &self,
        requests: &[LayerRequest<'_>],
        error: &StoreError,
    ) -> Decision {
        let wait = self.wait_after(error);
        let fallback = self.fallback_requests(requests);
        let fallback_verdicts = self.ask_fallback(&fallback).await;
        let layers =
            self.layers
                .iter()
                .enumerate()
                .map(|(i, layer)| match layer.policy.on_failure() {
                    OnStoreFailure::FailOpen => fail_open(layer),
                    OnStoreFailure::Fallback(_) => {
                        let slot = fallback.iter().position(|(j, _)| *j == i);
                        match (slot, &fallback_verdicts) {
                            (Some(slot), Some(verdicts)) => {
                                LayerDecision::new(layer, verdicts[slot], Source::Fallback)
                            }
                            _ => fail_closed(layer, wait),
                        }
                    }
                    _ => fail_closed(layer, wait),
                });
        Decision::degraded(layers, error.class())
    }

    /// The wait a failing-closed layer announces: the store's own when it
    /// knows one (a full budget frees up when its first key expires), else
    /// the breaker's.
    fn wait_after(&self, error: &StoreError) -> Duration {
        match error {
            StoreError::CircuitOpen(wait) => *wait,
            StoreError::Full { retry_after, .. } => *retry_after,
            _ => self.breaker.config().open_for,
        }
    }

    /// The layers the emergency store decides (with their index), each
    /// with its fallback policy; none when a layer fails closed, or when
    /// the request costs more than an enforced layer's emergency policy
    /// can ever hold: a request that cannot pass must not charge the
    /// emergency buckets. (A shadow layer that cannot hold the cost is
    /// left out.)
    fn fallback_requests<'a>(
        &'a self,
        requests: &[LayerRequest<'a>],
    ) -> Vec<(usize, LayerRequest<'a>)> {
        let any_closed = self.layers.iter().any(|l| {
            matches!(l.policy.on_failure(), OnStoreFailure::FailClosed) && !l.policy.is_shadow()
        });
        if any_closed {
            return Vec::new();
        }
        let mut fallback = Vec::new();
        for (i, (layer, r)) in self.layers.iter().zip(requests).enumerate() {
            let Some(policy) = layer.fallback.as_ref() else {
                continue;
            };
            if policy.check_cost(r.cost).is_err() {
                if layer.policy.is_shadow() {
                    continue;
                }
                return Vec::new();
            }
            let key = r.key;
            fallback.push((
                i,
                LayerRequest {
                    key,
                    policy,
                    cost: r.cost,
                },
            ));
        }
        fallback
    }

    /// The emergency store's verdicts for `fallback`, decided together;
    /// `None` when there is none to ask, or it failed too.
    async fn ask_fallback(&self, fallback: &[(usize, LayerRequest<'_>)]) -> Option<Verdicts> {
        let store = self.fallback.as_ref().filter(|_| !fallback.is_empty())?;
        let batch: Vec<LayerRequest<'_>> = fallback.iter().map(|(_, r)| *r).collect();
        // As the store decides: a request only shadow layers deny is
        // decided again without them (else the enforced layers would read
        // admitted, uncharged, and their emergency buckets never run out).
        let decided = match ask(&**store, &batch).await {
            Ok(verdicts) if denied_only_by_shadow(&batch, &verdicts) => {
                past_shadow(Passes::Decide(&**store), &batch, verdicts)
                    .await
                    .map(|(verdicts, _)| verdicts)
            }
            other => other,
        };
        match decided {
            Ok(verdicts) => Some(verdicts),
            Err(_) => {
                observe::fallback_failed(store.kind());
                None
            }
        }
    }
}

/// A layer failing closed: denied, back after `wait`.
fn fail_closed(layer: &Layer, wait: Duration) -> LayerDecision {
    let v = Verdict {
        allowed: false,
        limit: layer.policy.capacity(),
        remaining: 0,
        reset_after: wait,
        retry_after: Some(wait),
    };
    LayerDecision::new(layer, v, Source::FailClosed)
}

/// A layer failing open: admitted, its whole capacity reported.
pub(super) fn fail_open(layer: &Layer) -> LayerDecision {
    let v = Verdict {
        allowed: true,
        limit: layer.policy.capacity(),
        remaining: layer.policy.capacity(),
        reset_after: Duration::ZERO,
        retry_after: None,
    };
    LayerDecision::new(layer, v, Source::FailOpen)
}
