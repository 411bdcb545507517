//! The fixed window's parameters (the algorithm: `tollgate_algorithms`'s
//! `fixed_window.rs`).

use std::time::Duration;

use super::builtins::Layout;
use super::window::{window_algorithm, Window};
use super::{Limit, MAX_COUNT, MAX_QUOTA_WINDOW};
use crate::error::PolicyError;

impl Limit {
    /// Fixed window: `limit` per window aligned on multiples of `window`
    /// since the Unix epoch (1970-01-01 00:00 UTC): a day starts at 00:00
    /// UTC, a 7-day window on Thursdays, a 30-day one every 30 days from
    /// the epoch. Windows run up to [`MAX_QUOTA_WINDOW`] (366 days); every
    /// other algorithm's up to [`MAX_WINDOW`](super::MAX_WINDOW) (7 days).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::Limit;
    /// let month = Limit::fixed_window(10_000, Duration::from_secs(30 * 24 * 3600))?;
    /// assert_eq!(month.window(), Some(Duration::from_secs(30 * 24 * 3600)));
    /// assert!(Limit::fixed_window(1, Duration::from_secs(367 * 24 * 3600)).is_err());
    /// assert!(Limit::sliding_window(1, Duration::from_secs(8 * 24 * 3600)).is_err());
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        FixedWindow::new(limit, window).map(Limit::FixedWindow)
    }
}

impl FixedWindow {
    /// Validated fixed window parameters; see [`Limit::fixed_window`].
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_COUNT, MAX_QUOTA_WINDOW).map(FixedWindow)
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
