//! Tollgate.
