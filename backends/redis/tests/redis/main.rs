//! The Redis stores' integration tests, one binary (each file a module): one
//! link instead of one per file. `cargo xtask valkey` and `cargo xtask soak`
//! pick their suites by module path.

mod acl;
mod adjust;
mod cluster;
mod common;
mod concurrency;
mod conformance;
mod differential;
mod faults;
mod lease;
mod module;
mod refund;
mod replica_ack;
mod sentinel;
mod settings;
mod soak;
mod store;
mod tls;
