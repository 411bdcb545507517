//! Layers: a name, what a layer counts by (its scope), and its policy.

use std::sync::Arc;

use crate::decision::LayerInfo;
use crate::policy::Policy;
use crate::store::KeyMiddle;

/// What a layer counts by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// The request's subject (API key id, user, client IP prefix).
    Subject,
    /// The request's tenant.
    Tenant,
    /// One counter shared by everyone.
    Global,
    /// A named attribute of the request (for example `"route"`).
    Attribute(Arc<str>),
}

impl Scope {
    pub(crate) fn label(&self) -> &str {
        match self {
            Scope::Subject => "subject",
            Scope::Tenant => "tenant",
            Scope::Global => "global",
            Scope::Attribute(name) => name,
        }
    }

    /// The scope as the limiter writes it in store keys
    /// ([`StoreKey`](crate::StoreKey)): `s`, `t`, `g`, or `a.` and the
    /// attribute's name with `%` and `:` escaped (`%25`, `%3A`), so no
    /// scope holds a `:` and no two scopes read the same.
    ///
    /// ```
    /// use tollgate_limiter::Scope;
    /// assert_eq!(Scope::Subject.key_label(), "s");
    /// assert_eq!(Scope::Attribute("route".into()).key_label(), "a.route");
    /// assert_eq!(Scope::Attribute("a:b".into()).key_label(), "a.a%3Ab");
    /// ```
    pub fn key_label(&self) -> String {
        match self {
            Scope::Subject => "s".to_string(),
            Scope::Tenant => "t".to_string(),
            Scope::Global => "g".to_string(),
            Scope::Attribute(name) => {
                format!("a.{}", name.replace('%', "%25").replace(':', "%3A"))
            }
        }
    }
}

/// One layer: a name, what it counts by, and its policy.
///
/// Its names, mode and window are kept once per process for every
/// distinct layer (a few bytes each; layers come from code and
/// configuration, not from requests), so a [`Decision`](crate::Decision)
/// refers to them without reference counting.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub(crate) name: Arc<str>,
    pub(crate) scope: Scope,
    /// Shared by the limiter's clones (a decision refers to the layer's
    /// `info` instead).
    pub(crate) policy: Arc<Policy>,
    pub(crate) fallback: Option<Policy>,
    /// What its decisions report (names, mode, window), shared by all of them.
    pub(crate) info: &'static LayerInfo,
    /// The part of its store keys that never changes, rendered and hashed.
    pub(crate) middle: KeyMiddle,
}

impl Layer {
    /// A layer named `name` counting by `scope` under `policy`.
    pub fn new(name: impl Into<Arc<str>>, scope: Scope, policy: Policy) -> Self {
        let fallback = policy.fallback_policy();
        let name: Arc<str> = name.into();
        let info = LayerInfo::interned(LayerInfo {
            layer: name.as_ref().into(),
            policy: policy.name().into(),
            shadow: policy.is_shadow(),
            window: policy.limit().window(),
        });
        let middle = KeyMiddle::new(&policy, scope.key_label());
        Layer {
            info,
            middle,
            name,
            scope,
            policy: Arc::new(policy),
            fallback,
        }
    }
    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the layer counts by.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// The layer's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}
