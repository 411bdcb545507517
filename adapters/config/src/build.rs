//! From a validated configuration to a store and one limiter per route.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_limiter::{Clock, Limiter, RouteLimits, Store};
use tollgate_memory::MemoryStore;

use crate::{BuildError, Config, StoreSpec};

/// One configured route: its limiter and the cost of one request.
pub type Route = RouteLimits;

/// Every route's limiter, over one shared store.
#[derive(Debug, Clone)]
pub struct Limiters {
    store: Arc<dyn Store>,
    routes: BTreeMap<String, Route>,
}

impl Limiters {
    /// The route named `name`.
    pub fn route(&self, name: &str) -> Option<&Route> {
        self.routes.get(name)
    }

    /// Every route, by name.
    pub fn routes(&self) -> &BTreeMap<String, Route> {
        &self.routes
    }

    /// The store every limiter decides in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

impl Config {
    /// Open the configured store and build every route's limiter.
    ///
    /// `clock` is the time of the in-process stores (the memory store and
    /// the emergency fallback store) and of the circuit breaker: pass
    /// [`MonotonicClock`](tollgate_limiter::MonotonicClock) in production, a
    /// [`ManualClock`](tollgate_limiter::ManualClock) in tests. A Redis store
    /// reads the server's `TIME`.
    pub async fn build(&self, clock: Arc<dyn Clock>) -> Result<Limiters, BuildError> {
        let store = self.open_store(clock.clone()).await?;
        self.build_on(store, clock)
    }

    /// Build every route's limiter over `store` (a store you opened
    /// yourself, for example a custom one); the `[store]` section is ignored.
    pub fn build_on(
        &self,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<Limiters, BuildError> {
        let fallback = self.fallback_store(clock.clone());
        let routes = self
            .routes_over(&store, &fallback, &clock)?
            .into_iter()
            .map(|(name, route)| (name, Arc::unwrap_or_clone(route)))
            .collect();
        Ok(Limiters { store, routes })
    }

    /// The in-process emergency store, when some policy falls back.
    pub(crate) fn fallback_store(&self, clock: Arc<dyn Clock>) -> Option<Arc<dyn Store>> {
        self.any_fallback().then(|| {
            Arc::new(
                MemoryStore::builder()
                    .max_keys(self.fallback_max_keys())
                    .clock(clock)
                    .build(),
            ) as Arc<dyn Store>
        })
    }

    /// Every route's limiter over `store` (and `fallback`).
    pub(crate) fn routes_over(
        &self,
        store: &Arc<dyn Store>,
        fallback: &Option<Arc<dyn Store>>,
        clock: &Arc<dyn Clock>,
    ) -> Result<BTreeMap<String, Arc<RouteLimits>>, BuildError> {
        let mut routes = BTreeMap::new();
        for (name, def) in self.routes() {
            let mut builder = Limiter::builder(store.clone())
                .breaker(self.breaker())
                .clock(clock.clone());
            if let Some(fallback) = fallback {
                builder = builder.fallback_store(fallback.clone());
            }
            for layer in def.layers() {
                let policy = self
                    .policy(layer.policy())
                    .expect("validation checked every policy reference")
                    .clone();
                builder = builder.layer(layer.name(), layer.scope().clone(), policy);
            }
            let limiter = builder.build().map_err(|source| BuildError::Route {
                route: name.clone(),
                source,
            })?;
            routes.insert(
                name.clone(),
                Arc::new(RouteLimits::new(limiter, def.cost())),
            );
        }
        Ok(routes)
    }

    /// Open the configured store: in-process, or Redis (connecting now
    /// unless `lazy = true`).
    pub async fn open_store(&self, clock: Arc<dyn Clock>) -> Result<Arc<dyn Store>, BuildError> {
        match self.store() {
            StoreSpec::Memory(spec) => {
                let mut builder = MemoryStore::builder().clock(clock);
                if let Some(n) = spec.max_keys {
                    builder = builder.max_keys(n);
                }
                if let Some(when_full) = spec.when_full {
                    builder = builder.when_full(when_full.into());
                }
                if let Some(n) = spec.shards {
                    builder = builder.shards(n);
                }
                Ok(Arc::new(builder.build()))
            }
            #[cfg(feature = "redis")]
            StoreSpec::Redis(spec) => {
                use tollgate_redis::{ConnectionMode, RedisStore};
                let mut builder = RedisStore::builder(spec.url.clone());
                if let Some(prefix) = &spec.prefix {
                    builder = builder.prefix(prefix.clone());
                }
                if let Some(d) = spec.deadline {
                    builder = builder.deadline(d.0);
                }
                if let Some(d) = spec.connect_timeout {
                    builder = builder.connect_timeout(d.0);
                }
                if let Some(size) = spec.pool_size {
                    builder = builder.connection_mode(ConnectionMode::Pool { size });
                }
                let store = if spec.lazy {
                    builder.build()
                } else {
                    builder.connect().await
                };
                let store = store.map_err(|source| BuildError::Store {
                    kind: "redis",
                    source,
                })?;
                Ok(Arc::new(store))
            }
            #[cfg(not(feature = "redis"))]
            StoreSpec::Redis(_) => Err(BuildError::RedisNotEnabled),
        }
    }
}
