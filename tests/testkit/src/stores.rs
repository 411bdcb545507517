//! Stores for tests of what happens around a store: one that is down.

use tollgate_limiter::{async_trait, Decide, LayerRequest, Store, StoreError, Verdicts};

/// A store that is down: every call fails at once with
/// [`StoreError::Unavailable`] (an outage: it counts towards the circuit
/// breaker, and each policy's failure mode answers). Its kind is `down`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
/// use tollgate_testkit::DownStore;
///
/// let limiter = Limiter::builder(Arc::new(DownStore))
///     .layer("key", Scope::Subject, Policy::new("api", Limit::fixed_window(5, Duration::from_secs(60))?)?)
///     .build()?;
/// let decision = limiter.check(&Context::for_subject(Subject::new("k")?), 1).await?;
/// assert!(decision.failed_closed());
/// assert_eq!(decision.store_error(), Some("unavailable"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct DownStore;

#[async_trait]
impl Store for DownStore {
    fn kind(&self) -> &'static str {
        "down"
    }
    fn decide<'a>(&'a self, _: &'a [LayerRequest<'a>], verdicts: &'a mut Verdicts) -> Decide<'a> {
        Decide::later(verdicts, async move {
            Err(StoreError::Unavailable("test store is down".into()))
        })
    }
}
