//! A pool's failed connects, told to the decisions waiting for a
//! connection: bb8 hands a connect error to its error sink only, and a
//! waiter would otherwise wait out its whole deadline and report a
//! timeout where the pool knows why (refused, a wrong password, a TLS
//! error).

use tokio::sync::watch;
use tollgate_limiter::StoreError;

use crate::error::from_redis;

/// The last connect error of one pool, as it happens.
#[derive(Debug, Clone)]
pub(crate) struct ConnectFailures {
    last: watch::Sender<Option<String>>,
}

impl ConnectFailures {
    pub(crate) fn new() -> Self {
        ConnectFailures {
            last: watch::channel(None).0,
        }
    }

    /// The sink to build the pool with.
    pub(crate) fn sink(&self) -> Box<dyn bb8::ErrorSink<redis::RedisError>> {
        Box::new(Sink(self.last.clone()))
    }

    /// A watch of connect errors from now on (one made before it is not
    /// told: the pool may connect since).
    pub(crate) fn watch(&self) -> watch::Receiver<Option<String>> {
        self.last.subscribe()
    }
}

/// Wait for the next connect error `watch` sees.
pub(crate) async fn next_failure(mut watch: watch::Receiver<Option<String>>) -> StoreError {
    loop {
        if watch.changed().await.is_err() {
            // The pool is gone: never resolves, the pool's own answer wins.
            std::future::pending::<()>().await;
        }
        if let Some(why) = watch.borrow_and_update().clone() {
            return StoreError::Unavailable(format!("could not connect: {why}"));
        }
    }
}

#[derive(Debug, Clone)]
struct Sink(watch::Sender<Option<String>>);

impl bb8::ErrorSink<redis::RedisError> for Sink {
    fn sink(&self, error: redis::RedisError) {
        self.0.send_replace(Some(from_redis(error).to_string()));
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<redis::RedisError>> {
        Box::new(self.clone())
    }
}
