//! Tollgate's in-process store.
//!
//! A [`MemoryStore`] keeps every key's state in a sharded hash map behind one
//! mutex per shard. A decision locks the shards of all its layers (in shard
//! order, so two decisions never deadlock), judges every layer, and writes
//! only if all admit: layered decisions are atomic and all-or-nothing.
//!
//! Memory is bounded, exactly: at most `max_keys` keys (expired ones not yet
//! reclaimed included). Expired entries are reclaimed as the map grows (a
//! sweep whenever a shard has doubled since its last sweep) and whenever a
//! budget is full, so no cleanup task is needed and a full store refuses
//! only when it is full of live keys.
//!
//! Policies can have key budgets of their own
//! ([`Policy::with_key_budget`](tollgate_limiter::Policy::with_key_budget), or
//! `max_keys` in a configuration file), so anonymous traffic on one route
//! cannot take the room of another. What a full budget does is its
//! [`WhenFull`](tollgate_limiter::WhenFull): evict the key nearest to expiry
//! (the default; each eviction admits at most what that key's state still
//! withheld, never more than its policy's capacity), or refuse with
//! [`StoreError::Full`], which announces when the budget's first key
//! expires and leaves the request to the policy's failure mode.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
//! use tollgate_memory::MemoryStore;
//!
//! let store = Arc::new(MemoryStore::builder().max_keys(100_000).build());
//! let policy = Policy::new("login", Limit::sliding_log(3, Duration::from_secs(60))?)?;
//! let limiter = Limiter::builder(store).layer("user", Scope::Subject, policy).build()?;
//!
//! let ctx = Context::for_subject(Subject::new("alice")?);
//! let mut admitted = 0;
//! for _ in 0..5 {
//!     if limiter.check(&ctx, 1).await?.is_allowed() {
//!         admitted += 1;
//!     }
//! }
//! assert_eq!(admitted, 3);
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod entry_key;
mod prefetch;
#[cfg(feature = "serde")]
mod settings;
mod slot;
mod store;

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use settings::MemorySettings;
pub use store::{MemoryStore, MemoryStoreBuilder};
pub use tollgate_limiter::StoreError;
