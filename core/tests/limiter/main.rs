//! The limiter's integration tests, one binary (each file a module; the
//! allocation count keeps its own binary: it installs a counting allocator).

mod blocked_cache;
mod building;
mod calendar;
mod check_future;
mod concurrency;
mod failure_modes;
mod lease;
mod logs;
mod plan_source;
mod plans;
mod scoped;
mod shadow;
mod wait;
