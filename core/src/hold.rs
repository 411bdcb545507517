//! What a concurrency layer holds for an admitted request.

use smallvec::SmallVec;

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
