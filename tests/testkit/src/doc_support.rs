//! A stand-in store for the crate-level example (not part of the API).

use std::sync::Arc;

use tollgate_limiter::{async_trait, LayerRequest, ManualClock, Store, StoreError, Verdicts};

/// Refuses everything; only here so the crate docs compile.
#[derive(Debug)]
pub struct ExampleStore;

impl ExampleStore {
    /// A store ignoring `clock`.
    pub fn new(_clock: ManualClock) -> Self {
        ExampleStore
    }
}

#[async_trait]
impl Store for ExampleStore {
    fn kind(&self) -> &'static str {
        "example"
    }
    async fn decide(&self, _: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        Err(StoreError::Unavailable("example store".into()))
    }
}

#[allow(dead_code)]
fn _unused(_: Arc<ExampleStore>) {}
