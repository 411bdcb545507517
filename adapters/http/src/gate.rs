//! The framework-independent middleware: identify, decide, answer.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tollgate_limiter::{
    Context, Decision, Error, Limiter, LimiterSource, RouteLimits, RouteRequirement, Scope,
};

use crate::observe;

use crate::access::{Access, AccessRules};
use crate::grpc::is_grpc;
use crate::holding::Holding;
use crate::identity::{Identity, RequestView, Supplies};
use crate::rejection::{self, RejectHook, Rejection, RejectionKind};
use crate::response::{decision_headers, HeaderStyle, Headers, Reply};
use crate::skip::Skip;

/// What to do with a request.
// A decision is plain data (up to four layers inline): an outcome is made
// once per request and matched at once, so boxing it would only allocate.
#[allow(clippy::large_enum_variant)]
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
        /// The places the request holds in concurrency layers: adapters
        /// keep it until the response body has been sent.
        holding: Holding,
    },
    /// Answer with this response; the service is not called.
    Reject(Reply),
}

type CostFn<R> = Arc<dyn Fn(&R) -> u64 + Send + Sync>;
type ErrorHook = Arc<dyn Fn(&Error) + Send + Sync>;

enum Cost<R: ?Sized> {
    Fixed(u64),
    With(CostFn<R>),
    /// The live route's own cost (from its configuration).
    Route,
}

impl<R: ?Sized> Clone for Cost<R> {
    fn clone(&self) -> Self {
        match self {
            Cost::Fixed(n) => Cost::Fixed(*n),
            Cost::With(f) => Cost::With(f.clone()),
            Cost::Route => Cost::Route,
        }
    }
}

/// A configuration that cannot work: building the gate (or the tower layer,
/// or the actix-web middleware) fails rather than answering 401 or 500 to
/// every request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// A layer counts by subject and nothing identifies requests.
    #[error("layer {layer:?} counts per subject but the identity has no source: give the builder .identity(Identity::new().client_ip(..) / .api_key(..) / .extension() / .custom(..)), or a fallback subject")]
    NoIdentity {
        /// The layer's name.
        layer: String,
    },
    /// A layer counts by tenant and no identity source can supply one
    /// (only [`Identity::extension`] and [`Identity::custom`] can).
    #[error("layer {layer:?} counts per tenant but no identity source can supply a tenant: add Identity::extension() (an authentication layer inserting a Context) or Identity::custom(..)")]
    NoTenantSource {
        /// The layer's name.
        layer: String,
    },
    /// A layer counts by a request attribute and no identity source can
    /// supply attributes.
    #[error("layer {layer:?} counts per attribute {attribute:?} but no identity source can supply attributes: add Identity::extension() or Identity::custom(..)")]
    NoAttributeSource {
        /// The layer's name.
        layer: String,
        /// The attribute's name.
        attribute: String,
    },
    /// The `WWW-Authenticate` challenge is not a valid header value.
    #[error("the unauthorized challenge {0:?} is not a valid header value (visible ASCII only)")]
    Challenge(String),
    /// Network rules ([`AccessRules`]) and no way to read the client's
    /// address: behind a proxy they would judge the proxy.
    #[error("access rules name networks but nothing reads the client's address: give the rules AccessRules::client_ip(ClientIp::direct() or ::trusted_proxies(..)), or the identity a .client_ip(..) source")]
    NetworkRulesNeedClientIp,
    /// A skip rule that can never match.
    #[error("skip rule {rule:?}: {reason}")]
    SkipRule {
        /// The rule as given.
        rule: String,
        /// Why it cannot match.
        reason: String,
    },
    /// The fixed cost can never be admitted by some layer.
    #[error("cost {cost} is outside 1..={capacity} for layer {layer:?}: every request would fail")]
    Cost {
        /// The cost configured.
        cost: u64,
        /// The layer's name.
        layer: String,
        /// That layer's capacity.
        capacity: u64,
    },
    /// The fixed cost can never be admitted by some layer under a plan.
    #[error("cost {cost} is outside 1..={capacity} for layer {layer:?} under plan {plan:?}: every request of the plan's customers would fail")]
    PlanCost {
        /// The cost configured.
        cost: u64,
        /// The layer's name.
        layer: String,
        /// The plan whose limit for the layer is too small.
        plan: String,
        /// The layer's capacity under that plan.
        capacity: u64,
    },
}

/// A [`Limiter`](tollgate_limiter::Limiter) with everything an HTTP adapter adds around it: how to
/// identify a request, what it costs, which requests are not limited, which
/// headers to send and how to answer errors. Both adapters are thin
/// wrappers over this; build one with [`Gate::builder`].
///
/// `R` is the framework's request type (`http::request::Parts` for tower,
/// `ServiceRequest` for actix-web); it is what custom identity, cost and
/// skip functions receive.
///
/// | limiter answer | response |
/// |---|---|
/// | not limited (a [skip rule](GateBuilder::skip_if), a CORS preflight) | the service's response, no rate-limit headers |
/// | admitted | the service's response, plus `RateLimit-Policy` and `RateLimit` |
/// | denied by a limit | 429, `Retry-After`, `quota-exceeded` problem with `violated-policies` |
/// | denied by a layer failing closed | 503, `Retry-After`, `temporary-reduced-capacity` problem (no `RateLimit` item for layers the store did not decide) |
/// | no identity for a layer | 401 problem with `WWW-Authenticate` |
/// | exempt by [`AccessRules`] | the service's response, no rate-limit headers |
/// | denied by [`AccessRules`] | 403 problem |
/// | any other error | 500 problem |
///
/// A gRPC call (`content-type: application/grpc…`) gets each rejection the
/// gRPC way instead (see [`Reply::grpc`]): HTTP 200, no body, `grpc-status`
/// 8, 14, 16, 7 or 13 with the same headers as metadata. An application can
/// answer its own way with [`GateBuilder::reject_with`].
pub struct Gate<R: ?Sized> {
    source: LimiterSource,
    identity: Identity<R>,
    cost: Cost<R>,
    skip: Skip<R>,
    style: HeaderStyle,
    challenge: Arc<str>,
    on_error: Option<ErrorHook>,
    on_reject: Option<RejectHook>,
    /// Exempt and denied subjects and networks.
    access: Arc<AccessRules>,
    /// What a live route's limits must give this gate's requests, held
    /// here while the route holds it weakly: a reload that fails it is
    /// refused.
    requirement: Option<Arc<RouteRequirement>>,
}

/// A request identified and costed, ready for [`Gate::decide`]. With a
/// live route it holds the route's limits as they were when it was
/// prepared: a reload meanwhile does not change its decision.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Who the request is (empty when no source identified it).
    pub context: Context,
    /// What it costs.
    pub cost: u64,
    /// Why it has no identity, when it has none (a metric label).
    unidentified: Option<&'static str>,
    /// A live route's limits, loaded once for this request.
    route: Option<Arc<RouteLimits>>,
    /// A gRPC call: rejections are answered the gRPC way.
    grpc: bool,
    /// On a deny list: refused without a decision.
    denied: bool,
}

impl Prepared {
    /// A request of `cost` units for `context`.
    pub fn new(context: Context, cost: u64) -> Self {
        Prepared {
            context,
            cost,
            unidentified: None,
            route: None,
            grpc: false,
            denied: false,
        }
    }

    /// Answer rejections of this request the gRPC way (`prepare` sets it
    /// for requests with `content-type: application/grpc…`).
    pub fn with_grpc(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    /// Whether rejections of this request are answered the gRPC way.
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }
}

/// Builds a [`Gate`] — or, through `Out`, the tower layer or the actix-web
/// middleware around one (`RateLimitLayer::builder`, `RateLimit::builder`):
/// one builder for every adapter. [`build`](Self::build) checks the
/// configuration against the limiter's layers.
pub struct GateBuilder<R: ?Sized, Out = Gate<R>> {
    gate: Gate<R>,
    out: PhantomData<fn() -> Out>,
}

impl<R: ?Sized> Gate<R> {
    /// A builder over `limiter` (a [`Limiter`](tollgate_limiter::Limiter), or a live route of a
    /// reloadable configuration): no identity source yet (building fails if
    /// a layer needs one), cost 1 (a live route's own cost), CORS
    /// preflights charged like any request, standard headers only.
    pub fn builder(limiter: impl Into<LimiterSource>) -> GateBuilder<R> {
        GateBuilder::new(limiter)
    }

    /// Where the limiter comes from.
    pub fn source(&self) -> &LimiterSource {
        &self.source
    }

    /// The identity and cost of `request` (seen through `view`), or `None`
    /// when the request is not rate limited (a skip rule matched: it is
    /// passed on without a decision and without headers). Synchronous, so
    /// adapters need not hold the request across an await.
    pub fn prepare(&self, request: &R, view: &dyn RequestView) -> Option<Prepared> {
        let ip = if self.access.has_networks() {
            self.client_addr(view)
        } else {
            None
        };
        // A denied network is refused before anything else: no skip rule
        // (nor a request shaped like a CORS preflight) lets it through.
        // Nor does an unknown address (the server recorded no peer): it
        // cannot be shown to lie outside the denied networks.
        let denied_network = match ip {
            Some(ip) => self.access.denies_network(ip),
            None => self.access.has_denied_networks(),
        };
        if denied_network {
            return Some(Prepared {
                denied: true,
                grpc: is_grpc(view),
                ..Prepared::new(Context::new(), 1)
            });
        }
        if self.skip.matches(request, view) {
            return None;
        }
        let identified = self.identity.identify(request, view);
        let mut denied = false;
        if self.access.judges() {
            // A key sent twice identifies nobody, so no subject rule can
            // match it; but an authentication layer may have accepted
            // either copy, a denied key among them. Judged first: a
            // denial wins over an exempt network.
            denied = identified.is_none()
                && self.access.has_denied_subjects()
                && self.identity.repeats_a_credential(view);
            match self
                .access
                .judge(ip, identified.as_ref().and_then(Context::subject))
            {
                // Exempt: passed on like a skipped request.
                Some(Access::Exempt) if !denied => return None,
                Some(Access::Denied) => denied = true,
                _ => {}
            }
        }
        let unidentified = match identified {
            Some(_) => None,
            None if self.identity.reads_client_ip() && view.peer_ip().is_none() => {
                Some("no_client_address")
            }
            None => Some("no_identity"),
        };
        let route = match &self.source {
            LimiterSource::Live(live) => Some(live.current()),
            LimiterSource::Fixed(_) => None,
        };
        let cost = match &self.cost {
            Cost::Fixed(n) => *n,
            Cost::With(f) => f(request),
            Cost::Route => route.as_ref().map_or(1, |r| r.cost()),
        };
        Some(Prepared {
            // No identity is not an error yet: a limiter with only global
            // layers needs none. The limiter reports a missing subject.
            context: with_extension_plan(identified.unwrap_or_default(), view),
            cost,
            unidentified,
            route,
            grpc: is_grpc(view),
            denied,
        })
    }

    /// The client's address as network rules read it: through
    /// [`AccessRules::client_ip`], else the identity's [`ClientIp`](crate::ClientIp)
    /// (building checks one of them exists when there are network rules).
    fn client_addr(&self, view: &dyn RequestView) -> Option<std::net::IpAddr> {
        let rule = self
            .access
            .own_client_ip()
            .or_else(|| self.identity.client_ip_source())?;
        rule.client_addr(view.peer_ip(), &view.header_values("x-forwarded-for"))
    }

    /// Decide a prepared request and say how to answer it.
    pub async fn decide(&self, prepared: &Prepared) -> Outcome {
        if prepared.denied {
            return Outcome::Reject(self.reject(RejectionKind::Denied, None, prepared));
        }
        let loaded;
        let limiter = match (&prepared.route, &self.source) {
            (Some(route), _) => route.limiter(),
            (None, LimiterSource::Fixed(limiter)) => limiter,
            // Prepared by hand (`Prepared::new`): the route as it is now.
            (None, LimiterSource::Live(live)) => {
                loaded = live.current();
                loaded.limiter()
            }
        };
        let (kind, decision) = match ask(limiter, prepared).await {
            Ok((decision, holding)) if decision.is_allowed() => {
                return Outcome::Allow {
                    headers: decision_headers(&decision, self.style),
                    decision,
                    holding,
                }
            }
            Ok((decision, _)) if decision.failed_closed() => {
                (RejectionKind::FailedClosed, Some(decision))
            }
            Ok((decision, _)) => (RejectionKind::Limited, Some(decision)),
            Err(error) => {
                if let Some(hook) = &self.on_error {
                    hook(&error);
                }
                match error {
                    Error::MissingSubject { .. } => {
                        let reason = prepared.unidentified.unwrap_or("no_identity");
                        observe::unidentified(
                            reason,
                            (reason == "no_client_address").then_some(NO_CLIENT_ADDRESS),
                        );
                        (RejectionKind::Unidentified, None)
                    }
                    _ => (RejectionKind::Internal, None),
                }
            }
        };
        Outcome::Reject(self.reject(kind, decision.as_ref(), prepared))
    }

    fn reject(
        &self,
        kind: RejectionKind,
        decision: Option<&Decision>,
        prepared: &Prepared,
    ) -> Reply {
        rejection::reply(
            kind,
            decision,
            prepared.grpc,
            self.style,
            &self.challenge,
            self.on_reject.as_ref(),
        )
    }
}

/// The limiter's decision of `prepared`, with the places it holds: a
/// limiter with concurrency layers acquires, any other checks.
async fn ask(limiter: &Limiter, prepared: &Prepared) -> Result<(Decision, Holding), Error> {
    if limiter.has_concurrency() {
        let acquired = limiter.acquire(&prepared.context, prepared.cost).await?;
        return Ok((acquired.decision, Holding::new(acquired.permit)));
    }
    let decision = limiter.check(&prepared.context, prepared.cost).await?;
    Ok((decision, Holding::default()))
}

/// The warning logged once when requests arrive without a client address.
const NO_CLIENT_ADDRESS: &str = "rate limiting by client address, but requests carry none: answering 401. \
    With axum 0.8, serve with into_make_service_with_connect_info::<SocketAddr>() (axum 0.7's ConnectInfo is another type and is not seen); \
    with hyper or tonic, insert a PeerAddr extension per connection (see the HTTP guide)";

impl<R: ?Sized, Out> GateBuilder<R, Out> {
    /// A builder over `limiter` whose [`build`](Self::build) yields `Out`
    /// (a [`Gate`], or an adapter built from one); see [`Gate::builder`]
    /// for the defaults.
    pub fn new(limiter: impl Into<LimiterSource>) -> Self {
        let source = limiter.into();
        let cost = match source {
            LimiterSource::Fixed(_) => Cost::Fixed(1),
            LimiterSource::Live(_) => Cost::Route,
        };
        GateBuilder {
            gate: Gate {
                source,
                identity: Identity::new(),
                cost,
                skip: Skip::default(),
                style: HeaderStyle::default(),
                challenge: Arc::from(""),
                on_error: None,
                on_reject: None,
                access: Arc::new(AccessRules::new()),
                requirement: None,
            },
            out: PhantomData,
        }
    }

    /// How requests are identified (default: no source).
    pub fn identity(mut self, identity: Identity<R>) -> Self {
        self.gate.identity = identity;
        self
    }

    /// Every request costs `cost` units (default 1, or a live route's own
    /// cost; must be between 1 and every layer's capacity). Give one route
    /// its own cost with its own gate.
    pub fn cost(mut self, cost: u64) -> Self {
        self.gate.cost = Cost::Fixed(cost);
        self
    }

    /// The cost is `f(request)`, for example by method or path (a cost
    /// outside a layer's capacity answers 500).
    pub fn cost_with(mut self, f: impl Fn(&R) -> u64 + Send + Sync + 'static) -> Self {
        self.gate.cost = Cost::With(Arc::new(f));
        self
    }

    /// Requests for which `f` is true are not rate limited: passed on
    /// without a decision, nothing charged, no headers. Rules add up (any
    /// match skips).
    pub fn skip_if(
        mut self,
        f: impl Fn(&R, &dyn RequestView) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.gate.skip = self.gate.skip.with(Arc::new(f));
        self
    }

    /// Whether CORS preflights (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`) are charged (default true). Any
    /// client can send those headers, and a route that accepts every
    /// method (axum's `any`, a tonic service, actix-web's `Resource::to`)
    /// would run its handler for one. Pass `false` so that a browser's
    /// preflight costs nothing only when a CORS layer behind the limiter
    /// answers every `OPTIONS` before any handler.
    pub fn charge_preflights(mut self, on: bool) -> Self {
        self.gate.skip = self.gate.skip.preflights(!on);
        self
    }

    /// Which headers besides the standard ones to send.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.gate.style = style;
        self
    }

    /// Also send `RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.gate.style = self.gate.style.legacy(on);
        self
    }

    /// Also send `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.gate.style = self.gate.style.x_ratelimit(on);
        self
    }

    /// Also show layers in shadow mode in the `RateLimit` headers (default:
    /// left out).
    pub fn shadow_headers(mut self, on: bool) -> Self {
        self.gate.style = self.gate.style.shadow(on);
        self
    }

    /// The `WWW-Authenticate` challenge sent with every 401 (RFC 9110
    /// requires one). Default: from the identity — `Bearer` for bearer
    /// tokens, `ApiKey header="<name>"` for an API-key header, else
    /// `Bearer`.
    pub fn unauthorized_challenge(mut self, challenge: &str) -> Self {
        self.gate.challenge = challenge.into();
        self
    }

    /// Called with every error the limiter returns, before it becomes a
    /// 401 or 500 — the place to log or count them.
    pub fn on_error(mut self, f: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.gate.on_error = Some(Arc::new(f));
        self
    }

    /// Exempt and denied subjects and networks, and methods and paths not
    /// limited (see [`AccessRules`]); rules add up over calls. Skipped and
    /// exempt requests are passed on without a decision and without
    /// headers; denied ones get 403 (gRPC: `PERMISSION_DENIED`). None of
    /// them is charged.
    pub fn access(mut self, rules: AccessRules) -> Self {
        // Skip rules join the one skip mechanism; the rules keep a copy
        // for `build` to check.
        self.gate.skip = self
            .gate
            .skip
            .methods_and_paths(rules.skip_methods.clone(), rules.skip_paths.clone());
        self.gate.access = Arc::new((*self.gate.access).clone().merge(rules));
        self
    }

    /// Answer rejections your own way: `f` sees each [`Rejection`] (why,
    /// the decision, whether it is a gRPC call, the default reply) and
    /// returns the [`Reply`] to send, or `None` for the default —
    /// `application/problem+json`, or the gRPC form for gRPC calls. Keep
    /// [`Rejection::rate_limit_headers`] in your reply: clients wait by
    /// `Retry-After`.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use tollgate_limiter::{Limit, Limiter, Policy, Scope};
    /// use tollgate_http::{Gate, Reply, RejectionKind};
    /// # let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
    /// #     .layer("all", Scope::Global, Policy::new("all", Limit::fixed_window(1, Duration::from_secs(60))?)?)
    /// #     .build()?;
    /// let gate: Gate<http::request::Parts> = Gate::builder(limiter)
    ///     .reject_with(|rejection| {
    ///         if rejection.kind() != RejectionKind::Limited || rejection.is_grpc() {
    ///             return None; // the default
    ///         }
    ///         let mut headers = rejection.rate_limit_headers();
    ///         headers.push(("content-type", "text/html".into()));
    ///         Reply::new(429, headers, "<p>Slow down.</p>").ok()
    ///     })
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reject_with(
        mut self,
        f: impl Fn(&Rejection<'_>) -> Option<Reply> + Send + Sync + 'static,
    ) -> Self {
        self.gate.on_reject = Some(Arc::new(f));
        self
    }

    /// Check the configuration against the limiter's layers and build.
    ///
    /// Fails where every request would fail: a layer counts per subject,
    /// tenant or attribute and the identity cannot supply it, or the fixed
    /// cost is outside a layer's capacity.
    pub fn build(mut self) -> Result<Out, GateError>
    where
        Out: From<Gate<R>>,
    {
        let supplies = self.gate.identity.supplies();
        let fixed = match self.gate.cost {
            Cost::Fixed(cost) => Some(cost),
            _ => None,
        };
        match &self.gate.source {
            LimiterSource::Fixed(limiter) => {
                serves(supplies, fixed, &RouteLimits::new(limiter.clone(), 1))?;
            }
            LimiterSource::Live(live) => {
                // Kept before the limits are read: a reload either meets
                // the requirement or swapped in the limits read here.
                let requirement: Arc<RouteRequirement> = Arc::new(move |limits| {
                    serves(supplies, fixed, limits).map_err(|e| e.to_string())
                });
                live.require(Arc::downgrade(&requirement));
                serves(supplies, fixed, &live.current())?;
                self.gate.requirement = Some(requirement);
            }
        }
        if self.gate.access.has_networks()
            && self.gate.access.own_client_ip().is_none()
            && self.gate.identity.client_ip_source().is_none()
        {
            return Err(GateError::NetworkRulesNeedClientIp);
        }
        if let Some((rule, reason)) = self.gate.access.invalid_skip_rule() {
            return Err(GateError::SkipRule { rule, reason });
        }
        if self.gate.challenge.is_empty() {
            self.gate.challenge = self.gate.identity.challenge().into();
        }
        if !crate::response::is_header_text(&self.gate.challenge) {
            return Err(GateError::Challenge(self.gate.challenge.to_string()));
        }
        Ok(Out::from(self.gate))
    }
}

impl<R: ?Sized, Out> fmt::Debug for GateBuilder<R, Out> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateBuilder")
            .field("gate", &self.gate)
            .finish()
    }
}

impl<R: ?Sized> Clone for Gate<R> {
    fn clone(&self) -> Self {
        Gate {
            source: self.source.clone(),
            identity: self.identity.clone(),
            cost: self.cost.clone(),
            skip: self.skip.clone(),
            style: self.style,
            challenge: self.challenge.clone(),
            on_error: self.on_error.clone(),
            on_reject: self.on_reject.clone(),
            access: self.access.clone(),
            requirement: self.requirement.clone(),
        }
    }
}

impl<R: ?Sized> fmt::Debug for Gate<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("source", &self.source)
            .field("identity", &self.identity)
            .field("skip", &self.skip)
            .field("style", &self.style)
            .field("challenge", &self.challenge)
            .field("reject_with", &self.on_reject.is_some())
            .finish_non_exhaustive()
    }
}

/// `ctx` under the plan the application's authentication put into the
/// request's extensions ([`PlanName`](tollgate_limiter::PlanName)), unless
/// the context names one already. Nothing the client sends (no header,
/// no query) can choose a plan.
fn with_extension_plan(ctx: Context, view: &dyn RequestView) -> Context {
    match view.extension_plan() {
        Some(plan) if ctx.plan().is_none() => ctx.with_plan(plan),
        _ => ctx,
    }
}

/// Whether `limits` can serve a gate's requests: every enforced layer
/// finds what it counts by among what the identity `supplies`, and a
/// `fixed` cost fits each layer (and each plan's). Shadow layers never
/// deny: a layer only they could fail on is not a configuration that
/// cannot work.
fn serves(supplies: Supplies, fixed: Option<u64>, limits: &RouteLimits) -> Result<(), GateError> {
    let enforced = limits.limiter().layers().iter();
    for layer in enforced.filter(|l| !l.policy().is_shadow()) {
        let name = layer.name().to_string();
        match layer.scope() {
            Scope::Subject if supplies == Supplies::Nothing => {
                return Err(GateError::NoIdentity { layer: name })
            }
            Scope::Tenant if supplies != Supplies::Everything => {
                return Err(GateError::NoTenantSource { layer: name })
            }
            Scope::Attribute(attribute) if supplies != Supplies::Everything => {
                return Err(GateError::NoAttributeSource {
                    layer: name,
                    attribute: attribute.to_string(),
                })
            }
            _ => {}
        }
        if let Some(cost) = fixed {
            let capacity = layer.policy().capacity();
            if cost == 0 || cost > capacity {
                return Err(GateError::Cost {
                    cost,
                    layer: name,
                    capacity,
                });
            }
        }
    }
    match fixed {
        Some(cost) => check_plan_costs(limits.limiter(), cost),
        None => Ok(()),
    }
}

/// A fixed `cost` within every enforced layer's capacity under each of
/// the limiter's plans (a plan's limit may be smaller than the layer's).
fn check_plan_costs(limiter: &Limiter, cost: u64) -> Result<(), GateError> {
    for (plan, layers) in limiter.plan_layers() {
        let enforced = layers.iter().filter(|l| !l.policy().is_shadow());
        for layer in enforced {
            let capacity = layer.policy().capacity();
            if cost > capacity {
                return Err(GateError::PlanCost {
                    cost,
                    layer: layer.name().to_string(),
                    plan: plan.to_string(),
                    capacity,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientIp, ReplyError};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tollgate_limiter::{Limit, Limiter, OnStoreFailure, Policy, Scope, Source, Store, Subject};

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

    fn extension_gate(limiter: Limiter) -> GateBuilder<()> {
        Gate::builder(limiter).identity(Identity::new().extension())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn every_answer_maps_to_its_status() {
        let errors = Arc::new(AtomicUsize::new(0));
        let seen = errors.clone();
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let gate: Gate<()> = extension_gate(limiter(store, OnStoreFailure::FailClosed))
            .on_error(move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
        let ctx = Prepared::new(Context::for_subject(Subject::new("k").unwrap()), 1);
        assert_eq!(status(&gate.decide(&ctx).await), 200);
        assert_eq!(status(&gate.decide(&ctx).await), 200);
        assert_eq!(status(&gate.decide(&ctx).await), 429);
        // No subject: 401 with a challenge; a cost above the capacity: 500.
        // Both reach the hook.
        let Outcome::Reject(reply) = gate.decide(&Prepared::new(Context::new(), 1)).await else {
            panic!("no identity")
        };
        assert_eq!(reply.status(), 401);
        assert!(reply
            .headers()
            .iter()
            .any(|(n, v)| *n == "www-authenticate" && v == "Bearer"));
        let other = Prepared::new(Context::for_subject(Subject::new("other").unwrap()), 3);
        assert_eq!(status(&gate.decide(&other).await), 500);
        assert_eq!(errors.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn store_failures_follow_the_policy() {
        let ctx = Prepared::new(Context::for_subject(Subject::new("k").unwrap()), 1);
        let closed: Gate<()> = extension_gate(limiter(
            Arc::new(tollgate_testkit::DownStore),
            OnStoreFailure::FailClosed,
        ))
        .build()
        .unwrap();
        let Outcome::Reject(reply) = closed.decide(&ctx).await else {
            panic!("fail closed admits nothing")
        };
        assert_eq!(reply.status(), 503);
        let open: Gate<()> = extension_gate(limiter(
            Arc::new(tollgate_testkit::DownStore),
            OnStoreFailure::FailOpen,
        ))
        .build()
        .unwrap();
        let Outcome::Allow { decision, .. } = open.decide(&ctx).await else {
            panic!("fail open admits")
        };
        assert_eq!(decision.layers()[0].source, Source::FailOpen);
    }

    #[test]
    fn prepare_uses_identity_cost_and_skip_rules() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let gate: Gate<http::request::Parts> =
            Gate::builder(limiter(store.clone(), OnStoreFailure::FailClosed))
                .identity(Identity::new().fallback(Subject::new("anon").unwrap()))
                .cost_with(
                    |p: &http::request::Parts| if p.method == http::Method::POST { 2 } else { 1 },
                )
                .skip_if(|p: &http::request::Parts, _| p.uri.path() == "/health")
                .build()
                .unwrap();
        let (parts, ()) = http::Request::post("/").body(()).unwrap().into_parts();
        let prepared = gate.prepare(&parts, &parts).unwrap();
        assert_eq!(prepared.context.subject().unwrap().as_str(), "anon");
        assert_eq!(prepared.cost, 2);
        let (health, ()) = http::Request::get("/health").body(()).unwrap().into_parts();
        assert!(gate.prepare(&health, &health).is_none(), "skipped");
        let (preflight, ()) = http::Request::options("/")
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .body(())
            .unwrap()
            .into_parts();
        assert!(
            gate.prepare(&preflight, &preflight).is_some(),
            "a CORS preflight is charged by default: any client can send one"
        );
        let free_preflights: Gate<http::request::Parts> =
            Gate::builder(limiter(store.clone(), OnStoreFailure::FailClosed))
                .identity(Identity::new().fallback(Subject::new("anon").unwrap()))
                .charge_preflights(false)
                .build()
                .unwrap();
        assert!(
            free_preflights.prepare(&preflight, &preflight).is_none(),
            "not charged when asked"
        );
        let (plain_options, ()) = http::Request::options("/").body(()).unwrap().into_parts();
        assert!(free_preflights
            .prepare(&plain_options, &plain_options)
            .is_some());
        // Without `Origin` it is no browser's preflight: charged.
        let (no_origin, ()) = http::Request::options("/")
            .header("access-control-request-method", "POST")
            .body(())
            .unwrap()
            .into_parts();
        assert!(free_preflights.prepare(&no_origin, &no_origin).is_some());
    }

    #[test]
    fn configurations_that_cannot_work_do_not_build() {
        let store: Arc<dyn Store> = Arc::new(tollgate_memory::MemoryStore::default());
        let err = Gate::<()>::builder(limiter(store.clone(), OnStoreFailure::FailClosed))
            .build()
            .unwrap_err();
        assert!(matches!(err, GateError::NoIdentity { .. }), "{err}");
        let tenant = Limiter::builder(store.clone())
            .layer(
                "t",
                Scope::Tenant,
                Policy::new("t", Limit::fixed_window(5, Duration::from_secs(1)).unwrap()).unwrap(),
            )
            .build()
            .unwrap();
        let err = Gate::<()>::builder(tenant.clone())
            .identity(Identity::new().client_ip(ClientIp::direct()))
            .build()
            .unwrap_err();
        assert!(matches!(err, GateError::NoTenantSource { .. }), "{err}");
        assert!(Gate::<()>::builder(tenant)
            .identity(Identity::new().extension())
            .build()
            .is_ok());
        let err = extension_gate(limiter(store, OnStoreFailure::FailClosed))
            .cost(3)
            .build()
            .unwrap_err();
        assert!(matches!(err, GateError::Cost { cost: 3, .. }), "{err}");
    }

    /// A fixed cost within the layer's own capacity but above a plan's
    /// limit would fail every request of that plan's customers (500):
    /// refused when the gate is built (before, it built).
    #[test]
    fn a_cost_above_a_plans_limit_does_not_build() {
        use tollgate_limiter::{Plan, Plans};
        let minute = Duration::from_secs(60);
        let free = Plan::new("free")
            .unwrap()
            .limit("api", Limit::fixed_window(5, minute).unwrap());
        let pro = Plan::new("pro").unwrap();
        let planned = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
            .layer(
                "key",
                Scope::Subject,
                Policy::new("api", Limit::fixed_window(100, minute).unwrap()).unwrap(),
            )
            .plans(Plans::new(free).plan(pro))
            .build()
            .unwrap();
        let err = extension_gate(planned.clone())
            .cost(10)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, GateError::PlanCost { cost: 10, plan, capacity: 5, .. } if plan == "free"),
            "{err}"
        );
        assert!(extension_gate(planned).cost(5).build().is_ok());
    }

    fn header<'a>(reply: &'a Reply, name: &str) -> Option<&'a str> {
        reply
            .headers()
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn grpc_calls_are_rejected_the_grpc_way() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let gate: Gate<http::request::Parts> =
            Gate::builder(limiter(store, OnStoreFailure::FailClosed))
                .identity(Identity::new().custom(|p: &http::request::Parts| {
                    let user = p.headers.get("x-user")?.to_str().ok()?;
                    Some(Context::for_subject(Subject::new(user).ok()?))
                }))
                .build()
                .unwrap();
        let (parts, ()) = http::Request::post("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc+proto")
            .header("x-user", "k")
            .body(())
            .unwrap()
            .into_parts();
        let prepared = gate.prepare(&parts, &parts).unwrap();
        assert!(prepared.is_grpc());
        assert_eq!(status(&gate.decide(&prepared).await), 200);
        assert_eq!(status(&gate.decide(&prepared).await), 200);
        let Outcome::Reject(reply) = gate.decide(&prepared).await else {
            panic!("the limit is 2")
        };
        // HTTP 200, no body: the status travels in grpc-status.
        assert_eq!(reply.status(), 200);
        assert_eq!(reply.body(), "");
        assert_eq!(header(&reply, "content-type"), Some("application/grpc"));
        assert_eq!(header(&reply, "grpc-status"), Some("8"));
        let message = header(&reply, "grpc-message").unwrap();
        assert!(message.contains("(policies: api)"), "{message}");
        let retry = header(&reply, "retry-after").unwrap();
        assert!(retry.parse::<u64>().unwrap() >= 1);
        assert!(header(&reply, "ratelimit").is_some());
        assert!(header(&reply, "grpc-status-details-bin").is_some());
        // No identity: UNAUTHENTICATED.
        let (anonymous, ()) = http::Request::post("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
            .into_parts();
        let prepared = gate.prepare(&anonymous, &anonymous).unwrap();
        let Outcome::Reject(reply) = gate.decide(&prepared).await else {
            panic!("no identity")
        };
        assert_eq!(
            (reply.status(), header(&reply, "grpc-status")),
            (200, Some("16"))
        );
        // gRPC-Web is another protocol: the HTTP form.
        let (web, ()) = http::Request::post("/")
            .header("content-type", "application/grpc-web")
            .body(())
            .unwrap()
            .into_parts();
        assert!(!gate.prepare(&web, &web).unwrap().is_grpc());
        // A gRPC call is a POST: any other method is answered in HTTP's
        // form whatever its content type says (a throttled GET was
        // answered 200 with an empty body, which a shared cache may keep).
        let (get, ()) = http::Request::get("/")
            .header("content-type", "application/grpc")
            .header("x-user", "k")
            .body(())
            .unwrap()
            .into_parts();
        let prepared = gate.prepare(&get, &get).unwrap();
        assert!(!prepared.is_grpc());
        assert_eq!(status(&gate.decide(&prepared).await), 429);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failing_store_is_unavailable_to_grpc() {
        let gate: Gate<()> = extension_gate(limiter(
            Arc::new(tollgate_testkit::DownStore),
            OnStoreFailure::FailClosed,
        ))
        .build()
        .unwrap();
        let prepared =
            Prepared::new(Context::for_subject(Subject::new("k").unwrap()), 1).with_grpc(true);
        let Outcome::Reject(reply) = gate.decide(&prepared).await else {
            panic!("fail closed admits nothing")
        };
        assert_eq!(
            (reply.status(), header(&reply, "grpc-status")),
            (200, Some("14"))
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_rejection_hook_answers_or_keeps_the_default() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let gate: Gate<()> = extension_gate(limiter(store, OnStoreFailure::FailClosed))
            .reject_with(|rejection| {
                if rejection.kind() != RejectionKind::Limited {
                    return None;
                }
                let decision = rejection.decision().expect("a denial has its decision");
                assert!(!decision.is_allowed());
                assert_eq!(rejection.default_reply().status(), 429);
                let mut headers = rejection.rate_limit_headers();
                headers.push(("content-type", "text/plain".into()));
                let body = format!("wait {} s", rejection.retry_after().unwrap());
                Some(Reply::new(429, headers, body).unwrap())
            })
            .build()
            .unwrap();
        let ctx = Prepared::new(Context::for_subject(Subject::new("k").unwrap()), 1);
        gate.decide(&ctx).await;
        gate.decide(&ctx).await;
        let Outcome::Reject(reply) = gate.decide(&ctx).await else {
            panic!("the limit is 2")
        };
        assert_eq!(reply.status(), 429);
        assert!(reply.body().starts_with("wait "), "{}", reply.body());
        assert_eq!(header(&reply, "content-type"), Some("text/plain"));
        assert!(header(&reply, "retry-after").is_some());
        // Not a limit: the hook keeps the default problem.
        let Outcome::Reject(reply) = gate.decide(&Prepared::new(Context::new(), 1)).await else {
            panic!("no identity")
        };
        assert_eq!(reply.status(), 401);
        assert_eq!(
            header(&reply, "content-type"),
            Some("application/problem+json")
        );
    }

    #[test]
    fn replies_of_your_own_are_checked() {
        assert!(Reply::new(429, vec![], "").is_ok());
        assert_eq!(Reply::new(99, vec![], ""), Err(ReplyError::Status(99)));
        assert_eq!(Reply::new(600, vec![], ""), Err(ReplyError::Status(600)));
        assert_eq!(
            Reply::new(429, vec![("Retry-After", "1".into())], ""),
            Err(ReplyError::HeaderName("Retry-After"))
        );
        assert_eq!(
            Reply::new(429, vec![("bad name", "1".into())], ""),
            Err(ReplyError::HeaderName("bad name"))
        );
        assert!(matches!(
            Reply::new(429, vec![("x-note", "a\nb".into())], ""),
            Err(ReplyError::HeaderValue { name: "x-note", .. })
        ));
        assert!(matches!(
            Reply::new(429, vec![("x-note", "café".into())], ""),
            Err(ReplyError::HeaderValue { name: "x-note", .. })
        ));
        assert!(Reply::new(429, vec![("x-note", "a\tb c".into())], "").is_ok());
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let challenge = extension_gate(limiter(store, OnStoreFailure::FailClosed))
            .unauthorized_challenge("Bearer realm=\"café\"")
            .build();
        assert!(matches!(challenge, Err(GateError::Challenge(_))));
        assert_eq!(
            Reply::new(429, vec![("content-length", "3".into())], "abc"),
            Err(ReplyError::FramingHeader("content-length"))
        );
        assert_eq!(
            Reply::new(204, vec![], "body"),
            Err(ReplyError::BodyNotAllowed(204))
        );
        assert!(Reply::new(204, vec![], "").is_ok());
    }

    /// A denied key sent twice (an authentication layer may accept either
    /// copy) is refused, though it identifies nobody: before, a limiter with
    /// only a global layer admitted it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_denied_key_sent_twice_is_denied() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let global = Policy::new(
            "all",
            Limit::fixed_window(100, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        let limiter = Limiter::builder(store)
            .layer("all", Scope::Global, global)
            .build()
            .unwrap();
        let key = tollgate_limiter::HashKey::new(b"0123456789abcdef").unwrap();
        let gate: Gate<http::request::Parts> = Gate::builder(limiter)
            .identity(Identity::new().api_key("x-api-key", key.clone()))
            .access(crate::AccessRules::new().deny_subject(Subject::hashed("leaked", &key)))
            .build()
            .unwrap();
        let sending = |copies: &[&str]| with_api_keys(copies);
        for copies in [&["leaked"][..], &["leaked", "leaked"], &["good", "leaked"]] {
            let parts = sending(copies);
            let prepared = gate.prepare(&parts, &parts).unwrap();
            assert_eq!(status(&gate.decide(&prepared).await), 403, "{copies:?}");
        }
        let parts = sending(&["good"]);
        let prepared = gate.prepare(&parts, &parts).unwrap();
        assert_eq!(status(&gate.decide(&prepared).await), 200, "another key");
    }

    /// A `GET /` sending each of `copies` as an `x-api-key` header.
    fn with_api_keys(copies: &[&str]) -> http::request::Parts {
        let mut request = http::Request::get("/");
        for copy in copies {
            request = request.header("x-api-key", *copy);
        }
        request.body(()).unwrap().into_parts().0
    }

    /// A denial wins over an exemption: a key sent twice from an exempt
    /// network is denied as it is from anywhere (the exemption passed it
    /// on before the repeated key was looked at, and an authentication
    /// layer behind could accept the denied copy).
    #[tokio::test(flavor = "current_thread")]
    async fn an_exempt_network_does_not_pass_a_denied_key_sent_twice() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let key = tollgate_limiter::HashKey::new(b"0123456789abcdef").unwrap();
        let gate: Gate<http::request::Parts> =
            Gate::builder(limiter(store, OnStoreFailure::FailClosed))
                .identity(Identity::new().api_key("x-api-key", key.clone()))
                .access(
                    crate::AccessRules::new()
                        .client_ip(ClientIp::direct())
                        .exempt_network("10.0.0.0/8".parse().unwrap())
                        .deny_subject(Subject::hashed("leaked", &key)),
                )
                .build()
                .unwrap();
        let sending = |copies: &[&str]| {
            let mut parts = with_api_keys(copies);
            parts
                .extensions
                .insert(crate::PeerAddr("10.1.2.3:5000".parse().unwrap()));
            parts
        };
        for copies in [&["leaked"][..], &["leaked", "leaked"], &["good", "leaked"]] {
            let parts = sending(copies);
            let prepared = gate
                .prepare(&parts, &parts)
                .unwrap_or_else(|| panic!("{copies:?}: passed on, not decided"));
            assert_eq!(status(&gate.decide(&prepared).await), 403, "{copies:?}");
        }
        let parts = sending(&["good"]);
        assert!(gate.prepare(&parts, &parts).is_none(), "exempt: passed on");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn networks_are_judged_by_the_client_address_through_trusted_proxies() {
        let store = Arc::new(tollgate_memory::MemoryStore::default());
        let proxies = ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()]);
        let gate: Gate<http::request::Parts> =
            Gate::builder(limiter(store, OnStoreFailure::FailClosed))
                .identity(Identity::new().client_ip(proxies))
                .access(
                    crate::AccessRules::new()
                        .exempt_network("192.0.2.0/24".parse().unwrap())
                        .deny_network("198.51.100.0/24".parse().unwrap()),
                )
                .build()
                .unwrap();
        let via_proxy = |client: &str| {
            let (mut parts, ()) = http::Request::get("/")
                .header("x-forwarded-for", client)
                .body(())
                .unwrap()
                .into_parts();
            parts
                .extensions
                .insert(crate::PeerAddr("10.0.0.1:5000".parse().unwrap()));
            parts
        };
        let exempt = via_proxy("192.0.2.7");
        assert!(
            gate.prepare(&exempt, &exempt).is_none(),
            "exempt: passed on"
        );
        let denied = via_proxy("198.51.100.9");
        for _ in 0..3 {
            let prepared = gate.prepare(&denied, &denied).unwrap();
            assert_eq!(status(&gate.decide(&prepared).await), 403);
        }
        // The proxy itself is neither: limited as usual.
        let other = via_proxy("203.0.113.1");
        let prepared = gate.prepare(&other, &other).unwrap();
        assert_eq!(status(&gate.decide(&prepared).await), 200);
        // The denied client was never charged: its bucket is whole.
        let limiter = match gate.source() {
            LimiterSource::Fixed(limiter) => limiter.clone(),
            _ => unreachable!("a fixed limiter"),
        };
        let subject = ClientIp::direct().subject("198.51.100.9".parse().unwrap());
        let decision = limiter
            .check(&Context::for_subject(subject), 1)
            .await
            .unwrap();
        assert_eq!(
            decision.layers()[0].verdict().remaining,
            1,
            "2 - this check's unit"
        );
        // A denied network is refused even on a skipped path.
        let gate: Gate<http::request::Parts> = Gate::builder(limiter.clone())
            .identity(Identity::new().client_ip(ClientIp::direct()))
            .access(
                crate::AccessRules::new()
                    .deny_network("198.51.100.0/24".parse().unwrap())
                    .skip_path("/health"),
            )
            .build()
            .unwrap();
        let (mut health, ()) = http::Request::get("/health").body(()).unwrap().into_parts();
        health
            .extensions
            .insert(crate::PeerAddr("198.51.100.9:5000".parse().unwrap()));
        let prepared = gate.prepare(&health, &health).expect("denied, not skipped");
        assert_eq!(status(&gate.decide(&prepared).await), 403);
        // So is a request whose address is unknown (no peer recorded: a
        // Unix socket, a server without connect info), even one an API key
        // identifies.
        let key = tollgate_limiter::HashKey::new(b"0123456789abcdef").unwrap();
        let gate: Gate<http::request::Parts> = Gate::builder(limiter)
            .identity(
                Identity::new()
                    .api_key("x-api-key", key)
                    .client_ip(ClientIp::direct()),
            )
            .access(crate::AccessRules::new().deny_network("198.51.100.0/24".parse().unwrap()))
            .build()
            .unwrap();
        let (unknown, ()) = http::Request::get("/")
            .header("x-api-key", "k")
            .body(())
            .unwrap()
            .into_parts();
        let prepared = gate.prepare(&unknown, &unknown).expect("denied");
        assert_eq!(status(&gate.decide(&prepared).await), 403);
    }

    #[test]
    fn access_rules_that_cannot_work_do_not_build() {
        let store: Arc<dyn Store> = Arc::new(tollgate_memory::MemoryStore::default());
        let limiter = limiter(store, OnStoreFailure::FailClosed);
        // Network rules with an identity that reads no client address.
        let err = extension_gate(limiter.clone())
            .access(crate::AccessRules::new().exempt_network("10.0.0.0/8".parse().unwrap()))
            .build()
            .unwrap_err();
        assert_eq!(err, GateError::NetworkRulesNeedClientIp);
        // ... unless the rules say how to read it.
        assert!(extension_gate(limiter.clone())
            .access(
                crate::AccessRules::new()
                    .client_ip(ClientIp::direct())
                    .exempt_network("10.0.0.0/8".parse().unwrap())
            )
            .build()
            .is_ok());
        let err = extension_gate(limiter)
            .access(crate::AccessRules::new().skip_path("health"))
            .build()
            .unwrap_err();
        assert!(
            matches!(err, GateError::SkipRule { ref rule, .. } if rule == "health"),
            "{err}"
        );
    }
}
