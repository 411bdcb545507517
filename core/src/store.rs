//! The store contract: decide every layer of a request at once.

use std::fmt;
use std::hash::{Hash, Hasher};

use async_trait::async_trait;

use crate::adjustment::Adjustment;
use crate::decide::Decide;
use crate::error::StoreError;
use crate::hold::{Hold, Holds};
use crate::key_hash::{key_hash, text_hash};
use crate::limit::Limit;
use crate::policy::Policy;
use crate::verdicts::Verdicts;

/// Where one layer's state lives, without the store's prefix. Rendered
/// ([`StoreKey::render`], or `Display`) it reads
/// `{tag}:<policy>:v<version>:<algorithm>:<scope>:<subject>`, or, when the
/// subject is the tag (a key of its own slot, the usual case), without the
/// repeated `:<subject>`: `{tag}:<policy>:v<version>:<algorithm>:<scope>`.
/// No part before the subject contains `:`, so the two forms never meet.
/// The limiter's scopes are short ([`Scope::key_label`](crate::Scope::key_label):
/// `s`, `t`, `g`, `a.<attribute>`): a key is most of what Redis stores.
///
/// The algorithm is part of the key, so a state is only ever read by the
/// algorithm that wrote it: swapping a policy's algorithm starts every
/// subject from no state, while changing its parameters (capacity, window)
/// keeps sharing the state. The codes are short ([`Limit::key_code`]:
/// `tb`, `gcra`, `fw`, `sw`, `log`; `x-<name>` for a custom algorithm).
///
/// The `{tag}` is a Redis Cluster hash tag: keys with the same tag share a
/// slot, so layers keyed on one tenant are decided by a single script call.
/// A key borrows its parts; a layer builds one for a request from its
/// subjects' hashes, taken when they were made, while [`StoreKey::new`]
/// hashes the tag's and the subject's text. Stores render it (or compare
/// against a rendered key with [`StoreKey::matches`]) only when they need
/// text. Its `Hash` (and a [`Subject`](crate::Subject)'s) is seeded at
/// random once per process: never a value to keep or share across
/// processes (shard by the rendered key instead).
///
/// ```
/// # use std::time::Duration;
/// # use tollgate_limiter::{Limit, Policy, StoreKey};
/// let policy = Policy::new("search", Limit::fixed_window(5, Duration::from_secs(1))?)?;
/// let key = StoreKey::new("acme", &policy, "s", "key-7");
/// assert_eq!(key.to_string(), "{acme}:search:v1:fw:s:key-7");
/// assert!(key.matches("{acme}:search:v1:fw:s:key-7"));
/// assert_eq!(key.tag(), "acme");
/// // A subject that is its own tag is written once.
/// let own = StoreKey::new("key-7", &policy, "s", "key-7");
/// assert_eq!(own.to_string(), "{key-7}:search:v1:fw:s");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct StoreKey<'a> {
    tag: &'a str,
    /// Its name, version and algorithm are the key's: one reference keeps
    /// the key small (it is copied into every request of a decision).
    policy: &'a Policy,
    scope: &'a str,
    subject: &'a str,
    /// The key's hash: [`layer_hash`] (the parts every key of a layer
    /// shares) combined with the text hashes of the tag and the subject
    /// ([`key_hash`]); a layer's key takes them from its subjects, which
    /// hashed their text once.
    hash: u64,
    /// Those parts rendered (`:<policy>:v<version>:<algorithm>:<scope>`),
    /// when the key's layer has them ready: comparing a key is then three
    /// comparisons.
    middle: Option<&'a str>,
}

/// A layer's part of every key it makes: rendered and hashed once, when the
/// layer is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyMiddle {
    text: Box<str>,
    hash: u64,
    /// The scope as keys write it ([`Scope::key_label`](crate::Scope::key_label)).
    scope: Box<str>,
}

impl KeyMiddle {
    pub(crate) fn new(policy: &Policy, scope: String) -> Self {
        let key = StoreKey::new("", policy, &scope, "");
        let rendered = key.render();
        // `{}` before, no subject after (it is the tag): what is left is
        // the middle.
        KeyMiddle {
            text: rendered["{}".len()..].into(),
            hash: layer_hash(
                policy.name(),
                policy.version(),
                key.algorithm(),
                key.custom(),
                &scope,
            ),
            scope: scope.into(),
        }
    }

    /// The scope as keys write it.
    pub(crate) fn scope(&self) -> &str {
        &self.scope
    }
}

/// A fixed hash (FNV-1a) of a key's layer parts: the same for a key made by
/// [`StoreKey::new`] and by a layer, so both find the same entry. A key's
/// hash combines it with the tag's and the subject's text hashes (which
/// clients choose, hashed with the process's random seed: [`key_hash`]);
/// stores hash that again with their own hasher.
fn layer_hash(policy: &str, version: u32, algorithm: &str, custom: bool, scope: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator that no part contains.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    eat(policy.as_bytes());
    eat(&version.to_le_bytes());
    eat(algorithm.as_bytes());
    eat(&[u8::from(custom)]);
    eat(scope.as_bytes());
    h
}

impl PartialEq for StoreKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        // Equal keys hash alike: most unequal ones differ here already.
        self.hash == other.hash
            && (
                self.tag,
                self.policy.name(),
                self.policy.version(),
                self.algorithm(),
                self.custom(),
                self.scope,
                self.subject,
            ) == (
                other.tag,
                other.policy.name(),
                other.policy.version(),
                other.algorithm(),
                other.custom(),
                other.scope,
                other.subject,
            )
    }
}

impl Eq for StoreKey<'_> {}

impl Hash for StoreKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl<'a> StoreKey<'a> {
    /// A key from validated parts (subjects cannot contain `{`, `}` or white
    /// space; policy names hold only `A-Z a-z 0-9 _ - .`).
    pub fn new(tag: &'a str, policy: &'a Policy, scope: &'a str, subject: &'a str) -> Self {
        let algorithm = policy.limit().key_code();
        let custom = matches!(policy.limit(), Limit::Custom(_));
        StoreKey {
            tag,
            policy,
            scope,
            subject,
            hash: key_hash(
                layer_hash(policy.name(), policy.version(), algorithm, custom, scope),
                text_hash(tag),
                text_hash(subject),
            ),
            middle: None,
        }
    }

    /// A key of a layer whose middle part is ready, of its `tag` and
    /// `subject` (each with its text's hash, taken when it was made).
    #[inline]
    pub(crate) fn of_layer(
        (tag, tag_hash): (&'a str, u64),
        policy: &'a Policy,
        scope: &'a str,
        (subject, subject_hash): (&'a str, u64),
        middle: &'a KeyMiddle,
    ) -> Self {
        StoreKey {
            tag,
            policy,
            scope,
            subject,
            hash: key_hash(middle.hash, tag_hash, subject_hash),
            middle: Some(&middle.text),
        }
    }

    /// The hash tag (rendered between `{` and `}`).
    pub fn tag(&self) -> &'a str {
        self.tag
    }

    /// The tag, scope and subject the key was made of (its policy is the
    /// layer's).
    #[cfg(any(feature = "concurrency", feature = "lease"))]
    pub(crate) fn made_of(&self) -> (&'a str, &'a str, &'a str) {
        (self.tag, self.scope, self.subject)
    }

    /// The key's text, built in one allocation.
    pub fn render(&self) -> String {
        let mut version = [0u8; 10];
        let version = format_u32(self.policy.version(), &mut version);
        let parts = self.parts(version);
        let mut out = String::with_capacity(
            parts.iter().map(|p| p.len()).sum::<usize>() + 1 + self.subject.len(),
        );
        for part in parts {
            out.push_str(part);
        }
        if !self.subject_is_tag() {
            out.push(':');
            out.push_str(self.subject);
        }
        out
    }

    /// The algorithm's code ([`Limit::key_code`]).
    fn algorithm(&self) -> &'a str {
        self.policy.limit().key_code()
    }

    /// Whether the algorithm is a custom one (its code follows `x-`).
    fn custom(&self) -> bool {
        matches!(self.policy.limit(), Limit::Custom(_))
    }

    /// Whether the subject is the tag, and so not written again.
    fn subject_is_tag(&self) -> bool {
        self.subject == self.tag
    }

    /// Every piece of the rendered key before the subject.
    fn parts<'s>(&'s self, version: &'s str) -> [&'s str; 11] {
        [
            "{",
            self.tag,
            "}:",
            self.policy.name(),
            ":v",
            version,
            ":",
            if self.custom() { "x-" } else { "" },
            self.algorithm(),
            ":",
            self.scope,
        ]
    }

    /// What follows the parts: nothing, or `:` and the subject.
    fn rest_matches(&self, rest: &[u8]) -> bool {
        if self.subject_is_tag() {
            return rest.is_empty();
        }
        rest.split_first().is_some_and(|(&colon, subject)| {
            colon == b':' && same_bytes(subject, self.subject.as_bytes())
        })
    }

    /// Whether `rendered` is this key's text, without allocating.
    pub fn matches(&self, rendered: &str) -> bool {
        self.matches_bytes(rendered.as_bytes())
    }

    /// Whether `rendered` is the bytes of this key's text, without
    /// allocating (for a store that keeps keys as bytes: no UTF-8 check
    /// on each comparison).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate_limiter::{Limit, Policy, StoreKey};
    /// let policy = Policy::new("search", Limit::fixed_window(5, Duration::from_secs(1))?)?;
    /// let key = StoreKey::new("acme", &policy, "s", "key-7");
    /// assert!(key.matches_bytes(b"{acme}:search:v1:fw:s:key-7"));
    /// assert!(!key.matches_bytes(b"{acme}:search:v1:fw:s:key-8"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn matches_bytes(&self, rendered: &[u8]) -> bool {
        if let Some(middle) = self.middle {
            // `{` tag `}` middle subject
            let tag_end = 1 + self.tag.len();
            let middle_end = tag_end + 1 + middle.len();
            return rendered.len() >= middle_end
                && rendered[0] == b'{'
                && same_bytes(&rendered[1..tag_end], self.tag.as_bytes())
                && rendered[tag_end] == b'}'
                && same_bytes(&rendered[tag_end + 1..middle_end], middle.as_bytes())
                && self.rest_matches(&rendered[middle_end..]);
        }
        let mut version = [0u8; 10];
        let version = format_u32(self.policy.version(), &mut version);
        let mut rest = rendered;
        for part in self.parts(version) {
            match rest.strip_prefix(part.as_bytes()) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        self.rest_matches(rest)
    }
}

/// Whether `a` and `b` hold the same bytes. A key's parts are short (a
/// subject, a policy's middle part): compared eight bytes at a time here,
/// inline, where `==` on slices calls the C library's `memcmp` for each
/// part (4% of a one-key decision's samples).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    const WORD: usize = 8;
    let word =
        |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + WORD].try_into().expect("eight bytes"));
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < WORD {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    if n > 4 * WORD {
        return a == b;
    }
    // Whole words, then the last word (overlapping the one before).
    (0..n / WORD).all(|i| word(a, i * WORD) == word(b, i * WORD))
        && word(a, n - WORD) == word(b, n - WORD)
}

impl fmt::Display for StoreKey<'_> {
    /// The rendered key, written piece by piece (no allocation), so a
    /// store can write it straight into a command buffer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut version = [0u8; 10];
        let version = format_u32(self.policy.version(), &mut version);
        for part in self.parts(version) {
            f.write_str(part)?;
        }
        if !self.subject_is_tag() {
            f.write_str(":")?;
            f.write_str(self.subject)?;
        }
        Ok(())
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

/// A layer's key parts and policy, owned: what outlives the request that
/// named them (a permit's places, a lease's batch) and is given back later.
#[cfg(any(feature = "concurrency", feature = "lease"))]
#[derive(Debug, Clone)]
pub(crate) struct OwnedLayer {
    tag: Box<str>,
    policy: Policy,
    scope: Box<str>,
    subject: Box<str>,
}

#[cfg(any(feature = "concurrency", feature = "lease"))]
impl OwnedLayer {
    /// `request`'s layer, owned.
    pub(crate) fn of(request: &LayerRequest<'_>) -> Self {
        let (tag, scope, subject) = request.key.made_of();
        OwnedLayer {
            tag: tag.into(),
            policy: request.policy.clone(),
            scope: scope.into(),
            subject: subject.into(),
        }
    }

    /// The layer's policy.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A request of `cost` units on the layer.
    pub(crate) fn request(&self, cost: u64) -> LayerRequest<'_> {
        LayerRequest {
            key: StoreKey::new(&self.tag, &self.policy, &self.scope, &self.subject),
            policy: &self.policy,
            cost,
        }
    }
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

    /// Whether the store keeps its state in this process (then leased
    /// layers are decided as any other: a batch would save nothing). The
    /// default: `false`.
    ///
    /// A store that answers `true` promises that its
    /// [`acquire`](Self::acquire) never suspends once it has taken places:
    /// the limiter then runs it in place, not on a task of its own, and a
    /// future dropped after the places were taken would leave them taken
    /// until their lease ends.
    fn is_in_process(&self) -> bool {
        false
    }

    /// A hint that `key` is about to be decided: a store whose state is
    /// in this process may start bringing the key's state into the CPU's
    /// cache, so that the wait for it overlaps other work (the lookup of
    /// the customer's plan). Never required for correctness. The default
    /// does nothing.
    fn prefetch(&self, key: &StoreKey<'_>) {
        let _ = key;
    }

    /// Decide all `layers` of one request at once, writing one verdict
    /// per layer into `verdicts` (received empty). A store that never
    /// waits (its state is in this process) decides before it returns and
    /// answers [`Decide::Now`], which the limiter takes without a boxed
    /// future; one that waits answers a future,
    /// `Decide::later(verdicts, async move { … })`, which does nothing until
    /// polled. `.await` the answer either way ([`ask`](crate::ask) gives
    /// the verdicts as one value).
    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a>;

    /// Every layer's verdict for a request of its cost, as
    /// [`decide`](Store::decide) would give it — all-or-nothing included
    /// (when one layer denies, admitting layers report what they have left
    /// without the charge) — with nothing charged and nothing written.
    /// A key holding data Tollgate did not write fails with
    /// [`StoreError::Conflict`], as for `decide`.
    ///
    /// The default says the store cannot ([`StoreError::UnsupportedOperation`]).
    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        let _ = layers;
        Err(StoreError::UnsupportedOperation("peek"))
    }

    /// Forget every layer's state, atomically: the next request finds them
    /// new (after a password reset, say). A key holding data Tollgate did
    /// not write is never removed: the call fails with
    /// [`StoreError::Conflict`] and removes nothing.
    ///
    /// The default says the store cannot ([`StoreError::UnsupportedOperation`]).
    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        let _ = layers;
        Err(StoreError::UnsupportedOperation("reset"))
    }

    /// Change every layer's state as `adjustment` says (see
    /// [`Adjustment`]; the units of a penalty or reward are each layer's
    /// cost), atomically over the layers, and answer each layer's verdict
    /// for a request of one unit afterwards, as [`peek`](Store::peek)
    /// would. A key holding data Tollgate did not write fails the call
    /// with [`StoreError::Conflict`] and nothing is changed. A block is
    /// kept as [`State::Blocked`](crate::State::Blocked) under the layer's
    /// own key, with a TTL that covers it.
    ///
    /// The default says the store cannot ([`StoreError::UnsupportedOperation`]).
    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        let _ = layers;
        Err(StoreError::UnsupportedOperation(adjustment.name()))
    }

    /// Decide as [`decide`](Store::decide) does, and answer beside the
    /// verdicts what each layer holds: for an admitted request, the
    /// [`Hold`] of each concurrency layer
    /// ([`Limit::Concurrency`](crate::Limit::Concurrency)), `None` for
    /// every other layer and for a denied request (which holds nothing).
    ///
    /// The default says the store cannot ([`StoreError::UnsupportedOperation`]).
    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        let _ = layers;
        Err(StoreError::UnsupportedOperation("acquire"))
    }

    /// Give back each layer's hold (`holds[i]` for `layers[i]`, each a
    /// concurrency layer), atomically over the layers. A hold that was lost
    /// (it aged out, the key was reset) gives nothing back. Holds are named
    /// by the time their entries were written, and holds of one time are
    /// interchangeable: release each exactly once under its latest name,
    /// or another holder of that time loses its place. A key holding data
    /// Tollgate did not write is left alone.
    ///
    /// The default says the store cannot ([`StoreError::UnsupportedOperation`]).
    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        let _ = (layers, holds);
        Err(StoreError::UnsupportedOperation("release"))
    }

    /// Renew each layer's hold (`holds[i]` for `layers[i]`, each a
    /// concurrency layer) for another lease, atomically over the layers:
    /// each answer is the hold as it now is, or `None` when it was lost
    /// (its lease ran out before this renewal, or it was released or
    /// reset) — then nothing is written for it, and its holder no longer
    /// counts.
    ///
    /// The default says the store cannot ([`StoreError::UnsupportedOperation`]).
    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<Holds, StoreError> {
        let _ = (layers, holds);
        Err(StoreError::UnsupportedOperation("renew"))
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;
    use std::time::Duration;

    use super::*;

    fn policies() -> Vec<Policy> {
        let window = Duration::from_secs(1);
        vec![
            Policy::new("p", Limit::gcra(1, window, 5).unwrap()).unwrap(),
            Policy::new("p", Limit::gcra(1, window, 5).unwrap())
                .unwrap()
                .with_version(12),
            Policy::new("p", Limit::fixed_window(5, window).unwrap()).unwrap(),
            Policy::new("p.q-r_s", Limit::sliding_log(5, window).unwrap()).unwrap(),
        ]
    }

    /// A key a layer makes (its middle rendered once) and the same key made
    /// from its parts are equal, hash alike and match the same text; keys
    /// differing in any part match nothing of the other.
    #[test]
    fn bytes_compare_as_slices_do() {
        for n in 0usize..=40 {
            let a: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37)).collect();
            assert!(same_bytes(&a, &a.clone()), "{n} bytes, equal");
            assert!(!same_bytes(&a, &a[..n.saturating_sub(1)]) || n == 0);
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!same_bytes(&a, &b), "{n} bytes, differing at {at}");
            }
        }
    }

    #[test]
    fn a_layers_keys_are_the_keys_of_their_parts() {
        let hasher = std::collections::hash_map::RandomState::new();
        let policies = policies();
        let middles: Vec<(&Policy, &str, KeyMiddle)> = policies
            .iter()
            .flat_map(|p| {
                ["subject", "tenant", "route"].map(|s| (p, s, KeyMiddle::new(p, s.to_string())))
            })
            .collect();
        let mut all = Vec::new();
        let pairs = [("t", "s"), ("acme", "key-7"), ("", ""), ("s", "t")];
        for ((policy, scope, middle), (tag, subject)) in middles
            .iter()
            .flat_map(|m| pairs.iter().map(move |p| (m, p)))
        {
            let plain = StoreKey::new(tag, policy, scope, subject);
            let parts = |text: &'static str| (text, text_hash(text));
            let layered = StoreKey::of_layer(parts(tag), policy, scope, parts(subject), middle);
            assert_eq!(plain, layered);
            assert_eq!(hasher.hash_one(plain), hasher.hash_one(layered));
            let text = plain.render();
            assert_eq!(layered.render(), text);
            assert!(plain.matches(&text) && layered.matches(&text), "{text}");
            all.push((plain, layered, text));
        }
        for (i, (plain, layered, _)) in all.iter().enumerate() {
            for (j, (_, _, text)) in all.iter().enumerate() {
                if i != j && plain != &all[j].0 {
                    assert!(!plain.matches(text), "{plain} matched {text}");
                    assert!(!layered.matches(text), "{layered} matched {text}");
                }
            }
            assert!(!layered.matches(&format!("{}x", layered.render())));
            assert!(!layered.matches(""));
        }
    }
}
