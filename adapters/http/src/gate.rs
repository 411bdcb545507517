//! The framework-independent middleware: identify, decide, answer.

use std::fmt;
use std::sync::Arc;

use tollgate_core::{Context, Decision, Error, Limiter};

use crate::identity::{Identity, RequestView};
use crate::response::{decision_headers, HeaderStyle, Headers, Reply};

/// What to do with a request.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Call the service, then add `headers` to its response.
    Allow {
        /// The decision (adapters put it into the request extensions, so
        /// handlers can read it).
        decision: Decision,
        /// `RateLimit-Policy`, `RateLimit` and the optional legacy headers.
        headers: Headers,
    },
    /// Answer with this response; the service is not called.
    Reject(Reply),
}

type CostFn<R> = Arc<dyn Fn(&R) -> u64 + Send + Sync>;
type ErrorHook = Arc<dyn Fn(&Error) + Send + Sync>;

enum Cost<R: ?Sized> {
    Fixed(u64),
    With(CostFn<R>),
}

impl<R: ?Sized> Clone for Cost<R> {
    fn clone(&self) -> Self {
        match self {
            Cost::Fixed(n) => Cost::Fixed(*n),
            Cost::With(f) => Cost::With(f.clone()),
        }
    }
}

/// A [`Limiter`] with everything an HTTP adapter adds around it: how to
/// identify a request, what it costs, which headers to send and how to
/// answer errors. Both adapters are thin wrappers over this.
///
/// `R` is the framework's request type (`http::request::Parts` for tower,
/// `ServiceRequest` for actix-web); it is what custom identity and cost
/// functions receive.
///
/// | limiter answer | response |
/// |---|---|
/// | admitted | the service's response, plus `RateLimit-Policy` and `RateLimit` |
/// | denied by a limit | 429, `Retry-After`, `quota-exceeded` problem with `violated-policies` |
/// | denied by a layer failing closed | 503, `temporary-reduced-capacity` problem |
/// | store error (no failure mode applied) | 503 problem |
/// | no identity for a layer | 401 problem (or the identity's fallback subject) |
/// | any other error | 500 problem |
pub struct Gate<R: ?Sized> {
    limiter: Limiter,
    identity: Identity<R>,
    cost: Cost<R>,
    style: HeaderStyle,
    challenge: Option<Arc<str>>,
    on_error: Option<ErrorHook>,
}

impl<R: ?Sized> Gate<R> {
    /// A gate over `limiter`: identity from the request extensions only
    /// ([`Identity::default`]), cost 1, standard headers only.
    pub fn new(limiter: Limiter) -> Self {
        Gate {
            limiter,
            identity: Identity::default(),
            cost: Cost::Fixed(1),
            style: HeaderStyle::default(),
            challenge: None,
            on_error: None,
        }
    }

    /// How requests are identified.
    pub fn identity(mut self, identity: Identity<R>) -> Self {
        self.identity = identity;
        self
    }

    /// Every request costs `cost` units (default 1; must be between 1 and
    /// every layer's capacity, or requests get a 500). Give one route its own
    /// cost by wrapping it in its own layer.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// The cost is `f(request)`, for example by method or path.
    pub fn cost_with(mut self, f: impl Fn(&R) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Cost::With(Arc::new(f));
        self
    }

    /// Which headers besides the standard ones to send.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.style = style;
        self
    }

    /// Also send `RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.style = self.style.legacy(on);
        self
    }

    /// Also send `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.style = self.style.x_ratelimit(on);
        self
    }

    /// The `WWW-Authenticate` value sent with 401 (for example `Bearer`).
    pub fn unauthorized_challenge(mut self, challenge: &str) -> Self {
        self.challenge = Some(challenge.into());
        self
    }

    /// Called with every error the limiter returns, before it becomes a
    /// 401, 500 or 503 — the place to log or count them. Log
    /// [`StoreError::class`](tollgate_core::StoreError::class) rather than the
    /// message when the message may name hosts.
    pub fn on_error(mut self, f: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(f));
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The identity and cost of `request` (seen through `view`). Synchronous,
    /// so adapters need not hold the request across an await.
    pub fn prepare(&self, request: &R, view: &dyn RequestView) -> (Context, u64) {
        // No identity is not an error yet: a limiter with only global layers
        // needs none. The limiter reports a missing subject, which becomes 401.
        let ctx = self.identity.identify(request, view).unwrap_or_default();
        let cost = match &self.cost {
            Cost::Fixed(n) => *n,
            Cost::With(f) => f(request),
        };
        (ctx, cost)
    }

    /// Decide a request and say how to answer it.
    pub async fn decide(&self, ctx: &Context, cost: u64) -> Outcome {
        match self.limiter.check(ctx, cost).await {
            Ok(decision) if decision.is_allowed() => Outcome::Allow {
                headers: decision_headers(&decision, self.style),
                decision,
            },
            Ok(decision) if decision.failed_closed() => {
                Outcome::Reject(Reply::failed_closed(&decision, self.style))
            }
            Ok(decision) => Outcome::Reject(Reply::too_many_requests(&decision, self.style)),
            Err(error) => {
                if let Some(hook) = &self.on_error {
                    hook(&error);
                }
                Outcome::Reject(match error {
                    Error::MissingSubject { .. } => Reply::unidentified(self.challenge.as_deref()),
                    Error::Store(_) => Reply::store_unavailable(),
                    _ => Reply::internal_error(),
                })
            }
        }
    }
}

impl<R: ?Sized> Clone for Gate<R> {
    fn clone(&self) -> Self {
        Gate {
            limiter: self.limiter.clone(),
            identity: self.identity.clone(),
            cost: self.cost.clone(),
            style: self.style,
            challenge: self.challenge.clone(),
            on_error: self.on_error.clone(),
        }
    }
}

impl<R: ?Sized> fmt::Debug for Gate<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("limiter", &self.limiter)
            .field("identity", &self.identity)
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tollgate_core::{
        async_trait, LayerRequest, Limit, OnStoreFailure, Policy, Scope, Source, Store, StoreError,
        Subject, Verdict,
    };

    #[derive(Debug)]
    struct Down;

    #[async_trait]
    impl Store for Down {
        fn kind(&self) -> &'static str {
            "down"
        }
        async fn decide(&self, _: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError> {
            Err(StoreError::Unavailable("down".into()))
        }
    }

    fn limiter(store: Arc<dyn Store>, mode: OnStoreFailure) -> Limiter {
        let policy = Policy::new(
            "api",
            Limit::fixed_window(2, Duration::from_secs(60)).unwrap(),
        )
        .unwrap()
        .with_on_failure(mode)
        .unwrap();
        Limiter::builder(store)
            .layer("key", Scope::Subject, policy)
            .build()
            .unwrap()
    }

    fn status(outcome: &Outcome) -> u16 {
        match outcome {
            Outcome::Allow { .. } => 200,
            Outcome::Reject(reply) => reply.status(),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn every_answer_maps_to_its_status() {
        let errors = Arc::new(AtomicUsize::new(0));
        let seen = errors.clone();
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let gate: Gate<()> =
            Gate::new(limiter(store, OnStoreFailure::FailClosed)).on_error(move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            });
        let ctx = Context::subject(Subject::new("k").unwrap());
        assert_eq!(status(&gate.decide(&ctx, 1).await), 200);
        assert_eq!(status(&gate.decide(&ctx, 1).await), 200);
        assert_eq!(status(&gate.decide(&ctx, 1).await), 429);
        // No subject: 401; a cost above the capacity: 500. Both reach the hook.
        assert_eq!(status(&gate.decide(&Context::new(), 1).await), 401);
        let other = Context::subject(Subject::new("other").unwrap());
        assert_eq!(status(&gate.decide(&other, 3).await), 500);
        assert_eq!(errors.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn store_failures_follow_the_policy() {
        let ctx = Context::subject(Subject::new("k").unwrap());
        let closed: Gate<()> = Gate::new(limiter(Arc::new(Down), OnStoreFailure::FailClosed));
        let Outcome::Reject(reply) = closed.decide(&ctx, 1).await else {
            panic!("fail closed admits nothing")
        };
        assert_eq!(reply.status(), 503);
        let open: Gate<()> = Gate::new(limiter(Arc::new(Down), OnStoreFailure::FailOpen));
        let Outcome::Allow { decision, headers } = open.decide(&ctx, 1).await else {
            panic!("fail open admits")
        };
        assert_eq!(decision.layers()[0].source, Source::FailOpen);
        assert!(!headers.is_empty());
    }

    #[test]
    fn prepare_uses_identity_and_cost() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let gate: Gate<http::request::Parts> =
            Gate::new(limiter(store, OnStoreFailure::FailClosed))
                .identity(Identity::new().fallback(Subject::new("anon").unwrap()))
                .cost_with(
                    |p: &http::request::Parts| if p.method == http::Method::POST { 2 } else { 1 },
                );
        let (parts, ()) = http::Request::post("/").body(()).unwrap().into_parts();
        let (ctx, cost) = gate.prepare(&parts, &parts);
        assert_eq!(ctx.get_subject().unwrap().as_str(), "anon");
        assert_eq!(cost, 2);
    }
}
