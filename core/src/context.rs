//! Who a request is: the subjects its layers count by, and the store key
//! each layer's state lives under.

use std::sync::{Arc, OnceLock};

use crate::layer::{Layer, Scope};
use crate::plan::PlanName;
use crate::store::StoreKey;
use crate::subject::Subject;

/// Who a request is: the subjects its layers count by.
///
/// ```
/// use tollgate_limiter::{Context, Subject};
/// let ctx = Context::new()
///     .with_subject(Subject::new("key-7")?)
///     .with_tenant(Subject::new("acme")?);
/// # Ok::<(), tollgate_limiter::SubjectError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    subject: Option<Subject>,
    tenant: Option<Subject>,
    attributes: Vec<(Arc<str>, Subject)>,
    plan: Option<PlanName>,
}

impl Context {
    /// An empty context (only global layers can decide it).
    pub fn new() -> Self {
        Context::default()
    }
    /// A context with only a subject.
    pub fn for_subject(subject: Subject) -> Self {
        Context::new().with_subject(subject)
    }
    /// Set the subject.
    pub fn with_subject(mut self, subject: Subject) -> Self {
        self.subject = Some(subject);
        self
    }
    /// Set the tenant.
    pub fn with_tenant(mut self, tenant: Subject) -> Self {
        self.tenant = Some(tenant);
        self
    }
    /// Set a named attribute (for [`Scope::Attribute`]).
    pub fn with_attribute(mut self, name: impl Into<Arc<str>>, value: Subject) -> Self {
        let name = name.into();
        self.attributes.retain(|(n, _)| *n != name);
        self.attributes.push((name, value));
        self
    }
    /// Set the plan the request is decided under (see [`Plans`](crate::Plans)).
    /// Set it on the server side only, from who the caller is (your
    /// authentication), never from anything the client sends.
    pub fn with_plan(mut self, plan: PlanName) -> Self {
        self.plan = Some(plan);
        self
    }
    /// The plan set with [`with_plan`](Self::with_plan), if any.
    pub fn plan(&self) -> Option<&PlanName> {
        self.plan.as_ref()
    }
    /// The subject, if any.
    pub fn subject(&self) -> Option<&Subject> {
        self.subject.as_ref()
    }
    /// The tenant, if any.
    pub fn tenant(&self) -> Option<&Subject> {
        self.tenant.as_ref()
    }

    fn get_attribute(&self, name: &str) -> Option<&Subject> {
        self.attributes
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v)
    }

    /// The store key of `layer` for this request, or `None` when the request
    /// lacks what the layer counts by. Keys of one tenant share its hash tag.
    #[inline]
    pub(crate) fn key_for<'a>(&'a self, layer: &'a Layer) -> Option<StoreKey<'a>> {
        let scope = layer.middle.scope();
        let (tag, subject) = match &layer.scope {
            Scope::Subject => {
                let subject = self.subject.as_ref()?;
                (self.tenant.as_ref().unwrap_or(subject), subject)
            }
            Scope::Tenant => {
                let tenant = self.tenant.as_ref()?;
                (tenant, tenant)
            }
            Scope::Global => {
                let global = global();
                (global, global)
            }
            Scope::Attribute(name) => {
                let value = self.get_attribute(name)?;
                (value, value)
            }
        };
        let parts = |s: &'a Subject| (s.as_str(), s.text_hash());
        Some(StoreKey::of_layer(
            parts(tag),
            &layer.policy,
            scope,
            parts(subject),
            &layer.middle,
        ))
    }
}

/// The subject of every [`Scope::Global`] layer's key, made once.
fn global() -> &'static Subject {
    static GLOBAL: OnceLock<Subject> = OnceLock::new();
    GLOBAL.get_or_init(Subject::global)
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;
    use std::time::Duration;

    use super::*;
    use crate::limit::Limit;
    use crate::policy::Policy;

    /// A layer's key for a request, made from the subjects' stored hashes,
    /// is the key made from its text parts (as a released permit or a
    /// lease rebuilds it): equal, hashed alike, rendered alike.
    #[test]
    fn a_layers_key_is_the_key_of_its_text() {
        let policy =
            Policy::new("api", Limit::gcra(5, Duration::from_secs(1), 5).unwrap()).unwrap();
        let ctx = Context::for_subject(Subject::new("key-7").unwrap())
            .with_tenant(Subject::new("acme").unwrap())
            .with_attribute("route", Subject::new("/search").unwrap());
        let alone = Context::for_subject(Subject::new("key-7").unwrap());
        let hasher = foldhash::fast::RandomState::default();
        let cases = [
            (&ctx, Scope::Subject, ("acme", "s", "key-7")),
            (&alone, Scope::Subject, ("key-7", "s", "key-7")),
            (&ctx, Scope::Tenant, ("acme", "t", "acme")),
            (&ctx, Scope::Global, ("global", "g", "global")),
            (
                &ctx,
                Scope::Attribute("route".into()),
                ("/search", "a.route", "/search"),
            ),
        ];
        for (ctx, scope, (tag, label, subject)) in cases {
            let layer = Layer::new("l", scope, policy.clone());
            let key = ctx
                .key_for(&layer)
                .expect("the context has the layer's subject");
            let plain = StoreKey::new(tag, &policy, label, subject);
            assert_eq!(key, plain);
            assert_eq!(hasher.hash_one(key), hasher.hash_one(plain), "{plain}");
            assert_eq!(key.render(), plain.render());
        }
    }
}
