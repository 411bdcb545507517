//! The registry of built-in algorithms: the one list a new algorithm is
//! added to ([`builtin_algorithms!`](crate::builtin_algorithms)), and what
//! each built-in tells the rest of Tollgate about itself ([`Builtin`]).
//!
//! Everything that treats each algorithm in turn — the `Limit` and
//! `LimitSpec` enums, the reference's dispatch, the Lua's tables, the
//! native module — is generated from the list or reads [`Builtin::all`],
//! so registering an algorithm is one line here. Its parameters live in
//! their own file beside this one (`limit/<name>.rs`), which implements
//! `Parameters`.

use crate::error::PolicyError;

/// Calls `$callback!` with every built-in algorithm, once: its doc
/// comment, its `Limit` variant (also the name of its parameters' type),
/// its module (its name in configuration files, store keys' algorithm
/// names, the reference's and the Lua's file names) and its configuration
/// type. (The number the Redis protocol knows it by is the protocol
/// crate's.)
///
/// Internal to Tollgate's crates, which generate their dispatch from it.
#[doc(hidden)]
#[macro_export]
macro_rules! builtin_algorithms {
    ($callback:ident) => {
        $callback! {
            /// A bucket of `capacity` tokens refilled continuously.
            TokenBucket(token_bucket, TokenBucketSpec),
            /// The generic cell rate algorithm: a token bucket kept as one arrival time.
            Gcra(gcra, GcraSpec),
            /// At most `limit` per aligned window.
            FixedWindow(fixed_window, FixedWindowSpec),
            /// The previous window's count weighted by how much of it still overlaps.
            SlidingWindow(sliding_window, SlidingWindowSpec),
            /// Every admitted unit's timestamp, kept for one window.
            SlidingLog(sliding_log, SlidingLogSpec),
            /// At most `limit` per calendar span (a day, week, month or year in a time zone).
            Calendar(calendar, CalendarSpec),
            /// At most `limit` units in flight at once, each held until released.
            Concurrency(concurrency, ConcurrencySpec),
        }
    };
}

/// What a built-in algorithm's parameters tell the rest of Tollgate; each
/// `limit/<name>.rs` implements it for its parameters.
pub(crate) trait Parameters: Sized {
    /// The algorithm's code in store keys (unique among built-ins).
    const KEY_CODE: &'static str;
    /// How stores keep its state.
    const LAYOUT: Layout;
    /// Its parameters as configuration files write them, in order (a test
    /// holds them to its configuration type).
    const FIELDS: &'static [(&'static str, FieldKind)];
    /// Its configuration-file form.
    #[cfg(feature = "serde")]
    type Spec;
    /// Validate the configuration form.
    #[cfg(feature = "serde")]
    fn from_spec(spec: &Self::Spec) -> Result<Self, PolicyError>;
    /// The most a single request may cost.
    fn capacity_of(&self) -> u64;
    /// What HTTP headers announce as the window, in µs.
    fn announced_window_us(&self) -> u64;
    /// Units over µs at the sustained rate.
    fn rate(&self) -> (u64, u64);
    /// These parameters shared by `instances` processes (see
    /// [`Limit::divided_by`](crate::Limit::divided_by)).
    fn shared(&self, instances: u64) -> Result<Self, PolicyError>;
    /// Whether the state records the rate it was written at (see
    /// [`Limit::keeping_units`](crate::Limit::keeping_units)).
    fn keeps_units(&self) -> bool {
        false
    }
    /// These parameters with a state that keeps its units across a change
    /// of rate. A window counts units already: it is unchanged.
    fn keeping_units(self) -> Self {
        self
    }
}

/// How a store keeps a built-in algorithm's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Up to three integers ([`State::Cells`](crate::State::Cells)),
    /// stored as a string of `cells` numbers; cell `time_cell` (from 0)
    /// holds a time, which tells Tollgate's states from other data, and
    /// trailing cells after it that are 0 are left out.
    Cells {
        /// How many cells the state uses.
        cells: usize,
        /// The cell holding a time (µs since the Unix epoch).
        time_cell: usize,
    },
    /// A list of timestamps ([`State::Log`](crate::State::Log)), stored as
    /// a list: a log that grows and ages at its ends (the sliding log).
    Log,
    /// A list of timestamps ([`State::Log`](crate::State::Log)), stored as
    /// one string: the times in decimal, oldest first, separated by one
    /// space. It is read and written whole, one `GET` and one `SET`, where
    /// a list takes a command per edit: for a short log edited anywhere
    /// (a concurrency limit's holders, released in any order).
    LogText,
}

impl Layout {
    /// Whether the state is a log ([`State::Log`](crate::State::Log)),
    /// however it is stored.
    ///
    /// ```
    /// use tollgate_limiter::{Builtin, Layout};
    /// assert!(Layout::LogText.is_log());
    /// assert!(!Builtin::named("gcra").unwrap().layout.is_log());
    /// ```
    pub fn is_log(self) -> bool {
        matches!(self, Layout::Log | Layout::LogText)
    }
}

/// A built-in algorithm as stores and configuration readers see it.
///
/// ```
/// use tollgate_limiter::{Builtin, Layout};
/// let gcra = Builtin::named("gcra").unwrap();
/// assert_eq!(gcra.layout, Layout::Cells { cells: 2, time_cell: 0 });
/// assert_eq!(Builtin::all().len(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Builtin {
    /// Its name ([`Limit::algorithm_name`](crate::Limit::algorithm_name),
    /// and `algorithm = "…"` in configuration files).
    pub name: &'static str,
    /// Its code in store keys ([`Limit::key_code`](crate::Limit::key_code)).
    pub key_code: &'static str,
    /// How stores keep its state.
    pub layout: Layout,
    /// Its parameters as configuration files write them, in order.
    pub fields: &'static [(&'static str, FieldKind)],
}

impl Builtin {
    /// Every built-in algorithm, in the registry's order.
    pub fn all() -> &'static [Builtin] {
        super::BUILTINS
    }

    /// The built-in algorithm with this name (`token_bucket`, `gcra`, …).
    pub fn named(name: &str) -> Option<&'static Builtin> {
        Self::all().iter().find(|b| b.name == name)
    }
}

/// What a parameter of a built-in algorithm holds, as a configuration
/// file writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A whole number (`capacity = 100`).
    Count,
    /// A duration string (`period = "1s"`).
    Duration,
    /// A string the algorithm reads (`per = "month"`,
    /// `time_zone = "Europe/Berlin"`).
    Text,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_key_codes_are_unique() {
        let all = Builtin::all();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.key_code, b.key_code, "{} and {}", a.name, b.name);
            }
            if let Layout::Cells { cells, time_cell } = a.layout {
                assert!((1..=3).contains(&cells) && time_cell < cells, "{}", a.name);
            }
        }
    }
}
