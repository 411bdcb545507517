//! Tollgate's Redis stores: standalone Redis ([`RedisStore::builder`]), a
//! primary found through Redis Sentinel and followed across failovers
//! ([`RedisStore::sentinel`]) and, with the `cluster` feature, Redis Cluster
//! (`cluster::RedisClusterStore`: the same code per hash slot,
//! reserve-and-refund across slots; see the `cluster` module and
//! `docs/cluster.md`). With the `tls` feature every store speaks TLS
//! (`rediss://`, `Tls`); [`AclRule`] is the least-privilege ACL rule of a
//! store's user, checked at connect; `replica_ack` waits for replicas after
//! each charge (`docs/operations.md`, "Redis in production").
//!
//! Every decision is **one** call, whatever the number of layers: of
//! Tollgate's native module where the server loaded it, else of one Lua
//! program. It reads every layer's state, decides each one, and writes
//! every layer only if all of them admit (all-or-nothing; a denied request
//! charges nothing). Redis runs it atomically, so concurrent decisions on
//! one key behave as if they ran one after another. The calling
//! convention, the replies and the stored encodings are one protocol,
//! written once in `tollgate-redis-protocol`.
//!
//! - **Functions.** On Redis 7.0 and later the code is loaded once as a
//!   function library ([`function_library`], named after its own digest,
//!   so two releases sharing a Redis each keep theirs) and every decision
//!   is an `FCALL`: the code's helpers and tables are made once per load,
//!   not once per call. Before 7.0, or with [`Engine::Eval`], the same
//!   code runs as a script ([`eval_script`], `EVALSHA`). The store finds out at
//!   connect ([`Engine::Auto`], the default). A server that lost the
//!   code (restart, failover, `FUNCTION FLUSH`, `SCRIPT FLUSH`) gets it
//!   again at the first call that misses it, and that call is sent once
//!   more.
//! - **The native module, where loaded.** A server that loaded Tollgate's
//!   module (`backends/redis-module`: `TOLLGATE.DECIDE`, the reference
//!   algorithms compiled into Redis, same arguments, answers and states)
//!   is decided by it at a fraction of the Lua's Redis CPU: an `Auto`
//!   store finds it at connect and after the server lost what it used
//!   ([`Engine`], [`CheckedSettings::uses_module`], docs/redis-module.md).
//! - **Same answers as Rust.** Each algorithm is a Lua function in
//!   `lua/<algorithm>.lua`, a line-by-line port of the reference in
//!   `tollgate-algorithms` in exact integer arithmetic; a differential test
//!   checks on long random sequences that verdicts and stored states agree
//!   bit for bit, and that the TTLs agree to the millisecond.
//! - **Time.** By default the code reads the server's `TIME`, so every key
//!   is judged by one clock whatever the app servers' clocks say. A
//!   [`clock`](RedisStoreBuilder::clock) can supply the time instead (tests,
//!   replays); implausible times are refused, and
//!   [`max_skew`](RedisStoreBuilder::max_skew) bounds its distance from the
//!   server's.
//! - **Keys.** `<prefix>:{tag}:<policy>:v<version>:<algorithm>:<scope>:<subject>`
//!   (prefix `tollgate` by default; the scope is `s`, `t`, `g` or
//!   `a.<attribute>`), without the `:<subject>` when the subject is its own
//!   tag: `tollgate:{key-7}:api:v1:gcra:s`. Every write sets a TTL: the
//!   algorithm's (until the state is back to new, in milliseconds, rounded
//!   up) plus one millisecond, because Redis counts a TTL from its clock
//!   truncated to the millisecond; no key lives without one, and none
//!   outlives the longest a policy can ask for by more than that
//!   millisecond: a fixed window's [`MAX_QUOTA_WINDOW`](tollgate_limiter::MAX_QUOTA_WINDOW),
//!   any other state's [`MAX_RECOVERY`](tollgate_limiter::MAX_RECOVERY).
//! - **States.** The smallest exact encoding per algorithm: GCRA one
//!   integer (its theoretical arrival time, which Redis keeps inside the
//!   key's object), the token bucket one too (when it is full again) with a
//!   remainder after it when its refill does not divide its period
//!   (`"a b"`), the fixed window two integers, the sliding window counter
//!   three; the sliding log is a list of timestamps. A value of another shape, or whose time is not between
//!   2020 and 2101, or a key of another type, is someone else's data: the
//!   decision fails with [`StoreError::Conflict`] and the value is left as
//!   it was.
//! - **Deadlines.** Every decision is bounded by a deadline (50 ms by
//!   default) covering waiting for a connection and reloading the code;
//!   connecting is bounded by a connect timeout (1 s). A stalled or dead
//!   Redis costs a request at most the deadline, never a queue.
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
//! Requirements: Redis 7.0 or later for functions; the script form needs
//! Redis 5.0 or later (the code reads `TIME` before writing, which needs
//! effects replication, the default since 5.0). Only Redis 7.0 is tested
//! here: the script form is tested by forcing it
//! ([`Engine::Eval`]) on 7.0; versions before 7.0 are declared, not
//! tested (TLS and ACL users need 6.0).
//! Keep `maxmemory-policy noeviction` (Redis's default): under an evicting
//! policy every Tollgate key is a candidate (they all have TTLs), and an
//! evicted counter hands out its capacity again; under `noeviction` a full
//! Redis fails decisions with [`StoreError::Unavailable`], which the
//! policy's failure mode handles (and fails `connect`, since `FUNCTION
//! LOAD` is a write).
//!
//! [`StoreError::Unsupported`]: tollgate_limiter::StoreError::Unsupported
//! [`StoreError::Unavailable`]: tollgate_limiter::StoreError::Unavailable
//! [`StoreError::Conflict`]: tollgate_limiter::StoreError::Conflict

#![cfg_attr(docsrs, feature(doc_cfg))]

mod acl;
mod call_watch;
mod client;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub mod cluster;
mod conflicts;
mod connect_failures;
mod engine;
mod error;
#[cfg(feature = "cluster")]
mod holds;
mod managed;
mod permissions;
#[cfg(feature = "serde")]
mod redis_settings;
mod replication;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod script;
#[cfg(not(feature = "internals"))]
mod script;
mod sentinel;
mod settings;
mod store;
#[cfg(feature = "tls")]
mod tls;

pub use acl::AclRule;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use cluster::{ClusterNodes, RedisClusterStore, RedisClusterStoreBuilder};
pub use engine::{Engine, MODULE_PROTOCOL};
pub use error::RedisStoreError;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use redis_settings::{RedisKind, RedisSettings, RedisSettingsError};
pub use script::{eval_script, function_library, function_name, library_name};
pub use settings::{
    check_prefix, CheckedSettings, RedisBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEADLINE,
    DEFAULT_PREFIX,
};
pub use store::{ConnectionMode, RedisStore, RedisStoreBuilder, Standalone};
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use tls::Tls;
