//! The fixed window's parameters (the algorithm: `tollgate_algorithms`'s
//! `fixed_window.rs`).

use std::time::Duration;

use super::builtins::Layout;
use super::window::{window_algorithm, Window};
use super::{Limit, MAX_COUNT};
use crate::error::PolicyError;

impl Limit {
    /// Fixed window: `limit` per window aligned on multiples of `window`.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        FixedWindow::new(limit, window).map(Limit::FixedWindow)
    }
}

impl FixedWindow {
    /// Validated fixed window parameters; see [`Limit::fixed_window`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_COUNT).map(FixedWindow)
    }
}

window_algorithm! {
    /// Fixed window parameters: a [`Window`].
    FixedWindow,
    /// A fixed window as written in a configuration file
    /// (`algorithm = "fixed_window"`).
    FixedWindowSpec,
    key_code: "fw",
    // [count, the time of its last charge (µs)]
    layout: Layout::Cells { cells: 2, time_cell: 1 },
}
