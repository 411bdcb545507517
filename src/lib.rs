//! # Tollgate
//!
//! Rate limiting for Rust services that decides atomically across several
//! algorithms, layers and stores, and tells clients exactly when to come back.
//!
//! - Seven built-in algorithms, chosen per policy ([`Limit`]): token bucket,
//!   GCRA, fixed window, sliding window counter, sliding log, calendar
//!   quota, and the concurrency limit (requests in flight); and your own
//!   through the [`Algorithm`] trait ([`Limit::custom`]).
//! - Layered policies (per key, per tenant, global) decided together by a
//!   [`Limiter`]: all layers are charged, or none is.
//! - Stores behind one [`Store`] trait: the in-process [`MemoryStore`]
//!   (feature `memory`, on by default), and yours — checked by the
//!   conformance suite in `tollgate-testkit`.
//!
//! ```
//! # #[cfg(not(feature = "memory"))] fn main() {} // the example needs the default `memory` feature
//! # #[cfg(feature = "memory")]
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use tollgate::{Context, Limit, Limiter, MemoryStore, Policy, Scope, Subject};
//!
//! let limiter = Limiter::builder(Arc::new(MemoryStore::default()))
//!     .layer("key", Scope::Subject, Policy::new("api", Limit::gcra(10, Duration::from_secs(1), 20)?)?)
//!     .layer("tenant", Scope::Tenant, Policy::new("tenant", Limit::sliding_window(1_000, Duration::from_secs(60))?)?)
//!     .build()?;
//!
//! let ctx = Context::for_subject(Subject::new("key-7")?).with_tenant(Subject::new("acme")?);
//! let decision = limiter.check(&ctx, 1).await?;
//! if decision.is_allowed() {
//!     // serve the request
//! } else {
//!     let wait = decision.retry_after(); // tell the client when to come back
//! #   let _ = wait;
//! }
//! # Ok(()) }
//! ```
//!
//! ## Cargo features
//!
//! | feature | what it adds |
//! |---|---|
//! | `memory` (default) | [`MemoryStore`], the in-process store |
//! | `metrics` | counters and histograms through the `metrics` facade ([`observe`]) |
//! | `tracing` | log events (policy and error class, never keys) through `tracing` |
//! | `redis` | [`redis::RedisStore`], standalone Redis or a primary found through Sentinel: one script call per decision |
//! | `redis-tls` | `redis`, plus TLS (`rediss://`, a CA of your own, client certificates) over rustls for every Redis store (guide: `docs/operations.md`, "Redis in production") |
//! | `redis-cluster` | `redis::RedisClusterStore`: slot-aware layered decisions on Redis Cluster (guide: `docs/cluster.md`) |
//! | `blocked-cache` | long denials answered in-process without a store call |
//! | `plan-source` | plans from your own async source ([`PlanSource`]: a database, an account service), cached in-process with a deadline |
//! | `calendar` | calendar quotas ([`Recurrence`]): a limit per day, week, month or year in an IANA time zone, or from a billing date (guide: `docs/plans.md`) |
//! | `concurrency` | `Limiter::acquire` and `Permit`: concurrency limits, requests in flight each holding its place until its permit is dropped (tokio's runtime; guide: `docs/concurrency.md`) |
//! | `lease` | leased layers ([`Lease`], `Policy::leased`): a hot key admitted from batches charged in the store, one store call per batch, never over-admitting (tokio's runtime; guide: `docs/leases.md`) |
//! | `wait` | `Limiter::wait` and `Limiter::throttle`: outbound clients wait for capacity (tokio's timer; guide: `docs/operations.md`, "Waiting for capacity") |
//! | `tower` | [`tower::RateLimitLayer`], for axum, tonic and hyper (guide: `docs/http.md`) |
//! | `tonic` | `tower`, plus the client address from tonic's `TcpConnectInfo` |
//! | `axum` | `tower`, plus the client address from axum's `ConnectInfo` |
//! | `actix` | [`actix::RateLimit`], the actix-web middleware |
//! | `config` | [`config::Config`]: store, policies and routes from a TOML file, and [`config::LiveConfig`] to reload them while the service runs (guide: `docs/configuration.md`) |
//! | `config-watch` | `config`, plus reloading the file when it changes (`LiveConfig::watch`) |
#![cfg_attr(docsrs, feature(doc_cfg))]

// What an application builds, asks and reads, in one screen. Everything
// else of the core (configuration-file types, helpers for the other
// crates) is `tollgate::limiter`, the core crate itself.

// A limiter and what it is built from.
pub use tollgate_limiter::{
    BreakerConfig, BreakerState, Fallback, KeyBudget, OnStoreFailure, WhenFull,
};
pub use tollgate_limiter::{Limit, Limiter, LimiterBuilder, Policy, Scope};
// Plans: a policy's limits per customer, and what a customer has used.
pub use tollgate_limiter::{LayerUsage, Plan, PlanName, Plans, Usage};
// A request, and an operator's change to its layers.
pub use tollgate_limiter::{Adjustment, Context, HashKey, ScopedOperations, Subject};
// The answer.
pub use tollgate_limiter::{Decision, LayerDecision, Source, Verdict};
// What can go wrong.
pub use tollgate_limiter::{
    BuildError, Error, HashKeyError, PolicyError, StoreError, SubjectError,
};
// Time.
pub use tollgate_limiter::{Clock, ManualClock, MonotonicClock, SystemClock, Timestamp};
// Routes whose limits a reload replaces.
pub use tollgate_limiter::{LimiterSource, ReloadableRoute, RouteLimits, RouteRequirement};
// The login recipe (an application of the limiter, not part of the core).
mod login;
pub use login::{Escalation, LoginGuard};
// Stores and algorithms of your own.
pub use tollgate_limiter::MAX_RECOVERY;
pub use tollgate_limiter::{ask, Decide, Deciding};
pub use tollgate_limiter::{async_trait, Algorithm, LayerRequest, State, Store, StoreKey};
pub use tollgate_limiter::{check_holds, Hold, Holds};
pub use tollgate_limiter::{
    duration_micros, Builtin, FieldKind, Layout, Stored, Transition, Verdicts,
};
// Metrics and log events.
pub use tollgate_limiter::observe;
// With `wait`: outbound clients wait for capacity.
#[cfg(feature = "wait")]
#[cfg_attr(docsrs, doc(cfg(feature = "wait")))]
pub use tollgate_limiter::{Rejected, Sleep, Throttle, WhenLimited};
// With `plan-source`: plans from the application's own source.
#[cfg(feature = "plan-source")]
#[cfg_attr(docsrs, doc(cfg(feature = "plan-source")))]
pub use tollgate_limiter::{PlanCacheConfig, PlanSource, PlanSourceError};
// With `concurrency`: requests in flight, each holding its place in a permit.
#[cfg(feature = "concurrency")]
#[cfg_attr(docsrs, doc(cfg(feature = "concurrency")))]
pub use tollgate_limiter::{Acquired, Permit};
// With `lease`: hot keys admitted from batches charged in the store.
#[cfg(feature = "lease")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
pub use tollgate_limiter::Lease;
// With `calendar`: quotas per calendar day, week, month or year.
#[cfg(feature = "calendar")]
#[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
pub use tollgate_limiter::{CalendarUnit, Recurrence};
// With `blocked-cache`: long denials answered in-process.
#[cfg(feature = "blocked-cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocked-cache")))]
pub use tollgate_limiter::BlockedCacheConfig;

/// The core crate whole: the model, the helpers the other crates share
/// and, with `config`, the configuration-file forms (`LimitSpec`, …).
pub use tollgate_limiter as limiter;

/// The reference algorithm implementations (pure functions).
pub mod algorithms {
    pub use tollgate_algorithms::*;
}

#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use tollgate_memory::{MemoryStore, MemoryStoreBuilder};

/// The Redis stores (standalone, Sentinel, and with `redis-cluster` the
/// Cluster): one call per decision (Tollgate's native module where the
/// server loaded it, else the Lua code as a function or a script).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use tollgate_redis::*;
}

/// The tower layer (axum, tonic, hyper): see `tollgate-tower`.
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower {
    pub use tollgate_tower::*;
}

/// The actix-web middleware: see `tollgate-actix`.
#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix {
    pub use tollgate_actix::*;
}

/// The configuration file (TOML): see `tollgate-config` and `docs/configuration.md`.
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub mod config {
    pub use tollgate_config::*;
}

/// The HTTP guide's examples, compiled as doc-tests.
#[cfg(all(doctest, feature = "axum", feature = "actix", feature = "memory"))]
#[doc = include_str!("../docs/http.md")]
pub struct HttpGuideDoctests;

/// The plans guide's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "axum", feature = "memory", feature = "calendar"))]
#[doc = include_str!("../docs/plans.md")]
pub struct PlansGuideDoctests;

/// The concurrency limits guide's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "memory", feature = "concurrency"))]
#[doc = include_str!("../docs/concurrency.md")]
pub struct ConcurrencyGuideDoctests;

/// The leases guide's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "memory", feature = "lease"))]
#[doc = include_str!("../docs/leases.md")]
pub struct LeasesGuideDoctests;

/// The API consumers' guide's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/clients.md")]
pub struct ClientsGuideDoctests;

/// The concepts page's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../docs/concepts.md")]
pub struct ConceptsDoctests;

/// The README's examples, compiled as doc-tests so they cannot rot.
#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The algorithms guide's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../docs/algorithms.md")]
pub struct AlgorithmsGuideDoctests;

/// The operations guide's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "memory", feature = "metrics"))]
#[doc = include_str!("../docs/operations.md")]
pub struct OperationsGuideDoctests;

/// The login recipe's examples, compiled and run as doc-tests.
#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../docs/login.md")]
pub struct LoginGuideDoctests;

/// The configuration guide's examples, compiled and run as doc-tests (its
/// TOML examples are checked by `tollgate-config`'s tests).
#[cfg(all(doctest, feature = "config", feature = "memory", feature = "tower"))]
#[doc = include_str!("../docs/configuration.md")]
pub struct ConfigurationGuideDoctests;

/// The Redis Cluster guide's examples, compiled as doc-tests.
#[cfg(all(doctest, feature = "redis-cluster"))]
#[doc = include_str!("../docs/cluster.md")]
pub struct ClusterGuideDoctests;
