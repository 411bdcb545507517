//! What the three window algorithms' parameters share: a limit per window.

use std::time::Duration;

use super::{check_count, check_window_up_to};
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
    pub(super) fn new(
        limit: u64,
        window: Duration,
        max_limit: u64,
        max_window: Duration,
    ) -> Result<Self, PolicyError> {
        check_count("limit", limit, max_limit)?;
        let window_us = check_window_up_to("window", window, max_window)?;
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

/// Defines a window algorithm: its parameters type (a [`Window`] under
/// the algorithm's own name, so each algorithm has its own type and `Limit`
/// variant while the three share their fields and rules), its
/// configuration type, and its [`Parameters`](super::builtins::Parameters)
/// from its key code and state layout. Its file adds its constructors.
macro_rules! window_algorithm {
    (
        $(#[$doc:meta])*
        $name:ident, $(#[$spec_doc:meta])* $spec:ident,
        key_code: $key_code:literal,
        layout: $layout:expr,
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name(super::window::Window);

        impl std::ops::Deref for $name {
            type Target = super::window::Window;
            fn deref(&self) -> &super::window::Window {
                &self.0
            }
        }

        $(#[$spec_doc])*
        #[cfg(feature = "serde")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $spec {
            /// Units per window.
            pub limit: u64,
            /// Window length.
            pub window: crate::spec::DurationSpec,
        }

        impl super::builtins::Parameters for $name {
            const KEY_CODE: &'static str = $key_code;
            const LAYOUT: super::builtins::Layout = $layout;
            const FIELDS: &'static [(&'static str, super::builtins::FieldKind)] = &[
                ("limit", super::builtins::FieldKind::Count),
                ("window", super::builtins::FieldKind::Duration),
            ];
            #[cfg(feature = "serde")]
            type Spec = $spec;

            #[cfg(feature = "serde")]
            fn from_spec(s: &$spec) -> Result<Self, crate::error::PolicyError> {
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
            fn shared(&self, instances: u64) -> Result<Self, crate::error::PolicyError> {
                Self::new(super::share(self.limit(), instances), self.window())
            }
        }
    };
}
pub(super) use window_algorithm;
