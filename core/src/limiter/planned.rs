//! A limiter with plans: one limiter per plan, sharing the store, the
//! breaker, the caches and the metrics, and the rule that picks a
//! request's plan.

use std::collections::HashMap;
use std::sync::Arc;

use super::Limiter;
use crate::context::Context;
use crate::error::BuildError;
use crate::layer::{Layer, Scope};
use crate::observe;
use crate::plan::{PlanName, Plans};
use crate::subject::Subject;

/// Every plan's limiter and how a request's plan is found.
#[derive(Debug)]
pub(crate) struct PlanBook {
    /// Every plan's limiter (its layers under the plan), the default's
    /// included.
    by_name: HashMap<PlanName, Limiter>,
    default: PlanName,
    assigned: HashMap<Subject, PlanName>,
    keyed_by: Scope,
    #[cfg(feature = "plan-source")]
    source: Option<crate::plan_source::PlanCache>,
}

/// Where a request's plan was found, or where to look for it.
pub(crate) enum Resolved<'a> {
    /// Its plan's limiter.
    Ready(&'a Limiter),
    /// Not cached: ask the plan source for this customer's plan.
    #[cfg(feature = "plan-source")]
    Fetch(&'a crate::plan_source::PlanCache, Subject),
}

impl PlanBook {
    /// Each plan's limiter over `base`'s layers, store and caches. Every
    /// policy a plan names must be a layer's, every assignment a plan's.
    pub(crate) fn build(base: &Limiter, plans: Plans) -> Result<Self, BuildError> {
        let plan_error = |plan: &PlanName, reason: String| BuildError::Plan {
            plan: plan.to_string(),
            reason,
        };
        let mut by_name = HashMap::new();
        for plan in &plans.plans {
            if let Some((policy, _)) = plan
                .limits()
                .find(|(p, _)| !base.layers.iter().any(|l| l.policy.name() == *p))
            {
                let reason = format!("it gives a limit to policy {policy:?}, which no layer uses");
                return Err(plan_error(plan.name(), reason));
            }
            let layers = base
                .layers
                .iter()
                .map(|layer| layer.under_plan(plan))
                .collect::<Result<Arc<[Layer]>, _>>()
                .map_err(|e| plan_error(plan.name(), e.to_string()))?;
            by_name.insert(plan.name().clone(), base.with_layers(layers));
        }
        if let Some((subject, plan)) = plans
            .assigned
            .iter()
            .find(|(_, p)| !by_name.contains_key(*p))
        {
            let reason =
                format!("subject {subject} is assigned to it, but no such plan is defined");
            return Err(plan_error(plan, reason));
        }
        Ok(PlanBook {
            by_name,
            default: plans.default,
            assigned: plans.assigned,
            keyed_by: plans.keyed_by,
            #[cfg(feature = "plan-source")]
            source: plans.source.map(crate::plan_source::PlanCache::new),
        })
    }

    /// The limiter of `ctx`'s plan, when it is known without waiting: the
    /// context's plan, the static table's, a cached answer of the plan
    /// source, or the default.
    pub(crate) fn resolve(&self, ctx: &Context) -> Resolved<'_> {
        if let Some(plan) = ctx.plan() {
            return Resolved::Ready(self.named(Some(plan)));
        }
        let customer = match self.keyed_by {
            Scope::Tenant => ctx.tenant(),
            _ => ctx.subject(),
        };
        let Some(customer) = customer else {
            return Resolved::Ready(self.default_plan("unassigned"));
        };
        if let Some(plan) = self.assigned.get(customer) {
            return Resolved::Ready(self.named(Some(plan)));
        }
        #[cfg(feature = "plan-source")]
        if let Some(cache) = &self.source {
            return match cache.cached(customer) {
                Some(Ok(plan)) => Resolved::Ready(self.named(plan.as_ref())),
                Some(Err(reason)) => Resolved::Ready(self.default_plan(reason)),
                None => Resolved::Fetch(cache, customer.clone()),
            };
        }
        Resolved::Ready(self.default_plan("unassigned"))
    }

    /// The limiter of `ctx`'s plan, asking the plan source when it must.
    pub(crate) async fn limiter_for(&self, ctx: &Context) -> &Limiter {
        match self.resolve(ctx) {
            Resolved::Ready(limiter) => limiter,
            #[cfg(feature = "plan-source")]
            Resolved::Fetch(cache, customer) => self.fetched(cache, &customer).await,
        }
    }

    /// The limiter of the plan the source gives `customer` (the default
    /// when it fails, hangs past its deadline or names no plan).
    #[cfg(feature = "plan-source")]
    pub(crate) async fn fetched(
        &self,
        cache: &crate::plan_source::PlanCache,
        customer: &Subject,
    ) -> &Limiter {
        match cache.fetch(customer).await {
            Ok(plan) => self.named(plan.as_ref()),
            Err(reason) => self.default_plan(reason),
        }
    }

    /// The limiter of the plan `plan` (the default when there is none, or
    /// no plan of that name).
    fn named(&self, plan: Option<&PlanName>) -> &Limiter {
        match plan {
            None => self.default_plan("unassigned"),
            Some(plan) => match self.by_name.get(plan) {
                Some(limiter) => limiter,
                None => self.default_plan("unknown_plan"),
            },
        }
    }

    /// The default plan's limiter, counted with why it was chosen.
    fn default_plan(&self, reason: &'static str) -> &Limiter {
        observe::plan_defaulted(reason);
        &self.by_name[&self.default]
    }
}
