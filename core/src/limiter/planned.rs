//! A limiter with plans: one limiter per plan, sharing the store, the
//! breaker, the caches and the metrics, and the rule that picks a
//! request's plan.

use std::collections::HashMap;
use std::sync::Arc;

use super::Limiter;
use crate::context::Context;
use crate::error::{BuildError, PolicyError};
use crate::layer::{Layer, Scope};
use crate::observe;
use crate::plan::{PlanName, Plans};
use crate::subject::Subject;

/// Every plan's limiter and how a request's plan is found.
#[derive(Debug)]
pub(crate) struct PlanBook {
    /// Every plan's limiter (its layers under the plan), the default's
    /// included. Plans are few: found by name in a short scan.
    plans: Vec<(PlanName, Limiter)>,
    /// The default plan's index.
    default: usize,
    /// The static table: a customer's plan index.
    assigned: HashMap<Subject, usize, foldhash::fast::RandomState>,
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
        units_can_be_kept(base, &plans).map_err(|(plan, e)| plan_error(plan, e.to_string()))?;
        let mut limiters = Vec::new();
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
            limiters.push((plan.name().clone(), base.with_layers(layers)));
        }
        let index_of = |name: &PlanName| limiters.iter().position(|(n, _)| n == name);
        let mut assigned = HashMap::default();
        for (subject, plan) in &plans.assigned {
            let Some(index) = index_of(plan) else {
                let reason =
                    format!("subject {subject} is assigned to it, but no such plan is defined");
                return Err(plan_error(plan, reason));
            };
            assigned.insert(subject.clone(), index);
        }
        Ok(PlanBook {
            default: index_of(&plans.default).expect("Plans holds its default"),
            plans: limiters,
            assigned,
            keyed_by: plans.keyed_by,
            #[cfg(feature = "plan-source")]
            source: plans.source.map(crate::plan_source::PlanCache::new),
        })
    }

    /// Every plan's limiter, the default's included.
    pub(crate) fn limiters(&self) -> impl Iterator<Item = &Limiter> {
        self.plans.iter().map(|(_, limiter)| limiter)
    }

    /// Every plan, the default's included, with its limiter.
    pub(crate) fn plans(&self) -> impl Iterator<Item = (&PlanName, &Limiter)> {
        self.plans.iter().map(|(name, limiter)| (name, limiter))
    }

    /// The limiter of `ctx`'s plan, when it is known without waiting: the
    /// context's plan, the static table's, a cached answer of the plan
    /// source, or the default.
    #[inline]
    pub(crate) fn resolve(&self, ctx: &Context) -> Resolved<'_> {
        if let Some(plan) = ctx.plan() {
            return Resolved::Ready(match self.index_of(plan) {
                Some(i) => &self.plans[i].1,
                None => self.default_plan("unknown_plan"),
            });
        }
        let customer = match self.keyed_by {
            Scope::Tenant => ctx.tenant(),
            _ => ctx.subject(),
        };
        let Some(customer) = customer else {
            return Resolved::Ready(self.default_plan("unassigned"));
        };
        if let Some(&i) = self.assigned.get(customer) {
            return Resolved::Ready(&self.plans[i].1);
        }
        #[cfg(feature = "plan-source")]
        if let Some(cache) = &self.source {
            return match cache.cached(customer) {
                Some(answer) => Resolved::Ready(self.answered(answer)),
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
        let answer = cache.fetch(customer, |name| self.index_of(name)).await;
        self.answered(answer)
    }

    /// The limiter of the source's `answer`.
    #[cfg(feature = "plan-source")]
    #[inline]
    fn answered(&self, answer: crate::plan_source::Answer) -> &Limiter {
        use crate::plan_source::Answer;
        match answer {
            Answer::Plan(i) => &self.plans[i as usize].1,
            Answer::Default => self.default_plan("unassigned"),
            Answer::Failed(why) => self.default_plan(why.as_str()),
        }
    }

    /// The index of the plan named `name`, if the limiter has one.
    #[inline]
    fn index_of(&self, name: &PlanName) -> Option<usize> {
        self.plans.iter().position(|(n, _)| n == name)
    }

    /// The default plan's limiter, counted with why it was chosen.
    #[inline]
    fn default_plan(&self, reason: &'static str) -> &Limiter {
        observe::plan_defaulted(reason);
        &self.plans[self.default].1
    }
}

/// Every limit of a policy that some plan changes keeps its units across a
/// change of plan (see [`check_keeps_units`](crate::layer::check_keeps_units)):
/// the policy's own (the default plan's, and any plan's that leaves it
/// alone) and each plan's; an error names the plan. A policy no plan
/// changes keeps one rate, whatever plan its customers change to.
fn units_can_be_kept<'p>(
    base: &Limiter,
    plans: &'p Plans,
) -> Result<(), (&'p PlanName, PolicyError)> {
    for layer in base.layers.iter() {
        let policy = layer.policy.name();
        let changes: Vec<(&PlanName, &crate::Limit)> = plans
            .plans
            .iter()
            .filter_map(|plan| Some((plan.name(), plan.limit_of(policy)?)))
            .collect();
        if changes.is_empty() {
            continue;
        }
        let own = [(&plans.default, layer.policy.limit())];
        for (plan, limit) in own.into_iter().chain(changes) {
            crate::layer::check_keeps_units(policy, limit).map_err(|e| (plan, e))?;
        }
    }
    Ok(())
}
