//! The limiter: ordered layers decided together in one store call.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use crate::decision::{Decision, LayerDecision, Source};
use crate::error::Error;
use crate::policy::Policy;
use crate::store::{LayerRequest, Store, StoreKey};
use crate::subject::Subject;

/// What a layer counts by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// The request's subject (API key id, user, client IP prefix).
    Subject,
    /// The request's tenant.
    Tenant,
    /// One counter shared by everyone.
    Global,
    /// A named attribute of the request (for example `"route"`).
    Attribute(Arc<str>),
}

impl Scope {
    fn label(&self) -> &str {
        match self {
            Scope::Subject => "subject",
            Scope::Tenant => "tenant",
            Scope::Global => "global",
            Scope::Attribute(name) => name,
        }
    }
}

/// One layer: a name, what it counts by, and its policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    name: Arc<str>,
    scope: Scope,
    policy: Policy,
}

impl Layer {
    /// A layer named `name` counting by `scope` under `policy`.
    pub fn new(name: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        Layer {
            name: name.into(),
            scope,
            policy,
        }
    }
    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the layer counts by.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// The layer's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// Who a request is: the subjects its layers count by.
///
/// ```
/// use tollgate_core::{Context, Subject};
/// let ctx = Context::new()
///     .with_subject(Subject::new("key-7")?)
///     .with_tenant(Subject::new("acme")?);
/// # Ok::<(), tollgate_core::SubjectError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    subject: Option<Subject>,
    tenant: Option<Subject>,
    attributes: Vec<(Arc<str>, Subject)>,
}

impl Context {
    /// An empty context (only global layers can decide it).
    pub fn new() -> Self {
        Context::default()
    }
    /// A context with only a subject.
    pub fn subject(subject: Subject) -> Self {
        Context::new().with_subject(subject)
    }
    /// Set the subject.
    pub fn with_subject(mut self, subject: Subject) -> Self {
        self.subject = Some(subject);
        self
    }
    /// Set the tenant.
    pub fn with_tenant(mut self, tenant: Subject) -> Self {
        self.tenant = Some(tenant);
        self
    }
    /// Set a named attribute (for [`Scope::Attribute`]).
    pub fn with_attribute(mut self, name: impl Into<Arc<str>>, value: Subject) -> Self {
        let name = name.into();
        self.attributes.retain(|(n, _)| *n != name);
        self.attributes.push((name, value));
        self
    }
    /// The subject, if any.
    pub fn get_subject(&self) -> Option<&Subject> {
        self.subject.as_ref()
    }
    /// The tenant, if any.
    pub fn get_tenant(&self) -> Option<&Subject> {
        self.tenant.as_ref()
    }

    fn get_attribute(&self, name: &str) -> Option<&Subject> {
        self.attributes
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v)
    }

    /// The store key of `layer` for this request, or `None` when the request
    /// lacks what the layer counts by. Keys of one tenant share its hash tag.
    fn key_for<'a>(&'a self, layer: &'a Layer) -> Option<StoreKey<'a>> {
        let scope = layer.scope.label();
        let (tag, subject) = match &layer.scope {
            Scope::Subject => {
                let subject = self.subject.as_ref()?;
                (
                    self.tenant.as_ref().unwrap_or(subject).as_str(),
                    subject.as_str(),
                )
            }
            Scope::Tenant => {
                let tenant = self.tenant.as_ref()?.as_str();
                (tenant, tenant)
            }
            Scope::Global => ("global", "global"),
            Scope::Attribute(name) => {
                let value = self.get_attribute(name)?.as_str();
                (value, value)
            }
        };
        Some(StoreKey::new(tag, &layer.policy, scope, subject))
    }
}

/// An ordered list of layers over one store. `check` decides all layers in
/// one store call: admitted only if every layer admits, and then every layer
/// is charged; otherwise nothing is charged.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::sync::Arc;
/// # use tollgate_core::*;
/// # #[derive(Debug)] struct AlwaysYes;
/// # #[async_trait::async_trait] impl Store for AlwaysYes {
/// #   fn kind(&self) -> &'static str { "yes" }
/// #   async fn decide(&self, l: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError> {
/// #     Ok(l.iter().map(|r| Verdict { allowed: true, limit: r.policy.capacity(), remaining: 0,
/// #       reset_after: std::time::Duration::ZERO, retry_after: None }).collect()) } }
/// # let store: Arc<dyn Store> = Arc::new(AlwaysYes);
/// use std::time::Duration;
/// let per_key = Policy::new("per-key", Limit::gcra(10, Duration::from_secs(1), 20)?)?;
/// let global = Policy::new("global", Limit::fixed_window(10_000, Duration::from_secs(60))?)?;
/// let limiter = Limiter::builder(store)
///     .layer("key", Scope::Subject, per_key)
///     .layer("all", Scope::Global, global)
///     .build()?;
/// let decision = limiter.check(&Context::subject(Subject::new("key-7")?), 1).await?;
/// assert!(decision.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    layers: Arc<[Layer]>,
    store: Arc<dyn Store>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("layers", &self.layers)
            .field("store", &self.store.kind())
            .finish()
    }
}

impl Limiter {
    /// Start a limiter over `store`.
    pub fn builder(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder {
            store,
            layers: Vec::new(),
        }
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Decide a request of `cost` units for `ctx`.
    ///
    /// Errors are for bad input (a cost outside 1..=capacity, a missing
    /// subject) and store failures; being denied is `Ok` with
    /// [`Decision::is_allowed`] false.
    pub async fn check(&self, ctx: &Context, cost: u64) -> Result<Decision, Error> {
        let mut requests = Vec::with_capacity(self.layers.len());
        for layer in self.layers.iter() {
            layer.policy.check_cost(cost)?;
            let key = ctx.key_for(layer).ok_or_else(|| Error::MissingSubject {
                layer: layer.name.to_string(),
                scope: layer.scope.label().to_string(),
            })?;
            requests.push(LayerRequest {
                key,
                policy: &layer.policy,
                cost,
            });
        }
        let verdicts = self.store.decide(&requests).await?;
        if verdicts.len() != self.layers.len() {
            return Err(crate::StoreError::Protocol(format!(
                "{} verdicts for {} layers",
                verdicts.len(),
                self.layers.len()
            ))
            .into());
        }
        let layers = self
            .layers
            .iter()
            .zip(verdicts)
            .map(|(layer, v)| LayerDecision {
                layer: layer.name.clone(),
                policy: layer.policy.clone(),
                allowed: v.allowed,
                limit: v.limit,
                remaining: v.remaining,
                reset_after: v.reset_after,
                retry_after: v.retry_after,
                source: Source::Store,
            })
            .collect();
        Ok(Decision::new(layers))
    }
}

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[derive(Debug)]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    layers: Vec<Layer>,
}

impl LimiterBuilder {
    /// Add a layer (layers are decided together; order is the report order).
    pub fn layer(mut self, name: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        self.layers.push(Layer::new(name, scope, policy));
        self
    }

    /// Check the layers and build the limiter.
    pub fn build(self) -> Result<Limiter, Error> {
        if self.layers.is_empty() {
            return Err(Error::NoLayers);
        }
        let mut names = HashSet::new();
        let mut counters = HashSet::new();
        for layer in &self.layers {
            if !names.insert(layer.name.clone()) {
                return Err(Error::DuplicateLayer(layer.name.to_string()));
            }
            // Two layers with the same policy and scope would share one counter.
            if !counters.insert((
                layer.policy.name().to_string(),
                layer.policy.version(),
                layer.scope.clone(),
            )) {
                return Err(Error::DuplicateLayer(layer.name.to_string()));
            }
        }
        Ok(Limiter {
            layers: self.layers.into(),
            store: self.store,
        })
    }
}
