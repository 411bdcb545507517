//! Limits that can change while the service runs: a route's limiter and
//! cost, read anew for each request from a reloadable configuration.

use std::fmt;
use std::sync::Arc;

use crate::limiter::Limiter;

/// A route's limits at one moment: its limiter (every layer) and what one
/// request costs. A decision keeps the snapshot it started with, so a
/// reload never changes a decision in flight.
#[derive(Debug, Clone)]
pub struct RouteLimits {
    limiter: Limiter,
    cost: u64,
}

impl RouteLimits {
    /// A route's limiter and the cost of one request.
    pub fn new(limiter: Limiter, cost: u64) -> Self {
        RouteLimits { limiter, cost }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Units one request costs.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// A named route whose limits a reload can replace (implemented by the
/// configuration crate's live routes).
pub trait ReloadableRoute: Send + Sync + fmt::Debug {
    /// The route's name.
    fn name(&self) -> &str;

    /// The route's limits now.
    fn current(&self) -> Arc<RouteLimits>;
}

/// Where an HTTP adapter finds the limiter for each request: one fixed
/// [`Limiter`], or a [`ReloadableRoute`] whose limits a reload replaces.
#[derive(Debug, Clone)]
pub enum LimiterSource {
    /// Always this limiter.
    Fixed(Limiter),
    /// The route's limits as the running configuration has them.
    Live(Arc<dyn ReloadableRoute>),
}

impl From<Limiter> for LimiterSource {
    fn from(limiter: Limiter) -> Self {
        LimiterSource::Fixed(limiter)
    }
}

impl<R: ReloadableRoute + 'static> From<Arc<R>> for LimiterSource {
    fn from(route: Arc<R>) -> Self {
        LimiterSource::Live(route)
    }
}
