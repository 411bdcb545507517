//! The configuration crate's integration tests, one binary (each file a
//! module).

mod calendar;
mod concurrency;
mod config;
mod guide;
mod lease;
mod plans;
mod reload;
mod store_kinds;
