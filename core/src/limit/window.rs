//! What the three window algorithms' parameters share: a limit per window.

use std::time::Duration;

use super::{check_count, check_window};
use crate::error::PolicyError;

/// A limit per window: what [`FixedWindow`](super::FixedWindow),
/// [`SlidingWindow`](super::SlidingWindow) and
/// [`SlidingLog`](super::SlidingLog) each hold (and dereference to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    limit: u64,
    window_us: u64,
}

impl Window {
    pub(super) fn new(limit: u64, window: Duration, max_limit: u64) -> Result<Self, PolicyError> {
        check_count("limit", limit, max_limit)?;
        let window_us = check_window("window", window)?;
        Ok(Window { limit, window_us })
    }
    /// Units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The window length in microseconds.
    pub fn window_us(&self) -> u64 {
        self.window_us
    }
    /// The window's length.
    pub(super) fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }
}

/// Defines a window algorithm's parameters type: a [`Window`] under the
/// algorithm's own name, so each algorithm has its own type (and `Limit`
/// variant) while the three share their fields.
macro_rules! window_parameters {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name(super::window::Window);

        impl std::ops::Deref for $name {
            type Target = super::window::Window;
            fn deref(&self) -> &super::window::Window {
                &self.0
            }
        }
    };
}
pub(super) use window_parameters;

/// A window algorithm as written in a configuration file.
macro_rules! window_spec {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Units per window.
            pub limit: u64,
            /// Window length.
            pub window: crate::spec::DurationSpec,
        }
    };
}
pub(super) use window_spec;

/// Every window algorithm's configuration fields.
pub(super) const FIELDS: &[(&str, crate::spec::FieldKind)] = &[
    ("limit", crate::spec::FieldKind::Count),
    ("window", crate::spec::FieldKind::Duration),
];
