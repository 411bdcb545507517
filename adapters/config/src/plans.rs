//! The `[plans]` section: a policy's limits per customer.
//!
//! ```toml
//! [plans]
//! default = "free"          # the plan of every customer nothing else places
//! keyed_by = "subject"      # or "tenant": whose plan a request is decided under
//!
//! [plans.assign]            # the static table: subject = plan
//! "h.5f1c0e9a2b7d4c3e8f6a1b0c9d8e7f6a" = "enterprise"
//!
//! [plans.limits.pro.search] # plan "pro" gives policy "search" this limit
//! algorithm = "fixed_window"
//! limit = 600
//! window = "1m"
//! ```
//!
//! A plan gives some policies another limit (any algorithm); the others
//! keep the policy's own. Every route's limiter decides under the plans
//! (a plan's limits for policies a route does not use are ignored there).

use std::collections::BTreeMap;

use serde::Deserialize;
use tollgate_limiter::{Plan, PlanName, Plans, Policy, PolicyError, Subject};
use toml::{Table, Value};

use crate::spec::{de, limit};
use crate::{field_error, RouteDef};

/// The plans of a configuration file, as every route's limiter takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct PlansDef {
    default: Plan,
    others: Vec<Plan>,
    assigned: Vec<(Subject, PlanName)>,
    by_tenant: bool,
}

impl PlansDef {
    /// The plans for a limiter whose layers count by `policies`: each plan
    /// with only its limits for those policies.
    pub fn for_policies<'p>(&self, policies: impl Iterator<Item = &'p str> + Clone) -> Plans {
        let keep = |plan: &Plan| {
            let mut kept = Plan::new(plan.name().as_str()).expect("a checked name");
            for (policy, limit) in plan.limits() {
                if policies.clone().any(|p| p == policy) {
                    kept = kept.limit(policy, limit.clone());
                }
            }
            kept
        };
        let mut plans = Plans::new(keep(&self.default));
        for plan in &self.others {
            plans = plans.plan(keep(plan));
        }
        for (subject, plan) in &self.assigned {
            plans = plans.assign(subject.clone(), plan.clone());
        }
        if self.by_tenant {
            plans = plans.keyed_by_tenant();
        }
        plans
    }

    /// The default plan's name.
    pub fn default_plan(&self) -> &PlanName {
        self.default.name()
    }

    /// Report each plan limit below the cost of a route that counts by
    /// its policy: no request of the route could pass under that plan.
    pub(crate) fn check_costs(
        &self,
        errors: &mut Vec<PolicyError>,
        routes: &BTreeMap<String, RouteDef>,
    ) {
        let plans = std::iter::once(&self.default).chain(&self.others);
        for plan in plans {
            for (policy, limit) in plan.limits() {
                let route = routes.iter().find(|(_, r)| {
                    r.cost() > limit.capacity() && r.layers().iter().any(|l| l.policy() == policy)
                });
                if let Some((route, def)) = route {
                    errors.push(field_error(
                        &format!("plans.limits.{}.{policy}", plan.name()),
                        format!(
                            "its capacity {} is less than the cost {} of route {route:?}: no request of it could pass under this plan",
                            limit.capacity(),
                            def.cost()
                        ),
                    ));
                }
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlansSpec {
    default: String,
    #[serde(default)]
    keyed_by: KeyedBy,
    #[serde(default)]
    assign: BTreeMap<String, String>,
    #[serde(default)]
    limits: BTreeMap<String, Table>,
}

#[derive(Deserialize, Default, PartialEq)]
#[serde(rename_all = "snake_case")]
enum KeyedBy {
    #[default]
    Subject,
    Tenant,
}

/// The `[plans]` section, every error reported with its field path.
/// `policies` are the file's policies (`None`: one that is invalid, so
/// not reported again).
pub(crate) fn plans(
    errors: &mut Vec<PolicyError>,
    value: Value,
    policies: &BTreeMap<String, Option<Policy>>,
) -> Option<PlansDef> {
    let spec = de::<PlansSpec>(errors, "plans", value)?;
    let before = errors.len();
    let mut defined = Vec::new();
    for (name, table) in spec.limits {
        if let Some(plan) = plan(errors, &name, table, policies) {
            defined.push(plan);
        }
    }
    let default = match PlanName::new(&spec.default) {
        Ok(name) => defined
            .iter()
            .position(|p| *p.name() == name)
            .map(|i| defined.remove(i))
            .or_else(|| Plan::new(name.as_str()).ok()),
        Err(e) => {
            errors.push(field_error("plans.default", e.reason()));
            None
        }
    };
    let known = |name: &PlanName| {
        default.as_ref().is_some_and(|d| d.name() == name)
            || defined.iter().any(|p| p.name() == name)
    };
    let assigned = assignments(errors, spec.assign, &known);
    if errors.len() > before {
        return None;
    }
    Some(PlansDef {
        default: default?,
        others: defined,
        assigned,
        by_tenant: spec.keyed_by == KeyedBy::Tenant,
    })
}

/// `[plans.assign]`: each subject checked in the form the identity writes
/// it (as `[access]` checks its entries: another form, `h.` in upper case
/// or an address without its prefix length, would load and never match),
/// once only, to a plan `known` names.
fn assignments(
    errors: &mut Vec<PolicyError>,
    assign: BTreeMap<String, String>,
    known: &dyn Fn(&PlanName) -> bool,
) -> Vec<(Subject, PlanName)> {
    let mut assigned = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (subject, plan) in assign {
        let path = format!("plans.assign.{subject:?}");
        let subject = Subject::new(&subject)
            .map_err(|e| e.to_string())
            .and_then(|s| tollgate_http::check_subject(s.as_str()).map(|()| s))
            .and_then(|s| match seen.insert(s.clone()) {
                true => Ok(s),
                false => Err(format!("{s} is assigned twice (entries differing only by white space around them name one subject)")),
            })
            .map_err(|why| field_error(&path, why));
        let plan = PlanName::new(&plan)
            .map_err(|e| field_error(&path, e.reason()))
            .and_then(|p| match known(&p) {
                true => Ok(p),
                false => Err(field_error(
                    &path,
                    format!("no plan named {plan:?}: define it under [plans.limits.{plan}] or make it the default"),
                )),
            });
        match (subject, plan) {
            (Ok(subject), Ok(plan)) => assigned.push((subject, plan)),
            (subject, plan) => errors.extend(subject.err().into_iter().chain(plan.err())),
        }
    }
    assigned
}

/// `[plans.limits.<name>]`: a limit per policy it changes.
fn plan(
    errors: &mut Vec<PolicyError>,
    name: &str,
    table: Table,
    policies: &BTreeMap<String, Option<Policy>>,
) -> Option<Plan> {
    let path = format!("plans.limits.{name}");
    let mut plan = match Plan::new(name) {
        Ok(plan) => plan,
        Err(e) => {
            errors.push(field_error(&path, e.reason()));
            return None;
        }
    };
    for (policy, value) in table {
        let path = format!("{path}.{policy}");
        if !policies.contains_key(&policy) {
            let names: Vec<&str> = policies.keys().map(String::as_str).collect();
            let reason = format!(
                "no policy named {policy:?}; the policies are {}",
                names.join(", ")
            );
            errors.push(field_error(&path, reason));
            continue;
        }
        let Value::Table(table) = value else {
            errors.push(field_error(
                &path,
                "must be a table with an algorithm and its parameters",
            ));
            continue;
        };
        if let Some(limit) = limit(errors, &path, table, "") {
            plan = plan.limit(&policy, limit);
        }
    }
    Some(plan)
}
