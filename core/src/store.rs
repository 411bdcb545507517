//! The store contract: decide every layer of a request at once.

use std::fmt;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::limit::Limit;
use crate::policy::Policy;
use crate::verdicts::Verdicts;

/// Where one layer's state lives, without the store's prefix. Rendered
/// ([`StoreKey::render`], or `Display`) it reads
/// `{tag}:<policy>:v<version>:<algorithm>:<scope>:<subject>`.
///
/// The algorithm is part of the key, so a state is only ever read by the
/// algorithm that wrote it: swapping a policy's algorithm starts every
/// subject from no state, while changing its parameters (capacity, window)
/// keeps sharing the state. The codes are short ([`Limit::key_code`]:
/// `tb`, `gcra`, `fw`, `sw`, `log`; `x-<name>` for a custom algorithm).
///
/// The `{tag}` is a Redis Cluster hash tag: keys with the same tag share a
/// slot, so layers keyed on one tenant are decided by a single script call.
/// A key borrows its parts, so building one costs nothing; stores render it
/// (or compare against a rendered key with [`StoreKey::matches`]) only when
/// they need text.
///
/// ```
/// # use std::time::Duration;
/// # use tollgate_limiter::{Limit, Policy, StoreKey};
/// let policy = Policy::new("search", Limit::fixed_window(5, Duration::from_secs(1))?)?;
/// let key = StoreKey::new("acme", &policy, "subject", "key-7");
/// assert_eq!(key.to_string(), "{acme}:search:v1:fw:subject:key-7");
/// assert!(key.matches("{acme}:search:v1:fw:subject:key-7"));
/// assert_eq!(key.tag(), "acme");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreKey<'a> {
    tag: &'a str,
    policy: &'a str,
    version: u32,
    algorithm: &'a str,
    custom: bool,
    scope: &'a str,
    subject: &'a str,
}

impl<'a> StoreKey<'a> {
    /// A key from validated parts (subjects cannot contain `{`, `}` or white
    /// space; policy names hold only `A-Z a-z 0-9 _ - .`).
    pub fn new(tag: &'a str, policy: &'a Policy, scope: &'a str, subject: &'a str) -> Self {
        StoreKey {
            tag,
            policy: policy.name(),
            version: policy.version(),
            algorithm: policy.limit().key_code(),
            custom: matches!(policy.limit(), Limit::Custom(_)),
            scope,
            subject,
        }
    }

    /// The hash tag (rendered between `{` and `}`).
    pub fn tag(&self) -> &'a str {
        self.tag
    }

    /// The key's text, built in one allocation.
    pub fn render(&self) -> String {
        let mut version = [0u8; 10];
        let version = format_u32(self.version, &mut version);
        let parts = self.parts(version);
        let mut out = String::with_capacity(
            parts.iter().map(|p| p.len()).sum::<usize>() + self.subject.len(),
        );
        for part in parts {
            out.push_str(part);
        }
        out.push_str(self.subject);
        out
    }

    /// Every piece of the rendered key before the subject.
    fn parts<'s>(&'s self, version: &'s str) -> [&'s str; 12] {
        [
            "{",
            self.tag,
            "}:",
            self.policy,
            ":v",
            version,
            ":",
            if self.custom { "x-" } else { "" },
            self.algorithm,
            ":",
            self.scope,
            ":",
        ]
    }

    /// Whether `rendered` is this key's text, without allocating.
    pub fn matches(&self, rendered: &str) -> bool {
        let mut version = [0u8; 10];
        let version = format_u32(self.version, &mut version);
        let mut rest = rendered;
        for part in self.parts(version) {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest == self.subject
    }
}

impl fmt::Display for StoreKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

/// `n` in decimal, written into `buf`.
fn format_u32(mut n: u32, buf: &mut [u8; 10]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).expect("ASCII digits")
}

/// One layer of a decision as a store sees it.
#[derive(Debug, Clone, Copy)]
pub struct LayerRequest<'a> {
    /// Where the layer's state lives.
    pub key: StoreKey<'a>,
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
/// one [`Verdict`](crate::Verdict) per layer, in order ([`Verdicts`]: up
/// to four inline, no allocation). It is **all-or-nothing**: every layer
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
    async fn decide(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError>;

    /// The same decision, for stores that never wait (in-process ones):
    /// `Some` answer without going through a boxed future, which the
    /// limiter tries first. The default, `None`, means "use `decide`".
    fn decide_now(&self, layers: &[LayerRequest<'_>]) -> Option<Result<Verdicts, StoreError>> {
        let _ = layers;
        None
    }
}
