//! The file's sections, and their validation: every error is collected with
//! its field path, none stops the others from being found.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use tollgate_http::{check_method, check_path, check_subject, AccessRules, Cidr};
use tollgate_limiter::{
    check_name, duplicate_names, shared_counters, BreakerConfig, DurationSpec, FieldKind,
    KeyBudget, Layer, Lease, Limit, LimitSpec, ModeSpec, OnFailureSpec, Policy, PolicyError, Scope,
    Subject, WhenFullSpec,
};
use tollgate_memory::MemorySettings;
use toml::{Table, Value};

use crate::{
    check_duration, field_error, Config, ConfigError, LayerDef, RouteDef, StoreKinds,
    DEFAULT_FALLBACK_MAX_KEYS,
};

/// The `[store]` section: where the counters live.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StoreSpec {
    /// `kind = "memory"`: the in-process store.
    Memory(MemorySettings),
    /// `kind = "redis"`, `"redis-sentinel"` or `"redis-cluster"`: a Redis
    /// store, its settings its own (feature `redis`).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(Box<tollgate_redis::RedisSettings>),
    /// A kind registered with [`StoreKinds`](crate::StoreKinds).
    Custom(crate::CustomStore),
}

impl StoreSpec {
    /// `memory`, `redis`, `redis-sentinel`, `redis-cluster` or a
    /// registered kind's name.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreSpec::Custom(custom) => custom.kind(),
            StoreSpec::Memory(_) => "memory",
            #[cfg(feature = "redis")]
            StoreSpec::Redis(settings) => settings.kind.name(),
        }
    }

    /// Whether `other` opens the same store: an in-process store's
    /// settings compared with their defaults filled in (a reload that only
    /// writes a default out keeps the running store and its counters);
    /// any other store's as written.
    pub fn opens_the_same_store_as(&self, other: &StoreSpec) -> bool {
        match (self, other) {
            (StoreSpec::Memory(a), StoreSpec::Memory(b)) => a.builds_the_same_store_as(b),
            _ => self == other,
        }
    }

    /// Whether the store keeps its state in this process, so that a new
    /// one starts empty: `memory`, or a registered kind that says so
    /// ([`StoreKind::in_process`](crate::StoreKind::in_process)).
    pub fn in_process(&self) -> bool {
        match self {
            StoreSpec::Memory(_) => true,
            StoreSpec::Custom(custom) => custom.in_process(),
            #[cfg(feature = "redis")]
            StoreSpec::Redis(_) => false,
        }
    }

    /// Whether replacing this running store by `next` would lose its
    /// state: it is kept [in process](Self::in_process), and `next` opens
    /// another one. Only a restart may do it.
    pub fn loses_state_when_replaced_by(&self, next: &StoreSpec) -> bool {
        self.in_process() && !next.opens_the_same_store_as(self)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FallbackSpec {
    max_keys: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BreakerSpec {
    failure_threshold: Option<u32>,
    open_for: Option<DurationSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessSpec {
    #[serde(default)]
    exempt_subjects: Vec<String>,
    #[serde(default)]
    exempt_networks: Vec<String>,
    #[serde(default)]
    deny_subjects: Vec<String>,
    #[serde(default)]
    deny_networks: Vec<String>,
    #[serde(default)]
    skip_methods: Vec<String>,
    #[serde(default)]
    skip_paths: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteSpec {
    cost: Option<u64>,
    layers: Vec<LayerSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerSpec {
    name: Option<String>,
    scope: ScopeSpec,
    policy: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ScopeSpec {
    #[serde(alias = "key")]
    Subject,
    Tenant,
    Global,
    Attribute(String),
}

const SECTIONS: &str = "store, fallback, breaker, access, policies, plans, routes, server";

/// Validate a parsed document.
pub(crate) fn parse(mut doc: Table, kinds: &StoreKinds) -> Result<Config, ConfigError> {
    let mut errors = Vec::new();
    let store = match doc.remove("store") {
        Some(value) if !kinds.ignores_store() => store(&mut errors, value, kinds),
        // None, or one the caller's own store stands in for.
        _ => Some(StoreSpec::Memory(MemorySettings::default())),
    };
    let fallback_max_keys = fallback_section(&mut errors, doc.remove("fallback"));
    let breaker = breaker_section(&mut errors, doc.remove("breaker"));
    let access = match doc.remove("access") {
        Some(value) => de::<AccessSpec>(&mut errors, "access", value)
            .map(|spec| access(&mut errors, spec))
            .unwrap_or_default(),
        None => AccessRules::new(),
    };
    // Invalid policies stay in the map as `None`: routes and plans naming
    // them are not reported again as naming an undefined policy.
    let policies = named_section(&mut errors, "policies", doc.remove("policies"), policy);
    let plans = doc
        .remove("plans")
        .and_then(|value| crate::plans::plans(&mut errors, value, &policies));
    let routes = named_section(
        &mut errors,
        "routes",
        doc.remove("routes"),
        |errors, name, value| route(errors, name, value, &policies),
    );
    let routes: BTreeMap<String, RouteDef> = routes
        .into_iter()
        .filter_map(|(name, r)| r.map(|r| (name, r)))
        .collect();
    if let Some(plans) = &plans {
        plans.check_costs(&mut errors, &routes);
    }
    let server = server_section(&mut errors, doc.remove("server"));
    for key in doc.keys() {
        errors.push(field_error(
            key,
            format!("unknown section; the sections are {SECTIONS}"),
        ));
    }
    match (store, fallback_max_keys, breaker) {
        (Some(store), Some(fallback_max_keys), Some(breaker)) if errors.is_empty() => Ok(Config {
            store,
            fallback_max_keys,
            breaker,
            access,
            policies: policies
                .into_iter()
                .filter_map(|(name, p)| p.map(|p| (name, p)))
                .collect(),
            routes,
            plans,
            server,
            kinds: kinds.reading_store(),
        }),
        _ => Err(ConfigError::Invalid(errors)),
    }
}

/// `[fallback]`: the emergency store's size (default
/// [`DEFAULT_FALLBACK_MAX_KEYS`]); `None` when invalid.
fn fallback_section(errors: &mut Vec<PolicyError>, value: Option<Value>) -> Option<usize> {
    let Some(value) = value else {
        return Some(DEFAULT_FALLBACK_MAX_KEYS);
    };
    let fallback = de::<FallbackSpec>(errors, "fallback", value)?;
    if fallback.max_keys == 0 {
        errors.push(field_error("fallback.max_keys", "must be > 0"));
        return None;
    }
    Some(fallback.max_keys)
}

/// `[breaker]`: the circuit breaker's settings; `None` when invalid.
fn breaker_section(errors: &mut Vec<PolicyError>, value: Option<Value>) -> Option<BreakerConfig> {
    let mut config = BreakerConfig::default();
    let Some(value) = value else {
        return Some(config);
    };
    let spec = de::<BreakerSpec>(errors, "breaker", value)?;
    if let Some(n) = spec.failure_threshold {
        if n == 0 {
            errors.push(field_error("breaker.failure_threshold", "must be > 0"));
        }
        config.failure_threshold = n;
    }
    if let Some(d) = spec.open_for {
        check_duration(errors, "breaker.open_for", d, Duration::from_secs(3600));
        config.open_for = d.0;
    }
    Some(config)
}

/// A section of named tables (`[policies.<name>]`, `[routes.<name>]`),
/// each read by `read`; an entry that is invalid is kept as `None`.
fn named_section<T>(
    errors: &mut Vec<PolicyError>,
    section: &str,
    value: Option<Value>,
    mut read: impl FnMut(&mut Vec<PolicyError>, &str, Value) -> Option<T>,
) -> BTreeMap<String, Option<T>> {
    let mut read_all = BTreeMap::new();
    match value {
        Some(Value::Table(table)) => {
            for (name, value) in table {
                let entry = read(errors, &name, value);
                read_all.insert(name, entry);
            }
        }
        Some(other) => errors.push(field_error(
            section,
            format!(
                "must be a table of named {section} ([{section}.<name>]), not a {}",
                other.type_str()
            ),
        )),
        None => {}
    }
    read_all
}

/// `[server]`: the rate limit server's own section, which it validates.
fn server_section(errors: &mut Vec<PolicyError>, value: Option<Value>) -> Option<Table> {
    match value? {
        Value::Table(table) => Some(table),
        other => {
            errors.push(field_error(
                "server",
                format!("must be a table ([server]), not a {}", other.type_str()),
            ));
            None
        }
    }
}

/// The `[access]` rules, every entry checked (an error names its index).
fn access(errors: &mut Vec<PolicyError>, spec: AccessSpec) -> AccessRules {
    let mut rules = AccessRules::new();
    let subjects = |errors: &mut Vec<PolicyError>, field: &str, values: Vec<String>| {
        values
            .into_iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let checked = Subject::new(&v).map_err(|e| e.to_string());
                match checked.and_then(|s| check_subject(s.as_str()).map(|()| s)) {
                    Ok(subject) => Some(subject),
                    Err(why) => {
                        errors.push(field_error(&format!("access.{field}[{i}]"), why));
                        None
                    }
                }
            })
            .collect::<Vec<_>>()
    };
    let networks = |errors: &mut Vec<PolicyError>, field: &str, values: Vec<String>| {
        values
            .into_iter()
            .enumerate()
            .filter_map(|(i, v)| match v.parse::<Cidr>() {
                Ok(network) => Some(network),
                Err(e) => {
                    errors.push(field_error(&format!("access.{field}[{i}]"), e.to_string()));
                    None
                }
            })
            .collect::<Vec<_>>()
    };
    for s in subjects(errors, "exempt_subjects", spec.exempt_subjects) {
        rules = rules.exempt_subject(s);
    }
    for s in subjects(errors, "deny_subjects", spec.deny_subjects) {
        rules = rules.deny_subject(s);
    }
    for n in networks(errors, "exempt_networks", spec.exempt_networks) {
        rules = rules.exempt_network(n);
    }
    for n in networks(errors, "deny_networks", spec.deny_networks) {
        rules = rules.deny_network(n);
    }
    for (i, method) in spec.skip_methods.into_iter().enumerate() {
        match check_method(&method) {
            Ok(()) => rules = rules.skip_method(&method),
            Err(why) => errors.push(field_error(&format!("access.skip_methods[{i}]"), why)),
        }
    }
    for (i, path) in spec.skip_paths.into_iter().enumerate() {
        match check_path(&path) {
            Ok(()) => rules = rules.skip_path(&path),
            Err(why) => errors.push(field_error(&format!("access.skip_paths[{i}]"), why)),
        }
    }
    rules
}

/// Deserialize `value` as `T`, recording an error at `path` (plus the path
/// inside `value`) when it does not fit.
pub(crate) fn de<T: DeserializeOwned>(
    errors: &mut Vec<PolicyError>,
    path: &str,
    value: Value,
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let inner = e.path().to_string();
            let full = if inner == "." {
                path.to_string()
            } else if inner.starts_with('[') {
                format!("{path}{inner}")
            } else {
                format!("{path}.{inner}")
            };
            // toml appends "\nin `key`" to some messages: the path says it already.
            let message = e.into_inner().to_string();
            let message = message.lines().next().unwrap_or_default().trim();
            // A store's values hold passwords (URLs, `password`): its
            // messages never repeat what was written.
            let message = match full.split(['.', '[']).next() == Some("store") {
                true => without_values(message),
                false => message.to_string(),
            };
            errors.push(field_error(&full, message));
            None
        }
    }
}

/// `message` with the value it quotes first (`"…"` or `` `…` ``: serde
/// quotes what it read first, then what it expected) replaced by `…`;
/// unchanged when what it quotes is a field's name (`unknown field`,
/// `missing field`), never a secret. (`unknown variant` quotes the value
/// written, then the choices: the value goes.)
pub(crate) fn without_values(message: &str) -> String {
    let names = ["unknown field", "missing field", "duplicate field"];
    if names.iter().any(|n| message.starts_with(n)) {
        return message.to_string();
    }
    let Some(start) = message.find(['"', '`']) else {
        return message.to_string();
    };
    let quote = &message[start..=start];
    let after = &message[start + 1..];
    // (Unclosed, the rest is the value.) A quote escaped inside it (`\"`,
    // as serde's Debug writes one) does not close it.
    let end = closing_quote(after, quote).map_or(message.len(), |at| start + 1 + at);
    format!(
        "{}{quote}…{quote}{}",
        &message[..start],
        message.get(end + 1..).unwrap_or("")
    )
}

/// Where in `text` the quote `quote` closes, skipping escaped characters.
fn closing_quote(text: &str, quote: &str) -> Option<usize> {
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            c if quote.starts_with(c) => return Some(at),
            _ => {}
        }
    }
    None
}

fn store(errors: &mut Vec<PolicyError>, value: Value, kinds: &StoreKinds) -> Option<StoreSpec> {
    let Value::Table(mut table) = value else {
        errors.push(field_error("store", "must be a table ([store])"));
        return None;
    };
    let kind = table.remove("kind");
    let Some(kind) = kind.as_ref().and_then(Value::as_str) else {
        let reason = format!(
            "missing or not a string; write kind = {}",
            kind_names(kinds)
        );
        errors.push(field_error("store.kind", reason));
        return None;
    };
    match kind {
        "memory" => {
            let settings = de::<MemorySettings>(errors, "store", Value::Table(table))?;
            for (field, reason) in settings.problems() {
                errors.push(field_error(&format!("store.{field}"), reason));
            }
            Some(StoreSpec::Memory(settings))
        }
        "redis" | "redis-sentinel" | "redis-cluster" => redis_store(errors, kind, table),
        other => match kinds.find(other) {
            Some(kind) => kind.read(errors, table).map(StoreSpec::Custom),
            None => {
                let reason = format!("{other:?} is not a store; write {}", kind_names(kinds));
                errors.push(field_error("store.kind", reason));
                None
            }
        },
    }
}

/// Every kind a file may name, as `"memory", "redis", … or "postgres"`.
fn kind_names(kinds: &StoreKinds) -> String {
    let names: Vec<String> = crate::store_kind::BUILT_IN
        .into_iter()
        .chain(kinds.names())
        .map(|name| format!("{name:?}"))
        .collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// A `redis`, `redis-sentinel` or `redis-cluster` store: the Redis
/// store reads and checks its own settings.
#[cfg(feature = "redis")]
fn redis_store(errors: &mut Vec<PolicyError>, kind: &str, mut table: Table) -> Option<StoreSpec> {
    // The Redis settings name their kind themselves.
    table.insert("kind".into(), Value::String(kind.into()));
    let settings = de::<tollgate_redis::RedisSettings>(errors, "store", Value::Table(table))?;
    for (field, reason) in settings.problems() {
        errors.push(field_error(&format!("store.{field}"), reason));
    }
    Some(StoreSpec::Redis(Box::new(settings)))
}

/// Without the Redis store in the build, a Redis kind is refused.
#[cfg(not(feature = "redis"))]
fn redis_store(errors: &mut Vec<PolicyError>, kind: &str, _: Table) -> Option<StoreSpec> {
    let reason = format!(
        "{kind:?} needs the Redis store; enable the `redis` feature of `tollgate` (or `tollgate-config`)"
    );
    errors.push(field_error("store.kind", reason));
    None
}

/// One `[policies.<name>]` table; `None` when invalid (the errors are recorded).
fn policy(errors: &mut Vec<PolicyError>, name: &str, value: Value) -> Option<Policy> {
    let path = format!("policies.{name}");
    let Value::Table(mut table) = value else {
        errors.push(field_error(
            &path,
            "must be a table with an algorithm and its parameters",
        ));
        return None;
    };
    let before = errors.len();
    let extras = policy_extras(errors, &path, &mut table);
    let limit = limit(errors, &path, table, POLICY_FIELDS);
    let (Some(limit), Some(extras)) = (limit, extras) else {
        return None;
    };
    if errors.len() > before {
        return None;
    }
    match extras.policy(name, &path, limit) {
        Ok(policy) => Some(policy),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// What a policy's table holds besides its limit.
struct PolicyExtras {
    version: u32,
    on_failure: Option<OnFailureSpec>,
    max_keys: Option<usize>,
    when_full: Option<WhenFullSpec>,
    shadow: bool,
    leased: Option<LeaseSpec>,
}

/// A policy's `leased = { duration = "1s", max_batch = 200 }`: its hot keys
/// admitted from batches charged in the store (see `Lease`); both fields
/// optional (1 s, a sixteenth of the capacity).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseSpec {
    duration: Option<DurationSpec>,
    max_batch: Option<u64>,
}

impl LeaseSpec {
    fn build(self) -> Result<Lease, PolicyError> {
        let lease = match self.duration {
            Some(d) => Lease::new(d.0)?,
            None => Lease::default(),
        };
        match self.max_batch {
            Some(units) => lease.with_max_batch(units),
            None => Ok(lease),
        }
    }
}

/// Take a policy's fields other than its limit's out of `table` (errors
/// under `path`); `None` when one is invalid.
fn policy_extras(
    errors: &mut Vec<PolicyError>,
    path: &str,
    table: &mut Table,
) -> Option<PolicyExtras> {
    let before = errors.len();
    let version = match table.remove("version") {
        None => 1,
        Some(Value::Integer(v)) if v >= 1 && v <= i64::from(u32::MAX) => v as u32,
        Some(v) => {
            let reason = format!(
                "{} must be a whole number between 1 and {}",
                show(&v),
                u32::MAX
            );
            errors.push(field_error(&format!("{path}.version"), reason));
            1
        }
    };
    let mut field = |name: &str| table.remove(name).map(|v| (format!("{path}.{name}"), v));
    let on_failure = field("on_failure").and_then(|(at, v)| de::<OnFailureSpec>(errors, &at, v));
    let max_keys = match field("max_keys") {
        None => None,
        Some((_, Value::Integer(n))) if n >= 1 => Some(n as usize),
        Some((at, v)) => {
            errors.push(field_error(
                &at,
                format!("{} must be a whole number > 0", show(&v)),
            ));
            None
        }
    };
    let when_full = field("when_full").and_then(|(at, v)| de::<WhenFullSpec>(errors, &at, v));
    let mode = field("mode").and_then(|(at, v)| de::<ModeSpec>(errors, &at, v));
    let leased = field("leased").and_then(|(at, v)| de::<LeaseSpec>(errors, &at, v));
    if max_keys.is_none()
        && when_full.is_some()
        && !table_had_error(errors, before, path, "max_keys")
    {
        errors.push(field_error(
            &format!("{path}.when_full"),
            "applies to a key budget: set max_keys too",
        ));
    }
    (errors.len() == before).then_some(PolicyExtras {
        version,
        on_failure,
        max_keys,
        when_full,
        shadow: matches!(mode, Some(ModeSpec::Shadow)),
        leased,
    })
}

/// Whether an error about `<path>.<field>` was reported since `before`.
fn table_had_error(errors: &[PolicyError], before: usize, path: &str, field: &str) -> bool {
    let at = format!("{path}.{field}");
    errors[before..].iter().any(|e| e.field() == at)
}

impl PolicyExtras {
    /// The policy named `name` (at `path`) with `limit` and these fields.
    fn policy(self, name: &str, path: &str, limit: Limit) -> Result<Policy, PolicyError> {
        let mut policy = Policy::new(name, limit)
            .map_err(|e| field_error(path, format!("the policy name {}", e.reason())))?
            .with_version(self.version);
        if let Some(max_keys) = self.max_keys {
            let when_full = self.when_full.map(Into::into).unwrap_or_default();
            let budget = KeyBudget::new(max_keys, when_full).map_err(|e| e.within(path))?;
            policy = policy.with_key_budget(budget);
        }
        if self.shadow {
            policy = policy.shadow();
        }
        if let Some(spec) = self.leased {
            let lease = spec.build().map_err(|e| e.within(path))?;
            policy = policy.leased(lease).map_err(|e| e.within(path))?;
        }
        let Some(spec) = self.on_failure else {
            return Ok(policy);
        };
        let at = format!("{path}.on_failure");
        let on_failure = spec.build().map_err(|e| e.within(&at))?;
        policy
            .with_on_failure(on_failure)
            .map_err(|e| e.within(&at))
    }
}

/// What a policy's table holds besides its limit's fields.
const POLICY_FIELDS: &str = "version, mode, on_failure, max_keys, when_full and leased";

/// The limit `table` describes (an algorithm and its parameters; `also`
/// names the other fields the table's owner takes, already removed), every
/// error reported with its field path under `path`.
pub(crate) fn limit(
    errors: &mut Vec<PolicyError>,
    path: &str,
    mut table: Table,
    also: &str,
) -> Option<Limit> {
    let before = errors.len();
    // Check the parameters' types here, where the field path is known
    // (the tagged LimitSpec reports them without it).
    for (key, value) in table.iter_mut() {
        let kind = LimitSpec::field_kind(key);
        if kind == Some(FieldKind::Count) && !matches!(value, Value::Integer(n) if *n >= 0) {
            errors.push(field_error(
                &format!("{path}.{key}"),
                format!("{} must be a whole number > 0", show(value)),
            ));
            *value = Value::Integer(1);
        } else if kind == Some(FieldKind::Duration) {
            let parsed = match value.as_str() {
                Some(text) => text.parse::<DurationSpec>(),
                None => Err(format!(
                    "{} must be a duration string such as \"500ms\", \"1s\", \"5m\", \"2h\" or \"1d\"",
                    show(value)
                )),
            };
            if let Err(reason) = parsed {
                errors.push(field_error(&format!("{path}.{key}"), reason));
                *value = Value::String("1s".into());
            }
        } else if kind == Some(FieldKind::Text) && !value.is_str() {
            errors.push(field_error(
                &format!("{path}.{key}"),
                format!("{} must be a string", show(value)),
            ));
            *value = Value::String(String::new());
        }
    }
    let unknown_fields = unknown_limit_fields(errors, path, &mut table, also);
    let spec = de::<LimitSpec>(errors, path, Value::Table(table));
    if errors.len() > before + unknown_fields {
        return None;
    }
    match spec?.build() {
        Ok(limit) => (unknown_fields == 0).then_some(limit),
        Err(e) => {
            errors.push(e.within(path));
            None
        }
    }
}

/// Report (and drop) the fields of `table` its algorithm does not take,
/// so the limit's values are still checked in the same pass; how many.
fn unknown_limit_fields(
    errors: &mut Vec<PolicyError>,
    path: &str,
    table: &mut Table,
    also: &str,
) -> usize {
    let fields: Option<Vec<&str>> = table
        .get("algorithm")
        .and_then(Value::as_str)
        .and_then(LimitSpec::fields)
        .map(|fields| fields.iter().map(|(name, _)| *name).collect());
    let Some(fields) = fields else {
        return 0;
    };
    let before = errors.len();
    let also = if also.is_empty() {
        String::new()
    } else {
        format!(", plus {also}")
    };
    table.retain(|key, _| {
        let known = key == "algorithm" || fields.contains(&key);
        if !known {
            errors.push(field_error(
                &format!("{path}.{key}"),
                format!(
                    "unknown field `{key}`; this algorithm takes {}{also}",
                    fields.join(", ")
                ),
            ));
        }
        known
    });
    errors.len() - before
}

fn route(
    errors: &mut Vec<PolicyError>,
    name: &str,
    value: Value,
    policies: &BTreeMap<String, Option<Policy>>,
) -> Option<RouteDef> {
    let path = format!("routes.{name}");
    let spec = de::<RouteSpec>(errors, &path, value)?;
    let before = errors.len();
    let cost = spec.cost.unwrap_or(1);
    if cost == 0 {
        errors.push(field_error(&format!("{path}.cost"), "must be > 0"));
    }
    if spec.layers.is_empty() {
        errors.push(field_error(
            &format!("{path}.layers"),
            "must list at least one layer, like [{ scope = \"subject\", policy = \"<name>\" }]",
        ));
    }
    let mut layers = Vec::with_capacity(spec.layers.len());
    let mut checked = Vec::with_capacity(spec.layers.len());
    for (i, layer) in spec.layers.into_iter().enumerate() {
        let at = format!("{path}.layers[{i}]");
        let scope = layer_scope(errors, &at, layer.scope);
        let layer_name = layer.name.unwrap_or_else(|| default_layer_name(&scope));
        if let Some(policy) = layer_policy(errors, &path, i, &layer.policy, cost, policies) {
            checked.push((
                i,
                Layer::new(layer_name.as_str(), scope.clone(), policy.clone()),
            ));
        }
        layers.push(LayerDef {
            name: layer_name,
            scope,
            policy: layer.policy,
        });
    }
    route_conflicts(errors, &path, &layers, checked);
    (errors.len() == before).then_some(RouteDef { cost, layers })
}

/// A layer's scope (an attribute's name checked, errors under `at`).
fn layer_scope(errors: &mut Vec<PolicyError>, at: &str, scope: ScopeSpec) -> Scope {
    match scope {
        ScopeSpec::Subject => Scope::Subject,
        ScopeSpec::Tenant => Scope::Tenant,
        ScopeSpec::Global => Scope::Global,
        ScopeSpec::Attribute(attr) => {
            if let Err(e) = check_name("scope.attribute", &attr) {
                errors.push(e.within(at));
            }
            Scope::Attribute(Arc::from(attr))
        }
    }
}

/// The name of a layer that gives none: its scope's.
fn default_layer_name(scope: &Scope) -> String {
    match scope {
        Scope::Attribute(attr) => attr.to_string(),
        Scope::Tenant => "tenant".into(),
        Scope::Global => "global".into(),
        _ => "subject".into(),
    }
}

/// The valid policy layer `i` of route `path` names, which must exist and
/// take the route's `cost`; `None` (reported, or already reported as
/// invalid) otherwise.
fn layer_policy<'p>(
    errors: &mut Vec<PolicyError>,
    path: &str,
    i: usize,
    name: &str,
    cost: u64,
    policies: &'p BTreeMap<String, Option<Policy>>,
) -> Option<&'p Policy> {
    let Some(policy) = policies.get(name) else {
        let defined: Vec<&str> = policies.keys().map(String::as_str).collect();
        let defined = match defined.is_empty() {
            true => "none".to_string(),
            false => defined.join(", "),
        };
        errors.push(field_error(
            &format!("{path}.layers[{i}].policy"),
            format!("no policy named {name:?} is defined under [policies] (defined: {defined})"),
        ));
        return None;
    };
    let policy = policy.as_ref()?;
    if cost > policy.capacity() {
        errors.push(field_error(
            &format!("{path}.cost"),
            format!(
                "{cost} is more than the capacity {} of policy {name:?} (layers[{i}]): no request could ever pass",
                policy.capacity(),
            ),
        ));
    } else if let Some(fallback) = policy.fallback_policy().filter(|f| cost > f.capacity()) {
        errors.push(field_error(
            &format!("{path}.cost"),
            format!(
                "{cost} is more than the capacity {} of policy {name:?}'s emergency limit (its on_failure; layers[{i}]): no request could pass while the store is down",
                fallback.capacity(),
            ),
        ));
    }
    Some(policy)
}

/// The limiter's own rules for the layers of one route, each reported
/// where the layer was written (a layer whose policy is missing or invalid
/// is already reported and has no counter to compare: `checked` holds the
/// others, with their index).
fn route_conflicts(
    errors: &mut Vec<PolicyError>,
    path: &str,
    layers: &[LayerDef],
    checked: Vec<(usize, Layer)>,
) {
    for (i, duplicate) in duplicate_names(layers.iter().map(|l: &LayerDef| l.name.as_str())) {
        errors.push(field_error(
            &format!("{path}.layers[{i}].name"),
            duplicate.to_string(),
        ));
    }
    let (at, counting): (Vec<usize>, Vec<Layer>) = checked.into_iter().unzip();
    for (i, shared) in shared_counters(&counting) {
        errors.push(field_error(
            &format!("{path}.layers[{}]", at[i]),
            shared.to_string(),
        ));
    }
}

/// A value as the user wrote it, for messages (scalars), or its type.
fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Integer(n) => n.to_string(),
        Value::Float(x) => x.to_string(),
        Value::Boolean(b) => b.to_string(),
        other => format!("a {}", other.type_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::without_values;

    /// The value a store's message quotes is left out, a quote escaped
    /// inside it included (the rest of a password once followed it).
    #[test]
    fn a_stores_message_repeats_no_value() {
        let message = r#"invalid value: string "postgres://u:pa\"SECRET@h:99999", expected a URL"#;
        let hidden = without_values(message);
        assert!(!hidden.contains("SECRET"), "{hidden}");
        assert_eq!(hidden, r#"invalid value: string "…", expected a URL"#);
        let named = "unknown field `pasword`, expected one of `url`, `password`";
        assert_eq!(without_values(named), named);
        let variant = "unknown variant `hunter2`, expected `evict` or `refuse`";
        assert_eq!(
            without_values(variant),
            "unknown variant `…`, expected `evict` or `refuse`"
        );
    }
}
