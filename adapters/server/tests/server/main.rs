//! The rate limit server's integration tests, one binary (each file a
//! module).

mod common;
mod dashboard;
mod envoy;
mod envoy_config;
mod server;
mod tls;
mod traces;
