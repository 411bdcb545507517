//! Decisions: what the limiter answers, layer by layer.

use std::sync::Arc;
use std::time::Duration;

use crate::policy::Policy;

/// Where a layer's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The configured store decided.
    Store,
    /// The store failed; the in-process emergency bucket decided.
    Fallback,
    /// The store failed; the policy says to admit.
    FailOpen,
    /// The store failed; the policy says to reject (HTTP 503, not 429).
    FailClosed,
    /// The blocked-key cache repeated the store's recent denial, without a
    /// store call.
    Cache,
}

impl Source {
    /// A short label: `store`, `fallback`, `fail_open`, `fail_closed`, `cache`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::Fallback => "fallback",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
            Source::Cache => "cache",
        }
    }
}

/// One layer's part of a [`Decision`].
#[derive(Debug, Clone, PartialEq)]
pub struct LayerDecision {
    /// The layer's name.
    pub layer: Arc<str>,
    /// The layer's policy (shared with the limiter).
    pub policy: Arc<Policy>,
    /// Whether this layer admits the request.
    pub allowed: bool,
    /// The policy's capacity or window limit.
    pub limit: u64,
    /// Units left after this decision (when the request is denied by another
    /// layer, this layer was not charged and shows what it still has).
    pub remaining: u64,
    /// Time until this layer is back to full.
    pub reset_after: Duration,
    /// When this layer denies: the earliest time the same request could pass it.
    pub retry_after: Option<Duration>,
    /// Where the answer came from.
    pub source: Source,
}

/// The answer to one request: admitted only if every enforced layer admits,
/// and then every admitting layer was charged; denied otherwise, and no
/// layer was charged.
///
/// A layer whose policy is in shadow mode ([`Policy::shadow`]) is decided
/// and counted like the others, but its denial never denies the request:
/// [`is_allowed`](Self::is_allowed), [`denied_layers`](Self::denied_layers)
/// and [`retry_after`](Self::retry_after) leave it out;
/// [`shadow_denied`](Self::shadow_denied) lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    layers: Vec<LayerDecision>,
    store_error: Option<&'static str>,
}

impl Decision {
    /// A decision from its layers.
    pub fn new(layers: Vec<LayerDecision>) -> Self {
        Decision {
            layers,
            store_error: None,
        }
    }

    /// A decision made without the store, which failed with an error of
    /// `class` (see [`StoreError::class`](crate::StoreError::class)).
    pub fn degraded(layers: Vec<LayerDecision>, class: &'static str) -> Self {
        Decision {
            layers,
            store_error: Some(class),
        }
    }

    /// The layers, and the store error's class when the store failed.
    pub(crate) fn into_parts(self) -> (Vec<LayerDecision>, Option<&'static str>) {
        (self.layers, self.store_error)
    }

    /// When the store failed: the error class (`timeout`, `unavailable`, …).
    pub fn store_error(&self) -> Option<&'static str> {
        self.store_error
    }

    /// Whether the request is denied because a layer failed closed (HTTP
    /// 503), rather than by a limit (HTTP 429).
    pub fn failed_closed(&self) -> bool {
        self.denied_layers().any(|l| l.source == Source::FailClosed)
    }

    /// Whether the request may proceed: every enforced layer admits.
    pub fn is_allowed(&self) -> bool {
        self.layers
            .iter()
            .all(|l| l.allowed || l.policy.is_shadow())
    }

    /// The shadow layers that would have denied the request.
    pub fn shadow_denied(&self) -> impl Iterator<Item = &LayerDecision> {
        self.layers
            .iter()
            .filter(|l| !l.allowed && l.policy.is_shadow())
    }

    /// Every layer, in the limiter's order.
    pub fn layers(&self) -> &[LayerDecision] {
        &self.layers
    }

    /// The enforced layers that denied.
    pub fn denied_layers(&self) -> impl Iterator<Item = &LayerDecision> {
        self.layers
            .iter()
            .filter(|l| !l.allowed && !l.policy.is_shadow())
    }

    /// When denied: the longest wait among the denying layers (`None` when admitted).
    pub fn retry_after(&self) -> Option<Duration> {
        self.denied_layers().filter_map(|l| l.retry_after).max()
    }

    /// The enforced layer with the fewest remaining units (the one headers
    /// report first).
    pub fn tightest(&self) -> Option<&LayerDecision> {
        self.layers
            .iter()
            .filter(|l| !l.policy.is_shadow())
            .min_by_key(|l| (l.allowed, l.remaining))
    }
}
