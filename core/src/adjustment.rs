//! What an operator can do to a key's state besides deciding a request.

use std::time::Duration;

use crate::error::StoreError;
use crate::limit::MAX_RECOVERY;

/// A change to every layer of one call, made without a decision: the
/// [`Store::adjust`](crate::Store::adjust) operation behind
/// [`Limiter::penalize`](crate::Limiter::penalize),
/// [`Limiter::reward`](crate::Limiter::reward) and
/// [`Limiter::block`](crate::Limiter::block). The units of a penalty or a
/// reward are each layer's [`cost`](crate::LayerRequest::cost).
///
/// Each layer is changed as its algorithm would be (the reference:
/// `tollgate_algorithms::adjust`):
///
/// - a penalty charges the units without an admission check, saturating
///   at empty: what the layer cannot hold is dropped, and the layer admits
///   again as it refills;
/// - a reward gives units back, never above full (the token bucket and
///   GCRA refill by the units, the window counters count fewer, the
///   sliding log drops its newest entries);
/// - a block denies every request until an instant, whatever the
///   algorithm, with that instant as the retry-after; the state's TTL
///   covers it, and from the instant on the layer starts full. A block
///   never shortens a longer one already there; a reset lifts it.
///
/// A blocked layer keeps its block through penalties and rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Adjustment {
    /// Charge each layer its cost, without an admission check, saturating
    /// at empty.
    Penalize,
    /// Give each layer its cost back, never above full.
    Reward,
    /// Deny every request for this long (1 ms to
    /// [`MAX_RECOVERY`](crate::MAX_RECOVERY)), from the store's now.
    Block(Duration),
}

impl Adjustment {
    /// Whether a store can carry this out: a block lasts 1 ms to
    /// [`MAX_RECOVERY`] (14 days), or [`StoreError::InvalidBlock`]. Every
    /// store checks it before it writes.
    pub fn check(self) -> Result<(), StoreError> {
        match self {
            Adjustment::Block(d) if d < Duration::from_millis(1) || d > MAX_RECOVERY => {
                Err(StoreError::InvalidBlock(d))
            }
            _ => Ok(()),
        }
    }

    /// A short name, for errors and logs (`penalize`, `reward`, `block`).
    pub fn name(self) -> &'static str {
        match self {
            Adjustment::Penalize => "penalize",
            Adjustment::Reward => "reward",
            Adjustment::Block(_) => "block",
        }
    }
}
