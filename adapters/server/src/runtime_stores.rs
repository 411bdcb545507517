//! On a standalone Redis, each gRPC runtime decides over a connection of
//! its own.
//!
//! A multiplexed Redis connection is driven by a task of the runtime that
//! opened it. Called from another runtime, every decision crosses threads
//! twice (the request to that task, the reply back), which costs more CPU
//! than the call itself. So each gRPC runtime opens the configured store
//! again, in itself, and decides over it; until it has (or when it
//! cannot), it decides over the shared one. Every connection reaches the
//! same Redis, which decides atomically: counts are exact whichever
//! connection a decision takes. Only a standalone Redis is opened again:
//! an in-process store must stay one (two would split its counts), and
//! Sentinel and Cluster stores keep one set of connections.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tollgate_config::Config;
use tollgate_limiter::{Adjustment, Clock, Decide, LayerRequest, Store, StoreError, Verdicts};

thread_local! {
    /// This thread's own store, with the generation it was opened for.
    static LOCAL: RefCell<Option<(u64, Arc<dyn Store>)>> = const { RefCell::new(None) };
}

/// A store as every runtime sees it: the runtime's own, when it opened
/// one for this generation, else the shared one.
#[derive(Debug)]
pub(crate) struct RuntimeStores {
    generation: u64,
    shared: Arc<dyn Store>,
}

/// What the runtimes open their own stores from: a generation and its
/// configuration (`None`: nothing to open).
pub(crate) type Target = Option<(u64, Config)>;

/// How long a runtime waits before trying again to open its store.
const RETRY_EVERY: Duration = Duration::from_secs(1);

impl RuntimeStores {
    /// Whether the runtimes of a server on `config` open stores of their
    /// own.
    pub(crate) fn apply_to(config: &Config) -> bool {
        config.store().kind() == "redis"
    }

    /// A new generation over `shared`.
    pub(crate) fn new(shared: Arc<dyn Store>) -> RuntimeStores {
        static GENERATION: AtomicU64 = AtomicU64::new(1);
        RuntimeStores {
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            shared,
        }
    }

    /// Its generation, for [`Target`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The store it wraps, shared by every runtime.
    pub(crate) fn shared(&self) -> &Arc<dyn Store> {
        &self.shared
    }

    /// The store this thread decides over.
    fn current(&self) -> Arc<dyn Store> {
        LOCAL.with(|local| match &*local.borrow() {
            Some((generation, store)) if *generation == self.generation => store.clone(),
            _ => self.shared.clone(),
        })
    }
}

/// Keep this thread's own store open for the generation `targets` names:
/// run by each gRPC runtime, on its one thread, until the server stops.
pub(crate) async fn keep_local(mut targets: watch::Receiver<Target>, clock: Arc<dyn Clock>) {
    loop {
        let target = targets.borrow_and_update().clone();
        let opened = match target {
            Some((generation, config)) => match config.open_store(clock.clone()).await {
                Ok(store) => Some((generation, store)),
                // The shared store serves meanwhile (an older
                // generation's connection is closed now): try again, or
                // open the next generation's when one comes first.
                Err(_) => {
                    LOCAL.with(|local| *local.borrow_mut() = None);
                    match tokio::time::timeout(RETRY_EVERY, targets.changed()).await {
                        Ok(Err(_)) => return,
                        Ok(Ok(())) | Err(_) => continue,
                    }
                }
            },
            None => None,
        };
        LOCAL.with(|local| *local.borrow_mut() = opened);
        if targets.changed().await.is_err() {
            return;
        }
    }
}

#[async_trait]
impl Store for RuntimeStores {
    fn kind(&self) -> &'static str {
        self.shared.kind()
    }

    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        let store = self.current();
        let at_once = match store.decide(layers, verdicts) {
            Decide::Now(answer) => Some(answer),
            Decide::Later(_) => None,
        };
        match at_once {
            Some(answer) => Decide::Now(answer),
            // Asked again from a future that owns the store (a `Later`
            // does nothing until polled).
            None => Decide::Later(Box::pin(
                async move { store.decide(layers, verdicts).await },
            )),
        }
    }

    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        self.current().peek(layers).await
    }

    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        self.current().reset(layers).await
    }

    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        self.current().adjust(layers, adjustment).await
    }
}
