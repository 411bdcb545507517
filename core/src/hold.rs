//! What a concurrency layer holds for an admitted request.

use smallvec::SmallVec;

use crate::error::StoreError;
use crate::limit::Limit;
use crate::store::LayerRequest;

/// The units a concurrency layer ([`Limit::concurrency`](crate::Limit::concurrency))
/// holds for one admitted request, as its store wrote them: what a release
/// gives back and a renewal moves. A store answers one per concurrency
/// layer from [`Store::acquire`](crate::Store::acquire); the limiter keeps
/// them in a [`Permit`](crate::Permit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold {
    /// The units held (the request's cost).
    pub cost: u64,
    /// The time (µs since the Unix epoch) the units were charged or last
    /// renewed at, by the store's clock: it names them in the store.
    pub at: u64,
}

/// One entry per layer of a request: the layer's [`Hold`], or `None` for a
/// layer that holds nothing (not a concurrency layer, a denied request, a
/// hold that was lost). Up to four inline.
pub type Holds = SmallVec<[Option<Hold>; 4]>;

/// Refuse a release or renewal ([`Store::release`](crate::Store::release),
/// [`Store::renew`](crate::Store::renew)) that does not name one hold per
/// layer, each layer a concurrency limit and each hold of the layer's cost
/// at a time the store wrote (not 0): the caller's mistake, refused with
/// [`StoreError::Protocol`] before the store is touched (a store that
/// wrote for fewer holds than layers would release some and not others).
/// Every store calls it first, a store of your own too.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{check_holds, Hold, LayerRequest, Limit, Policy, StoreKey};
/// let policy = Policy::new("in-flight", Limit::concurrency(5, Duration::from_secs(30))?)?;
/// let layer = LayerRequest { key: StoreKey::new("k", &policy, "s", "k"), policy: &policy, cost: 1 };
/// let hold = Hold { cost: 1, at: 1_800_000_000_000_000 };
/// assert!(check_holds(&[layer], &[hold]).is_ok());
/// assert!(check_holds(&[layer, layer], &[hold]).is_err(), "one hold for two layers");
/// assert!(check_holds(&[layer], &[Hold { cost: 2, ..hold }]).is_err(), "not the layer's cost");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_holds(layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
    let matching = holds.len() == layers.len()
        && layers.iter().zip(holds).all(|(l, h)| {
            matches!(l.policy.limit(), Limit::Concurrency(_)) && l.cost == h.cost && h.at != 0
        });
    if !matching {
        return Err(StoreError::Protocol(
            "a release or renewal takes one hold of each concurrency layer, at its cost".into(),
        ));
    }
    Ok(())
}
