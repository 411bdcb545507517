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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::Poll;

use tollgate_config::Config;
use tollgate_limiter::{
    BreakerState, Clock, Context, Decision, HashKey, LayerDecision, Limit, Limiter, Policy, Scope,
    Store, Subject,
};

use crate::envoy_config::{Counting, Domains};
use crate::error::{BadRequest, ServerError};
use crate::rule_stats::{Counts, RuleCounters};
use crate::settings::{RuleSpec, Settings, Unknown};

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Its entries, `(key, value)`, in order. A value is bytes, as on
    /// Envoy's wire (a request header may hold any): one that is not
    /// UTF-8 never matches a rule's fixed value and is counted under its
    /// hash.
    pub entries: Vec<(String, Vec<u8>)>,
    /// Units it costs (Envoy's `hits_addend`); 0 checks without charging:
    /// over the limit when one unit would be refused (a descriptor's own
    /// `hits_addend` of 0, as envoyproxy/ratelimit reads it; a request's
    /// unset or 0 `hits_addend` is 1).
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
/// (`UNKNOWN`) or a limit of 0 makes the descriptor over the limit: the
/// server never admits on a limit it does not understand. `MONTH` and
/// `YEAR` count as envoyproxy/ratelimit counts them: 30 and 365 days from
/// the epoch (a calendar month is a `calendar` policy of the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit, as `envoy.type.v3.RateLimitUnit` numbers it
    /// (1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year, 7 week).
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
        crate::envoy_limit::unit_numbered(self.unit)
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
    /// is then over the limit. A limit above the most a window counts
    /// ([`MAX_COUNT`](tollgate_limiter::MAX_COUNT); `u32::MAX` is "no
    /// limit" to many) is counted at that most.
    fn limit(&self) -> Option<Limit> {
        let (_, secs) = self.unit()?;
        let window = std::time::Duration::from_secs(secs);
        let count = u64::from(self.requests_per_unit).min(tollgate_limiter::MAX_COUNT);
        Limit::fixed_window(count, window).ok()
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
    /// The rule that decided it, as its counters' `rule` label names it.
    pub rule: Option<Arc<str>>,
    /// Whether it matched an `unlimited` limit of envoyproxy/ratelimit's
    /// configuration: admitted and never counted (Envoy is told
    /// `limit_remaining` u32::MAX, as the reference tells it).
    pub unlimited: bool,
}

/// A request's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// One status per descriptor, in order.
    pub statuses: Vec<Status>,
    /// The decisions made (one per round, usually one); the headers
    /// describe them as one ([`Answer::for_headers`]).
    pub decisions: Vec<Decision>,
}

impl Status {
    /// How long until its tightest layer changes its answer: when over the
    /// limit, the wait until a retry passes; else until the layer is full.
    pub fn until_reset(&self) -> Option<std::time::Duration> {
        Some(self.tightest.as_ref()?.wait())
    }
}

impl Answer {
    /// Whether every descriptor is under its limit.
    pub fn ok(&self) -> bool {
        self.statuses.iter().all(|s| s.ok)
    }

    /// Whether a denial came from a store failure (fail-closed).
    pub fn failed_closed(&self) -> bool {
        self.decisions.iter().any(Decision::failed_closed)
    }

    /// Every round's layers as one decision, for the headers: the
    /// tightest layer and `Retry-After` are then taken over all rounds (a
    /// request denied by a daily and a per-second limit waits for the
    /// day); `None` when nothing was decided.
    pub fn for_headers(&self) -> Option<Decision> {
        if self.decisions.is_empty() {
            return None;
        }
        let layers = self
            .decisions
            .iter()
            .flat_map(|d| d.layers().iter().copied());
        Some(Decision::new(layers))
    }
}

/// How a rule's descriptors fill a request's context.
enum Filling {
    /// A `[[server.rules]]` rule: each mapped entry fills its attribute.
    Entries {
        spec: RuleSpec,
        /// The attribute each mapped entry fills (`<rule>/s`, …), and the
        /// global one: made once, shared by every request.
        attributes: HashMap<String, Arc<str>>,
        global: Arc<str>,
        /// The entry keys a descriptor must have (entries and values).
        keys: BTreeSet<String>,
    },
    /// A leaf of envoyproxy/ratelimit's configuration (`None`: a domain's
    /// rule for descriptors with a limit override): the whole descriptor,
    /// its keys and values, is the subject of its one layer, as the
    /// reference counts per descriptor.
    Descriptor {
        attribute: Arc<str>,
        leaf: Option<usize>,
        /// Its domain's keys whose values are hashed (`tollgate.hashed`).
        hashed: Arc<BTreeSet<String>>,
    },
}

struct Rule {
    /// Its name: its layers' prefix, its counters' `rule` label.
    name: String,
    filling: Filling,
    /// Its counters' `rule` label (for `detailed_metric`, the one used
    /// past the cap), made once: a decision shares it.
    label: Arc<str>,
    /// Its counters, when their labels are the same for every request
    /// (not for `detailed_metric`, nor a domain's override rule).
    counters: Option<RuleCounters>,
    /// The route's layers, scoped to this rule: (name, scope, policy).
    layers: Vec<(String, Scope, Policy)>,
}

/// What one descriptor of a request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Rule `i` decides it.
    Rule(usize),
    /// Admitted without counting: an `unlimited` limit, or a limit another
    /// descriptor of the request `replaces`.
    Free { unlimited: bool },
    /// Over the limit without a store call: a limit override that cannot
    /// be counted (a limit of 0, a unit no window has, or one override too
    /// many), counted on the counters of `rule`, the rule it overrides.
    Over { rule: Option<usize> },
    /// A limit of 0 (`requests_per_unit: 0`) of leaf `leaf`: over the
    /// limit without a store call, admitted in shadow mode. Its rule's
    /// counters count it, as the reference's do.
    Zero { leaf: usize, shadow: bool },
    /// No rule: as `unknown_descriptors` says.
    Unknown,
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
    /// envoyproxy/ratelimit's configuration (`envoy_config_dir`).
    domains: Domains,
    /// The rule of each of its leaves that counts.
    leaf_rules: Vec<Option<usize>>,
    /// The rule of each of its domains for descriptors with an override.
    override_rules: HashMap<String, usize>,
    /// The counters of each of its leaves with a limit of 0, looked up
    /// once (`None`: another leaf, or one whose labels are the request's
    /// values, `detailed_metric`).
    zero_counters: Vec<Option<RuleCounters>>,
    /// The policies made for its limits, by name.
    leaf_policies: HashMap<String, Policy>,
    /// The name the file gives each limit of envoyproxy/ratelimit's
    /// configuration (`rate_limit.name`, empty without one; empty for a
    /// descriptor's own `limit`), by its layer's name.
    limit_names: HashMap<String, String>,
    config: Config,
    store: Arc<dyn Store>,
    fallback: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    hash_key: Option<HashKey>,
    /// Each rule's own limiter, by rule: built with the rules, however
    /// many (a directory of per-customer values), never rebuilt.
    singles: Vec<Arc<Combined>>,
    /// Limiters of combinations of rules (and of overrides), up to
    /// [`MAX_CACHED`].
    combined: RwLock<HashMap<Vec<RuleUse>, Arc<Combined>>>,
    /// The distinct limit overrides counted ([`Rules::counts_override`]),
    /// shared with the rules a reload replaces these with.
    overrides: Arc<std::sync::Mutex<BTreeSet<LimitOverride>>>,
}

impl Rules {
    /// The key subjects marked `hashed` are hashed with, when the server
    /// has one (`server.hash_key_env`).
    pub(crate) fn hash_key(&self) -> Option<&HashKey> {
        self.hash_key.as_ref()
    }
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
pub(crate) fn odd_values_key() -> &'static HashKey {
    static KEY: std::sync::OnceLock<HashKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        HashKey::new(b"tollgate-ratelimit-server: values that are not subjects").expect("16+ bytes")
    })
}

/// A value as its subject: itself when it is one exactly as sent (UTF-8,
/// no white space around it, …), else its hash under the public key, so
/// `" pad "` and `"pad"`, or two byte strings that are not UTF-8, never
/// share a budget. A value in the hashed form (`h.` and 32 hex digits) is
/// hashed too: the key is public, and as itself it would be counted on
/// the budget of the value it is the hash of.
fn plain_subject(value: &[u8]) -> Subject {
    std::str::from_utf8(value)
        .ok()
        .filter(|text| text.trim() == *text && !Subject::is_hashed_form(text))
        .and_then(|text| Subject::new(text).ok())
        .unwrap_or_else(|| Subject::hashed(value, odd_values_key()))
}

/// A whole descriptor as one subject: `key=value&key=value` when that is
/// a subject exactly as written (each part UTF-8 without `=`, `&` or
/// white space), else the hash of its entries, each length-prefixed, so
/// two descriptors share a subject only when their entries are the same.
fn descriptor_subject(entries: &[(String, Vec<u8>)]) -> Subject {
    let plain = |bytes: &[u8]| !bytes.iter().any(|b| matches!(b, b'=' | b'&'));
    let mut text = String::new();
    for (key, value) in entries {
        match std::str::from_utf8(value) {
            Ok(value) if plain(key.as_bytes()) && plain(value.as_bytes()) => {
                if !text.is_empty() {
                    text.push('&');
                }
                text.push_str(key);
                text.push('=');
                text.push_str(value);
            }
            _ => return hashed_entries(entries),
        }
    }
    match Subject::new(&text) {
        Ok(subject) if subject.as_str() == text => subject,
        _ => hashed_entries(entries),
    }
}

/// The hash of `entries`, each key and value length-prefixed.
fn hashed_entries(entries: &[(String, Vec<u8>)]) -> Subject {
    let mut bytes = Vec::new();
    for (key, value) in entries {
        for part in [key.as_bytes(), value] {
            bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bytes.extend_from_slice(part);
        }
    }
    Subject::hashed(bytes, odd_values_key())
}

/// Most labels `detailed_metric` makes (of every domain); past it, a
/// request's values are counted under their limit's own label. Each
/// label is five counters kept for the process's life, and values come
/// from clients.
const MAX_DETAILED_LABELS: usize = 10_000;

/// Longest value a `detailed_metric` label shows as sent; a longer one
/// (or one that is not UTF-8) is shown hashed.
const MAX_LABEL_VALUE: usize = 64;

/// `label` of `domain` if it is one of the first [`MAX_DETAILED_LABELS`].
fn bounded_label(domain: &str, label: String) -> Option<String> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<HashSet<(String, String)>>> =
        std::sync::OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let key = (domain.to_string(), label);
    if seen.contains(&key) || seen.len() < MAX_DETAILED_LABELS {
        let label = key.1.clone();
        seen.insert(key);
        return Some(label);
    }
    None
}

/// Most descriptors one request may carry; a request with more is over
/// the limit (nothing is decided). A descriptor naming an entry twice
/// matches no rule (it is unknown, answered as unknown ones are).
pub const MAX_DESCRIPTORS: usize = 64;

/// Most limiters kept for combinations of rules; past it, a new
/// combination gets a limiter of its own for that request only.
const MAX_CACHED: usize = 4096;

/// Distinct limit overrides the server counts in its life, reloads
/// included (see `Rules::counts_override`); a route's overrides are a
/// handful.
const MAX_OVERRIDES: usize = 1024;

/// Whether `item` is in `seen`, or added to it while it holds fewer than
/// `max`.
fn admit_distinct<T: Ord>(seen: &mut BTreeSet<T>, item: T, max: usize) -> bool {
    if seen.contains(&item) {
        return true;
    }
    seen.len() < max && seen.insert(item)
}

/// The key in environment variable `name` that hashed entries are
/// hashed with.
fn hash_key_from_env(name: &str) -> Result<HashKey, ServerError> {
    let env_error = |reason: String| ServerError::Env {
        name: name.to_string(),
        reason,
    };
    let value = std::env::var(name).map_err(|_| {
        env_error("not set (it holds the key hashed entries are hashed with)".into())
    })?;
    HashKey::new(value.as_bytes()).map_err(|e| env_error(e.to_string()))
}

/// A domain whose values are hashed (`tollgate.hashed`) needs the
/// server's hash key: without it, its secrets would be kept as sent.
fn hash_key_for_hashed(hash_key: Option<&HashKey>, domains: &Domains) -> Result<(), ServerError> {
    match domains.domains.iter().find(|(_, d)| !d.hashed.is_empty()) {
        Some((domain, _)) if hash_key.is_none() => Err(ServerError::Settings(format!(
            "domain '{domain}' of envoy_config_dir hashes its tollgate.hashed keys with the server's hash key, and the server has none: set server.hash_key_env"
        ))),
        _ => Ok(()),
    }
}

/// A domain is configured in one place: by `[[server.rules]]` or by a file
/// of `envoy_config_dir`.
fn one_place_per_domain(settings: &Settings, domains: &Domains) -> Result<(), ServerError> {
    match settings
        .rules
        .iter()
        .find(|r| domains.domains.contains_key(&r.domain))
    {
        Some(spec) => Err(ServerError::Rule {
            rule: spec.name.clone(),
            reason: format!(
                "domain {:?} is also a domain of envoy_config_dir: configure a domain in one place",
                spec.domain
            ),
        }),
        None => Ok(()),
    }
}

/// The rule of a `[[server.rules]]`: its route's layers, each counted per
/// the rule's own attribute for its scope.
fn entries_rule(config: &Config, spec: &RuleSpec) -> Result<Rule, ServerError> {
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
    Ok(Rule {
        label: Arc::from(spec.name.as_str()),
        counters: Some(RuleCounters::new(&spec.domain, &spec.name)),
        name: spec.name.clone(),
        filling: Filling::Entries {
            global: scoped(&spec.name, &Scope::Global).into(),
            attributes,
            spec: spec.clone(),
            keys,
        },
        layers,
    })
}

/// Each leaf's rule (`None`: it counts nothing) and each domain's rule for
/// descriptors with an override.
type DescriptorRules = (Vec<Option<usize>>, HashMap<String, usize>);

/// A rule counting each whole descriptor under `policy`, named `name`,
/// its counters labelled `label` (`counters`: looked up once, when that
/// label is the same for every request), the values of its domain's
/// `hashed` keys hashed.
fn descriptor_rule(
    name: String,
    leaf: Option<usize>,
    policy: Policy,
    (label, counters): (Arc<str>, Option<RuleCounters>),
    hashed: Arc<BTreeSet<String>>,
) -> Rule {
    let attribute: Arc<str> = scoped(&name, &Scope::Subject).into();
    Rule {
        layers: vec![(name.clone(), Scope::Attribute(attribute.clone()), policy)],
        filling: Filling::Descriptor {
            attribute,
            leaf,
            hashed,
        },
        label,
        counters,
        name,
    }
}

/// The rules of envoyproxy/ratelimit's configuration, added to `rules`:
/// one per leaf that counts, and one per domain for the descriptors that
/// carry their own limit (counted with it; the placeholder policy is
/// never counted). Answers each leaf's rule and each domain's.
fn descriptor_rules(
    domains: &Domains,
    rules: &mut Vec<Rule>,
) -> Result<DescriptorRules, ServerError> {
    let mut leaf_rules = Vec::new();
    for (l, leaf) in domains.leaves.iter().enumerate() {
        let Counting::Policy(policy) = &leaf.counting else {
            leaf_rules.push(None);
            continue;
        };
        leaf_rules.push(Some(rules.len()));
        let counters = (!leaf.detailed).then(|| RuleCounters::new(&leaf.domain, &leaf.label));
        let labels = (Arc::from(leaf.label.as_str()), counters);
        let hashed = domains.domains[&leaf.domain].hashed.clone();
        let rule = descriptor_rule(leaf.rule.clone(), Some(l), policy.clone(), labels, hashed);
        rules.push(rule);
    }
    let mut override_rules = HashMap::new();
    for (domain, tree) in &domains.domains {
        let name = crate::envoy_config::override_rule_name(domain);
        let placeholder = Limit::fixed_window(1, std::time::Duration::from_secs(1))
            .and_then(|limit| Policy::new(&name, limit))
            .and_then(|policy| policy.with_on_failure(tree.on_failure.clone()))
            .map_err(|e| ServerError::Settings(e.to_string()))?;
        override_rules.insert(domain.clone(), rules.len());
        // Its keys and values are the client's: one label for them all.
        let labels = (Arc::from("limit_override"), None);
        let hashed = tree.hashed.clone();
        rules.push(descriptor_rule(name, None, placeholder, labels, hashed));
    }
    Ok((leaf_rules, override_rules))
}

impl Rules {
    /// The rules of `config`'s `[server]` section over `store` (and
    /// `fallback`, the emergency store of policies that fall back: keep
    /// one across reloads, so its counts survive them), with
    /// envoyproxy/ratelimit's configuration when `envoy_config_dir` names
    /// one (relative to `base`, the configuration file's directory).
    /// Every rule's limiter is built here, so a rule that cannot decide
    /// fails now.
    pub fn new(
        config: Config,
        base: &Path,
        store: Arc<dyn Store>,
        fallback: Option<Arc<dyn Store>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Rules, ServerError> {
        let domains = Rules::domains_of(&config, base)?;
        Rules::with_domains(config, domains, store, fallback, clock)
    }

    /// envoyproxy/ratelimit's configuration as `config` names it
    /// (`envoy_config_dir`, relative to `base`), read now.
    pub(crate) fn domains_of(config: &Config, base: &Path) -> Result<Domains, ServerError> {
        match &Settings::of(config)?.envoy_config_dir {
            Some(dir) => Domains::load(&base.join(dir), &|name| config.policy(name).cloned()),
            None => Ok(Domains::default()),
        }
    }

    /// [`new`](Rules::new) with envoyproxy/ratelimit's configuration
    /// already read.
    pub(crate) fn with_domains(
        config: Config,
        domains: Domains,
        store: Arc<dyn Store>,
        fallback: Option<Arc<dyn Store>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Rules, ServerError> {
        let settings = Settings::of(&config)?;
        let hash_key = settings
            .hash_key_env
            .as_deref()
            .map(hash_key_from_env)
            .transpose()?;
        one_place_per_domain(&settings, &domains)?;
        hash_key_for_hashed(hash_key.as_ref(), &domains)?;
        let mut rules = settings
            .rules
            .iter()
            .map(|spec| entries_rule(&config, spec))
            .collect::<Result<Vec<_>, _>>()?;
        let (leaf_rules, override_rules) = descriptor_rules(&domains, &mut rules)?;
        let zero_counters = domains
            .leaves
            .iter()
            .map(|leaf| {
                let zero = matches!(leaf.counting, Counting::Zero { .. }) && !leaf.detailed;
                zero.then(|| RuleCounters::new(&leaf.domain, &leaf.label))
            })
            .collect();
        let leaf_policies = domains
            .leaves
            .iter()
            .filter_map(|leaf| match &leaf.counting {
                Counting::Policy(p) => Some((p.name().to_string(), p.clone())),
                _ => None,
            })
            .collect();
        // (A leaf counted under a policy of the server's file,
        // `tollgate.policy`, keeps that policy's name.)
        let limit_names = domains
            .leaves
            .iter()
            .filter(|leaf| matches!(&leaf.counting, Counting::Policy(p) if p.name() == leaf.rule))
            .map(|leaf| (leaf.rule.clone(), leaf.name.clone()))
            .chain(override_rules.keys().map(|domain| {
                let rule = crate::envoy_config::override_rule_name(domain);
                (rule, String::new())
            }))
            .collect();
        let rules = Rules {
            settings,
            rules,
            domains,
            leaf_rules,
            override_rules,
            zero_counters,
            leaf_policies,
            limit_names,
            config,
            store,
            fallback,
            clock,
            hash_key,
            singles: Vec::new(),
            combined: RwLock::new(HashMap::new()),
            overrides: Arc::default(),
        };
        let singles = (0..rules.rules.len())
            .map(|i| {
                let single = rules.build(&[(i, None)]).map_err(|e| ServerError::Rule {
                    rule: rules.rules[i].name.clone(),
                    reason: e.0,
                })?;
                Ok(Arc::new(single))
            })
            .collect::<Result<_, ServerError>>()?;
        Ok(Rules { singles, ..rules })
    }

    /// How many rules there are: `[[server.rules]]`, and the limits of
    /// envoyproxy/ratelimit's configuration (`unlimited` ones included).
    pub fn len(&self) -> usize {
        self.settings.rules.len() + self.domains.leaves.len()
    }

    /// Whether there is no rule at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `[server]` settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A policy the rules count with, by name: one of the file's, or one
    /// made for a limit of envoyproxy/ratelimit's configuration.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.config
            .policy(name)
            .or_else(|| self.leaf_policies.get(name))
    }

    /// The name Envoy is told for `layer`'s limit: the file's
    /// `rate_limit.name` for a limit of envoyproxy/ratelimit's
    /// configuration (empty without one, as the reference answers), the
    /// policy's name for a `[[server.rules]]` rule or a leaf's
    /// `tollgate.policy`.
    pub fn limit_name(&self, layer: &LayerDecision) -> &str {
        self.limit_names
            .get(layer.layer())
            .map_or(layer.policy(), String::as_str)
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

    /// The `[[server.rules]]` rule a descriptor of `domain` matches, first
    /// in file order. Its keys must be exactly the rule's, each once.
    fn rule_of(&self, domain: &str, d: &Descriptor) -> Option<usize> {
        let keys: BTreeSet<&String> = d.entries.iter().map(|(k, _)| k).collect();
        if keys.len() != d.entries.len() {
            return None;
        }
        self.rules.iter().position(|rule| {
            let Filling::Entries {
                spec, keys: wanted, ..
            } = &rule.filling
            else {
                return false;
            };
            spec.domain == domain
                && keys.len() == wanted.len()
                && d.entries.iter().all(|(k, v)| {
                    wanted.contains(k)
                        && spec
                            .values
                            .get(k)
                            .is_none_or(|value| value.as_bytes() == v.as_slice())
                })
        })
    }

    /// What descriptor `d` of `domain` finds, and the leaf of
    /// envoyproxy/ratelimit's configuration it landed on, if any. There,
    /// a descriptor with its own limit is counted with it whatever it
    /// matches, as the reference counts it.
    fn find(&self, domain: &str, d: &Descriptor) -> (Found, Option<usize>) {
        let Some(tree) = self.domains.domains.get(domain) else {
            let found = self.rule_of(domain, d).map_or(Found::Unknown, Found::Rule);
            return (found, None);
        };
        if d.limit.is_some() {
            return (Found::Rule(self.override_rules[domain]), None);
        }
        let Some(leaf) = tree.root.find(&d.entries) else {
            return (Found::Unknown, None);
        };
        let found = match (&self.domains.leaves[leaf].counting, self.leaf_rules[leaf]) {
            (Counting::Unlimited, _) => Found::Free { unlimited: true },
            (Counting::Policy(_), Some(rule)) => Found::Rule(rule),
            (&Counting::Zero { shadow }, _) => Found::Zero { leaf, shadow },
            _ => Found::Over { rule: None },
        };
        (found, Some(leaf))
    }

    /// What each descriptor of a request found, once the limits another
    /// descriptor `replaces` are taken out (admitted uncounted, as the
    /// reference does; an `unlimited` one stays so) and overrides that
    /// cannot be counted are over.
    fn found(&self, domain: &str, descriptors: &[Descriptor]) -> Vec<Found> {
        let found: Vec<(Found, Option<usize>)> =
            descriptors.iter().map(|d| self.find(domain, d)).collect();
        let leaves = &self.domains.leaves;
        let replaced: HashSet<&str> = found
            .iter()
            .filter_map(|(_, leaf)| *leaf)
            .flat_map(|l| leaves[l].replaces.iter().map(String::as_str))
            .collect();
        found
            .into_iter()
            .zip(descriptors)
            .map(|((found, leaf), d)| {
                let name = leaf.map_or("", |l| leaves[l].name.as_str());
                let counted = matches!(
                    found,
                    Found::Rule(_)
                        | Found::Over { .. }
                        | Found::Zero { .. }
                        | Found::Free { unlimited: false }
                );
                match found {
                    _ if counted && !name.is_empty() && replaced.contains(name) => {
                        Found::Free { unlimited: false }
                    }
                    Found::Rule(rule)
                        if d.limit
                            .is_some_and(|o| o.limit().is_none() || !self.counts_override(o)) =>
                    {
                        Found::Over { rule: Some(rule) }
                    }
                    found => found,
                }
            })
            .collect()
    }

    /// Whether the descriptors of `domain` are decided together,
    /// all-or-nothing: always for `[[server.rules]]`; for a domain of
    /// envoyproxy/ratelimit's configuration, when it asks to.
    fn together(&self, domain: &str) -> bool {
        self.domains
            .domains
            .get(domain)
            .is_none_or(|d| d.all_or_nothing)
    }

    /// The `rule` label of the counters of `d`, decided by rule `i`.
    fn label(&self, i: usize, d: &Descriptor) -> Arc<str> {
        let rule = &self.rules[i];
        let Filling::Descriptor { leaf: Some(l), .. } = &rule.filling else {
            return rule.label.clone();
        };
        self.detailed_label(*l, d)
            .unwrap_or_else(|| rule.label.clone())
    }

    /// `entries` with the values of the `hashed` keys hashed with the
    /// server's key (which a domain with such keys has: checked when
    /// built), as every counter, label and log line names them.
    fn secrets_hashed<'e>(
        &self,
        entries: &'e [(String, Vec<u8>)],
        hashed: &BTreeSet<String>,
    ) -> std::borrow::Cow<'e, [(String, Vec<u8>)]> {
        let Some(hash_key) = &self.hash_key else {
            return entries.into();
        };
        if !entries.iter().any(|(key, _)| hashed.contains(key)) {
            return entries.into();
        }
        let hide = |(key, value): &(String, Vec<u8>)| {
            let value = if hashed.contains(key) {
                Subject::hashed(value, hash_key).as_str().into()
            } else {
                value.clone()
            };
            (key.clone(), value)
        };
        entries.iter().map(hide).collect::<Vec<_>>().into()
    }

    /// The label `d`'s values give leaf `l`'s counters when it asks for
    /// `detailed_metric` (and the domain's labels are not all taken).
    fn detailed_label(&self, l: usize, d: &Descriptor) -> Option<Arc<str>> {
        let leaf = &self.domains.leaves[l];
        if !leaf.detailed {
            return None;
        }
        let entry = |(k, v): &(String, Vec<u8>)| match std::str::from_utf8(v) {
            Ok(text) if v.len() <= MAX_LABEL_VALUE => format!("{k}_{text}"),
            // A long or binary value is shown by its hash: labels stay
            // small whatever clients send.
            _ => format!("{k}_{}", Subject::hashed(v, odd_values_key())),
        };
        let hashed = &self.domains.domains[&leaf.domain].hashed;
        let entries = self.secrets_hashed(&d.entries, hashed);
        let detailed = entries.iter().map(entry).collect::<Vec<_>>().join(".");
        bounded_label(&leaf.domain, detailed).map(Arc::from)
    }

    /// Count the hits of each descriptor denied without a store call (a
    /// limit of 0, an override that cannot be counted) on its rule's
    /// counters, as the reference counts them: all over the limit, and in
    /// shadow mode all shadow hits too.
    fn count_uncalled(&self, domain: &str, found: &[Found], descriptors: &[Descriptor]) {
        for (found, d) in found.iter().zip(descriptors) {
            match *found {
                Found::Zero { leaf, shadow } => {
                    let counts = Counts::denied_uncalled(d.hits, shadow);
                    if let Some(counters) = &self.zero_counters[leaf] {
                        counters.add(&counts);
                        continue;
                    }
                    let label = self
                        .detailed_label(leaf, d)
                        .unwrap_or_else(|| Arc::from(self.domains.leaves[leaf].label.as_str()));
                    counts.record(domain, &label);
                }
                Found::Over { rule: Some(rule) } => {
                    let counts = Counts::denied_uncalled(d.hits, false);
                    match &self.rules[rule].counters {
                        Some(counters) => counters.add(&counts),
                        None => counts.record(domain, &self.label(rule, d)),
                    }
                }
                _ => {}
            }
        }
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

    /// Whether `limit` is an override these rules count: each distinct one
    /// is a policy of its own, whose layer descriptions and metric series
    /// are kept for good, so a caller sending ever new overrides would grow
    /// them without bound. The first [`MAX_OVERRIDES`] distinct ones seen
    /// are counted; a new one past them makes its descriptor over the limit.
    /// A reload keeps the count ([`keeping_overrides_of`](Self::keeping_overrides_of)):
    /// what it bounds lives as long as the process.
    fn counts_override(&self, limit: LimitOverride) -> bool {
        let mut seen = self.overrides.lock().unwrap_or_else(|p| p.into_inner());
        admit_distinct(&mut seen, limit, MAX_OVERRIDES)
    }

    /// These rules, counting the limit overrides `running` counted: the
    /// rules a reload puts in their place.
    pub(crate) fn keeping_overrides_of(mut self, running: &Rules) -> Rules {
        self.overrides = running.overrides.clone();
        self
    }

    /// The limiter of a combination of rules, each with its descriptor's
    /// override if any: a rule alone is built with the rules; a
    /// combination once, outside the lock decisions read under, and kept
    /// while fewer than [`MAX_CACHED`] are (past it, built for its request
    /// only).
    fn combined(&self, uses: &[RuleUse]) -> Result<Arc<Combined>, BadRequest> {
        if let [(i, None)] = uses {
            if let Some(single) = self.singles.get(*i) {
                return Ok(single.clone());
            }
        }
        let cached = |cache: &HashMap<Vec<RuleUse>, Arc<Combined>>| cache.get(uses).cloned();
        if let Some(c) = cached(&self.combined.read().unwrap_or_else(|p| p.into_inner())) {
            return Ok(c);
        }
        let built = Arc::new(self.build(uses)?);
        let mut cache = self.combined.write().unwrap_or_else(|p| p.into_inner());
        // Another request may have built it meanwhile: one limiter (one
        // breaker) per combination.
        if let Some(c) = cached(&cache) {
            return Ok(c);
        }
        if cache.len() < MAX_CACHED {
            cache.insert(uses.to_vec(), built.clone());
        }
        Ok(built)
    }

    /// A limiter of `uses`' layers, in order.
    fn build(&self, uses: &[RuleUse]) -> Result<Combined, BadRequest> {
        let mut builder =
            self.config
                .limiter_builder(&self.store, self.fallback.as_ref(), &self.clock);
        let mut ranges = Vec::new();
        let mut at = 0;
        for &(i, limit) in uses {
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
        Ok(Combined { limiter, ranges })
    }

    /// The context of descriptor `d` under rule `i`, added to `ctx`.
    fn context(&self, ctx: Context, i: usize, d: &Descriptor) -> Context {
        let mut ctx = match &self.rules[i].filling {
            Filling::Entries { global, .. } => ctx.with_attribute(global.clone(), global_subject()),
            Filling::Descriptor { .. } => ctx,
        };
        for (attribute, _, subject) in self.subjects(i, d) {
            ctx = ctx.with_attribute(attribute, subject);
        }
        ctx
    }

    /// The subject each mapped entry of `d` fills under rule `i`: its
    /// attribute, its key, and the subject (hashed for a `hashed` entry, or
    /// a value that is not a subject as sent); for a rule of
    /// envoyproxy/ratelimit's configuration, the whole descriptor's.
    fn subjects<'d>(&self, i: usize, d: &'d Descriptor) -> Vec<(Arc<str>, &'d str, Subject)> {
        let (spec, attributes) = match &self.rules[i].filling {
            Filling::Entries {
                spec, attributes, ..
            } => (spec, attributes),
            Filling::Descriptor {
                attribute, hashed, ..
            } => {
                let subject = descriptor_subject(&self.secrets_hashed(&d.entries, hashed));
                return vec![(attribute.clone(), "descriptor", subject)];
            }
        };
        let subject = |key: &String, value: &[u8]| match (&self.hash_key, spec.hashed.contains(key))
        {
            (Some(hash_key), true) => Subject::hashed(value, hash_key),
            _ => plain_subject(value),
        };
        d.entries
            .iter()
            .filter_map(|(key, value)| {
                let attribute = attributes.get(key)?.clone();
                Some((attribute, key.as_str(), subject(key, value)))
            })
            .collect()
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
        let Found::Rule(i) = self.find(domain, d).0 else {
            return None;
        };
        let combined = match self.combined(&[(i, d.limit)]) {
            Ok(combined) => combined,
            Err(e) => return Some(Err(e)),
        };
        let rule = &self.rules[i];
        Some(Ok(Target {
            rule: rule.name.clone(),
            limiter: combined.limiter.clone(),
            context: self.context(Context::new(), i, d),
            own: Scope::Attribute(scoped(&rule.name, &Scope::Subject).into()),
            subjects: self
                .subjects(i, d)
                .into_iter()
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
    ///
    /// A domain of envoyproxy/ratelimit's configuration decides each
    /// descriptor on its own, as the reference does (one over its limit
    /// does not stop the others being charged), unless it asks for
    /// `all_or_nothing`.
    pub async fn decide(
        &self,
        domain: &str,
        descriptors: &[Descriptor],
    ) -> Result<Answer, BadRequest> {
        let over = |_| Status {
            ok: false,
            tightest: None,
            limit: None,
            rule: None,
            unlimited: false,
        };
        if descriptors.len() > MAX_DESCRIPTORS {
            // Deciding them would be a store call each: refuse the lot.
            return Ok(Answer {
                statuses: descriptors.iter().map(over).collect(),
                decisions: Vec::new(),
            });
        }
        let found = self.found(domain, descriptors);
        self.count_uncalled(domain, &found, descriptors);
        let matched: Vec<Option<usize>> = found
            .iter()
            .map(|f| match f {
                Found::Rule(i) => Some(*i),
                _ => None,
            })
            .collect();
        let mut statuses: Vec<Status> = found.iter().map(|f| self.first_status(f)).collect();
        let together = self.together(domain);
        let mut denied = together && statuses.iter().any(|s| !s.ok);
        let mut decisions = Vec::new();
        let asked = Asked {
            domain,
            matched: &matched,
            descriptors,
        };
        let rounds = rounds(&matched, descriptors, &statuses, together);
        if !together {
            // Each round on its own: decided at once, so a request of five
            // descriptors waits one store deadline, not five in a row (a
            // stalled store would otherwise outlast Envoy's timeout, and
            // Envoy would let the request through).
            let deciding = rounds
                .into_iter()
                .map(|(cost, ds)| self.decide_round(&asked, ds, cost, false, &statuses));
            for round in all_at_once(deciding.collect()).await {
                decisions.extend(round?.apply(&mut statuses));
            }
            return Ok(Answer {
                statuses,
                decisions,
            });
        }
        for (cost, ds) in rounds {
            let round = self
                .decide_round(&asked, ds, cost, denied, &statuses)
                .await?;
            let Some(decision) = round.apply(&mut statuses) else {
                denied = true;
                continue;
            };
            if !decision.is_allowed() {
                denied = true;
            }
            decisions.push(decision);
        }
        Ok(Answer {
            statuses,
            decisions,
        })
    }

    /// A descriptor's status before anything is decided: what it found
    /// says whether it can still be admitted.
    fn first_status(&self, found: &Found) -> Status {
        Status {
            ok: match found {
                Found::Rule(_) | Found::Free { .. } => true,
                Found::Zero { shadow, .. } => *shadow,
                Found::Over { .. } => false,
                Found::Unknown => self.settings.unknown_descriptors == Unknown::Allow,
            },
            tightest: None,
            limit: None,
            rule: None,
            unlimited: *found == Found::Free { unlimited: true },
        }
    }

    /// A refused charge of several units counted anyway, as the reference
    /// counts every hit: each of the round's `rate_limit` limits (and
    /// Envoy's own overrides) is charged what it still holds, so a charge
    /// that did not fit (made after the response, with
    /// `apply_on_stream_done`) still empties it; the answer then says so
    /// (nothing remaining). Limits named by `tollgate: { policy }` keep
    /// Tollgate's rule: a denial charges nothing. Only a denial the store
    /// made, with the limiter's breaker closed: the charge goes to the
    /// store directly, and must not wait on one that is failing. A failure
    /// here leaves the denial as answered.
    async fn count_refused_hits(
        &self,
        uses: &[RuleUse],
        limiter: &Limiter,
        ctx: &Context,
        cost: u64,
        decided: Result<Decision, tollgate_limiter::Error>,
    ) -> Result<Decision, tollgate_limiter::Error> {
        let refused = match &decided {
            Ok(decision) => {
                !decision.is_allowed()
                    && decision
                        .denied_layers()
                        .all(|l| l.source == tollgate_limiter::Source::Store)
            }
            // A cost larger than a layer can ever hold.
            Err(e) => matches!(e, tollgate_limiter::Error::Policy(_)),
        };
        let healthy = limiter.breaker().state() == tollgate_limiter::BreakerState::Closed;
        // One unit refused: the limit was already empty.
        if !refused || !healthy || cost < 2 {
            return decided;
        }
        let mut emptied = Vec::new();
        for &(i, _) in uses {
            if let Some(own) = self.counts_every_hit(i) {
                if limiter.on_scope(&own).penalize(ctx, cost).await.is_ok() {
                    emptied.push(self.rules[i].name.as_str());
                }
            }
        }
        let Ok(decision) = decided else {
            return decided;
        };
        let layers = decision.layers().iter().map(|l| {
            if !emptied.contains(&l.layer()) {
                return *l;
            }
            let verdict = l.verdict();
            l.with_verdict(tollgate_limiter::Verdict {
                remaining: 0,
                ..verdict
            })
        });
        Ok(Decision::new(layers))
    }

    /// The scope of rule `i`'s layer when it counts as the reference does
    /// (a YAML `rate_limit`, or a domain's rule for Envoy's own limits).
    fn counts_every_hit(&self, i: usize) -> Option<Scope> {
        let Filling::Descriptor {
            attribute, leaf, ..
        } = &self.rules[i].filling
        else {
            return None;
        };
        let reference = match leaf {
            None => true,
            Some(l) => {
                let leaf = &self.domains.leaves[*l];
                matches!(&leaf.counting, Counting::Policy(p) if p.name() == leaf.rule)
            }
        };
        reference.then(|| Scope::Attribute(attribute.clone()))
    }

    /// Decide one round, descriptors `ds` at `cost` each (`statuses`: every
    /// descriptor's so far): charged, or only peeked once the request is
    /// `denied`. Its decision is `None` when the limiter refused the
    /// request as bad input.
    async fn decide_round(
        &self,
        asked: &Asked<'_>,
        mut ds: Vec<usize>,
        cost: u64,
        denied: bool,
        statuses: &[Status],
    ) -> Result<Round, BadRequest> {
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
        // After a denial nothing more is charged: the rest is peeked; so is
        // a round of descriptors that only check (cost 0), for one unit.
        let decided = if denied || cost == 0 {
            limiter.peek(&ctx, cost.max(1)).await
        } else {
            let decided = limiter.check(&ctx, cost).await;
            if self.together(asked.domain) {
                decided
            } else {
                self.count_refused_hits(&rules, limiter, &ctx, cost, decided)
                    .await
            }
        };
        // An error is bad input for a layer — more than it can ever hold
        // — so the request is over the limit (an error answer would be an
        // allow in Envoy).
        let mut round = Round {
            statuses: ds.iter().map(|&d| (d, statuses[d].clone())).collect(),
            decision: None,
        };
        let Ok(decision) = decided else {
            for (_, status) in &mut round.statuses {
                status.ok = false;
            }
            return Ok(round);
        };
        let decided = round.statuses.iter_mut().zip(&combined.ranges).zip(&rules);
        for (((d, status), range), &(rule, _)) in decided {
            let d = *d;
            let layers = &decision.layers()[range.clone()];
            let enforced = || layers.iter().filter(|l| !l.is_shadow());
            let tightest = |ls: &mut dyn Iterator<Item = &LayerDecision>| {
                ls.min_by_key(|l| l.tightness()).copied()
            };
            status.ok = enforced().all(|l| l.verdict().allowed);
            // A rule whose layers are all in shadow mode still reports
            // its limit (answered OK), as the reference does.
            status.tightest = tightest(&mut enforced()).or_else(|| tightest(&mut layers.iter()));
            status.limit = descriptors[d].limit;
            let shadow_denied = layers.iter().any(|l| l.is_shadow() && !l.verdict().allowed);
            let counts = Counts::of(cost, status.tightest.as_ref(), shadow_denied);
            let label = self.label(rule, &descriptors[d]);
            match &self.rules[rule].counters {
                Some(counters) => counters.add(&counts),
                None => counts.record(asked.domain, &label),
            }
            status.rule = Some(label);
        }
        round.decision = Some(decision);
        Ok(round)
    }
}

/// What one round decided: its descriptors' statuses, and its decision
/// (`None`: refused as bad input, its descriptors over the limit).
struct Round {
    statuses: Vec<(usize, Status)>,
    decision: Option<Decision>,
}

impl Round {
    /// Write the round's statuses into the request's; its decision.
    fn apply(self, statuses: &mut [Status]) -> Option<Decision> {
        for (d, status) in self.statuses {
            statuses[d] = status;
        }
        self.decision
    }
}

/// The outputs of `futures`, in order, run at once (each polled until it
/// answers, never after).
async fn all_at_once<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(answer) => *output = Some(answer),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future answered"))
        .collect()
}

/// A request being decided: its domain, its descriptors, and the rule
/// each matched.
struct Asked<'a> {
    domain: &'a str,
    matched: &'a [Option<usize>],
    descriptors: &'a [Descriptor],
}

/// The rounds of a request: descriptors whose rules differ and whose costs
/// agree are decided together (when `together`; else each on its own);
/// those already over the limit (no rule, an override that cannot be
/// counted) are left out.
fn rounds(
    matched: &[Option<usize>],
    descriptors: &[Descriptor],
    statuses: &[Status],
    together: bool,
) -> Vec<(u64, Vec<usize>)> {
    let mut rounds: Vec<(u64, Vec<usize>)> = Vec::new();
    for (d, rule) in matched.iter().enumerate() {
        let Some(rule) = rule else { continue };
        if !statuses[d].ok {
            continue;
        }
        let hits = descriptors[d].hits;
        let joins = |(cost, ds): &&mut (u64, Vec<usize>)| {
            together && *cost == hits && ds.iter().all(|&o| matched[o] != Some(*rule))
        };
        match rounds.iter_mut().find(joins) {
            Some((_, ds)) => ds.push(d),
            None => rounds.push((hits, vec![d])),
        }
    }
    rounds
}
