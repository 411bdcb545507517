//! The algorithms' integration tests, one binary (each file a module).

mod properties;
mod semantics;
