//! The sliding window counter's parameters (the algorithm:
//! `tollgate_algorithms`'s `sliding_window.rs`).

use std::time::Duration;

use super::builtins::{Layout, Parameters};
use super::window::{window_parameters, window_spec, Window, FIELDS};
use super::{share, Limit, MAX_COUNT, MAX_EXACT};
use crate::error::PolicyError;
use crate::spec::FieldKind;

impl Limit {
    /// Sliding window counter: `limit` per `window`, estimated from two counters.
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        SlidingWindow::new(limit, window).map(Limit::SlidingWindow)
    }
}

window_parameters! {
    /// Sliding window counter parameters: a [`Window`].
    SlidingWindow
}

impl SlidingWindow {
    /// Validated sliding window counter parameters; see [`Limit::sliding_window`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let w = Window::new(limit, window, MAX_COUNT)?;
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

window_spec! {
    /// A sliding window counter as written in a configuration file
    /// (`algorithm = "sliding_window"`).
    SlidingWindowSpec
}

impl Parameters for SlidingWindow {
    const KEY_CODE: &'static str = "sw";
    // [this window's count, the previous window's, the time of the last
    // charge (µs)]
    const LAYOUT: Layout = Layout::Cells {
        cells: 3,
        time_cell: 2,
    };
    const FIELDS: &'static [(&'static str, FieldKind)] = FIELDS;
    type Spec = SlidingWindowSpec;

    fn from_spec(s: &SlidingWindowSpec) -> Result<Self, PolicyError> {
        Self::new(s.limit, s.window.0)
    }
    #[inline]
    fn capacity_of(&self) -> u64 {
        self.limit()
    }
    fn announced_window_us(&self) -> u64 {
        self.window_us()
    }
    fn rate(&self) -> (u64, u64) {
        (self.limit(), self.window_us())
    }
    fn shared(&self, instances: u64) -> Result<Self, PolicyError> {
        Self::new(share(self.limit(), instances), self.window())
    }
    fn args(&self) -> [u64; 3] {
        [self.limit(), self.window_us(), 0]
    }
    fn from_args([limit, window_us, _]: [u64; 3]) -> Result<Self, PolicyError> {
        Self::new(limit, Duration::from_micros(window_us))
    }
}
