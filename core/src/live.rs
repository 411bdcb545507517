//! Limits that can change while the service runs: a route's limiter and
//! cost, read anew for each request from a reloadable configuration.

use std::fmt;
use std::sync::{Arc, Weak};

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

    /// Keep `requirement` for as long as it lives (held weakly: dropping
    /// what it came from withdraws it). An adapter built on the route
    /// registers what every request needs of the limits (an identity for
    /// each layer, a cost each layer can hold); a reload whose limits for
    /// this route fail a requirement must be refused, or every request
    /// would fail. The default keeps nothing.
    fn require(&self, requirement: Weak<RouteRequirement>) {
        let _ = requirement;
    }
}

/// What an adapter needs of a route's limits: `Err` says why these limits
/// cannot serve its requests ([`ReloadableRoute::require`]).
pub type RouteRequirement = dyn Fn(&RouteLimits) -> Result<(), String> + Send + Sync;

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
