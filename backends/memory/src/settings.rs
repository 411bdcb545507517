//! The store's settings as a configuration file writes them (feature
//! `serde`): read by any serde format, checked, and applied to a builder,
//! so a configuration layer needs no knowledge of the store's options.

use serde::Deserialize;
use tollgate_limiter::WhenFullSpec;

use crate::store::MemoryStoreBuilder;

/// `max_keys`, `when_full` and `shards`, each optional (the builder's
/// defaults otherwise). Unknown fields are refused.
///
/// ```
/// use tollgate_memory::{MemorySettings, MemoryStore};
/// let settings: MemorySettings = serde_json::from_str(r#"{ "max_keys": 10000, "when_full": "refuse" }"#)?;
/// assert!(settings.problems().is_empty());
/// let store = settings.apply(MemoryStore::builder()).build();
/// assert_eq!(store.max_keys(), 10_000);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MemorySettings {
    /// Most keys, exactly (default 1,000,000; see
    /// [`MemoryStoreBuilder::max_keys`]).
    pub max_keys: Option<usize>,
    /// What a full store does: `"evict"` (the default) or `"refuse"`.
    pub when_full: Option<WhenFullSpec>,
    /// Shards of the map (default 64).
    pub shards: Option<usize>,
}

impl MemorySettings {
    /// What is wrong with these settings, each as its field and what to
    /// fix (none: they can be applied). A zero would be raised to one by
    /// the builder; written in a file it is a mistake, so it is refused.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut problems = Vec::new();
        if self.max_keys == Some(0) {
            problems.push(("max_keys", "must be > 0"));
        }
        if self.shards == Some(0) {
            problems.push(("shards", "must be > 0"));
        }
        problems
    }

    /// Whether `other` builds the same store as these settings: a setting
    /// left out is its default, so `shards = 64` written or not is the
    /// same store (a configuration reload compares with this, and keeps
    /// the running store and its counters when it says so).
    ///
    /// ```
    /// use tollgate_memory::MemorySettings;
    /// let unset: MemorySettings = serde_json::from_str("{}")?;
    /// let default: MemorySettings = serde_json::from_str(r#"{ "shards": 64, "when_full": "evict" }"#)?;
    /// let smaller: MemorySettings = serde_json::from_str(r#"{ "max_keys": 10 }"#)?;
    /// assert!(unset.builds_the_same_store_as(&default));
    /// assert!(!unset.builds_the_same_store_as(&smaller));
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn builds_the_same_store_as(&self, other: &MemorySettings) -> bool {
        let builder = || crate::MemoryStore::builder();
        self.apply(builder()).same_shape(&other.apply(builder()))
    }

    /// `builder` with every setting given here.
    pub fn apply(&self, mut builder: MemoryStoreBuilder) -> MemoryStoreBuilder {
        if let Some(n) = self.max_keys {
            builder = builder.max_keys(n);
        }
        if let Some(when_full) = self.when_full {
            builder = builder.when_full(when_full.into());
        }
        if let Some(n) = self.shards {
            builder = builder.shards(n);
        }
        builder
    }
}
