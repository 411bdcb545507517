//! Concurrent clients driving a limiter while a test breaks its Redis:
//! every decision recorded with when it started, how long it took and who
//! decided it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_limiter::{Context, Limiter, Source, Subject};
use tollgate_testkit::conformance::unique;

/// Concurrent clients driving the limiter.
pub const CLIENTS: usize = 8;

/// One decision as a client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// When it started, from the start of the run.
    pub at: Duration,
    /// How long it took.
    pub latency: Duration,
    /// Whether it was admitted.
    pub allowed: bool,
    /// Who decided it.
    pub source: Source,
}

/// Drives `CLIENTS` concurrent clients until stopped; every decision is recorded.
pub struct Load {
    pub start: Instant,
    pub stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(usize, Seen)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(limiter: &Limiter) -> Load {
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..CLIENTS)
            .map(|client| {
                let (limiter, stop, seen) = (limiter.clone(), stop.clone(), seen.clone());
                let ctx = Context::for_subject(Subject::new(unique("client")).unwrap());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        let d = limiter.check(&ctx, 1).await.expect("no input errors");
                        let s = Seen {
                            at: t0 - start,
                            latency: t0.elapsed(),
                            allowed: d.is_allowed(),
                            source: d.layers()[0].source,
                        };
                        seen.lock().unwrap().push((client, s));
                        // A client paces itself a little, as real ones do.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            })
            .collect();
        Load {
            start,
            stop,
            seen,
            tasks,
        }
    }

    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub async fn finish(self) -> Vec<(usize, Seen)> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("client task");
        }
        Arc::try_unwrap(self.seen)
            .expect("tasks done")
            .into_inner()
            .unwrap()
    }
}

/// Waits until a decision after `since` came from the store; the time it took.
pub async fn recovered(load: &Load, since: Duration, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        if load
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, s)| s.at >= since && s.source == Source::Store)
        {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "decisions did not come back from the store within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn max_latency(seen: &[(usize, Seen)]) -> Duration {
    seen.iter()
        .map(|(_, s)| s.latency)
        .max()
        .unwrap_or_default()
}
