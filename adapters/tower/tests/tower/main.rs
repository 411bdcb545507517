//! The tower adapter's integration tests, one binary (each file a module).

#[path = "../../../testing/common.rs"]
mod common;
mod concurrency;
mod with_axum;
mod with_hyper;
