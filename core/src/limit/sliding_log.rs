//! The sliding log's parameters (the algorithm: `tollgate_algorithms`'s
//! `sliding_log.rs`).

use std::time::Duration;

use super::builtins::{Layout, Parameters};
use super::window::{window_parameters, window_spec, Window, FIELDS};
use super::{share, Limit, MAX_LOG_LIMIT};
use crate::error::PolicyError;
use crate::spec::FieldKind;

impl Limit {
    /// Sliding log: exactly `limit` per any `window`-long interval.
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        SlidingLog::new(limit, window).map(Limit::SlidingLog)
    }
}

window_parameters! {
    /// Sliding log parameters: a [`Window`].
    SlidingLog
}

impl SlidingLog {
    /// Validated sliding log parameters; see [`Limit::sliding_log`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_LOG_LIMIT).map(SlidingLog)
    }
}

window_spec! {
    /// A sliding log as written in a configuration file
    /// (`algorithm = "sliding_log"`).
    SlidingLogSpec
}

impl Parameters for SlidingLog {
    const KEY_CODE: &'static str = "log";
    // One entry per admitted unit: its time (µs).
    const LAYOUT: Layout = Layout::Log;
    const FIELDS: &'static [(&'static str, FieldKind)] = FIELDS;
    type Spec = SlidingLogSpec;

    fn from_spec(s: &SlidingLogSpec) -> Result<Self, PolicyError> {
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
