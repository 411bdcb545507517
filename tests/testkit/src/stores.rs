//! Stores for tests of what happens around a store: one that is down, and
//! one that answers as a remote store does and can be switched off.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tollgate_limiter::{
    async_trait, Adjustment, Decide, Hold, Holds, LayerRequest, Store, StoreError, Verdicts,
};

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

/// Another store (the in-process one, typically) answering as a remote
/// store does: every decision waits for its call, so the limiter times it,
/// counts it and tells the circuit breaker how it went. It counts the
/// decisions and rewards it is asked for, and can be switched off — at
/// once ([`set_down`](Self::set_down)) or after its first few decisions
/// ([`down_after`](Self::down_after)); a decision while it is off fails
/// with [`StoreError::Unavailable`]. Everything else goes to the inner
/// store. Its kind is `remote`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::{sync::Arc, time::Duration};
/// use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
/// use tollgate_testkit::{DownStore, RemoteStore};
///
/// // (In a test, the inner store is the in-process one.)
/// let store = Arc::new(RemoteStore::new(Arc::new(DownStore)));
/// let limiter = Limiter::builder(store.clone())
///     .layer("key", Scope::Subject, Policy::new("api", Limit::fixed_window(5, Duration::from_secs(60))?)?)
///     .build()?;
/// store.set_down(true);
/// let decision = limiter.check(&Context::for_subject(Subject::new("k")?), 1).await?;
/// assert_eq!(decision.store_error(), Some("unavailable"));
/// assert_eq!(store.decides(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RemoteStore {
    inner: Arc<dyn Store>,
    down: AtomicBool,
    /// Decisions answered before it goes down by itself.
    answers: usize,
    decides: AtomicUsize,
    rewards: AtomicUsize,
}

impl RemoteStore {
    /// `inner` as a remote store, up.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        RemoteStore {
            inner,
            down: AtomicBool::new(false),
            answers: usize::MAX,
            decides: AtomicUsize::new(0),
            rewards: AtomicUsize::new(0),
        }
    }

    /// The same store, down from its decision number `answers` on (the
    /// first `answers` decisions are answered).
    pub fn down_after(mut self, answers: usize) -> Self {
        self.answers = answers;
        self
    }

    /// Switch the store off (`true`) or on again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// How many decisions it was asked for, answered or not.
    pub fn decides(&self) -> usize {
        self.decides.load(Ordering::SeqCst)
    }

    /// How many rewards ([`Adjustment::Reward`]) it was asked for.
    pub fn rewards(&self) -> usize {
        self.rewards.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Store for RemoteStore {
    fn kind(&self) -> &'static str {
        "remote"
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        Decide::Later(Box::pin(async move {
            let call = self.decides.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) || call >= self.answers {
                return Err(StoreError::Unavailable("switched off".into()));
            }
            self.inner.decide(layers, verdicts).await
        }))
    }
    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        self.inner.peek(layers).await
    }
    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        self.inner.reset(layers).await
    }
    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        if adjustment == Adjustment::Reward {
            self.rewards.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.adjust(layers, adjustment).await
    }
    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        self.inner.acquire(layers).await
    }
    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        self.inner.release(layers, holds).await
    }
    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<Holds, StoreError> {
        self.inner.renew(layers, holds).await
    }
}
