//! The in-process store's integration tests, one binary (each file a module).

mod conformance;
mod store;
