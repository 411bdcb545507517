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
            StoreSpec::Redis(spec) => {
                let mut builder = tollgate_redis::RedisStore::builder(spec.url.clone());
                if let Some(size) = spec.pool_size {
                    builder =
                        builder.connection_mode(tollgate_redis::ConnectionMode::Pool { size });
                }
                redis_store(builder, &spec.options, "redis").await
            }
            #[cfg(feature = "redis")]
            StoreSpec::RedisSentinel(spec) => {
                let mut builder = tollgate_redis::RedisStore::sentinel(
                    spec.sentinels.clone(),
                    spec.service.clone(),
                )
                .primary_db(spec.db);
                if let Some(size) = spec.pool_size {
                    builder =
                        builder.connection_mode(tollgate_redis::ConnectionMode::Pool { size });
                }
                if let Some(password) = &spec.password {
                    builder = builder.primary_auth(spec.username.as_deref(), password);
                }
                redis_store(builder, &spec.options, "redis-sentinel").await
            }
            #[cfg(feature = "cluster")]
            StoreSpec::RedisCluster(spec) => {
                let builder = tollgate_redis::RedisClusterStore::builder(spec.nodes.clone());
                let builder = configured(builder, &spec.options)?;
                let store = builder
                    .connect()
                    .await
                    .map_err(|source| SetupError::Store {
                        kind: "redis-cluster",
                        source,
                    })?;
                Ok(Arc::new(store))
            }
            #[cfg(not(feature = "cluster"))]
            StoreSpec::RedisCluster(_) => Err(SetupError::ClusterNotEnabled),
            StoreSpec::Custom(custom) => {
                let store = custom.open(clock).await;
                store.map_err(|source| SetupError::Store {
                    kind: custom.kind(),
                    source,
                })
            }
            #[cfg(not(feature = "redis"))]
            StoreSpec::Redis(_) | StoreSpec::RedisSentinel(_) => Err(SetupError::RedisNotEnabled),
        }
    }
}

/// `builder` (a standalone or a Cluster store's: one builder type, the
/// same setters) with the file's shared `options`, TLS included.
#[cfg(feature = "redis")]
fn configured<T>(
    builder: tollgate_redis::RedisBuilder<T>,
    options: &crate::RedisOptions,
) -> Result<tollgate_redis::RedisBuilder<T>, SetupError> {
    let mut builder = builder;
    if let Some(prefix) = &options.prefix {
        builder = builder.prefix(prefix.clone());
    }
    if let Some(d) = options.deadline {
        builder = builder.deadline(d.0);
    }
    if let Some(d) = options.connect_timeout {
        builder = builder.connect_timeout(d.0);
    }
    if let Some(engine) = options.engine {
        builder = builder.engine(engine_of(engine));
    }
    if let Some(replicas) = options.replica_ack {
        let timeout = options
            .replica_ack_timeout
            .map_or(DEFAULT_REPLICA_ACK_TIMEOUT, |d| d.0);
        builder = builder.replica_ack(replicas, timeout);
    }
    #[cfg(feature = "tls")]
    if let Some(tls) = tls_of(options)? {
        builder = builder.tls(tls);
    }
    #[cfg(not(feature = "tls"))]
    no_tls(options)?;
    Ok(builder)
}

/// A Redis store from `builder` with the file's shared `options`.
#[cfg(feature = "redis")]
async fn redis_store(
    builder: tollgate_redis::RedisStoreBuilder,
    options: &crate::RedisOptions,
    kind: &'static str,
) -> Result<Arc<dyn Store>, SetupError> {
    let builder = configured(builder, options)?;
    let store = if options.lazy {
        builder.build()
    } else {
        builder.connect().await
    };
    let store = store.map_err(|source| SetupError::Store { kind, source })?;
    Ok(Arc::new(store))
}

/// The Redis store's [`Engine`](tollgate_redis::Engine) for the
/// file's `engine`.
#[cfg(feature = "redis")]
pub(crate) fn engine_of(spec: crate::EngineSpec) -> tollgate_redis::Engine {
    use crate::EngineSpec;
    use tollgate_redis::Engine;
    match spec {
        EngineSpec::Auto => Engine::Auto,
        EngineSpec::Module => Engine::Module,
        EngineSpec::Functions => Engine::Functions,
        EngineSpec::PreloadedFunctions => Engine::PreloadedFunctions,
        EngineSpec::Eval => Engine::Eval,
    }
}

/// How long `replica_ack` waits when the file does not say.
#[cfg(feature = "redis")]
const DEFAULT_REPLICA_ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(20);

/// The TLS settings the file names, read from their files.
#[cfg(feature = "tls")]
fn tls_of(options: &crate::RedisOptions) -> Result<Option<tollgate_redis::Tls>, SetupError> {
    let read =
        |field: &'static str, path: &Option<String>| -> Result<Option<Vec<u8>>, SetupError> {
            path.as_ref()
                .map(|p| {
                    std::fs::read(p).map_err(|source| SetupError::TlsFile {
                        field,
                        path: p.clone(),
                        source,
                    })
                })
                .transpose()
        };
    let ca = read("ca_file", &options.ca_file)?;
    let cert = read("client_cert_file", &options.client_cert_file)?;
    let key = read("client_key_file", &options.client_key_file)?;
    if ca.is_none() && cert.is_none() {
        return Ok(None);
    }
    let mut tls = tollgate_redis::Tls::new();
    if let Some(ca) = ca {
        tls = tls.ca_pem(ca);
    }
    if let (Some(cert), Some(key)) = (cert, key) {
        tls = tls.client_pem(cert, key);
    }
    Ok(Some(tls))
}

/// Without TLS in the build, a file that asks for it is refused.
#[cfg(all(feature = "redis", not(feature = "tls")))]
fn no_tls(options: &crate::RedisOptions) -> Result<(), SetupError> {
    let any = options.ca_file.is_some() || options.client_cert_file.is_some();
    if any {
        return Err(SetupError::TlsNotEnabled);
    }
    Ok(())
}
