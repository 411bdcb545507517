//! Tollgate's test kit.
//!
//! - [`conformance`]: the store conformance suite. Every store — the built-in
//!   ones and yours — runs the same cases through
//!   [`conformance_tests!`](crate::conformance_tests).
//! - [`redis_server`]: real `redis-server` processes on free loopback ports,
//!   started per test or shared by a test binary (no Redis mock, and no
//!   silent skip when Redis is missing).
//! - [`redis_sentinel`]: a primary, a replica and three sentinels, for
//!   failover tests; [`tls_certificates`]: a CA and certificates for TLS
//!   servers, made at run time.
//! - [`DownStore`]: a store that is down, for tests of failure modes,
//!   breakers, metrics and logs.
//!
//! Use it from your store's tests:
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_limiter::{ManualClock, Store};
//! # mod my_store { pub use tollgate_testkit::doc_support::ExampleStore as MyStore; }
//!
//! // One #[tokio::test] per conformance case. The closure gets the manual
//! // clock the case moves and returns a fresh store that reads time from it.
//! tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
//!     Arc::new(my_store::MyStore::new(clock)) as Arc<dyn Store>
//! });
//! # fn main() {}
//! ```

pub mod command_stats;
pub mod conformance;
mod ready;
pub use ready::ready;
mod recorder;
pub use recorder::AtomicRecorder;
#[doc(hidden)]
pub mod doc_support;
pub mod redis_cluster;
pub mod redis_module;
pub mod redis_sentinel;
pub mod redis_server;
pub mod resp;
mod stores;
pub mod tls_certificates;
pub use stores::{DownStore, RemoteStore};
