//! Policies as written in a configuration file, before validation: the
//! serde forms that build the validated types ([`LimitSpec`] →
//! [`Limit`](crate::Limit), [`OnFailureSpec`] →
//! [`OnStoreFailure`](crate::OnStoreFailure), …). Validation itself lives
//! with the validated types.

use std::time::Duration;

use serde::Deserialize;

use crate::budget::KeyBudget;
use crate::error::PolicyError;
use crate::failure::{Fallback, OnStoreFailure};
use crate::limit::{Builtin, FieldKind, Limit, Parameters};
use crate::policy::Policy;

/// `LimitSpec` from the list of built-ins.
macro_rules! define_limit_spec {
    ($( $(#[$doc:meta])* $variant:ident($module:ident, $spec:ident), )*) => {
        /// A limit as written in a configuration file, before validation:
        /// `algorithm` names the variant, the other fields are its
        /// configuration type's.
        ///
        /// ```
        /// use tollgate_limiter::LimitSpec;
        /// let spec: LimitSpec = serde_json::from_str(
        ///     r#"{ "algorithm": "sliding_window", "limit": 100, "window": "1m" }"#,
        /// ).unwrap();
        /// assert_eq!(spec.build().unwrap().capacity(), 100);
        /// ```
        #[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
        #[serde(tag = "algorithm", rename_all = "snake_case")]
        #[non_exhaustive]
        pub enum LimitSpec {
            $(
                #[doc = concat!("See [`Limit::", stringify!($module), "`].")]
                $variant(crate::limit::$spec),
            )*
        }

        impl LimitSpec {
            /// Validate the parameters.
            pub fn build(&self) -> Result<Limit, PolicyError> {
                match self {
                    $( LimitSpec::$variant(spec) => {
                        <crate::limit::$variant as Parameters>::from_spec(spec).map(Limit::$variant)
                    } )*
                }
            }
        }
    };
}
crate::builtin_algorithms!(define_limit_spec);

impl LimitSpec {
    /// The parameters the algorithm named `algorithm` (as configuration
    /// files write it: `token_bucket`, `gcra`, `fixed_window`,
    /// `sliding_window`, `sliding_log`) takes, in order; `None` for any
    /// other name.
    ///
    /// ```
    /// use tollgate_limiter::{FieldKind, LimitSpec};
    /// let fields = LimitSpec::fields("gcra").unwrap();
    /// assert_eq!(fields[1], ("period", FieldKind::Duration));
    /// assert!(LimitSpec::fields("leaky_bucket").is_none());
    /// ```
    pub fn fields(algorithm: &str) -> Option<&'static [(&'static str, FieldKind)]> {
        Builtin::named(algorithm).map(|b| b.fields)
    }

    /// What a parameter named `field` holds, in whichever algorithm takes
    /// it; `None` when no built-in algorithm does.
    ///
    /// ```
    /// use tollgate_limiter::{FieldKind, LimitSpec};
    /// assert_eq!(LimitSpec::field_kind("burst"), Some(FieldKind::Count));
    /// assert_eq!(LimitSpec::field_kind("window"), Some(FieldKind::Duration));
    /// assert_eq!(LimitSpec::field_kind("mode"), None);
    /// ```
    pub fn field_kind(field: &str) -> Option<FieldKind> {
        Builtin::all()
            .iter()
            .flat_map(|b| b.fields.iter())
            .find(|(name, _)| *name == field)
            .map(|(_, kind)| *kind)
    }
}

/// A duration as people write it: a number and a unit, or several
/// (`"250ms"`, `"1s"`, `"1.5s"`, `"1m30s"`, `"1min"`, `"2h"`, `"1d"`).
///
/// Units: `us`/`µs`, `ms`, `s`/`sec`/`secs`/`second`/`seconds`,
/// `m`/`min`/`mins`/`minute`/`minutes`, `h`/`hr`/`hour`/`hours`,
/// `d`/`day`/`days`. A fraction must come to whole microseconds.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::DurationSpec;
/// let d: DurationSpec = "1m30s".parse()?;
/// assert_eq!(d.0, Duration::from_secs(90));
/// assert_eq!("1.5s".parse::<DurationSpec>()?.0, Duration::from_millis(1500));
/// assert_eq!("1min".parse::<DurationSpec>()?.0, Duration::from_secs(60));
/// assert!("1.5".parse::<DurationSpec>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct DurationSpec(pub Duration);

impl TryFrom<String> for DurationSpec {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl DurationSpec {
    /// What is wrong with this duration as a setting that must be above
    /// zero and at most `max` (`None`: nothing).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::DurationSpec;
    /// let max = Duration::from_secs(60);
    /// assert_eq!("50ms".parse::<DurationSpec>()?.problem(max), None);
    /// assert_eq!("0s".parse::<DurationSpec>()?.problem(max).as_deref(), Some("must be > 0"));
    /// assert!("2m".parse::<DurationSpec>()?.problem(max).is_some());
    /// # Ok::<(), String>(())
    /// ```
    pub fn problem(self, max: Duration) -> Option<String> {
        if self.0.is_zero() {
            Some("must be > 0".into())
        } else if self.0 > max {
            Some(format!("{:?} is over the maximum {max:?}", self.0))
        } else {
            None
        }
    }
}

impl std::str::FromStr for DurationSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = |why: &str| {
            format!("{text:?} is not a duration ({why}): write numbers with units, like \"500ms\", \"1.5s\", \"1m30s\", \"2h\" or \"1d\"")
        };
        if text.is_empty() {
            return Err(bad("it is empty"));
        }
        let mut rest = text;
        let mut total: u64 = 0;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let (number, tail) = rest.split_at(digits);
            let unit_len = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(unit_len);
            if number.is_empty() {
                return Err(bad("a unit without a number"));
            }
            let per: u64 = match unit.trim() {
                "us" | "µs" => 1,
                "ms" => 1_000,
                "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
                "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
                "h" | "hr" | "hour" | "hours" => 3_600_000_000,
                "d" | "day" | "days" => 86_400_000_000,
                "" => return Err(bad("a number without a unit")),
                _ => return Err(bad("unknown unit")),
            };
            let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
            if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
                return Err(bad("a malformed number"));
            }
            let whole: u64 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| bad("a number too large"))?
            };
            let mut micros = whole.checked_mul(per).ok_or_else(|| bad("too long"))?;
            if !fraction.is_empty() {
                if fraction.len() > 12 {
                    return Err(bad("too many decimals"));
                }
                let digits: u128 = fraction.parse().map_err(|_| bad("a malformed number"))?;
                let scale = 10u128.pow(fraction.len() as u32);
                let part = digits * u128::from(per);
                if !part.is_multiple_of(scale) {
                    return Err(bad("not a whole number of microseconds"));
                }
                micros = micros
                    .checked_add(u64::try_from(part / scale).map_err(|_| bad("too long"))?)
                    .ok_or_else(|| bad("too long"))?;
            }
            total = total.checked_add(micros).ok_or_else(|| bad("too long"))?;
            rest = tail;
        }
        Ok(DurationSpec(Duration::from_micros(total)))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyDef {
    name: String,
    #[serde(default = "first_version")]
    version: u32,
    limit: LimitSpec,
    #[serde(default)]
    on_failure: Option<OnFailureSpec>,
    #[serde(default)]
    max_keys: Option<usize>,
    #[serde(default)]
    when_full: Option<WhenFullSpec>,
    #[serde(default)]
    mode: Option<ModeSpec>,
}

/// Whether a policy is enforced or in shadow mode, as written in a
/// configuration file: `"enforce"` (the default) or `"shadow"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSpec {
    /// Denials deny.
    Enforce,
    /// See [`Policy::shadow`].
    Shadow,
}

/// What a full key budget does, as written in a configuration file:
/// `"evict"` or `"refuse"` (see [`WhenFull`](crate::WhenFull)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFullSpec {
    /// [`WhenFull::EvictNearestExpiry`](crate::WhenFull::EvictNearestExpiry).
    Evict,
    /// [`WhenFull::Refuse`](crate::WhenFull::Refuse).
    Refuse,
}

impl From<WhenFullSpec> for crate::WhenFull {
    fn from(spec: WhenFullSpec) -> Self {
        match spec {
            WhenFullSpec::Evict => crate::WhenFull::EvictNearestExpiry,
            WhenFullSpec::Refuse => crate::WhenFull::Refuse,
        }
    }
}

/// A store-failure mode as written in a configuration file:
/// `"fail_open"`, `"fail_closed"`, `{ fallback = { algorithm = … } }` or
/// `{ fallback_share = 4 }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum OnFailureSpec {
    /// [`OnStoreFailure::FailOpen`].
    FailOpen,
    /// [`OnStoreFailure::FailClosed`].
    FailClosed,
    /// [`Fallback::Limit`].
    Fallback(LimitSpec),
    /// [`Fallback::Share`] among this many processes.
    FallbackShare(u32),
}

impl OnFailureSpec {
    /// Validate into an [`OnStoreFailure`].
    pub fn build(&self) -> Result<OnStoreFailure, PolicyError> {
        Ok(match self {
            OnFailureSpec::FailOpen => OnStoreFailure::FailOpen,
            OnFailureSpec::FailClosed => OnStoreFailure::FailClosed,
            OnFailureSpec::Fallback(spec) => OnStoreFailure::Fallback(Fallback::Limit(
                spec.build().map_err(|e| e.within("fallback"))?,
            )),
            OnFailureSpec::FallbackShare(instances) => OnStoreFailure::Fallback(Fallback::Share {
                instances: *instances,
            }),
        })
    }
}

fn first_version() -> u32 {
    1
}

/// A policy reads from any serde format (JSON, TOML, …) in the form of a
/// configuration file's `[policies.<name>]` table, with its name.
impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let def = PolicyDef::deserialize(deserializer)?;
        Policy::try_from(def).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<PolicyDef> for Policy {
    type Error = PolicyError;
    fn try_from(def: PolicyDef) -> Result<Self, PolicyError> {
        let mut policy = Policy::new(def.name, def.limit.build().map_err(|e| e.within("limit"))?)?
            .with_version(def.version);
        match (def.max_keys, def.when_full) {
            (Some(max_keys), when_full) => {
                let when_full = when_full.map(Into::into).unwrap_or_default();
                policy = policy.with_key_budget(KeyBudget::new(max_keys, when_full)?);
            }
            (None, Some(_)) => {
                return Err(PolicyError::new(
                    "when_full",
                    "applies to a key budget: set max_keys too",
                ))
            }
            (None, None) => {}
        }
        if def.mode == Some(ModeSpec::Shadow) {
            policy = policy.shadow();
        }
        match def.on_failure {
            Some(spec) => policy.with_on_failure(spec.build().map_err(|e| e.within("on_failure"))?),
            None => Ok(policy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy table holding `fields` with a valid value of each kind.
    fn table(algorithm: &str, fields: &[(&str, FieldKind)]) -> serde_json::Value {
        let mut table = serde_json::Map::new();
        table.insert("algorithm".into(), algorithm.into());
        for (name, kind) in fields {
            let value = match kind {
                FieldKind::Count => serde_json::Value::from(5),
                FieldKind::Duration => serde_json::Value::from("1s"),
                FieldKind::Text => serde_json::Value::from(match *name {
                    "per" => "month",
                    "time_zone" => "UTC",
                    _ => "2025-01-01T00:00",
                }),
            };
            table.insert((*name).into(), value);
        }
        serde_json::Value::Object(table)
    }

    #[test]
    fn the_field_list_is_the_serde_form() {
        for Builtin {
            name: algorithm,
            fields,
            ..
        } in Builtin::all()
        {
            let spec: LimitSpec = serde_json::from_value(table(algorithm, fields))
                .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            assert!(spec.build().is_ok(), "{algorithm}");
            for i in 0..fields.len() {
                let mut fewer = fields.to_vec();
                let (missing, _) = fewer.remove(i);
                let parsed = serde_json::from_value::<LimitSpec>(table(algorithm, &fewer));
                assert!(parsed.is_err(), "{algorithm} without {missing}");
            }
            for others in Builtin::all().iter().map(|b| b.fields) {
                for field in others.iter().filter(|f| !fields.contains(f)) {
                    let mut more = fields.to_vec();
                    more.push(*field);
                    let parsed = serde_json::from_value::<LimitSpec>(table(algorithm, &more));
                    assert!(parsed.is_err(), "{algorithm} with {}", field.0);
                }
            }
        }
        let unknown = serde_json::json!({ "algorithm": "leaky_bucket", "limit": 5 });
        assert!(serde_json::from_value::<LimitSpec>(unknown).is_err());
    }

    #[test]
    fn a_field_has_one_kind_whatever_the_algorithm() {
        for builtin in Builtin::all() {
            for (name, kind) in builtin.fields {
                assert_eq!(LimitSpec::field_kind(name), Some(*kind), "{name}");
            }
        }
    }
}
