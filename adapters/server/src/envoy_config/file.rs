//! One file of envoyproxy/ratelimit's configuration, as its users write it
//! (`domain`, nested `descriptors`, `rate_limit`), with the checks the
//! reference makes when it loads one.
//!
//! Keys are checked as the reference checks them ([`check_keys`]): a key
//! it does not know, anywhere, refuses the file; a key it knows in a
//! place where it means nothing is ignored. Its fields Tollgate does not
//! implement (`quota_mode`, `value_to_metric`, `share_threshold`,
//! `metadata`) are read so that a file using them is refused by name;
//! `tollgate` is Tollgate's own extension field (docs/server.md, "Coming
//! from envoyproxy/ratelimit"), whose own fields are checked strictly.

use serde::Deserialize;

/// The keys the reference knows, and Tollgate's extension's.
const KNOWN_KEYS: [&str; 17] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "tollgate",
];

/// The reference's check of a file's keys: every key of every mapping is
/// one it knows (`metadata`'s contents excepted, and `tollgate`'s, which
/// its own types check strictly: its keys anywhere else would be read as
/// nothing), and every list holds mappings. `tollgate` itself is read
/// only at the top of a file and on a descriptor: anywhere else it would
/// be dropped unread, so it refuses the file.
pub(super) fn check_keys(value: &serde_norway::Value) -> Result<(), String> {
    keys_in(value, Place::File)
}

/// Where a mapping of a file is: the places `tollgate:` is read.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    File,
    Descriptor,
    Elsewhere,
}

fn keys_in(value: &serde_norway::Value, place: Place) -> Result<(), String> {
    use serde_norway::Value;
    match value {
        Value::Mapping(map) => {
            for (key, value) in map {
                let Value::String(key) = key else {
                    return Err(format!("config error, key is not of type string: {key:?}"));
                };
                if !KNOWN_KEYS.contains(&key.as_str()) {
                    return Err(format!("config error, unknown key '{key}'"));
                }
                match key.as_str() {
                    "metadata" => {}
                    "tollgate" if place == Place::Elsewhere => {
                        return Err("config error, 'tollgate' is read at the top of a file \
                             and on a descriptor only, not inside another key"
                            .into())
                    }
                    "tollgate" => {}
                    "descriptors" if place != Place::Elsewhere => {
                        keys_in(value, Place::Descriptor)?
                    }
                    _ => keys_in(value, Place::Elsewhere)?,
                }
            }
            Ok(())
        }
        Value::Sequence(items) => items.iter().try_for_each(|item| match untagged(item) {
            Value::Mapping(_) => keys_in(item, place),
            other => Err(format!(
                "config error, yaml file contains list of type other than map: {other:?}"
            )),
        }),
        // A tag (`!d {…}`) means nothing here; its value is read as if
        // untagged, so its keys are checked as that value's.
        Value::Tagged(_) => keys_in(untagged(value), place),
        _ => Ok(()),
    }
}

/// `value` without its YAML tags (`!t {…}` reads as `{…}`).
fn untagged(mut value: &serde_norway::Value) -> &serde_norway::Value {
    while let serde_norway::Value::Tagged(tagged) = value {
        value = &tagged.value;
    }
    value
}

/// A file: one domain and its descriptors.
#[derive(Debug, Deserialize)]
pub(super) struct File {
    #[serde(default, deserialize_with = "scalar_text")]
    pub(super) domain: String,
    #[serde(default)]
    pub(super) descriptors: Vec<DescriptorYaml>,
    /// Tollgate's extension: how the domain's descriptors are decided.
    #[serde(default)]
    pub(super) tollgate: DomainExtension,
}

/// `tollgate:` at the top of a file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DomainExtension {
    /// Decide a request's descriptors together, all-or-nothing (nothing is
    /// charged when one is over its limit), instead of each on its own as
    /// the reference does.
    #[serde(default)]
    pub(super) all_or_nothing: bool,
    /// Descriptor keys whose values are secrets (API keys): hashed with
    /// the server's key (`hash_key_env`) before they name a counter, a
    /// metric's label or a log line.
    #[serde(default)]
    pub(super) hashed: Vec<String>,
    /// What the domain's `rate_limit` limits answer when the store fails.
    #[serde(default)]
    pub(super) on_failure: OnFailure,
}

/// `tollgate: { on_failure: … }`: the answer of a domain's `rate_limit`
/// limits (and its overrides) when the store fails. The reference answers
/// an error, which Envoy admits unless its `failure_mode_deny` is set: so
/// `fail_open` by default.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum OnFailure {
    #[default]
    FailOpen,
    FailClosed,
}

impl OnFailure {
    pub(super) fn policy(self) -> tollgate_limiter::OnStoreFailure {
        match self {
            OnFailure::FailOpen => tollgate_limiter::OnStoreFailure::FailOpen,
            OnFailure::FailClosed => tollgate_limiter::OnStoreFailure::FailClosed,
        }
    }
}

/// One descriptor of the tree.
#[derive(Debug, Deserialize)]
pub(super) struct DescriptorYaml {
    #[serde(default, deserialize_with = "scalar_text")]
    pub(super) key: String,
    /// None or empty: the default for any value of `key`.
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub(super) value: Option<String>,
    #[serde(default)]
    pub(super) rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    pub(super) descriptors: Vec<DescriptorYaml>,
    #[serde(default)]
    pub(super) shadow_mode: bool,
    #[serde(default)]
    pub(super) detailed_metric: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    metadata: Option<serde_norway::Value>,
    /// Tollgate's extension: count with a policy of the server's file.
    #[serde(default)]
    pub(super) tollgate: Option<DescriptorExtension>,
}

/// `rate_limit:` of a descriptor.
#[derive(Debug, Deserialize)]
pub(super) struct RateLimitYaml {
    #[serde(default)]
    pub(super) requests_per_unit: u32,
    #[serde(default, deserialize_with = "scalar_text")]
    pub(super) unit: String,
    #[serde(default)]
    pub(super) unlimited: bool,
    #[serde(default, deserialize_with = "scalar_text")]
    pub(super) name: String,
    #[serde(default)]
    pub(super) replaces: Vec<Replaces>,
}

/// One entry of `replaces:`.
#[derive(Debug, Deserialize)]
pub(super) struct Replaces {
    #[serde(default, deserialize_with = "scalar_text")]
    pub(super) name: String,
}

/// The text of a scalar: the reference reads `value: 429` or `value: true`
/// into its text fields as text, so a number or a boolean is its text.
/// The file was read as a YAML value first (merge keys applied), so it is
/// the text of what the scalar reads as: `1.50` is `1.5`, `True` is
/// `true`, where the reference keeps the text as written (docs/server.md
/// says to quote such values).
fn scalar_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    optional_scalar_text(d)?
        .ok_or_else(|| serde::de::Error::custom("expected text, found nothing (null)"))
}

/// As [`scalar_text`], `None` for a null (`value: ~`, or `value:` alone).
fn optional_scalar_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    use serde_norway::Value;
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text)),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Bool(b) => Ok(Some(b.to_string())),
        other => Err(serde::de::Error::custom(format!(
            "expected text, found {other:?}"
        ))),
    }
}

/// `tollgate:` of a descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorExtension {
    /// A `[policies.<name>]` of the server's file, counted instead of a
    /// fixed window (any algorithm, failure mode and fallback).
    pub(super) policy: String,
}

/// A unit as the reference names it (any case), in seconds: `None` for a
/// name it does not know.
pub(super) fn unit_seconds(unit: &str) -> Option<u64> {
    crate::envoy_limit::unit_named(unit).map(|(seconds, _, _)| seconds)
}

impl DescriptorYaml {
    /// The reference's checks of one descriptor (not of its children),
    /// and Tollgate's refusal of the fields it does not implement.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        for (set, field) in [
            (self.quota_mode, "quota_mode"),
            (self.value_to_metric, "value_to_metric"),
            (self.share_threshold, "share_threshold"),
            (self.metadata.is_some(), "metadata"),
        ] {
            if set {
                return Err(format!(
                    "descriptor {:?}: {field} is not supported by Tollgate (remove it; see docs/server.md)",
                    self.key
                ));
            }
        }
        if let (Some(_), Some(_)) = (&self.rate_limit, &self.tollgate) {
            return Err(format!(
                "descriptor {:?}: give rate_limit or tollgate.policy, not both",
                self.key
            ));
        }
        let Some(limit) = &self.rate_limit else {
            return Ok(());
        };
        let unit = unit_seconds(&limit.unit);
        if limit.unlimited {
            if unit.is_some() {
                return Err("should not specify rate limit unit when unlimited".into());
            }
        } else {
            if unit.is_none() {
                return Err(format!("invalid rate limit unit '{}'", limit.unit));
            }
        }
        for replaces in &limit.replaces {
            if replaces.name.is_empty() {
                return Err("should not have an empty replaces entry".into());
            }
            if replaces.name == limit.name {
                return Err("replaces should not contain name of same descriptor".into());
            }
        }
        Ok(())
    }

    /// The key the reference stores it under: `key`, or `key_value`.
    pub(super) fn final_key(&self) -> String {
        match self.value.as_deref() {
            None | Some("") => self.key.clone(),
            Some(value) => format!("{}_{value}", self.key),
        }
    }
}
