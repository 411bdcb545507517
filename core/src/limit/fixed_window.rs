//! The fixed window's parameters (the algorithm: `tollgate_algorithms`'s
//! `fixed_window.rs`).

use std::time::Duration;

use super::builtins::{Layout, Parameters};
use super::window::{window_parameters, window_spec, Window, FIELDS};
use super::{share, Limit, MAX_COUNT};
use crate::error::PolicyError;
use crate::spec::FieldKind;

impl Limit {
    /// Fixed window: `limit` per window aligned on multiples of `window`.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        FixedWindow::new(limit, window).map(Limit::FixedWindow)
    }
}

window_parameters! {
    /// Fixed window parameters: a [`Window`].
    FixedWindow
}

impl FixedWindow {
    /// Validated fixed window parameters; see [`Limit::fixed_window`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_COUNT).map(FixedWindow)
    }
}

window_spec! {
    /// A fixed window as written in a configuration file
    /// (`algorithm = "fixed_window"`).
    FixedWindowSpec
}

impl Parameters for FixedWindow {
    const KEY_CODE: &'static str = "fw";
    // [count, the time of its last charge (µs)]
    const LAYOUT: Layout = Layout::Cells {
        cells: 2,
        time_cell: 1,
    };
    const FIELDS: &'static [(&'static str, FieldKind)] = FIELDS;
    type Spec = FixedWindowSpec;

    fn from_spec(s: &FixedWindowSpec) -> Result<Self, PolicyError> {
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
