//! Envoy descriptors decided by the configured routes.
//!
//! A rule maps the descriptors of one shape (a domain, entry keys, fixed
//! values) to a route's layers. Each rule counts on layers of its own: a
//! route layer counted per subject becomes one counted per the rule's
//! subject attribute (`<rule>.subject`), and so on for the tenant, the
//! global layer and attributes. So the descriptors of one request — each
//! with its own subject — are decided by one limiter, in one store call,
//! all-or-nothing, and a rule's counters are the same whatever other
//! descriptors come with it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use tollgate_config::Config;
use tollgate_limiter::{
    BreakerState, Clock, Context, Decision, HashKey, LayerDecision, Limiter, Policy, Scope, Store,
    Subject,
};

use crate::error::{BadRequest, ServerError};
use crate::settings::{RuleSpec, Settings, Unknown};

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Its entries, `(key, value)`, in order.
    pub entries: Vec<(String, String)>,
    /// Units it costs (Envoy's `hits_addend`; 0 or unset means 1).
    pub hits: u64,
}

/// One descriptor's answer.
#[derive(Debug, Clone)]
pub struct Status {
    /// Whether it is under its limit.
    pub ok: bool,
    /// Its tightest layer (the one with the least left), when a rule
    /// matched and a decision was made.
    pub tightest: Option<LayerDecision>,
}

/// A request's answer.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// One status per descriptor, in order.
    pub statuses: Vec<Status>,
    /// The decisions made (one per round, usually one), for the headers:
    /// the denying one first when there is one.
    pub decisions: Vec<Decision>,
}

impl Status {
    /// How long until its tightest layer changes its answer: when over the
    /// limit, the wait until a retry passes; else until the layer is full.
    pub fn until_reset(&self) -> Option<std::time::Duration> {
        let layer = self.tightest.as_ref()?;
        Some(if layer.verdict.allowed {
            layer.verdict.reset_after
        } else {
            layer
                .verdict
                .retry_after
                .unwrap_or(layer.verdict.reset_after)
        })
    }
}

impl Outcome {
    /// Whether every descriptor is under its limit.
    pub fn ok(&self) -> bool {
        self.statuses.iter().all(|s| s.ok)
    }

    /// Whether a denial came from a store failure (fail-closed).
    pub fn failed_closed(&self) -> bool {
        self.decisions.iter().any(Decision::failed_closed)
    }
}

struct Rule {
    spec: RuleSpec,
    /// The attribute each mapped entry fills (`<rule>.subject`, …), and
    /// the global one: made once, shared by every request.
    attributes: HashMap<String, Arc<str>>,
    global: Arc<str>,
    /// The entry keys a descriptor must have (entries and values).
    keys: BTreeSet<String>,
    /// The route's layers, scoped to this rule: (name, scope, policy).
    layers: Vec<(String, Scope, Policy)>,
}

/// One limiter for a combination of rules, and the range of its layers
/// each rule owns.
struct Combined {
    limiter: Limiter,
    ranges: Vec<std::ops::Range<usize>>,
}

/// The rules of one configuration, over its store.
pub struct Rules {
    settings: Settings,
    rules: Vec<Rule>,
    config: Config,
    store: Arc<dyn Store>,
    fallback: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    hash_key: Option<HashKey>,
    combined: RwLock<HashMap<Vec<usize>, Arc<Combined>>>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

/// The subject of a rule's global layer.
fn global_subject() -> Subject {
    static GLOBAL: std::sync::OnceLock<Subject> = std::sync::OnceLock::new();
    GLOBAL
        .get_or_init(|| Subject::new("global").expect("a valid subject"))
        .clone()
}

/// A rule's own name for a scope: its attribute in the shared limiter.
/// Each scope has a namespace of its own (`s`, `t`, `g`, `a.<name>`), so
/// an attribute named `subject` or `global` never meets the subject or the
/// global layer.
fn scoped(rule: &str, scope: &Scope) -> String {
    match scope {
        Scope::Subject => format!("{rule}/s"),
        Scope::Tenant => format!("{rule}/t"),
        Scope::Attribute(name) => format!("{rule}/a.{name}"),
        _ => format!("{rule}/g"),
    }
}

/// The key values that are not valid subjects (white space, braces, over
/// 256 bytes) are hashed with: public, so every instance counts such a
/// value on the same key. Such values are counted, never refused: a
/// refusal would be a gRPC error, which Envoy turns into an allow.
fn odd_values_key() -> &'static HashKey {
    static KEY: std::sync::OnceLock<HashKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        HashKey::new(b"tollgate-ratelimit-server: values that are not subjects").expect("16+ bytes")
    })
}

/// Most descriptors one request may carry; a request with more is over
/// the limit (nothing is decided), as is one naming an entry twice.
pub const MAX_DESCRIPTORS: usize = 64;

/// Most limiters kept for combinations of rules; past it, a new
/// combination gets a limiter of its own for that request only.
const MAX_CACHED: usize = 4096;

impl Rules {
    /// The rules of `config`'s `[server]` section over `store` (and
    /// `fallback`, the emergency store of policies that fall back: keep
    /// one across reloads, so its counts survive them). Every rule's
    /// limiter is built here, so a rule that cannot decide fails now.
    pub fn new(
        config: Config,
        store: Arc<dyn Store>,
        fallback: Option<Arc<dyn Store>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Rules, ServerError> {
        let settings = Settings::of(&config)?;
        let hash_key = match &settings.hash_key_env {
            Some(name) => {
                let value = std::env::var(name).map_err(|_| ServerError::Env {
                    name: name.clone(),
                    reason: "not set (it holds the key hashed entries are hashed with)".into(),
                })?;
                Some(
                    HashKey::new(value.as_bytes()).map_err(|e| ServerError::Env {
                        name: name.clone(),
                        reason: e.to_string(),
                    })?,
                )
            }
            None => None,
        };
        let mut rules = Vec::new();
        for spec in &settings.rules {
            let route = config
                .route(&spec.route)
                .expect("Settings::of checked the route");
            let mut layers = Vec::new();
            for layer in route.layers() {
                let global = *layer.scope() == Scope::Global;
                if !global && !spec.entries.values().any(|r| r.scope() == *layer.scope()) {
                    return Err(ServerError::Rule {
                        rule: spec.name.clone(),
                        reason: format!(
                            "layer {:?} of route {:?} counts per {:?}: map a descriptor entry to it in entries",
                            layer.name(),
                            spec.route,
                            layer.scope()
                        ),
                    });
                }
                let policy = config
                    .policy(layer.policy())
                    .expect("the configuration checked its policies")
                    .clone();
                layers.push((
                    format!("{}.{}", spec.name, layer.name()),
                    Scope::Attribute(scoped(&spec.name, layer.scope()).into()),
                    policy,
                ));
            }
            let keys = spec
                .entries
                .keys()
                .chain(spec.values.keys())
                .cloned()
                .collect();
            let attributes = spec
                .entries
                .iter()
                .map(|(key, role)| (key.clone(), Arc::from(scoped(&spec.name, &role.scope()))))
                .collect();
            rules.push(Rule {
                global: scoped(&spec.name, &Scope::Global).into(),
                attributes,
                spec: spec.clone(),
                keys,
                layers,
            });
        }
        let rules = Rules {
            settings,
            rules,
            config,
            store,
            fallback,
            clock,
            hash_key,
            combined: RwLock::new(HashMap::new()),
        };
        for (i, rule) in rules.rules.iter().enumerate() {
            rules.combined(&[i]).map_err(|e| ServerError::Rule {
                rule: rule.spec.name.clone(),
                reason: e.0,
            })?;
        }
        Ok(rules)
    }

    /// The `[server]` settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A configured policy, by name.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.config.policy(name)
    }

    /// The limit of a status's tightest layer in Envoy's terms.
    pub fn envoy_limit(&self, status: &Status) -> Option<crate::EnvoyLimit> {
        let layer = status.tightest.as_ref()?;
        crate::envoy_limit(self.policy(layer.policy())?.limit())
    }

    /// The store the rules decide in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Whether no limiter's circuit breaker is open.
    pub fn breakers_closed(&self) -> bool {
        let combined = self.combined.read().unwrap_or_else(|p| p.into_inner());
        combined
            .values()
            .all(|c| c.limiter.breaker().state() != BreakerState::Open)
    }

    /// The rule a descriptor of `domain` matches, first in file order.
    /// Its keys must be exactly the rule's, each once.
    fn rule_of(&self, domain: &str, d: &Descriptor) -> Option<usize> {
        let keys: BTreeSet<&String> = d.entries.iter().map(|(k, _)| k).collect();
        if keys.len() != d.entries.len() {
            return None;
        }
        self.rules.iter().position(|rule| {
            rule.spec.domain == domain
                && keys.len() == rule.keys.len()
                && d.entries.iter().all(|(k, v)| {
                    rule.keys.contains(k)
                        && rule.spec.values.get(k).is_none_or(|wanted| wanted == v)
                })
        })
    }

    /// The limiter of a combination of rules (built once).
    fn combined(&self, rules: &[usize]) -> Result<Arc<Combined>, BadRequest> {
        if let Some(c) = self
            .combined
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(rules)
        {
            return Ok(c.clone());
        }
        let mut cache = self.combined.write().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(rules) {
            return Ok(c.clone());
        }
        let mut builder =
            self.config
                .limiter_builder(&self.store, self.fallback.as_ref(), &self.clock);
        let mut ranges = Vec::new();
        let mut at = 0;
        for &i in rules {
            let rule = &self.rules[i];
            for (name, scope, policy) in &rule.layers {
                builder = builder.layer(name.clone(), scope.clone(), policy.clone());
            }
            ranges.push(at..at + rule.layers.len());
            at += rule.layers.len();
        }
        let limiter = builder.build().map_err(|e| {
            BadRequest(format!("these descriptors cannot be decided together: {e}"))
        })?;
        let combined = Arc::new(Combined { limiter, ranges });
        if cache.len() < MAX_CACHED {
            cache.insert(rules.to_vec(), combined.clone());
        }
        Ok(combined)
    }

    /// The context of descriptor `d` under rule `i`, added to `ctx`.
    fn context(&self, ctx: Context, i: usize, d: &Descriptor) -> Context {
        let rule = &self.rules[i];
        let mut ctx = ctx.with_attribute(rule.global.clone(), global_subject());
        for (key, value) in &d.entries {
            let Some(attribute) = rule.attributes.get(key) else {
                continue;
            };
            let subject = match (&self.hash_key, rule.spec.hashed.contains(key)) {
                (Some(hash_key), true) => Subject::hashed(value, hash_key),
                _ => {
                    Subject::new(value).unwrap_or_else(|_| Subject::hashed(value, odd_values_key()))
                }
            };
            ctx = ctx.with_attribute(attribute.clone(), subject);
        }
        ctx
    }

    /// Decide `descriptors` of `domain`: every descriptor a rule matches,
    /// together, all-or-nothing; one that no rule matches as
    /// `unknown_descriptors` says (denied: nothing is charged).
    ///
    /// Descriptors repeating a rule, or costing differently, cannot share
    /// one limiter: they are decided in rounds (each all-or-nothing), and
    /// a round that denies leaves the later ones uncharged (they are only
    /// peeked) while the earlier ones stay charged.
    pub async fn decide(
        &self,
        domain: &str,
        descriptors: &[Descriptor],
    ) -> Result<Outcome, BadRequest> {
        if descriptors.len() > MAX_DESCRIPTORS {
            // Deciding them would be a store call each: refuse the lot.
            return Ok(Outcome {
                statuses: descriptors
                    .iter()
                    .map(|_| Status {
                        ok: false,
                        tightest: None,
                    })
                    .collect(),
                decisions: Vec::new(),
            });
        }
        let matched: Vec<Option<usize>> = descriptors
            .iter()
            .map(|d| self.rule_of(domain, d))
            .collect();
        let mut statuses: Vec<Status> = matched
            .iter()
            .map(|m| Status {
                ok: m.is_some() || self.settings.unknown_descriptors == Unknown::Allow,
                tightest: None,
            })
            .collect();
        // Rounds: descriptors whose rules differ and whose costs agree.
        let mut rounds: Vec<(u64, Vec<usize>)> = Vec::new();
        for (d, rule) in matched.iter().enumerate() {
            let Some(rule) = rule else { continue };
            let hits = descriptors[d].hits.max(1);
            match rounds
                .iter_mut()
                .find(|(cost, ds)| *cost == hits && ds.iter().all(|&o| matched[o] != Some(*rule)))
            {
                Some((_, ds)) => ds.push(d),
                None => rounds.push((hits, vec![d])),
            }
        }
        let mut denied = statuses.iter().any(|s| !s.ok);
        let mut decisions = Vec::new();
        for (cost, mut ds) in rounds {
            // In rule order, so one limiter serves every order of them.
            ds.sort_by_key(|&d| matched[d]);
            let rules: Vec<usize> = ds.iter().filter_map(|&d| matched[d]).collect();
            let combined = self.combined(&rules)?;
            let mut ctx = Context::new();
            for (&d, &rule) in ds.iter().zip(&rules) {
                ctx = self.context(ctx, rule, &descriptors[d]);
            }
            let limiter = &combined.limiter;
            // After a denial nothing more is charged: the rest is peeked.
            let decided = if denied {
                limiter.peek(&ctx, cost).await.map_err(|e| e.to_string())
            } else {
                // An error is bad input for a layer — more than it can ever
                // hold — so the request is over the limit (an error
                // answer would be an allow in Envoy).
                limiter.check(&ctx, cost).await.map_err(|e| e.to_string())
            };
            let decision = match decided {
                Ok(decision) => decision,
                Err(_) => {
                    for &d in &ds {
                        statuses[d].ok = false;
                    }
                    denied = true;
                    continue;
                }
            };
            for (&d, range) in ds.iter().zip(&combined.ranges) {
                let layers = &decision.layers()[range.clone()];
                let enforced = || layers.iter().filter(|l| !l.is_shadow());
                statuses[d].ok = enforced().all(|l| l.verdict.allowed);
                statuses[d].tightest = enforced()
                    .min_by_key(|l| (l.verdict.allowed, l.verdict.remaining))
                    .copied();
            }
            if !decision.is_allowed() {
                denied = true;
                decisions.insert(0, decision);
            } else {
                decisions.push(decision);
            }
        }
        Ok(Outcome {
            statuses,
            decisions,
        })
    }
}
