//! The facade's integration tests, one binary (each file a module).

mod login;
mod recorded_metrics;
