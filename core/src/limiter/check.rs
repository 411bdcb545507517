//! The future of [`Limiter::check`](super::Limiter::check) and the
//! common path it runs on its first poll.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Poll};

use super::shadow::{denied_only_by_shadow, undecidable};
use super::{planned, Limiter, Requests};
use crate::context::Context;
use crate::decision::Decision;
use crate::error::{Error, StoreError};
use crate::failure::Admission;
use crate::layer::Layer;
use crate::observe;
use crate::verdicts::Verdicts;

/// The future of [`Limiter::check`]: the decision itself. Its first poll
/// runs the common path ([`Limiter::start`]) and, when that path finishes
/// (an in-process store answering at once, nothing in shadow mode to set
/// aside, no failure), returns the decision it builds straight from the
/// poll: no state machine sits between the decision and its caller. A
/// decision that must wait keeps only the box of its rest, so the future
/// stays small, and a shadow layer's recursive re-decision needs no box of
/// its own.
pub(super) struct Check<'a> {
    limiter: &'a Limiter,
    ctx: &'a Context,
    cost: u64,
    stage: Stage<'a>,
}

/// How far a [`Check`] got.
enum Stage<'a> {
    /// Not polled yet.
    Start,
    /// Waiting for the rest of the decision.
    Rest(Rest<'a>),
    /// Answered: polling again is a bug of the caller's.
    Done,
}

impl<'a> Check<'a> {
    pub(super) fn new(limiter: &'a Limiter, ctx: &'a Context, cost: u64) -> Self {
        Check {
            limiter,
            ctx,
            cost,
            stage: Stage::Start,
        }
    }
}

impl Future for Check<'_> {
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (limiter, ctx, cost) = (this.limiter, this.ctx, this.cost);
        loop {
            match &mut this.stage {
                Stage::Start => {
                    // Marked first: if the store panics, a caller that
                    // catches it and polls again gets a panic, never a
                    // second decision.
                    this.stage = Stage::Done;
                    let limiter = match limiter.plans.as_deref() {
                        None => limiter,
                        Some(book) => {
                            // Finding the plan waits on memory: the store
                            // starts fetching the first layer's state
                            // meanwhile (its key is the same under every
                            // plan that keeps the layer's algorithm).
                            limiter.prefetch_first(ctx);
                            match book.resolve(ctx) {
                                planned::Resolved::Ready(limiter) => limiter,
                                #[cfg(feature = "plan-source")]
                                planned::Resolved::Fetch(cache, customer) => {
                                    this.stage = Stage::Rest(Box::pin(async move {
                                        let limiter = book.fetched(cache, &customer).await;
                                        Check::new(limiter, ctx, cost).await
                                    }));
                                    continue;
                                }
                            }
                        }
                    };
                    // The start's lists live on this poll's stack: a
                    // decision that waits moves them into its rest.
                    let mut requests = Requests::new();
                    let mut verdicts = Verdicts::new();
                    match limiter.start(ctx, cost, &mut requests, &mut verdicts) {
                        Start::Decided => {
                            return Poll::Ready(
                                Ok(limiter.decision_of(&requests, cost, &verdicts)),
                            );
                        }
                        Start::Done(result) => return Poll::Ready(result),
                        Start::Unfinished(unfinished) => {
                            let rest = limiter.rest(ctx, cost, unfinished, requests, verdicts);
                            this.stage = Stage::Rest(rest);
                        }
                    }
                }
                Stage::Rest(rest) => {
                    let answer = ready!(rest.as_mut().poll(cx));
                    this.stage = Stage::Done;
                    return Poll::Ready(answer);
                }
                Stage::Done => panic!("a `Limiter::check` future polled after it answered"),
            }
        }
    }
}

/// What is left of a decision that must wait, boxed ([`Limiter::rest`]).
type Rest<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// Where [`Limiter::start`] left a decision (its requests and the store's
/// verdicts are in the lists the caller gave it). `Done` is large, and on
/// purpose: a `Start` lives on the stack for a moment (never in a future),
/// and boxing would allocate for every refusal and cached denial.
#[allow(clippy::large_enum_variant)]
enum Start {
    /// The store decided: its verdicts are the decision.
    Decided,
    /// Decided otherwise: refused as bad input, or answered by the
    /// blocked-key cache.
    Done(Result<Decision, Error>),
    /// More steps to take, which may wait ([`Limiter::rest`]).
    Unfinished(Unfinished),
}

/// A decision [`Limiter::start`] could not finish.
enum Unfinished {
    /// A shadow layer cannot take part: decide without it.
    Undecidable,
    /// The store must be waited for (nothing decided yet).
    Waiting(Admission),
    /// The store answered (its verdicts are in the list when `Ok`); shadow
    /// layers or a failure need more steps.
    Answered(Result<(), StoreError>),
}

impl Limiter {
    /// The rest of a decision that [`start`](Self::start) could not finish,
    /// boxed. Kept out of line: the futures of the paths that wait are
    /// large, and built inline they would make every decision's stack
    /// frame as large.
    #[inline(never)]
    fn rest<'a>(
        &'a self,
        ctx: &'a Context,
        cost: u64,
        unfinished: Unfinished,
        requests: Requests<'a>,
        verdicts: Verdicts,
    ) -> Rest<'a> {
        match unfinished {
            Unfinished::Undecidable => Box::pin(async move {
                let left_out = |l: &Layer| undecidable(l, ctx, cost);
                self.without(ctx, cost, &left_out).await
            }),
            Unfinished::Waiting(admission) => {
                Box::pin(self.wait_for_store(ctx, cost, requests, admission))
            }
            Unfinished::Answered(answer) => {
                let answer = answer.map(|()| verdicts);
                // An answer in place, not timed: nor are its later passes.
                let passes = super::shadow::Passes::Decide(&*self.store);
                Box::pin(self.settle(ctx, cost, requests, answer, passes))
            }
        }
    }

    /// Hint the store that `ctx`'s first layer is about to be decided
    /// ([`Store::prefetch`](crate::Store::prefetch)).
    #[inline]
    fn prefetch_first(&self, ctx: &Context) {
        if let Some(key) = self.layers.first().and_then(|l| ctx.key_for(l)) {
            self.store.prefetch(&key);
        }
    }

    /// Everything a decision does before it would have to wait: the
    /// layers' requests go to `requests` (received empty) and the store's
    /// verdicts, when it answers at once, to `verdicts` (received empty).
    #[inline(always)]
    fn start<'a>(
        &'a self,
        ctx: &'a Context,
        cost: u64,
        requests: &mut Requests<'a>,
        verdicts: &mut Verdicts,
    ) -> Start {
        // A shadow layer never fails a request: one that cannot be decided
        // (a cost above its capacity, no subject for it) is left out.
        if self.has_shadow && self.layers.iter().any(|l| undecidable(l, ctx, cost)) {
            return Start::Unfinished(Unfinished::Undecidable);
        }
        if self.has_concurrency {
            return Start::Done(Err(self.needs_permit()));
        }
        if let Err(e) = self.requests_into(ctx, cost, requests) {
            return Start::Done(Err(e));
        }
        #[cfg(feature = "blocked-cache")]
        if let Some(cache) = &self.blocked {
            if let Some(decision) = cache.get(&self.layers, requests, cost, &*self.clock) {
                self.metrics.decision(&decision);
                return Start::Done(Ok(decision));
            }
        }
        let admission = self.breaker.admit();
        let answer = match admission {
            // Batches already charged still admit while the breaker is open.
            Admission::Skip(wait) => match self.leases_answer(requests, verdicts) {
                Some(answer) => answer,
                None => {
                    observe::store_skipped(self.store.kind());
                    Err(StoreError::CircuitOpen(wait))
                }
            },
            Admission::Call | Admission::Probe => {
                match self.answer_at_once(admission, requests, verdicts) {
                    Some(answer) => answer,
                    // Nothing was decided: the waiting path takes over.
                    None => return Start::Unfinished(Unfinished::Waiting(admission)),
                }
            }
        };
        match answer {
            Ok(()) if !denied_only_by_shadow(requests, verdicts) => Start::Decided,
            answer => Start::Unfinished(Unfinished::Answered(answer)),
        }
    }
}
