//! Layers: a name, what a layer counts by (its scope), and its policy.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::decision::LayerInfo;
use crate::error::{BuildError, PolicyError};
use crate::limit::Limit;
use crate::plan::Plan;
use crate::policy::Policy;
use crate::store::KeyMiddle;

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
    pub(crate) fn label(&self) -> &str {
        match self {
            Scope::Subject => "subject",
            Scope::Tenant => "tenant",
            Scope::Global => "global",
            Scope::Attribute(name) => name,
        }
    }

    /// The scope as the limiter writes it in store keys
    /// ([`StoreKey`](crate::StoreKey)): `s`, `t`, `g`, or `a.` and the
    /// attribute's name with `%` and `:` escaped (`%25`, `%3A`), so no
    /// scope holds a `:` and no two scopes read the same.
    ///
    /// ```
    /// use tollgate_limiter::Scope;
    /// assert_eq!(Scope::Subject.key_label(), "s");
    /// assert_eq!(Scope::Attribute("route".into()).key_label(), "a.route");
    /// assert_eq!(Scope::Attribute("a:b".into()).key_label(), "a.a%3Ab");
    /// ```
    pub fn key_label(&self) -> String {
        match self {
            Scope::Subject => "s".to_string(),
            Scope::Tenant => "t".to_string(),
            Scope::Global => "g".to_string(),
            Scope::Attribute(name) => {
                format!("a.{}", name.replace('%', "%25").replace(':', "%3A"))
            }
        }
    }
}

/// One layer: a name, what it counts by, and its policy.
///
/// Its names, mode and window are kept once per process for every
/// distinct layer (a few bytes each; layers come from code and
/// configuration, not from requests), so a [`Decision`](crate::Decision)
/// refers to them without reference counting.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub(crate) name: Arc<str>,
    pub(crate) scope: Scope,
    /// Shared by the limiter's clones (a decision refers to the layer's
    /// `info` instead).
    pub(crate) policy: Arc<Policy>,
    pub(crate) fallback: Option<Policy>,
    /// What its decisions report (names, mode, window), shared by all of them.
    pub(crate) info: &'static LayerInfo,
    /// The part of its store keys that never changes, rendered and hashed.
    pub(crate) middle: KeyMiddle,
}

impl Layer {
    /// A layer named `name` counting by `scope` under `policy`.
    pub fn new(name: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        let fallback = policy.fallback_policy();
        let name: Arc<str> = name.into();
        let info = LayerInfo::interned(LayerInfo {
            layer: name.as_ref().into(),
            policy: policy.name().into(),
            shadow: policy.is_shadow(),
            window: policy.limit().window(),
            fallback_window: fallback.as_ref().and_then(|f| f.limit().window()),
            in_flight: matches!(policy.limit(), Limit::Concurrency(_)),
            plan: None,
        });
        let middle = KeyMiddle::new(&policy, scope.key_label());
        Layer {
            info,
            middle,
            name,
            scope,
            policy: Arc::new(policy),
            fallback,
        }
    }
    /// Whether the layer is a concurrency limit
    /// ([`Limit::concurrency`](crate::Limit::concurrency)): a limiter with
    /// one decides with `Limiter::acquire`.
    pub fn is_concurrency(&self) -> bool {
        matches!(self.policy.limit(), Limit::Concurrency(_))
    }

    /// The same layer under `plan`: the plan's limit for its policy, if
    /// the plan gives one (the policy's own otherwise), and the plan's name
    /// in its decisions. The keys stay the layer's: a subject's usage
    /// carries over from plan to plan, in units
    /// ([`Limit::keeping_units`]).
    pub(crate) fn under_plan(&self, plan: &Plan) -> Result<Layer, PolicyError> {
        let mut layer = match plan.limit_of(self.policy.name()) {
            Some(limit) if matches!(limit, Limit::Concurrency(_)) != self.is_concurrency() => {
                return Err(PolicyError::new(
                    "limit",
                    format!(
                        "policy {:?} counts {}: a plan can change its limit, not turn it into a {}",
                        self.policy.name(),
                        if self.is_concurrency() {
                            "requests in flight"
                        } else {
                            "requests over time"
                        },
                        if self.is_concurrency() {
                            "rate limit"
                        } else {
                            "concurrency limit"
                        },
                    ),
                ));
            }
            Some(theirs) if self.policy.limit().lease_change(theirs).is_some() => {
                return Err(PolicyError::new(
                    "limit",
                    format!(
                        "policy {:?} holds places for {:?}: a plan can change how many, not how long (the places of every plan share one count)",
                        self.policy.name(),
                        self.policy.limit().window().unwrap_or_default(),
                    ),
                ));
            }
            // A plan's layer keeps the units used when the plan changes.
            limit => match limit.unwrap_or(self.policy.limit()).keeping_units() {
                same if same == *self.policy.limit() => self.clone(),
                limit => Layer::new(
                    self.name.clone(),
                    self.scope.clone(),
                    self.policy.with_limit(limit)?,
                ),
            },
        };
        layer.info = LayerInfo::interned(LayerInfo {
            plan: Some(plan.name().as_str().into()),
            ..layer.info.clone()
        });
        Ok(layer)
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

/// Whether `limit`'s state can keep its units across a change of plan
/// ([`Limit::keeping_units`]) when plans give policy `policy` different
/// limits: refused for a token bucket whose rate is too fine to be
/// recorded with its state (at a plan change its state would be read as
/// time, and a customer moved to a slower rate would be handed units it
/// had used).
pub(crate) fn check_keeps_units(policy: &str, limit: &Limit) -> Result<(), PolicyError> {
    match limit.keeping_units() {
        Limit::TokenBucket(bucket) if !bucket.keeps_units() => Err(PolicyError::new(
            "limit",
            format!(
                "policy {policy:?}: a token bucket refilling {} per {} µs cannot record its rate with its state (at most {} per period once the two are divided by their common factors), which a change of plan needs to keep the units used: give the refill and the period a larger common factor (10,000 per second is recorded as 1 per 100 µs)",
                bucket.refill(),
                bucket.period_us(),
                crate::limit::MAX_RECORDED_REFILL,
            ),
        )),
        _ => Ok(()),
    }
}

/// The layer names of one limiter that an earlier layer already has, with
/// their index ([`BuildError::DuplicateLayer`]): a decision reports its
/// layers by name, so each must be unique.
/// [`LimiterBuilder::build`](crate::LimiterBuilder::build) refuses the
/// first; a configuration reports each where it was written.
///
/// ```
/// use tollgate_limiter::{duplicate_names, BuildError};
/// let found = duplicate_names(["key", "tenant", "key"]);
/// assert!(matches!(&found[..], [(2, BuildError::DuplicateLayer(name))] if name == "key"));
/// ```
pub fn duplicate_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<(usize, BuildError)> {
    let mut seen = HashSet::new();
    names
        .into_iter()
        .enumerate()
        .filter(|(_, name)| !seen.insert(*name))
        .map(|(i, name)| (i, BuildError::DuplicateLayer(name.to_string())))
        .collect()
}

/// The layers of one limiter that count by a policy (name and version) and
/// scope an earlier layer already counts by, with their index
/// ([`BuildError::SharedCounter`]): both would charge one counter, so every
/// request would be charged twice.
/// [`LimiterBuilder::build`](crate::LimiterBuilder::build) refuses the
/// first; a configuration reports each where it was written.
///
/// ```
/// # use std::time::Duration;
/// use tollgate_limiter::{shared_counters, BuildError, Layer, Limit, Policy, Scope};
/// let policy = Policy::new("api", Limit::gcra(10, Duration::from_secs(1), 10)?)?;
/// let layers = [
///     Layer::new("key", Scope::Subject, policy.clone()),
///     Layer::new("everyone", Scope::Global, policy.clone()),
///     Layer::new("again", Scope::Subject, policy),
/// ];
/// let found = shared_counters(&layers);
/// assert!(matches!(&found[..], [(2, BuildError::SharedCounter { first, .. })] if first == "key"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn shared_counters(layers: &[Layer]) -> Vec<(usize, BuildError)> {
    let mut counters: HashMap<(&str, u32, &Scope), &str> = HashMap::new();
    let mut found = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let counter = (layer.policy.name(), layer.policy.version(), &layer.scope);
        match counters.get(&counter) {
            Some(first) => found.push((
                i,
                BuildError::SharedCounter {
                    first: first.to_string(),
                    second: layer.name.to_string(),
                    policy: layer.policy.name().to_string(),
                },
            )),
            None => {
                counters.insert(counter, &layer.name);
            }
        }
    }
    found
}
