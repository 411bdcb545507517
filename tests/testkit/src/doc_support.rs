//! A stand-in store for the crate-level example (not part of the API).

use std::sync::Arc;

use tollgate_limiter::{
    async_trait, Decide, LayerRequest, ManualClock, Store, StoreError, Verdicts,
};

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
    fn decide<'a>(&'a self, _: &'a [LayerRequest<'a>], verdicts: &'a mut Verdicts) -> Decide<'a> {
        Decide::later(verdicts, async move {
            Err(StoreError::Unavailable("example store".into()))
        })
    }
}

#[allow(dead_code)]
fn _unused(_: Arc<ExampleStore>) {}
