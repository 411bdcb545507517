//! Tollgate's Redis stores: standalone Redis ([`RedisStore`]) and, with the
//! `cluster` feature, Redis Cluster (`cluster::RedisClusterStore`: the same
//! script per hash slot, reserve-and-refund across slots; see the `cluster`
//! module and `docs/cluster.md`).
//!
//! Every decision is **one** `EVALSHA` of one Lua script, whatever the number
//! of layers: the script reads every layer's state, decides each one, and
//! writes every layer only if all of them admit (all-or-nothing; a denied
//! request charges nothing). Redis runs a script atomically, so concurrent
//! decisions on one key behave as if they ran one after another.
//!
//! - **Same answers as Rust.** Each algorithm is a Lua function in
//!   `lua/<algorithm>.lua`, a line-by-line port of the reference in
//!   `tollgate-algorithms` in exact integer arithmetic; a differential test
//!   checks on long random sequences that verdicts and stored states agree
//!   bit for bit, and that the TTLs agree to the millisecond.
//! - **Time.** By default the script reads the server's `TIME`, so every key
//!   is judged by one clock whatever the app servers' clocks say. A
//!   [`clock`](RedisStoreBuilder::clock) can supply the time instead (tests,
//!   replays); implausible times are refused, and
//!   [`max_skew`](RedisStoreBuilder::max_skew) bounds its distance from the
//!   server's.
//! - **Keys.** `<prefix>:{tag}:<policy>:v<version>:<scope>:<subject>`
//!   (prefix `tollgate` by default). Every write sets a TTL: the
//!   algorithm's (until the state is back to new, in milliseconds, rounded
//!   up) plus one millisecond, because Redis counts a TTL from its clock
//!   truncated to the millisecond; no key lives without one, and none
//!   outlives [`MAX_RECOVERY`](tollgate_limiter::MAX_RECOVERY) by more than that
//!   millisecond. Counter states are the string `"a b c"` (smaller than a
//!   hash); the sliding log is a list of timestamps.
//! - **Deadlines.** Every decision is bounded by a deadline (50 ms by
//!   default) covering waiting for a connection and reloading the script;
//!   connecting is bounded by a connect timeout (1 s). A stalled or dead
//!   Redis costs a request at most the deadline, never a queue.
//! - **Scripts.** `EVALSHA` in steady state; after `NOSCRIPT` (restart,
//!   `SCRIPT FLUSH`) the store loads the script and retries once.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Store, Subject};
//! use tollgate_redis::RedisStore;
//!
//! let store = RedisStore::builder("redis://127.0.0.1:6379/").connect().await?;
//! let limiter = Limiter::builder(Arc::new(store) as Arc<dyn Store>)
//!     .layer(
//!         "key",
//!         Scope::Subject,
//!         Policy::new("api", Limit::gcra(10, Duration::from_secs(1), 20)?)?,
//!     )
//!     .build()?;
//! let decision = limiter.check(&Context::for_subject(Subject::new("key-7")?), 1).await?;
//! println!("allowed: {}", decision.is_allowed());
//! # Ok(()) }
//! ```
//!
//! Custom algorithms ([`Limit::Custom`](tollgate_limiter::Limit::Custom)) have no
//! Lua counterpart: the store answers [`StoreError::Unsupported`] for them.
//!
//! Requirements: Redis 5.0 or later (scripts read `TIME` before writing,
//! which needs effects replication, the default since 5.0). Keep
//! `maxmemory-policy noeviction` (Redis's default): under an evicting policy
//! every Tollgate key is a candidate (they all have TTLs), and an evicted
//! counter hands out its capacity again; under `noeviction` a full Redis
//! fails decisions with [`StoreError::Unavailable`], which the policy's
//! failure mode handles.
//!
//! [`StoreError::Unsupported`]: tollgate_limiter::StoreError::Unsupported
//! [`StoreError::Unavailable`]: tollgate_limiter::StoreError::Unavailable

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub mod cluster;
mod error;
#[cfg(feature = "cluster")]
mod holds;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod script;
#[cfg(not(feature = "internals"))]
mod script;
mod settings;
mod store;

#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use cluster::{RedisClusterStore, RedisClusterStoreBuilder};
pub use error::RedisStoreError;
pub use script::SCRIPT;
pub use settings::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEADLINE, DEFAULT_PREFIX};
pub use store::{ConnectionMode, RedisStore, RedisStoreBuilder};
