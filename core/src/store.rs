//! The store contract: decide every layer of a request at once.

use std::fmt;

use async_trait::async_trait;

use crate::algorithm::Verdict;
use crate::error::StoreError;
use crate::policy::Policy;

/// Where one layer's state lives, without the store's prefix:
/// `{tag}:<policy>:v<version>:<scope>:<subject>`.
///
/// The `{tag}` is a Redis Cluster hash tag: keys with the same tag share a
/// slot, so layers keyed on one tenant are decided by a single script call.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey(String);

impl StoreKey {
    /// Build a key from validated parts (subjects cannot contain `{`, `}` or
    /// white space, policy names only `A-Z a-z 0-9 _ - .`).
    pub fn new(tag: &str, policy: &Policy, scope: &str, subject: &str) -> Self {
        StoreKey(format!(
            "{{{tag}}}:{}:v{}:{scope}:{subject}",
            policy.name(),
            policy.version()
        ))
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hash tag (between the first `{` and `}`).
    pub fn tag(&self) -> &str {
        let end = self.0.find('}').unwrap_or(1);
        &self.0[1..end]
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({:?})", self.0)
    }
}

/// One layer of a decision as a store sees it.
#[derive(Debug, Clone, Copy)]
pub struct LayerRequest<'a> {
    /// Where the layer's state lives.
    pub key: &'a StoreKey,
    /// The layer's policy.
    pub policy: &'a Policy,
    /// Units the request costs (1 ≤ cost ≤ the policy's capacity).
    pub cost: u64,
}

/// Keeps limiter state and decides requests atomically.
///
/// # Contract
///
/// `decide` receives every layer of one request (distinct keys) and returns
/// one [`Verdict`] per layer, in order. It is **all-or-nothing**: every layer
/// is judged against its current state; only if every layer admits is every
/// layer charged. A denied request changes nothing. Concurrent calls behave as
/// if they ran one after another, and stored state expires by the TTL the
/// algorithm gives.
///
/// The store owns time (a [`Clock`](crate::Clock), or the server's clock):
/// callers never pass `now`, so every key is read against one clock.
///
/// Any implementation can be checked with the conformance suite in
/// `tollgate-testkit`.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// A short, stable name for logs and metrics (`memory`, `redis`, …).
    fn kind(&self) -> &'static str;

    /// Decide all `layers` of one request at once.
    async fn decide(&self, layers: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError>;
}
