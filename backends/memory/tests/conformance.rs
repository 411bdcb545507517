//! The store conformance suite on the in-process store.

use std::sync::Arc;

use tollgate_core::{ManualClock, Store};
use tollgate_memory::MemoryStore;

tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
    Arc::new(MemoryStore::builder().clock(Arc::new(clock)).build()) as Arc<dyn Store>
});
