//! Building a [`Limiter`](super::Limiter).

use std::sync::Arc;

use super::{planned, Limiter};
use crate::error::BuildError;
use crate::failure::{BreakerConfig, CircuitBreaker};
use crate::layer::{duplicate_names, shared_counters, Layer, Scope};
use crate::limit::Limit;
use crate::observe::{self, LimiterMetrics};
use crate::plan::Plans;
use crate::policy::Policy;
use crate::store::Store;
use crate::time::{Clock, MonotonicClock};

/// `store` wrapped for the leased layers among `layers`, when there are
/// any and the store is not in-process; leases read `clock`.
#[cfg(feature = "lease")]
fn leased(
    layers: &[Layer],
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
) -> Option<Arc<crate::leased_store::LeasedStore>> {
    let shortest = layers
        .iter()
        .filter_map(|l| l.policy.lease())
        .map(|lease| lease.duration())
        .min()?;
    if store.is_in_process() {
        return None;
    }
    let leased = crate::leased_store::LeasedStore::new(store.clone(), clock.clone(), shortest);
    Some(leased)
}

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[derive(Debug)]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    layers: Vec<Layer>,
    fallback: Option<Arc<dyn Store>>,
    breaker: BreakerConfig,
    clock: Arc<dyn Clock>,
    #[cfg(feature = "blocked-cache")]
    blocked: Option<crate::blocked::BlockedCacheConfig>,
    plans: Option<Plans>,
}

impl LimiterBuilder {
    /// What [`Limiter::builder`] starts from: no layers, no emergency
    /// store, the default breaker, the monotonic clock.
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        LimiterBuilder {
            store,
            layers: Vec::new(),
            fallback: None,
            breaker: BreakerConfig::default(),
            clock: Arc::new(MonotonicClock::new()),
            #[cfg(feature = "blocked-cache")]
            blocked: None,
            plans: None,
        }
    }

    /// Add a layer (layers are decided together; order is the report order).
    pub fn layer(mut self, name: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        self.layers.push(Layer::new(name, scope, policy));
        self
    }

    /// The in-process emergency store for layers whose policy falls back
    /// (typically a small `MemoryStore`). Required when any layer falls back.
    pub fn fallback_store(mut self, store: Arc<dyn Store>) -> Self {
        self.fallback = Some(store);
        self
    }

    /// Circuit breaker settings (default: open after 5 consecutive failures,
    /// probe after 1 s).
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Answer requests the store denied with a retry-after of at least
    /// `config.threshold` locally until that time, without a store call.
    #[cfg(feature = "blocked-cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "blocked-cache")))]
    pub fn blocked_cache(mut self, config: crate::blocked::BlockedCacheConfig) -> Self {
        self.blocked = Some(config);
        self
    }

    /// The clock the circuit breaker and blocked-key cache read, and the
    /// one `wait` and `throttle` measure and sleep on (default: a
    /// [`MonotonicClock`]): with a [`ManualClock`](crate::ManualClock), a
    /// wait ends only as the clock is moved.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Decide each request under its customer's plan (see [`Plans`]):
    /// every plan's limits are checked when the limiter is built.
    pub fn plans(mut self, plans: Plans) -> Self {
        self.plans = Some(plans);
        self
    }

    /// Check the layers and build the limiter.
    pub fn build(self) -> Result<Limiter, BuildError> {
        if self.layers.is_empty() {
            return Err(BuildError::NoLayers);
        }
        let names = self.layers.iter().map(|l| l.name());
        let first_conflict = duplicate_names(names)
            .into_iter()
            .chain(shared_counters(&self.layers))
            .min_by_key(|(i, _)| *i);
        if let Some((_, conflict)) = first_conflict {
            return Err(conflict);
        }
        // Every layer falling back, not the first: a concurrency limit's
        // place taken in the emergency store would never be given back.
        for layer in self.layers.iter() {
            let Some(fallback) = &layer.fallback else {
                continue;
            };
            if layer.is_concurrency() || matches!(fallback.limit(), Limit::Concurrency(_)) {
                return Err(BuildError::ConcurrencyFallback(layer.name.to_string()));
            }
            if self.fallback.is_none() {
                return Err(BuildError::NoFallbackStore(layer.name.to_string()));
            }
        }
        let policies: Vec<&str> = self.layers.iter().map(|l| l.policy.name()).collect();
        observe::register(self.store.kind(), &policies);
        let metrics = Arc::new(LimiterMetrics::new(&self.layers));
        let breaker = Arc::new(CircuitBreaker::with_clock(self.breaker, self.clock.clone()));
        #[cfg(feature = "blocked-cache")]
        let blocked = self
            .blocked
            .map(|c| Arc::new(crate::blocked::BlockedCache::new(c)));
        let has_shadow = self.layers.iter().any(|l| l.policy.is_shadow());
        let has_concurrency = self.layers.iter().any(Layer::is_concurrency);
        #[cfg(feature = "lease")]
        let leases = leased(&self.layers, &self.store, &self.clock);
        #[cfg(feature = "lease")]
        let store = match &leases {
            Some(leases) => Arc::clone(leases) as Arc<dyn Store>,
            None => self.store,
        };
        #[cfg(not(feature = "lease"))]
        let store = self.store;
        #[cfg(feature = "concurrency")]
        let releases = Arc::new(crate::release_queue::ReleaseQueue::new(store.clone()));
        let mut limiter = Limiter {
            layers: self.layers.into(),
            store,
            fallback: self.fallback,
            breaker,
            clock: self.clock,
            #[cfg(feature = "blocked-cache")]
            blocked,
            has_shadow,
            has_concurrency,
            #[cfg(feature = "concurrency")]
            releases,
            metrics,
            plans: None,
            #[cfg(feature = "lease")]
            leases,
        };
        if let Some(plans) = self.plans {
            limiter.plans = Some(Arc::new(planned::PlanBook::build(&limiter, plans)?));
        }
        Ok(limiter)
    }
}
