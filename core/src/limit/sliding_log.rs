//! The sliding log's parameters (the algorithm: `tollgate_algorithms`'s
//! `sliding_log.rs`).

use std::time::Duration;

use super::builtins::Layout;
use super::window::{window_algorithm, Window};
use super::{Limit, MAX_LOG_LIMIT, MAX_WINDOW};
use crate::error::PolicyError;

impl Limit {
    /// Sliding log: exactly `limit` per any `window`-long interval.
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        SlidingLog::new(limit, window).map(Limit::SlidingLog)
    }
}

impl SlidingLog {
    /// Validated sliding log parameters; see [`Limit::sliding_log`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_LOG_LIMIT, MAX_WINDOW).map(SlidingLog)
    }
}

window_algorithm! {
    /// Sliding log parameters: a [`Window`].
    SlidingLog,
    /// A sliding log as written in a configuration file
    /// (`algorithm = "sliding_log"`).
    SlidingLogSpec,
    key_code: "log",
    // one entry per admitted unit: its time (µs)
    layout: Layout::Log,
}
