//! The `[server]` section of the configuration file: where the server
//! listens, and which Envoy descriptors map to which routes.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;
use tollgate_config::Config;

use crate::error::ServerError;

/// What an unknown descriptor (no rule matches it) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Unknown {
    /// `OK`, as Envoy's own rate limit service answers (the default).
    #[default]
    Allow,
    /// `OVER_LIMIT`.
    Deny,
}

/// What a descriptor entry's value fills in the request's context.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Role {
    /// The subject (layers with `scope = "subject"`).
    Subject,
    /// The tenant (`scope = "tenant"`).
    Tenant,
    /// A named attribute (`scope = { attribute = "…" }`).
    Attribute(String),
}

impl Role {
    /// The scope of the layers it fills.
    pub fn scope(&self) -> tollgate_limiter::Scope {
        use tollgate_limiter::Scope;
        match self {
            Role::Subject => Scope::Subject,
            Role::Tenant => Scope::Tenant,
            Role::Attribute(name) => Scope::Attribute(name.as_str().into()),
        }
    }
}

/// One rule: descriptors of `domain` whose entry keys are exactly those of
/// `entries` and `values` (and whose values match `values`) are decided by
/// the layers of `route`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The rule's name: its layers are named `<name>.<layer>`, and its
    /// counters are its own.
    pub name: String,
    /// The Envoy domain.
    pub domain: String,
    /// A `[routes.<name>]` of the file: its layers and their policies.
    pub route: String,
    /// Descriptor entry key → what its value fills.
    #[serde(default)]
    pub entries: BTreeMap<String, Role>,
    /// Descriptor entry key → the value it must have (Envoy's
    /// `generic_key`, a fixed `header_value_match`…).
    #[serde(default)]
    pub values: BTreeMap<String, String>,
    /// Entry keys whose values are secrets (API keys): hashed with the
    /// server's hash key before they reach a store key.
    #[serde(default)]
    pub hashed: Vec<String>,
}

impl RuleSpec {
    /// What one rule must be on its own: a valid name, a route of the
    /// file, entries, and hashed entries that are among them (with a hash
    /// key when there are any).
    fn check(&self, config: &Config, has_hash_key: bool) -> Result<(), String> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        {
            return Err("a rule's name is made of letters, digits, '-' and '_'".into());
        }
        if config.route(&self.route).is_none() {
            let known: Vec<&String> = config.routes().keys().collect();
            return Err(format!(
                "route {:?} is not a [routes.<name>] of the file (there are {known:?})",
                self.route
            ));
        }
        let cost = config.route(&self.route).map_or(1, |r| r.cost());
        if cost != 1 {
            return Err(format!(
                "route {:?} costs {cost} units a request, which the server would not charge: it charges each descriptor Envoy's hits_addend (1 unless set); give the route no cost and send hits_addend",
                self.route
            ));
        }
        if let Some(held) = concurrency_policy(config, &self.route) {
            return Err(format!(
                "route {:?} has a concurrency limit (policy {held:?}): Envoy's rate limit protocol cannot give a place back, so it would stay taken until its lease ran out; hold places through the HTTP API (POST /v1/acquire) or in the application (the HTTP adapters hold a place until the response is sent)",
                self.route
            ));
        }
        if self.entries.is_empty() && self.values.is_empty() {
            return Err("give the descriptor's entries (entries, values)".into());
        }
        if let Some(both) = self.entries.keys().find(|k| self.values.contains_key(*k)) {
            return Err(format!("entry {both:?} is in both entries and values"));
        }
        // Two entries filling one role: only the last one sent would
        // count, and a client choosing the other could pass unlimited.
        for (i, (first, role)) in self.entries.iter().enumerate() {
            if let Some((second, _)) = self.entries.iter().skip(i + 1).find(|(_, r)| *r == role) {
                return Err(format!(
                    "entries {first:?} and {second:?} both fill the {role:?} role: only one would count; give each its own role (an attribute) and layer"
                ));
            }
        }
        if let Some(stray) = self.hashed.iter().find(|k| !self.entries.contains_key(*k)) {
            return Err(format!("hashed entry {stray:?} is not one of its entries"));
        }
        if !self.hashed.is_empty() && !has_hash_key {
            return Err(
                "hashed entries need server.hash_key_env, the variable holding the hash key".into(),
            );
        }
        Ok(())
    }
}

/// The `[server]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Where the gRPC service listens (default `127.0.0.1:8081`).
    #[serde(default = "default_grpc")]
    pub grpc_listen: SocketAddr,
    /// Where the HTTP API listens (default `127.0.0.1:8080`).
    #[serde(default = "default_http")]
    pub http_listen: SocketAddr,
    /// What a descriptor no rule matches gets (default `allow`).
    #[serde(default)]
    pub unknown_descriptors: Unknown,
    /// Send the IETF `RateLimit` and `RateLimit-Policy` headers (and
    /// `Retry-After` when over the limit) as `response_headers_to_add`
    /// (default true).
    #[serde(default = "yes")]
    pub response_headers: bool,
    /// The environment variable holding the HTTP API's bearer token; none:
    /// the API is open (never put the token itself in the file).
    #[serde(default)]
    pub api_token_env: Option<String>,
    /// The environment variable holding the gRPC service's bearer token;
    /// none: any client that reaches the port may ask (protect it with
    /// mutual TLS, `[server.tls] client_ca_file`, or this). Envoy sends it
    /// with the `grpc_service`'s `initial_metadata`.
    #[serde(default)]
    pub grpc_token_env: Option<String>,
    /// The operators' tokens, by name → the environment variable holding
    /// each (`POST /v1/operations/…` needs one of them; none: the
    /// operations are off). Each change is logged with the token's name,
    /// never the token.
    #[serde(default)]
    pub operator_tokens: BTreeMap<String, String>,
    /// TLS on both listeners (`[server.tls]`); none: plain TCP.
    #[serde(default)]
    pub tls: Option<crate::TlsSettings>,
    /// OpenTelemetry traces over OTLP/HTTP (`[server.traces]`); none: no
    /// traces.
    #[serde(default)]
    pub traces: Option<crate::TraceSettings>,
    /// The environment variable holding the key hashed entries are hashed
    /// with (at least 16 bytes); needed when a rule hashes an entry.
    #[serde(default)]
    pub hash_key_env: Option<String>,
    /// How many single-threaded runtimes serve gRPC, each on a thread and
    /// a listener of its own (default: one per core).
    #[serde(default)]
    pub grpc_runtimes: Option<usize>,
    /// How long a gRPC connection may stay quiet before the server pings it
    /// (an HTTP/2 `PING`), and how long the ping waits for its answer: a
    /// peer that does not answer is disconnected, so connections of Envoy
    /// instances that died without closing them do not pile up (default
    /// 30 s; at most 1 hour).
    #[serde(default = "default_keepalive")]
    pub grpc_keepalive: tollgate_limiter::DurationSpec,
    /// Largest HTTP request body accepted (default 64 KiB).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// envoyproxy/ratelimit's configuration directory (its YAML files,
    /// one domain each), relative to this file; its domains are decided
    /// as the reference decides them (docs/server.md, "Coming from
    /// envoyproxy/ratelimit").
    #[serde(default)]
    pub envoy_config_dir: Option<std::path::PathBuf>,
    /// How long the server keeps serving at shutdown after telling health
    /// checks `NOT_SERVING`, so Envoy (and Kubernetes) stop sending to it
    /// before its listeners close: about what they take to notice (Envoy:
    /// its health check's `interval` × `unhealthy_threshold`). Default:
    /// none, the listeners close at once. At most 5 minutes.
    #[serde(default)]
    pub shutdown_drain: Option<tollgate_limiter::DurationSpec>,
    /// The rules, in the order they are tried.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

fn default_grpc() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8081))
}

fn default_http() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

fn default_keepalive() -> tollgate_limiter::DurationSpec {
    tollgate_limiter::DurationSpec(std::time::Duration::from_secs(30))
}

fn default_max_body() -> usize {
    64 * 1024
}

fn yes() -> bool {
    true
}

impl Settings {
    /// How many runtimes serve gRPC: `grpc_runtimes`, or one per core.
    pub fn grpc_runtimes(&self) -> usize {
        self.grpc_runtimes
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The `[server]` section of `config`, checked against its routes.
    pub fn of(config: &Config) -> Result<Settings, ServerError> {
        let table = config.server_section().cloned().unwrap_or_default();
        // With the field's path: "grpc_listen: invalid socket address".
        let settings: Settings = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| {
                let path = e.path().to_string();
                let message = e.into_inner().message().to_string();
                ServerError::Settings(match path.as_str() {
                    "." => message,
                    _ => format!("{path}: {message}"),
                })
            })?;
        unapplied_sections(config)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, rule) in settings.rules.iter().enumerate() {
            let at = format!("server.rules[{i}] ({:?})", rule.name);
            if !names.insert(rule.name.as_str()) {
                return Err(ServerError::Settings(format!(
                    "{at}: two rules share this name"
                )));
            }
            rule.check(config, settings.hash_key_env.is_some())
                .map_err(|why| ServerError::Settings(format!("{at}: {why}")))?;
        }
        if let Some(name) = settings.operator_tokens.keys().find(|n| {
            n.is_empty()
                || !n
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        }) {
            return Err(ServerError::Settings(format!(
                "server.operator_tokens: the name {name:?} is made of letters, digits, '-', '_' and '.' (it is logged)"
            )));
        }
        if settings.grpc_runtimes == Some(0) {
            return Err(ServerError::Settings(
                "server.grpc_runtimes must be > 0 (leave it out for one per core)".into(),
            ));
        }
        if settings.max_body_bytes == 0 {
            return Err(ServerError::Settings(
                "server.max_body_bytes must be > 0".into(),
            ));
        }
        if let Some(problem) = settings
            .grpc_keepalive
            .problem(std::time::Duration::from_secs(3_600))
        {
            return Err(ServerError::Settings(format!(
                "server.grpc_keepalive {problem}"
            )));
        }
        let drain_at_most = std::time::Duration::from_secs(300);
        if let Some(problem) = settings
            .shutdown_drain
            .and_then(|d| d.problem(drain_at_most))
        {
            return Err(ServerError::Settings(format!(
                "server.shutdown_drain {problem} (leave it out to close at once)"
            )));
        }
        Ok(settings)
    }
}

/// The library's sections the server does not apply, refused rather than
/// read as nothing: `[plans]` (its limits would not be enforced, and every
/// customer would get the base policy's) and `[access]` (the HTTP
/// adapters' rules).
fn unapplied_sections(config: &Config) -> Result<(), ServerError> {
    let section = if config.plans().is_some() {
        "[plans]"
    } else if config.access() != &tollgate_http::AccessRules::default() {
        "[access]"
    } else {
        return Ok(());
    };
    Err(ServerError::Settings(format!(
        "{section}: the rate limit server does not apply this section (it serves the policies and routes of the file); remove it, or decide in the application through the library"
    )))
}

/// The name of the first concurrency policy among `route`'s layers.
fn concurrency_policy<'c>(config: &'c Config, route: &str) -> Option<&'c str> {
    let route = config.route(route)?;
    route.layers().iter().map(|l| l.policy()).find(|name| {
        config
            .policy(name)
            .is_some_and(|p| matches!(p.limit(), tollgate_limiter::Limit::Concurrency(_)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A per-user policy of 5 a minute, its route `api` (`route_extra`:
    /// more lines of `[routes.api]`), and a rule over it with `entries`.
    fn per_user_api(route_extra: &str, entries: &str) -> String {
        format!(
            r#"
[policies.per-user]
algorithm = "fixed_window"
limit = 5
window = "1m"

[routes.api]
{route_extra}layers = [{{ name = "user", scope = "subject", policy = "per-user" }}]

[[server.rules]]
name = "api"
domain = "edge"
route = "api"
entries = {entries}
"#
        )
    }

    /// Two entries filling one role are refused: only the last one sent
    /// would count.
    #[test]
    fn two_entries_filling_one_role_are_refused() {
        let file = per_user_api("", r#"{ user_id = "subject", session = "subject" }"#);
        let config = Config::from_toml_str(&file).unwrap();
        let refused = Settings::of(&config).unwrap_err().to_string();
        assert!(refused.contains("both fill the Subject role"), "{refused}");
    }

    /// A route's cost is not what the server charges (Envoy's hits_addend
    /// is): a rule over a route costing 5 would admit five times its
    /// limit, so it is refused.
    #[test]
    fn a_rule_over_a_route_with_a_cost_is_refused() {
        let entries = r#"{ user_id = "subject" }"#;
        let config = Config::from_toml_str(&per_user_api("cost = 5\n", entries)).unwrap();
        let refused = Settings::of(&config).unwrap_err().to_string();
        assert!(refused.contains("costs 5 units"), "{refused}");
        let config = Config::from_toml_str(&per_user_api("", entries)).unwrap();
        assert!(Settings::of(&config).is_ok());
    }

    /// A bad field of `[server]` is named in the error.
    #[test]
    fn a_bad_server_field_is_named() {
        let file = r#"
[server]
grpc_listen = "localhost:8081"
"#;
        let config = Config::from_toml_str(file).unwrap();
        let refused = Settings::of(&config).unwrap_err().to_string();
        assert!(refused.contains("grpc_listen"), "{refused}");
    }

    /// Sections the server does not apply are refused, not read as
    /// nothing: a plan's lower limit would not be enforced.
    #[test]
    fn plans_and_access_rules_are_refused() {
        let base = per_user_api("", r#"{ user_id = "subject" }"#);
        let plans = r#"
[plans]
default = "free"

[plans.limits.pro.per-user]
algorithm = "fixed_window"
limit = 2
window = "1m"
"#;
        let access = r#"
[access]
deny_subjects = ["someone"]
"#;
        assert!(Settings::of(&Config::from_toml_str(&base).unwrap()).is_ok());
        for (extra, section) in [(plans, "[plans]"), (access, "[access]")] {
            let config = Config::from_toml_str(&format!("{base}{extra}")).unwrap();
            let refused = Settings::of(&config).unwrap_err().to_string();
            assert!(refused.contains(section), "{refused}");
        }
    }

    /// A keepalive of zero (no ping) or over an hour is refused, naming
    /// the field; the default is 30 s.
    #[test]
    fn a_keepalive_out_of_range_is_refused() {
        let base = per_user_api("", r#"{ user_id = "subject" }"#);
        let settings = Settings::of(&Config::from_toml_str(&base).unwrap()).unwrap();
        assert_eq!(
            settings.grpc_keepalive.0,
            std::time::Duration::from_secs(30)
        );
        for keepalive in ["0s", "2h"] {
            let file = base.replacen(
                "[[server.rules]]",
                &format!("[server]\ngrpc_keepalive = \"{keepalive}\"\n\n[[server.rules]]"),
                1,
            );
            let refused = Settings::of(&Config::from_toml_str(&file).unwrap()).unwrap_err();
            assert!(
                refused.to_string().contains("server.grpc_keepalive"),
                "{refused}"
            );
        }
    }

    /// Envoy cannot give a place back: a rule over a concurrency limit is
    /// refused when the file is read, naming the policy.
    #[test]
    fn a_rule_over_a_concurrency_limit_is_refused() {
        let file = r#"
[policies.exports]
algorithm = "concurrency"
limit = 2
lease = "30s"

[routes.export]
layers = [{ name = "in-flight", scope = "subject", policy = "exports" }]

[[server.rules]]
name = "export"
domain = "edge"
route = "export"
entries = { user_id = "subject" }
"#;
        let config = Config::from_toml_str(file).unwrap();
        let refused = Settings::of(&config).unwrap_err().to_string();
        assert!(
            refused.contains("concurrency limit (policy \"exports\")"),
            "{refused}"
        );
    }
}
