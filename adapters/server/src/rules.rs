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
    BreakerState, Clock, Context, Decision, HashKey, LayerDecision, Limit, Limiter, Policy, Scope,
    Store, Subject,
};

use crate::error::{BadRequest, ServerError};
use crate::rule_stats::Counts;
use crate::settings::{RuleSpec, Settings, Unknown};

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Its entries, `(key, value)`, in order. A value is bytes, as on
    /// Envoy's wire (a request header may hold any): one that is not
    /// UTF-8 never matches a rule's fixed value and is counted under its
    /// hash.
    pub entries: Vec<(String, Vec<u8>)>,
    /// Units it costs (Envoy's `hits_addend`; 0 or unset means 1).
    pub hits: u64,
    /// Envoy's dynamic limit for this descriptor, which replaces the limit
    /// of each of its rule's layers.
    pub limit: Option<LimitOverride>,
}

impl Descriptor {
    /// A descriptor of text entries, costing `hits`, without an override.
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
        hits: u64,
    ) -> Descriptor {
        Descriptor {
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into().into_bytes()))
                .collect(),
            hits,
            limit: None,
        }
    }
}

/// Envoy's dynamic limit for one descriptor (`RateLimitDescriptor.limit`,
/// set by the route's `limit` action from dynamic metadata): requests per
/// unit, counted in a fixed window of the unit aligned like
/// envoyproxy/ratelimit's (to the Unix epoch).
///
/// Each of the matched rule's layers is counted with it instead of its
/// policy's limit, on counters of their own (a policy named after the
/// override), keeping its scope and failure mode, never in shadow mode
/// (as the reference). A unit Tollgate cannot count as a fixed window
/// (`UNKNOWN`, `MONTH`, `YEAR`) or a limit of 0 makes the descriptor over
/// the limit: the server never admits on a limit it does not understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit, as `envoy.type.v3.RateLimitUnit` numbers it
    /// (1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year).
    pub unit: i32,
}

impl LimitOverride {
    /// The override Envoy sent.
    pub fn from_envoy(requests_per_unit: u32, unit: i32) -> LimitOverride {
        LimitOverride {
            requests_per_unit,
            unit,
        }
    }

    /// The unit's Envoy name and its length in seconds, for the units a
    /// fixed window counts.
    fn unit(&self) -> Option<(&'static str, u64)> {
        match self.unit {
            1 => Some(("SECOND", 1)),
            2 => Some(("MINUTE", 60)),
            3 => Some(("HOUR", 3600)),
            4 => Some(("DAY", 86_400)),
            _ => None,
        }
    }

    /// The override as the answer's `current_limit` states it.
    fn envoy_limit(&self) -> Option<crate::EnvoyLimit> {
        let (unit_name, _) = self.unit()?;
        Some(crate::EnvoyLimit {
            requests_per_unit: self.requests_per_unit,
            unit: self.unit,
            unit_name,
            exact: true,
        })
    }

    /// The fixed window it counts with, or `None` when it cannot be
    /// counted (a unit that is not a window, a limit of 0): its descriptor
    /// is then over the limit.
    fn limit(&self) -> Option<Limit> {
        let (_, secs) = self.unit()?;
        let window = std::time::Duration::from_secs(secs);
        Limit::fixed_window(u64::from(self.requests_per_unit), window).ok()
    }

    /// `layer_policy` counted with this override, or `None` when it cannot
    /// be counted.
    fn policy(&self, layer_policy: &Policy) -> Option<Policy> {
        let (unit, _) = self.unit()?;
        let limit = self.limit()?;
        let name = format!(
            "envoy.{}.per-{}",
            self.requests_per_unit,
            unit.to_ascii_lowercase()
        );
        let policy = Policy::new(name, limit).ok()?;
        // The configured failure mode, unless it cannot hold this limit
        // (a fallback limit of another shape): then it fails closed.
        Some(
            policy
                .clone()
                .with_on_failure(layer_policy.on_failure().clone())
                .unwrap_or(policy),
        )
    }
}

/// One descriptor's answer.
#[derive(Debug, Clone)]
pub struct Status {
    /// Whether it is under its limit.
    pub ok: bool,
    /// Its tightest layer (the one with the least left), when a rule
    /// matched and a decision was made.
    pub tightest: Option<LayerDecision>,
    /// The descriptor's limit override, when it decided.
    pub limit: Option<LimitOverride>,
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

/// A rule a request uses, with its descriptor's limit override if any.
type RuleUse = (usize, Option<LimitOverride>);

/// What an operator's call works on ([`Rules::target`]).
pub(crate) struct Target {
    /// The rule's name.
    pub(crate) rule: String,
    /// The rule's limiter.
    pub(crate) limiter: Limiter,
    /// The descriptor's context.
    pub(crate) context: Context,
    /// The scope the rule counts its client in (the route's per-subject
    /// layers).
    pub(crate) own: Scope,
    /// `key=subject` of each mapped entry, for the log (secrets hashed).
    pub(crate) subjects: Vec<String>,
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
    combined: RwLock<HashMap<Vec<RuleUse>, Arc<Combined>>>,
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

/// A value as its subject: itself when it is one exactly as sent (UTF-8,
/// no white space around it, …), else its hash under the public key, so
/// `" pad "` and `"pad"`, or two byte strings that are not UTF-8, never
/// share a budget.
fn plain_subject(value: &[u8]) -> Subject {
    std::str::from_utf8(value)
        .ok()
        .filter(|text| text.trim() == *text)
        .and_then(|text| Subject::new(text).ok())
        .unwrap_or_else(|| Subject::hashed(value, odd_values_key()))
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
            rules
                .combined(&[(i, None)])
                .map_err(|e| ServerError::Rule {
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
        if let Some(limit) = &status.limit {
            return limit.envoy_limit();
        }
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
                        && rule
                            .spec
                            .values
                            .get(k)
                            .is_none_or(|wanted| wanted.as_bytes() == v.as_slice())
                })
        })
    }

    /// Rule `i`'s layers, with `limit` overriding their policies: then one
    /// layer per scope (the route's layers of one scope would all count the
    /// same override, on one counter).
    fn layers_of(
        &self,
        i: usize,
        limit: Option<LimitOverride>,
    ) -> Result<Vec<(String, Scope, Policy)>, BadRequest> {
        let rule = &self.rules[i];
        let Some(limit) = limit else {
            return Ok(rule.layers.clone());
        };
        let mut layers: Vec<(String, Scope, Policy)> = Vec::new();
        for (name, scope, policy) in &rule.layers {
            if layers.iter().any(|(_, s, _)| s == scope) {
                continue;
            }
            let policy = limit.policy(policy).ok_or_else(|| {
                BadRequest(format!("the limit override {limit:?} cannot be counted"))
            })?;
            layers.push((name.clone(), scope.clone(), policy));
        }
        Ok(layers)
    }

    /// The limiter of a combination of rules, each with its descriptor's
    /// override if any (built once).
    fn combined(&self, rules: &[RuleUse]) -> Result<Arc<Combined>, BadRequest> {
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
        for &(i, limit) in rules {
            let layers = self.layers_of(i, limit)?;
            ranges.push(at..at + layers.len());
            at += layers.len();
            for (name, scope, policy) in layers {
                builder = builder.layer(name, scope, policy);
            }
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
        for (attribute, _, subject) in self.subjects(i, d) {
            ctx = ctx.with_attribute(attribute, subject);
        }
        ctx
    }

    /// The subject each mapped entry of `d` fills under rule `i`: its
    /// attribute, its key, and the subject (hashed for a `hashed` entry, or
    /// a value that is not a subject as sent).
    fn subjects<'d>(
        &self,
        i: usize,
        d: &'d Descriptor,
    ) -> impl Iterator<Item = (Arc<str>, &'d str, Subject)> + use<'_, 'd> {
        let rule = &self.rules[i];
        d.entries.iter().filter_map(move |(key, value)| {
            let attribute = rule.attributes.get(key)?.clone();
            let subject = match (&self.hash_key, rule.spec.hashed.contains(key)) {
                (Some(hash_key), true) => Subject::hashed(value, hash_key),
                _ => plain_subject(value),
            };
            Some((attribute, key.as_str(), subject))
        })
    }

    /// What an operator's call on descriptor `d` of `domain` works on: the
    /// limiter of the rule it matches (with its override), the context it
    /// makes, and the scope that rule counts its client in; `None` when no
    /// rule matches.
    pub(crate) fn target(
        &self,
        domain: &str,
        d: &Descriptor,
    ) -> Option<Result<Target, BadRequest>> {
        let i = self.rule_of(domain, d)?;
        let combined = match self.combined(&[(i, d.limit)]) {
            Ok(combined) => combined,
            Err(e) => return Some(Err(e)),
        };
        let rule = &self.rules[i];
        Some(Ok(Target {
            rule: rule.spec.name.clone(),
            limiter: combined.limiter.clone(),
            context: self.context(Context::new(), i, d),
            own: Scope::Attribute(scoped(&rule.spec.name, &Scope::Subject).into()),
            subjects: self
                .subjects(i, d)
                .map(|(_, key, subject)| format!("{key}={}", subject.as_str()))
                .collect(),
        }))
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
        let over = |_| Status {
            ok: false,
            tightest: None,
            limit: None,
        };
        if descriptors.len() > MAX_DESCRIPTORS {
            // Deciding them would be a store call each: refuse the lot.
            return Ok(Outcome {
                statuses: descriptors.iter().map(over).collect(),
                decisions: Vec::new(),
            });
        }
        let matched: Vec<Option<usize>> = descriptors
            .iter()
            .map(|d| self.rule_of(domain, d))
            .collect();
        let mut statuses: Vec<Status> = matched
            .iter()
            .zip(descriptors)
            .map(|(m, d)| Status {
                // An override that cannot be counted is over the limit.
                ok: match m {
                    Some(_) => d.limit.is_none_or(|o| o.limit().is_some()),
                    None => self.settings.unknown_descriptors == Unknown::Allow,
                },
                tightest: None,
                limit: None,
            })
            .collect();
        let mut denied = statuses.iter().any(|s| !s.ok);
        let mut decisions = Vec::new();
        let asked = Asked {
            domain,
            matched: &matched,
            descriptors,
        };
        for (cost, ds) in rounds(&matched, descriptors, &statuses) {
            let Some(decision) = self
                .decide_round(&asked, ds, cost, denied, &mut statuses)
                .await?
            else {
                denied = true;
                continue;
            };
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

    /// Decide one round, descriptors `ds` at `cost` each, writing their
    /// statuses: charged, or only peeked once the request is `denied`.
    /// `None` when the limiter refused the request as bad input.
    async fn decide_round(
        &self,
        asked: &Asked<'_>,
        mut ds: Vec<usize>,
        cost: u64,
        denied: bool,
        statuses: &mut [Status],
    ) -> Result<Option<Decision>, BadRequest> {
        let (matched, descriptors) = (asked.matched, asked.descriptors);
        // In rule order, so one limiter serves every order of them.
        ds.sort_by_key(|&d| (matched[d], descriptors[d].limit));
        let rules: Vec<RuleUse> = ds
            .iter()
            .filter_map(|&d| Some((matched[d]?, descriptors[d].limit)))
            .collect();
        let combined = self.combined(&rules)?;
        let mut ctx = Context::new();
        for (&d, &(rule, _)) in ds.iter().zip(&rules) {
            ctx = self.context(ctx, rule, &descriptors[d]);
        }
        let limiter = &combined.limiter;
        // After a denial nothing more is charged: the rest is peeked.
        let decided = if denied {
            limiter.peek(&ctx, cost).await
        } else {
            limiter.check(&ctx, cost).await
        };
        // An error is bad input for a layer — more than it can ever hold
        // — so the request is over the limit (an error answer would be an
        // allow in Envoy).
        let Ok(decision) = decided else {
            for &d in &ds {
                statuses[d].ok = false;
            }
            return Ok(None);
        };
        for (&d, range) in ds.iter().zip(&combined.ranges) {
            let layers = &decision.layers()[range.clone()];
            let enforced = || layers.iter().filter(|l| !l.is_shadow());
            statuses[d].ok = enforced().all(|l| l.verdict.allowed);
            statuses[d].tightest = enforced()
                .min_by_key(|l| (l.verdict.allowed, l.verdict.remaining))
                .copied();
            statuses[d].limit = descriptors[d].limit;
            let shadow_denied = layers.iter().any(|l| l.is_shadow() && !l.verdict.allowed);
            let rule = &self.rules[matched[d].expect("decided descriptors matched")];
            Counts::of(cost, statuses[d].tightest.as_ref(), shadow_denied)
                .record(asked.domain, &rule.spec.name);
        }
        Ok(Some(decision))
    }
}

/// A request being decided: its domain, its descriptors, and the rule
/// each matched.
struct Asked<'a> {
    domain: &'a str,
    matched: &'a [Option<usize>],
    descriptors: &'a [Descriptor],
}

/// The rounds of a request: descriptors whose rules differ and whose costs
/// agree are decided together; those already over the limit (no rule, an
/// override that cannot be counted) are left out.
fn rounds(
    matched: &[Option<usize>],
    descriptors: &[Descriptor],
    statuses: &[Status],
) -> Vec<(u64, Vec<usize>)> {
    let mut rounds: Vec<(u64, Vec<usize>)> = Vec::new();
    for (d, rule) in matched.iter().enumerate() {
        let Some(rule) = rule else { continue };
        if !statuses[d].ok {
            continue;
        }
        let hits = descriptors[d].hits.max(1);
        match rounds
            .iter_mut()
            .find(|(cost, ds)| *cost == hits && ds.iter().all(|&o| matched[o] != Some(*rule)))
        {
            Some((_, ds)) => ds.push(d),
            None => rounds.push((hits, vec![d])),
        }
    }
    rounds
}
