//! From a validated configuration to a store and one limiter per route.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_limiter::{Clock, Limiter, LimiterBuilder, RouteLimits, Store};
use tollgate_memory::MemoryStore;

use crate::{Config, SetupError, StoreSpec};

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
    pub async fn build(&self, clock: Arc<dyn Clock>) -> Result<Limiters, SetupError> {
        let store = self.open_store(clock.clone()).await?;
        self.build_on(store, clock)
    }

    /// Build every route's limiter over `store` (a store you opened
    /// yourself, for example a custom one); the `[store]` section is ignored.
    pub fn build_on(
        &self,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<Limiters, SetupError> {
        let fallback = self.fallback_store(clock.clone());
        let routes = self
            .routes_over(&store, &fallback, &clock)?
            .into_iter()
            .map(|(name, route)| (name, Arc::unwrap_or_clone(route)))
            .collect();
        Ok(Limiters { store, routes })
    }

    /// The in-process emergency store (`[fallback]`), when some policy
    /// falls back to it: share one among the limiters built with
    /// [`limiter_builder`](Self::limiter_builder).
    pub fn fallback_store(&self, clock: Arc<dyn Clock>) -> Option<Arc<dyn Store>> {
        self.any_fallback().then(|| {
            Arc::new(
                MemoryStore::builder()
                    .max_keys(self.fallback_max_keys())
                    .clock(clock)
                    .build(),
            ) as Arc<dyn Store>
        })
    }

    /// A limiter builder wired as this configuration wires its routes:
    /// deciding in `store`, with the `[breaker]` settings, `clock`, and
    /// `fallback` (from [`fallback_store`](Self::fallback_store)) as the
    /// emergency store. Add layers of the configured policies
    /// ([`policy`](Self::policy)) for limiters the routes do not describe
    /// (the rate limit server builds its own this way).
    pub fn limiter_builder(
        &self,
        store: &Arc<dyn Store>,
        fallback: Option<&Arc<dyn Store>>,
        clock: &Arc<dyn Clock>,
    ) -> LimiterBuilder {
        let mut builder = Limiter::builder(store.clone())
            .breaker(self.breaker())
            .clock(clock.clone());
        if let Some(fallback) = fallback {
            builder = builder.fallback_store(fallback.clone());
        }
        builder
    }

    /// Every route's limiter over `store` (and `fallback`).
    pub(crate) fn routes_over(
        &self,
        store: &Arc<dyn Store>,
        fallback: &Option<Arc<dyn Store>>,
        clock: &Arc<dyn Clock>,
    ) -> Result<BTreeMap<String, Arc<RouteLimits>>, SetupError> {
        let mut routes = BTreeMap::new();
        for (name, def) in self.routes() {
            let mut builder = self.limiter_builder(store, fallback.as_ref(), clock);
            for layer in def.layers() {
                let policy = self
                    .policy(layer.policy())
                    .expect("validation checked every policy reference")
                    .clone();
                builder = builder.layer(layer.name(), layer.scope().clone(), policy);
            }
            if let Some(plans) = self.plans() {
                builder =
                    builder.plans(plans.for_policies(def.layers().iter().map(|l| l.policy())));
            }
            let limiter = builder.build().map_err(|source| SetupError::Route {
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

    /// Open the configured store: in-process, Redis (connecting now
    /// unless `lazy = true`), or a registered [`StoreKind`](crate::StoreKind)'s.
    pub async fn open_store(&self, clock: Arc<dyn Clock>) -> Result<Arc<dyn Store>, SetupError> {
        match self.store() {
            StoreSpec::Memory(settings) => {
                let builder = settings.apply(MemoryStore::builder().clock(clock));
                Ok(Arc::new(builder.build()))
            }
            #[cfg(feature = "redis")]
            StoreSpec::Redis(settings) => {
                settings.open().await.map_err(|e| redis_error(settings, e))
            }
            StoreSpec::Custom(custom) => {
                let store = custom.open(clock).await;
                store.map_err(|source| SetupError::Store {
                    kind: custom.kind(),
                    source,
                })
            }
        }
    }
}

/// The setup error of a Redis store that did not open.
#[cfg(feature = "redis")]
fn redis_error(
    settings: &tollgate_redis::RedisSettings,
    error: tollgate_redis::RedisSettingsError,
) -> SetupError {
    use tollgate_redis::RedisSettingsError as E;
    let kind = settings.kind.name();
    match error {
        E::ClusterNotEnabled => SetupError::ClusterNotEnabled,
        E::TlsNotEnabled => SetupError::TlsNotEnabled,
        E::TlsFile {
            field,
            path,
            source,
        } => SetupError::TlsFile {
            field,
            path,
            source,
        },
        E::Open(source) => SetupError::Store { kind, source },
        // Settings the file's checks passed: not met here.
        other => SetupError::Store {
            kind,
            source: tollgate_limiter::StoreError::Backend(Box::new(other)),
        },
    }
}
