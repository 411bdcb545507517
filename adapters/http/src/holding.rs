//! The places an admitted request holds in concurrency layers, carried
//! from the decision to the end of the response.

use std::sync::Arc;

use tollgate_limiter::Permit;

/// The places an admitted request holds in its concurrency layers
/// ([`Limit::concurrency`](tollgate_limiter::Limit::concurrency)): the
/// limiter's [`Permit`], shared. Adapters keep it with the response body
/// and drop it when the body has been sent (or dropped): the places come
/// back when the last clone goes. Empty for a limiter without concurrency
/// layers.
#[derive(Debug, Clone, Default)]
pub struct Holding(Option<Arc<Permit>>);

impl Holding {
    /// Holding `permit` (none: nothing).
    pub fn new(permit: Option<Permit>) -> Self {
        Holding(permit.map(Arc::new))
    }

    /// Whether it holds a place.
    pub fn is_holding(&self) -> bool {
        self.0.is_some()
    }
}

/// Two holdings are equal when they share one permit (or both hold none).
impl PartialEq for Holding {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}
