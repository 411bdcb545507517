//! The store conformance suite on the in-process store.

use std::sync::Arc;

use tollgate_limiter::{ManualClock, Store, WhenFull};
use tollgate_memory::MemoryStore;

tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
    Arc::new(MemoryStore::builder().clock(Arc::new(clock)).build()) as Arc<dyn Store>
});

/// Exact bounds, refusing and evicting budgets, per-policy budgets.
#[tokio::test]
async fn key_budgets() {
    tollgate_testkit::conformance::key_budgets(
        |clock: ManualClock, max_keys: usize, when_full: WhenFull| {
            Arc::new(
                MemoryStore::builder()
                    .clock(Arc::new(clock))
                    .max_keys(max_keys)
                    .when_full(when_full)
                    .build(),
            ) as Arc<dyn Store>
        },
    )
    .await;
}
