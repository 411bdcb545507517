//! A store's acquisition of places that survives its caller: a request
//! dropped while the store takes its places (its client gone, a timeout
//! around `Limiter::acquire`) gives them back, instead of leaving them
//! taken for a whole lease.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::decide::one_each;
use crate::error::StoreError;
use crate::hold::Holds;
use crate::permit::Permit;
use crate::release_queue::ReleaseQueue;
use crate::store::{LayerRequest, OwnedLayer, Store};
use crate::verdicts::Verdicts;

/// The store's acquisition of `requests` and the permit of the places it
/// took (`None` when it took none). On a Tokio runtime the call runs on a
/// task of its own, which makes the permit as soon as the store answers:
/// if nobody takes the answer (this future was dropped), the permit is
/// dropped with it and its places go back. Without a runtime, or on an
/// in-process store, the call runs here, as any decision.
pub(super) async fn acquire_detached(
    store: &Arc<dyn Store>,
    releases: &Arc<ReleaseQueue>,
    requests: &[LayerRequest<'_>],
) -> Result<(Verdicts, Option<Permit>), StoreError> {
    // An in-process store answers as it is asked, so nobody can drop the
    // call halfway: no task (and its copies of the layers) is needed.
    let runtime = match tokio::runtime::Handle::try_current() {
        Ok(runtime) if !store.is_in_process() => runtime,
        _ => {
            let (verdicts, holds) = held_each(store.acquire(requests).await, requests.len())?;
            return Ok((verdicts, Permit::new(releases, requests, &holds)));
        }
    };
    let owned: SmallVec<[(OwnedLayer, u64); 4]> = requests
        .iter()
        .map(|r| (OwnedLayer::of(r), r.cost))
        .collect();
    let (store, releases) = (Arc::clone(store), Arc::clone(releases));
    let (answer, answered) = tokio::sync::oneshot::channel();
    let task = runtime.spawn(async move {
        let requests: SmallVec<[LayerRequest<'_>; 4]> = owned
            .iter()
            .map(|(layer, cost)| layer.request(*cost))
            .collect();
        let acquired = held_each(store.acquire(&requests).await, requests.len());
        // Sent or not, the permit lives in the answer: an answer nobody
        // takes drops it, and it gives its places back.
        let _ = answer.send(acquired.map(|(verdicts, holds)| {
            let permit = Permit::new(&releases, &requests, &holds);
            (verdicts, permit)
        }));
    });
    match answered.await {
        Ok(answer) => answer,
        // A store that panics panics its caller, as in `check`: an outage
        // would let a fail-open layer admit.
        Err(_) => match task.await {
            Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
            _ => Err(StoreError::Unavailable(
                "the store's acquisition ended without an answer (its runtime shut down)".into(),
            )),
        },
    }
}

/// `answer` of an acquisition, unless it lacks a verdict or hold per layer.
fn held_each(
    answer: Result<(Verdicts, Holds), StoreError>,
    layers: usize,
) -> Result<(Verdicts, Holds), StoreError> {
    let (verdicts, holds) = answer?;
    one_each(&verdicts, layers)?;
    if holds.len() != layers {
        return Err(StoreError::Protocol(format!(
            "{} holds for {layers} layers",
            holds.len()
        )));
    }
    Ok((verdicts, holds))
}
