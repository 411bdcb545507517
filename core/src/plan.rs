//! Plans: a policy's parameters per customer ("free: 60/min, pro: 600/min,
//! this customer: 5,000/min by contract").
//!
//! A [`Plan`] gives some policies another [`Limit`]; [`Plans`] names the
//! limiter's plans, its default plan, and how a request's plan is found —
//! always on the server side, never from anything the client sends:
//!
//! 1. the [`PlanName`] in the request's [`Context`](crate::Context) (the application's
//!    authentication puts it into the request's extensions; the HTTP
//!    adapters copy it into the context);
//! 2. the static table of [`Plans::assign`], by the customer's subject;
//! 3. the application's own [`PlanSource`](crate::PlanSource), cached
//!    (feature `plan-source`);
//! 4. else the default plan.
//!
//! A plan changes the limit, never the key: the key holds the policy's
//! name, version and algorithm, so a customer who changes plan keeps what
//! they used (a plan with another algorithm starts from no state, as any
//! algorithm swap does).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::PolicyError;
use crate::layer::Scope;
use crate::limit::Limit;
use crate::policy::check_name;
use crate::subject::Subject;

/// A plan's name (1–64 characters of `A-Z a-z 0-9 _ - .`). Put it into a
/// request's extensions from your authentication middleware (or into the
/// [`Context`](crate::Context) with [`Context::with_plan`](crate::Context::with_plan)) to choose the request's plan.
///
/// ```
/// use tollgate_limiter::PlanName;
/// assert_eq!(PlanName::new("pro")?.as_str(), "pro");
/// assert!(PlanName::new("no spaces").is_err());
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlanName(Arc<str>);

impl PlanName {
    /// A checked plan name.
    pub fn new(name: impl AsRef<str>) -> Result<Self, PolicyError> {
        let name = name.as_ref();
        check_name("plan", name)?;
        Ok(PlanName(name.into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PlanName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One plan: for each policy it names, the limit that replaces the
/// policy's own (any algorithm). Policies it does not name keep their own.
///
/// ```
/// # use std::time::Duration;
/// use tollgate_limiter::{Limit, Plan};
/// let minute = Duration::from_secs(60);
/// let pro = Plan::new("pro")?.limit("per-key", Limit::gcra(600, minute, 600)?);
/// // A customer's contract: the pro plan with one limit raised.
/// let acme = Plan::based_on("acme-contract", &pro)?.limit("per-key", Limit::gcra(5_000, minute, 5_000)?);
/// assert_eq!(acme.limit_of("per-key").unwrap().capacity(), 5_000);
/// assert_eq!(pro.limit_of("per-key").unwrap().capacity(), 600);
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    name: PlanName,
    limits: Vec<(Arc<str>, Limit)>,
}

impl Plan {
    /// A plan named `name` that changes no limit yet.
    pub fn new(name: impl AsRef<str>) -> Result<Self, PolicyError> {
        Ok(Plan {
            name: PlanName::new(name)?,
            limits: Vec::new(),
        })
    }

    /// A plan named `name` with every limit of `base` (then change some
    /// with [`limit`](Self::limit)): a customer's own terms.
    pub fn based_on(name: impl AsRef<str>, base: &Plan) -> Result<Self, PolicyError> {
        Ok(Plan {
            name: PlanName::new(name)?,
            limits: base.limits.clone(),
        })
    }

    /// The same plan with `limit` for the policy named `policy` (replacing
    /// an earlier one).
    pub fn limit(mut self, policy: impl AsRef<str>, limit: Limit) -> Self {
        let policy = policy.as_ref();
        self.limits.retain(|(p, _)| &**p != policy);
        self.limits.push((policy.into(), limit));
        self
    }

    /// The plan's name.
    pub fn name(&self) -> &PlanName {
        &self.name
    }

    /// The limit this plan gives the policy named `policy`, if it changes it.
    pub fn limit_of(&self, policy: &str) -> Option<&Limit> {
        self.limits
            .iter()
            .find(|(p, _)| &**p == policy)
            .map(|(_, l)| l)
    }

    /// The policies this plan changes, with their limits.
    pub fn limits(&self) -> impl Iterator<Item = (&str, &Limit)> {
        self.limits.iter().map(|(p, l)| (&**p, l))
    }
}

/// A limiter's plans: the named plans, the default, a static table of
/// subjects and their plans, and optionally the application's own source.
/// Given to [`LimiterBuilder::plans`](crate::LimiterBuilder::plans).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::sync::Arc;
/// # use std::time::Duration;
/// use tollgate_limiter::{Context, Limit, Limiter, Plan, PlanName, Plans, Policy, Scope, Subject};
/// # let store = Arc::new(tollgate_memory::MemoryStore::builder().build());
/// let minute = Duration::from_secs(60);
/// let per_key = Policy::new("per-key", Limit::fixed_window(60, minute)?)?;
/// let plans = Plans::new(Plan::new("free")?)
///     .plan(Plan::new("pro")?.limit("per-key", Limit::fixed_window(600, minute)?))
///     .assign(Subject::new("key-9")?, PlanName::new("pro")?);
/// let limiter = Limiter::builder(store)
///     .layer("key", Scope::Subject, per_key)
///     .plans(plans)
///     .build()?;
///
/// let free = Context::for_subject(Subject::new("key-1")?);
/// assert_eq!(limiter.check(&free, 1).await?.layers()[0].verdict().limit, 60);
/// let pro = Context::for_subject(Subject::new("key-9")?);
/// assert_eq!(limiter.check(&pro, 1).await?.layers()[0].verdict().limit, 600);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Plans {
    pub(crate) plans: Vec<Plan>,
    pub(crate) default: PlanName,
    pub(crate) assigned: HashMap<Subject, PlanName>,
    pub(crate) keyed_by: Scope,
    #[cfg(feature = "plan-source")]
    pub(crate) source: Option<crate::plan_source::SourceSettings>,
}

impl Plans {
    /// Plans whose default is `default`: the plan of every request no
    /// rule below assigns, and of every request whose plan cannot be found
    /// (an unknown name, a failing source).
    pub fn new(default: Plan) -> Self {
        Plans {
            default: default.name.clone(),
            plans: vec![default],
            assigned: HashMap::new(),
            keyed_by: Scope::Subject,
            #[cfg(feature = "plan-source")]
            source: None,
        }
    }

    /// The same plans with `plan` as well (replacing one of the same name).
    pub fn plan(mut self, plan: Plan) -> Self {
        self.plans.retain(|p| p.name != plan.name);
        self.plans.push(plan);
        self
    }

    /// The same plans with `subject`'s plan fixed to `plan` (a static
    /// table, as a configuration file lists it; secrets listed as their
    /// [`Subject::hashed`] form, as the limiter sees them).
    pub fn assign(mut self, subject: Subject, plan: PlanName) -> Self {
        self.assigned.insert(subject, plan);
        self
    }

    /// Plans found by the request's tenant rather than its subject (for
    /// APIs that sell plans to organisations and count per key).
    pub fn keyed_by_tenant(mut self) -> Self {
        self.keyed_by = Scope::Tenant;
        self
    }

    /// The plans, the default among them.
    pub fn plans(&self) -> &[Plan] {
        &self.plans
    }

    /// The default plan's name.
    pub fn default_plan(&self) -> &PlanName {
        &self.default
    }
}
