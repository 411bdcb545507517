//! The sliding window counter's parameters (the algorithm:
//! `tollgate_algorithms`'s `sliding_window.rs`).

use std::time::Duration;

use super::builtins::Layout;
use super::window::{window_algorithm, Window};
use super::{Limit, MAX_COUNT, MAX_EXACT, MAX_WINDOW};
use crate::error::PolicyError;

impl Limit {
    /// Sliding window counter: `limit` per `window`, estimated from two counters.
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        SlidingWindow::new(limit, window).map(Limit::SlidingWindow)
    }
}

impl SlidingWindow {
    /// Validated sliding window counter parameters; see [`Limit::sliding_window`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let w = Window::new(limit, window, MAX_COUNT, MAX_WINDOW)?;
        // The weighted count is `count x window`, exact below 2^53.
        if w.limit().saturating_mul(w.window_us()) > MAX_EXACT {
            return Err(PolicyError::new(
                "limit",
                format!("limit x window in microseconds must stay below 2^53 (limit {limit}, window {window:?})"),
            ));
        }
        Ok(SlidingWindow(w))
    }
}

window_algorithm! {
    /// Sliding window counter parameters: a [`Window`].
    SlidingWindow,
    /// A sliding window counter as written in a configuration file
    /// (`algorithm = "sliding_window"`).
    SlidingWindowSpec,
    key_code: "sw",
    // [this window's count, the previous window's, the last charge's time (µs)]
    layout: Layout::Cells { cells: 3, time_cell: 2 },
}
