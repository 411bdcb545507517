//! The actix-web adapter's integration tests, one binary (each file a
//! module).

mod actix;
#[path = "../../../testing/common.rs"]
mod common;
mod concurrency;
