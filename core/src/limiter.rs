//! The limiter: ordered layers decided together in one store call.

#[cfg(feature = "concurrency")]
mod acquire;
mod degraded;
mod planned;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Poll};

use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::context::Context;
use crate::decision::{Decision, LayerDecision, Source};
use crate::error::{BuildError, Error, StoreError};
use crate::failure::{Admission, BreakerConfig, BreakerState, CircuitBreaker};
use crate::hold::Holds;
use crate::layer::{duplicate_names, shared_counters, Layer, Scope};
use crate::observe::{self, LimiterMetrics};
use crate::plan::Plans;
use crate::policy::Policy;
use crate::store::{LayerRequest, Store};
use crate::time::{Clock, MonotonicClock};
use crate::verdicts::Verdicts;
#[cfg(feature = "concurrency")]
pub use acquire::Acquired;

/// An ordered list of layers over one store. `check` decides all layers in
/// one store call: admitted only if every layer admits, and then every layer
/// is charged; otherwise nothing is charged.
///
/// When the store fails, each layer's policy decides
/// ([`OnStoreFailure`](crate::OnStoreFailure)): fail open, fail closed, or fall back to the
/// limiter's emergency store. A [`CircuitBreaker`] stops calling a store that
/// keeps failing and probes it for recovery.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::sync::Arc;
/// # use tollgate_limiter::*;
/// # #[derive(Debug)] struct AlwaysYes;
/// # #[async_trait::async_trait] impl Store for AlwaysYes {
/// #   fn kind(&self) -> &'static str { "yes" }
/// #   async fn decide(&self, l: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
/// #     Ok(l.iter().map(|r| Verdict { allowed: true, limit: r.policy.capacity(), remaining: 0,
/// #       reset_after: std::time::Duration::ZERO, retry_after: None }).collect()) } }
/// # let store: Arc<dyn Store> = Arc::new(AlwaysYes);
/// use std::time::Duration;
/// let per_key = Policy::new("per-key", Limit::gcra(10, Duration::from_secs(1), 20)?)?;
/// let global = Policy::new("global", Limit::fixed_window(10_000, Duration::from_secs(60))?)?
///     .with_on_failure(OnStoreFailure::FailOpen)?;
/// let limiter = Limiter::builder(store)
///     .layer("key", Scope::Subject, per_key)
///     .layer("all", Scope::Global, global)
///     .build()?;
/// let decision = limiter.check(&Context::for_subject(Subject::new("key-7")?), 1).await?;
/// assert!(decision.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    layers: Arc<[Layer]>,
    store: Arc<dyn Store>,
    fallback: Option<Arc<dyn Store>>,
    breaker: Arc<CircuitBreaker>,
    clock: Arc<dyn Clock>,
    #[cfg(feature = "blocked-cache")]
    blocked: Option<Arc<crate::blocked::BlockedCache>>,
    /// Whether any layer is in shadow mode.
    has_shadow: bool,
    /// Whether any layer is a concurrency limit (decided by `acquire`).
    has_concurrency: bool,
    /// Where dropped permits' places go back to the store.
    #[cfg(feature = "concurrency")]
    releases: Arc<crate::release_queue::ReleaseQueue>,
    /// Counters of decisions per layer, and the store's latency.
    metrics: Arc<LimiterMetrics>,
    /// Each plan's limiter, when the limiter has plans.
    plans: Option<Arc<planned::PlanBook>>,
    /// The store as leased layers see it, when any is leased (`store` is
    /// then this one).
    #[cfg(feature = "lease")]
    leases: Option<Arc<crate::leased_store::LeasedStore>>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("layers", &self.layers)
            .field("store", &self.store.kind())
            .field("fallback", &self.fallback.as_ref().map(|s| s.kind()))
            .field("breaker", &self.breaker.state())
            .finish()
    }
}

impl Limiter {
    /// Start a limiter over `store`.
    pub fn builder(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder {
            store,
            layers: Vec::new(),
            fallback: None,
            breaker: BreakerConfig::default(),
            clock: Arc::new(MonotonicClock::new()),
            #[cfg(feature = "blocked-cache")]
            blocked: None,
            plans: None,
        }
    }

    /// The same limiter (store, breaker, caches and metrics shared) over
    /// `layers`: its own layers under a plan (the same names, scopes and
    /// keys), or some of them.
    fn with_layers(&self, layers: Arc<[Layer]>) -> Limiter {
        Limiter {
            has_shadow: layers.iter().any(|l| l.policy.is_shadow()),
            has_concurrency: layers.iter().any(Layer::is_concurrency),
            layers,
            plans: None,
            ..self.clone()
        }
    }

    /// The limiter of `ctx`'s plan (this one when it has no plans).
    pub(crate) async fn planned(&self, ctx: &Context) -> &Limiter {
        match &self.plans {
            None => self,
            Some(book) => book.limiter_for(ctx).await,
        }
    }

    /// Whether a layer is a concurrency limit: such a limiter decides with
    /// `Limiter::acquire` (feature `concurrency`), whose permit gives the
    /// places back; [`check`](Self::check) refuses it. Plans keep this
    /// (a plan cannot turn a rate limit into a concurrency limit).
    pub fn has_concurrency(&self) -> bool {
        self.has_concurrency
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The blocked-key cache, when the limiter has one.
    #[cfg(feature = "blocked-cache")]
    pub(crate) fn blocked_cache(&self) -> Option<&crate::blocked::BlockedCache> {
        self.blocked.as_deref()
    }

    /// The clock of the breaker and the blocked-key cache.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The circuit breaker guarding the store.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// Give back to the store what this process's leases hold and have
    /// not admitted (a token bucket's or GCRA's units; a window's end with
    /// their window), and wait for it: call it on shutdown. A dropped
    /// limiter gives them back in the background, on the Tokio runtime
    /// current where it is dropped. Nothing to do without leased layers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use std::{sync::Arc, time::Duration};
    /// use tollgate_limiter::{Lease, Limit, Limiter, Policy, Scope};
    /// # let store = Arc::new(tollgate_memory::MemoryStore::default());
    /// let all = Policy::new("all", Limit::gcra(1_000, Duration::from_secs(1), 1_000)?)?
    ///     .leased(Lease::default())?;
    /// let limiter = Limiter::builder(store).layer("all", Scope::Global, all).build()?;
    /// limiter.return_leases().await;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "lease")]
    #[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
    pub async fn return_leases(&self) {
        if let Some(leases) = &self.leases {
            leases.return_all().await;
        }
    }

    /// Decide a request of `cost` units for `ctx`.
    ///
    /// Errors are for bad input (a cost outside 1..=capacity, a missing
    /// subject). Being denied is `Ok` with [`Decision::is_allowed`] false; a
    /// store failure is `Ok` too, decided by each layer's failure mode (see
    /// [`Decision::failed_closed`] and [`LayerDecision::source`]).
    ///
    /// The future is the decision itself, not a wrapper around it: nothing
    /// is moved or allocated on the way (with the `tracing` feature, it is
    /// instrumented with a `tollgate.check` span).
    pub fn check<'a>(
        &'a self,
        ctx: &'a Context,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            let span = tracing::debug_span!(
                "tollgate.check",
                store = self.store.kind(),
                layers = self.layers.len(),
                cost
            );
            Check::new(self, ctx, cost).instrument(span)
        }
        #[cfg(not(feature = "tracing"))]
        Check::new(self, ctx, cost)
    }

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
                Box::pin(self.settle(ctx, cost, requests, answer))
            }
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
                match self.decide_now(admission, requests, verdicts) {
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

    /// `check` refuses a limiter with a concurrency layer: it would take
    /// a place nothing gives back.
    #[cold]
    fn needs_permit(&self) -> Error {
        let layer = self.layers.iter().find(|l| l.is_concurrency());
        Error::NeedsPermit {
            layer: layer.map_or_else(String::new, |l| l.name.to_string()),
        }
    }

    /// Each layer's request for `ctx` at `cost`, into `requests`: up to
    /// four live on the stack, so a decision allocates nothing. Refused
    /// when a cost exceeds a layer's capacity or the context lacks a
    /// layer's subject.
    #[inline(always)]
    fn requests_into<'a>(
        &'a self,
        ctx: &'a Context,
        cost: u64,
        requests: &mut Requests<'a>,
    ) -> Result<(), Error> {
        for layer in self.layers.iter() {
            layer.policy.check_cost(cost)?;
            let Some(key) = ctx.key_for(layer) else {
                return Err(Error::MissingSubject {
                    layer: layer.name.to_string(),
                    scope: layer.scope.label().to_string(),
                });
            };
            requests.push(LayerRequest {
                key,
                policy: &layer.policy,
                cost,
            });
        }
        Ok(())
    }

    /// Whether the store's answers at once come from leased batches (the
    /// store itself is remote), not from a store call.
    #[inline(always)]
    fn answers_from_leases(&self) -> bool {
        #[cfg(feature = "lease")]
        return self.leases.is_some();
        #[cfg(not(feature = "lease"))]
        false
    }

    /// The answer of leased batches alone, when they cover every layer
    /// (no store call is made); `None` otherwise, or without leases.
    #[cold]
    fn leases_answer(
        &self,
        requests: &Requests<'_>,
        verdicts: &mut Verdicts,
    ) -> Option<Result<(), StoreError>> {
        if !self.answers_from_leases() {
            return None;
        }
        let answer = self.store.decide_now(requests, verdicts)?;
        Some(answer.and_then(|()| one_each(verdicts, requests.len())))
    }

    /// The answer of a store that decides at once (in-process), written
    /// into `verdicts` in place (the answer is not moved); `None` when the
    /// store must be waited for (nothing decided).
    #[inline(always)]
    fn decide_now(
        &self,
        admission: Admission,
        requests: &Requests<'_>,
        verdicts: &mut Verdicts,
    ) -> Option<Result<(), StoreError>> {
        // A probe whose caller stops waiting must not keep the breaker
        // half-open for good.
        let probe = ProbeGuard {
            breaker: (admission == Admission::Probe).then_some(&*self.breaker),
        };
        let Some(answer) = self.store.decide_now(requests, verdicts) else {
            // The waiting path takes over the probe.
            probe.settled();
            return None;
        };
        // An in-process answer is not timed: it takes less time than
        // reading a clock twice.
        let answer = answer.and_then(|()| one_each(verdicts, requests.len()));
        if self.answers_from_leases() {
            // Admitted from batches: no store call was made, so the
            // breaker learns nothing (a probe goes to the next request).
            return Some(answer);
        }
        self.after_call(admission, None, answer.as_ref().err());
        probe.settled();
        Some(answer)
    }

    /// The store's answer, from a store that waits (Redis).
    async fn wait_for_store(
        &self,
        ctx: &Context,
        cost: u64,
        requests: Requests<'_>,
        admission: Admission,
    ) -> Result<Decision, Error> {
        let call = async { counted(self.store.decide(&requests).await, requests.len()) };
        let answer = self.store_call(admission, call).await;
        self.settle(ctx, cost, requests, answer).await
    }

    /// One call of a store that waits, admitted by the breaker: timed and
    /// counted, the breaker told how it went, and a probe's place given
    /// back even when the caller stops waiting.
    pub(crate) async fn store_call<T>(
        &self,
        admission: Admission,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let probe = ProbeGuard {
            breaker: (admission == Admission::Probe).then_some(&*self.breaker),
        };
        let started = self.metrics.start();
        let answer = call.await;
        self.after_call(admission, started, answer.as_ref().err());
        probe.settled();
        answer
    }

    /// Tell the metrics and the breaker how a store call went (`error`:
    /// how it failed, if it did).
    #[inline]
    fn after_call(
        &self,
        admission: Admission,
        started: observe::Started,
        error: Option<&StoreError>,
    ) {
        self.metrics.store_call(self.store.kind(), started, error);
        // Any answer that is not an outage (a decision, or an error
        // about one key, a budget or the clock) means the store is
        // there: it closes the breaker as a success does.
        match error {
            Some(e) if e.is_outage() => {
                if self.breaker.failure(admission == Admission::Probe) {
                    observe::breaker(self.store.kind(), BreakerState::Open, Some(e))
                }
            }
            _ => {
                if self.breaker.success() {
                    observe::breaker(self.store.kind(), BreakerState::Closed, None)
                }
            }
        }
    }

    /// The decision from the store's answer, whatever it is: shadow layers
    /// set aside, failures decided by each layer's failure mode.
    async fn settle(
        &self,
        ctx: &Context,
        cost: u64,
        requests: Requests<'_>,
        answer: Result<Verdicts, StoreError>,
    ) -> Result<Decision, Error> {
        // A request denied only by shadow layers passes: decide it again
        // without them, so the enforced layers are charged.
        let answer = match answer {
            Ok(verdicts) if denied_only_by_shadow(&requests, &verdicts) => {
                past_shadow(&*self.store, &requests, verdicts, false)
                    .await
                    .map(|(verdicts, _)| verdicts)
            }
            other => other,
        };
        // A store error about a shadow policy alone (its key holds foreign
        // data, its key budget is full) does not fail the enforced layers.
        if let (Err(error), true) = (&answer, self.has_shadow) {
            if let Some(name) = error.policy() {
                let named = |l: &Layer| l.policy.name() == name;
                let only_shadow = self
                    .layers
                    .iter()
                    .filter(|l| named(l))
                    .all(|l| l.policy.is_shadow());
                if only_shadow && self.layers.iter().any(named) {
                    return Box::pin(self.without(ctx, cost, &named)).await;
                }
            }
        }
        match answer {
            Ok(verdicts) => Ok(self.finish(&requests, cost, &verdicts)),
            Err(error) => {
                let decision = self.degraded(&requests, &error).await;
                Ok(self.finished(&requests, cost, decision))
            }
        }
    }

    /// The decision of the store's `verdicts`, counted.
    #[inline]
    fn finish(&self, requests: &[LayerRequest<'_>], cost: u64, verdicts: &[Verdict]) -> Decision {
        let decision = Decision::of_store(&self.layers, verdicts);
        self.finished(requests, cost, decision)
    }

    /// `decision`, remembered when the blocked-key cache should, and counted.
    #[inline]
    fn finished(&self, requests: &[LayerRequest<'_>], cost: u64, decision: Decision) -> Decision {
        #[cfg(feature = "blocked-cache")]
        if let (Some(cache), false) = (&self.blocked, decision.is_allowed()) {
            cache.remember(requests, cost, &decision, &*self.clock);
        }
        let _ = (requests, cost);
        self.metrics.decision(&decision);
        decision
    }

    /// Decide without the shadow layers `left_out` picks (they could not
    /// take part: no subject for them, a cost above their capacity, a store
    /// error about their own keys); every other layer decides as usual,
    /// other shadow layers included. The layers left out report a would-be
    /// denial that no store made (`Source::FailClosed`).
    async fn without(
        &self,
        ctx: &Context,
        cost: u64,
        left_out: &(dyn Fn(&Layer) -> bool + Sync),
    ) -> Result<Decision, Error> {
        let decided_kept = match self.subset(left_out) {
            // Fewer shadow layers each time: the recursion ends.
            Some(subset) => Some(Check::new(&subset, ctx, cost).await?),
            None => None,
        };
        Ok(self.with_left_out(decided_kept, left_out))
    }

    /// This limiter without the layers `left_out` picks, with its own
    /// counters (its layers are fewer) and no cached denial of the whole
    /// request answering for it; `None` when no layer is kept.
    fn subset(&self, left_out: &(dyn Fn(&Layer) -> bool + Sync)) -> Option<Limiter> {
        let kept: Arc<[Layer]> = self
            .layers
            .iter()
            .filter(|l| !left_out(l))
            .cloned()
            .collect();
        if kept.is_empty() {
            return None;
        }
        Some(Limiter {
            metrics: Arc::new(LimiterMetrics::new(&kept)),
            #[cfg(feature = "blocked-cache")]
            blocked: None,
            ..self.with_layers(kept)
        })
    }

    /// The decision of every layer: the kept layers' from `decided_kept`
    /// (the [`subset`](Self::subset)'s), the layers `left_out` picks
    /// reporting a would-be denial that no store made
    /// (`Source::FailClosed`).
    fn with_left_out(
        &self,
        decided_kept: Option<Decision>,
        left_out: &(dyn Fn(&Layer) -> bool + Sync),
    ) -> Decision {
        let (decided_layers, store_error) =
            decided_kept.map(Decision::into_parts).unwrap_or_default();
        let mut kept_layers = decided_layers.into_iter();
        let layers: Vec<LayerDecision> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| {
                if left_out(layer) {
                    let none = Verdict {
                        allowed: false,
                        limit: layer.policy.capacity(),
                        remaining: 0,
                        reset_after: Duration::ZERO,
                        retry_after: None,
                    };
                    let d = LayerDecision::new(layer, none, Source::FailClosed);
                    // The layers kept were counted by their own decision.
                    self.metrics.layer(i, &d);
                    d
                } else {
                    kept_layers.next().expect("one decision per layer kept")
                }
            })
            .collect();
        match store_error {
            Some(class) => Decision::degraded(layers, class),
            None => Decision::new(layers),
        }
    }
}

/// The future of [`Limiter::check`]: the decision itself. Its first poll
/// runs the common path ([`Limiter::start`]) and, when that path finishes
/// (an in-process store answering at once, nothing in shadow mode to set
/// aside, no failure), returns the decision it builds straight from the
/// poll: no state machine sits between the decision and its caller. A
/// decision that must wait keeps only the box of its rest, so the future
/// stays small, and a shadow layer's recursive re-decision needs no box of
/// its own.
struct Check<'a> {
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
    fn new(limiter: &'a Limiter, ctx: &'a Context, cost: u64) -> Self {
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
                        Some(book) => match book.resolve(ctx) {
                            planned::Resolved::Ready(limiter) => limiter,
                            #[cfg(feature = "plan-source")]
                            planned::Resolved::Fetch(cache, customer) => {
                                this.stage = Stage::Rest(Box::pin(async move {
                                    let limiter = book.fetched(cache, &customer).await;
                                    Check::new(limiter, ctx, cost).await
                                }));
                                continue;
                            }
                        },
                    };
                    // The start's lists live on this poll's stack: a
                    // decision that waits moves them into its rest.
                    let mut requests = Requests::new();
                    let mut verdicts = Verdicts::new();
                    match limiter.start(ctx, cost, &mut requests, &mut verdicts) {
                        Start::Decided => {
                            return Poll::Ready(Ok(limiter.finish(&requests, cost, &verdicts)));
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

/// One request's layers as the store sees them (up to four inline).
pub(crate) type Requests<'a> = SmallVec<[LayerRequest<'a>; 4]>;

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

/// Whether `layer` is a shadow layer this request cannot be decided by (a
/// cost above its capacity, no subject for it).
fn undecidable(layer: &Layer, ctx: &Context, cost: u64) -> bool {
    layer.policy.is_shadow()
        && (layer.policy.check_cost(cost).is_err() || ctx.key_for(layer).is_none())
}

/// Clears a half-open probe that ends without an answer (its future
/// dropped), so the next request can probe.
struct ProbeGuard<'a> {
    breaker: Option<&'a CircuitBreaker>,
}

impl ProbeGuard<'_> {
    /// The probe got its answer (the breaker was told).
    fn settled(mut self) {
        self.breaker = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker {
            breaker.abandon_probe();
        }
    }
}

/// Whether the store denied `requests` and every denying layer is in
/// shadow mode.
#[inline]
fn denied_only_by_shadow(requests: &[LayerRequest<'_>], verdicts: &[Verdict]) -> bool {
    let mut denied = requests.iter().zip(verdicts).filter(|(_, v)| !v.allowed);
    let first = denied.next();
    first.is_some_and(|(r, _)| r.policy.is_shadow()) && denied.all(|(r, _)| r.policy.is_shadow())
}

/// Decide a request its shadow layers alone denied: again, without the
/// shadow layers that denied, so the enforced layers (and the shadow
/// layers that admit) are charged exactly as if those had admitted. A
/// shadow layer that denies in a later pass is left out of the next one;
/// a denial by an enforced layer denies the request. The shadow layers
/// left out keep the verdict that left them out (they charged nothing).
/// With `holding`, each pass acquires ([`Store::acquire`]) and the answer
/// carries the holds of the pass that charged; otherwise no holds.
async fn past_shadow(
    store: &dyn Store,
    requests: &[LayerRequest<'_>],
    mut verdicts: Verdicts,
    holding: bool,
) -> Result<(Verdicts, Holds), StoreError> {
    let mut included: SmallVec<[bool; 4]> = verdicts.iter().map(|v| v.allowed).collect();
    let mut holds: Holds = requests.iter().map(|_| None).collect();
    loop {
        let slots: SmallVec<[usize; 4]> = (0..requests.len()).filter(|&i| included[i]).collect();
        let batch: SmallVec<[LayerRequest<'_>; 4]> = slots.iter().map(|&i| requests[i]).collect();
        if batch.is_empty() {
            // Only shadow layers, all denying: admitted, nothing to charge.
            return Ok((verdicts, holds));
        }
        let (again, held) = match holding {
            true => held_each(store.acquire(&batch).await, batch.len())?,
            false => (ask(store, &batch).await?, Holds::new()),
        };
        for (j, (&i, v)) in slots.iter().zip(&again).enumerate() {
            verdicts[i] = *v;
            holds[i] = held.get(j).copied().flatten();
        }
        if !denied_only_by_shadow(&batch, &again) {
            // Admitted (and charged), or denied by an enforced layer
            // (nothing charged): the answer.
            return Ok((verdicts, holds));
        }
        for (&i, v) in slots.iter().zip(&again) {
            if !v.allowed {
                included[i] = false;
            }
        }
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

/// `store`'s answer, without a boxed future when it can decide at once:
/// one verdict per layer, or a protocol error: every store call of the
/// limiter goes through here.
async fn ask(store: &dyn Store, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
    let mut verdicts = Verdicts::new();
    match store.decide_now(layers, &mut verdicts) {
        Some(answer) => answer
            .and_then(|()| one_each(&verdicts, layers.len()))
            .map(|()| verdicts),
        None => counted(store.decide(layers).await, layers.len()),
    }
}

/// `answer`, unless it does not have one verdict per layer.
pub(crate) fn counted(
    answer: Result<Verdicts, StoreError>,
    layers: usize,
) -> Result<Verdicts, StoreError> {
    let verdicts = answer?;
    one_each(&verdicts, layers)?;
    Ok(verdicts)
}

/// A protocol error unless there is one verdict per layer.
#[inline]
fn one_each(verdicts: &[Verdict], layers: usize) -> Result<(), StoreError> {
    if verdicts.len() != layers {
        return Err(StoreError::Protocol(format!(
            "{} verdicts for {} layers",
            verdicts.len(),
            layers
        )));
    }
    Ok(())
}

/// `store` wrapped for the leased layers among `layers`, when there are
/// any and the store is not in-process; leases read `clock`.
#[cfg(feature = "lease")]
fn leased(
    layers: &[Layer],
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
) -> Option<Arc<crate::leased_store::LeasedStore>> {
    let shortest = layers
        .iter()
        .filter_map(|l| l.policy.lease())
        .map(|lease| lease.duration())
        .min()?;
    if store.is_in_process() {
        return None;
    }
    let leased = crate::leased_store::LeasedStore::new(store.clone(), clock.clone(), shortest);
    Some(leased)
}

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[derive(Debug)]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    layers: Vec<Layer>,
    fallback: Option<Arc<dyn Store>>,
    breaker: BreakerConfig,
    clock: Arc<dyn Clock>,
    #[cfg(feature = "blocked-cache")]
    blocked: Option<crate::blocked::BlockedCacheConfig>,
    plans: Option<Plans>,
}

impl LimiterBuilder {
    /// Add a layer (layers are decided together; order is the report order).
    pub fn layer(mut self, name: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        self.layers.push(Layer::new(name, scope, policy));
        self
    }

    /// The in-process emergency store for layers whose policy falls back
    /// (typically a small `MemoryStore`). Required when any layer falls back.
    pub fn fallback_store(mut self, store: Arc<dyn Store>) -> Self {
        self.fallback = Some(store);
        self
    }

    /// Circuit breaker settings (default: open after 5 consecutive failures,
    /// probe after 1 s).
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Answer requests the store denied with a retry-after of at least
    /// `config.threshold` locally until that time, without a store call.
    #[cfg(feature = "blocked-cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "blocked-cache")))]
    pub fn blocked_cache(mut self, config: crate::blocked::BlockedCacheConfig) -> Self {
        self.blocked = Some(config);
        self
    }

    /// The clock the circuit breaker and blocked-key cache read (default:
    /// a [`MonotonicClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Decide each request under its customer's plan (see [`Plans`]):
    /// every plan's limits are checked when the limiter is built.
    pub fn plans(mut self, plans: Plans) -> Self {
        self.plans = Some(plans);
        self
    }

    /// Check the layers and build the limiter.
    pub fn build(self) -> Result<Limiter, BuildError> {
        if self.layers.is_empty() {
            return Err(BuildError::NoLayers);
        }
        let names = self.layers.iter().map(|l| l.name());
        let first_conflict = duplicate_names(names)
            .into_iter()
            .chain(shared_counters(&self.layers))
            .min_by_key(|(i, _)| *i);
        if let Some((_, conflict)) = first_conflict {
            return Err(conflict);
        }
        if let Some(layer) = self.layers.iter().find(|l| l.fallback.is_some()) {
            if layer.is_concurrency() {
                return Err(BuildError::ConcurrencyFallback(layer.name.to_string()));
            }
            if self.fallback.is_none() {
                return Err(BuildError::NoFallbackStore(layer.name.to_string()));
            }
        }
        let policies: Vec<&str> = self.layers.iter().map(|l| l.policy.name()).collect();
        observe::register(self.store.kind(), &policies);
        let metrics = Arc::new(LimiterMetrics::new(&self.layers));
        let breaker = Arc::new(CircuitBreaker::with_clock(self.breaker, self.clock.clone()));
        #[cfg(feature = "blocked-cache")]
        let blocked = self
            .blocked
            .map(|c| Arc::new(crate::blocked::BlockedCache::new(c)));
        let has_shadow = self.layers.iter().any(|l| l.policy.is_shadow());
        let has_concurrency = self.layers.iter().any(Layer::is_concurrency);
        #[cfg(feature = "lease")]
        let leases = leased(&self.layers, &self.store, &self.clock);
        #[cfg(feature = "lease")]
        let store = match &leases {
            Some(leases) => Arc::clone(leases) as Arc<dyn Store>,
            None => self.store,
        };
        #[cfg(not(feature = "lease"))]
        let store = self.store;
        #[cfg(feature = "concurrency")]
        let releases = Arc::new(crate::release_queue::ReleaseQueue::new(store.clone()));
        let mut limiter = Limiter {
            layers: self.layers.into(),
            store,
            fallback: self.fallback,
            breaker,
            clock: self.clock,
            #[cfg(feature = "blocked-cache")]
            blocked,
            has_shadow,
            has_concurrency,
            #[cfg(feature = "concurrency")]
            releases,
            metrics,
            plans: None,
            #[cfg(feature = "lease")]
            leases,
        };
        if let Some(plans) = self.plans {
            limiter.plans = Some(Arc::new(planned::PlanBook::build(&limiter, plans)?));
        }
        Ok(limiter)
    }
}
