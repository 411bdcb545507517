//! The limiter: ordered layers decided together in one store call.

#[cfg(feature = "concurrency")]
mod acquire;
mod at_fault;
mod builder;
mod check;
mod degraded;
#[cfg(feature = "concurrency")]
mod detached;
mod planned;
mod shadow;
pub(crate) use shadow::undecidable;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::context::Context;
use crate::decide::{ask, one_each, Decide};
use crate::decision::Decision;
use crate::error::{Error, StoreError};
use crate::failure::{Admission, BreakerState, CircuitBreaker};
use crate::layer::Layer;
use crate::observe::{self, LimiterMetrics};
use crate::store::{LayerRequest, Store};
use crate::time::Clock;
use crate::verdicts::Verdicts;
#[cfg(feature = "concurrency")]
pub use acquire::Acquired;
pub use builder::LimiterBuilder;
use check::Check;
use shadow::{denied_only_by_shadow, past_shadow, Passes};

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
/// #   fn decide<'a>(&'a self, l: &'a [LayerRequest<'a>], out: &'a mut Verdicts) -> Decide<'a> {
/// #     out.extend(l.iter().map(|r| Verdict { allowed: true, limit: r.policy.capacity(), remaining: 0,
/// #       reset_after: std::time::Duration::ZERO, retry_after: None }));
/// #     Decide::Now(Ok(())) } }
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
        LimiterBuilder::new(store)
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

    /// Every plan's limiter (none without plans).
    pub(crate) fn plan_limiters(&self) -> impl Iterator<Item = &Limiter> {
        self.plans.iter().flat_map(|book| book.limiters())
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

    /// Each plan's name and layers, in order, each layer under its plan's
    /// limit ([`Plans`](crate::Plans)): what a request may be decided
    /// under. Empty without plans ([`layers`](Self::layers) then). A
    /// setting checked against [`layers`](Self::layers) alone (a fixed
    /// cost within a layer's capacity) may still fail under a plan with a
    /// smaller limit.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// use tollgate_limiter::{Limit, Limiter, Plan, Plans, Policy, Scope};
    /// let minute = Duration::from_secs(60);
    /// let free = Plan::new("free")?.limit("api", Limit::fixed_window(10, minute)?);
    /// let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
    ///     .layer("key", Scope::Subject, Policy::new("api", Limit::fixed_window(600, minute)?)?)
    ///     .plans(Plans::new(free))
    ///     .build()?;
    /// let (plan, layers) = limiter.plan_layers().next().unwrap();
    /// assert_eq!((plan, layers[0].policy().capacity()), ("free", 10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn plan_layers(&self) -> impl Iterator<Item = (&str, &[Layer])> {
        self.plans
            .iter()
            .flat_map(|book| book.plans())
            .map(|(name, limiter)| (name.as_str(), limiter.layers()))
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
    /// [`Decision::failed_closed`] and [`LayerDecision::source`](crate::LayerDecision::source)).
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
    /// (no store call is made), with the verdicts written into `verdicts`
    /// (received empty); `None` otherwise, or without leases.
    #[cold]
    fn leases_answer(
        &self,
        requests: &Requests<'_>,
        verdicts: &mut Verdicts,
    ) -> Option<Result<(), StoreError>> {
        if !self.answers_from_leases() {
            return None;
        }
        // A `Later` answer does nothing until polled: dropped, it calls
        // no store.
        let Decide::Now(answer) = self.store.decide(requests, verdicts) else {
            return None;
        };
        Some(answer.and_then(|()| one_each(verdicts, requests.len())))
    }

    /// The answer of a store that decides at once (in-process), with the
    /// verdicts written into `verdicts` in place (the answer is not moved);
    /// `None` when the store must be waited for (then nothing was decided:
    /// the waiting path asks again).
    #[inline(always)]
    fn answer_at_once(
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
        let Decide::Now(answer) = self.store.decide(requests, verdicts) else {
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
        let call = ask(&*self.store, &requests);
        let answer = self.store_call(admission, call).await;
        self.settle(ctx, cost, requests, answer, Passes::Timed(self))
            .await
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

    /// A later pass of a request (past a shadow layer's denial): not
    /// admitted by the breaker again (the first pass was let through), but
    /// timed and counted as its first store call was, and the breaker told
    /// how it went: an outage met there counts as any other.
    pub(crate) async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = self.metrics.start();
        let answer = call.await;
        self.after_call(Admission::Call, started, answer.as_ref().err());
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
    /// set aside, failures decided by each layer's failure mode. A
    /// request's later passes ask the store as `passes` says (timed when
    /// its first call was).
    async fn settle(
        &self,
        ctx: &Context,
        cost: u64,
        requests: Requests<'_>,
        answer: Result<Verdicts, StoreError>,
        passes: Passes<'_>,
    ) -> Result<Decision, Error> {
        // A request denied only by shadow layers passes: decide it again
        // without them, so the enforced layers are charged.
        let answer = match answer {
            Ok(verdicts) if denied_only_by_shadow(&requests, &verdicts) => {
                past_shadow(passes, &requests, verdicts)
                    .await
                    .map(|(verdicts, _)| verdicts)
            }
            other => other,
        };
        // A store error about a shadow policy alone (its key holds foreign
        // data, its key budget is full) does not fail the enforced layers.
        if let Some(name) = answer.as_ref().err().and_then(|e| self.shadow_at_fault(e)) {
            let named = |l: &Layer| l.policy.name() == name;
            return Box::pin(self.without(ctx, cost, &named)).await;
        }
        // One about an enforced policy fails its layers alone.
        if let Err(error) = &answer {
            if let Some(name) = self.enforced_at_fault(error) {
                return Box::pin(self.despite_fault(ctx, cost, &requests, name, error)).await;
            }
        }
        match answer {
            Ok(verdicts) => Ok(self.decision_of(&requests, cost, &verdicts)),
            Err(error) => {
                let decision = self.degraded(&requests, &error).await;
                Ok(self.recorded(&requests, cost, decision))
            }
        }
    }

    /// The decision of the store's `verdicts`, [`recorded`](Self::recorded).
    #[inline]
    fn decision_of(
        &self,
        requests: &[LayerRequest<'_>],
        cost: u64,
        verdicts: &[Verdict],
    ) -> Decision {
        let decision = Decision::of_store(&self.layers, verdicts);
        self.recorded(requests, cost, decision)
    }

    /// `decision`, remembered when the blocked-key cache should, and
    /// counted: every decision of the limiter's own store passes here.
    #[inline]
    fn recorded(&self, requests: &[LayerRequest<'_>], cost: u64, decision: Decision) -> Decision {
        #[cfg(feature = "blocked-cache")]
        if let (Some(cache), false) = (&self.blocked, decision.is_allowed()) {
            cache.remember(requests, cost, &decision, &*self.clock);
        }
        let _ = (requests, cost);
        self.metrics.decision(&decision);
        decision
    }
}

/// One request's layers as the store sees them (up to four inline).
pub(crate) type Requests<'a> = SmallVec<[LayerRequest<'a>; 4]>;

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
