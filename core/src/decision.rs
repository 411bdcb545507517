//! Decisions: what the limiter answers, layer by layer.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::layer::Layer;

/// Where a layer's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The configured store decided.
    Store,
    /// The store failed; the in-process emergency bucket decided.
    Fallback,
    /// The store failed; the policy says to admit.
    FailOpen,
    /// The store failed; the policy says to reject (HTTP 503, not 429).
    FailClosed,
    /// The blocked-key cache repeated the store's recent denial, without a
    /// store call.
    Cache,
}

impl Source {
    /// A short label: `store`, `fallback`, `fail_open`, `fail_closed`, `cache`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::Fallback => "fallback",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
            Source::Cache => "cache",
        }
    }
}

/// What a decision reports about its layer besides numbers: names, mode
/// and window. Made once per distinct layer (see [`Layer::new`]) and kept
/// for the life of the process, so a decision refers to it by a plain
/// reference: deciding clones no `Arc` and allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LayerInfo {
    pub(crate) layer: Box<str>,
    pub(crate) policy: Box<str>,
    pub(crate) shadow: bool,
    pub(crate) window: Option<Duration>,
    /// The window of the emergency limit the policy falls back to, if any
    /// ([`Fallback`](crate::Fallback)): what a decision it made announces.
    pub(crate) fallback_window: Option<Duration>,
    /// Whether the layer limits requests in flight rather than over time.
    pub(crate) in_flight: bool,
    /// The plan whose limit the layer decides by, if the limiter has plans.
    pub(crate) plan: Option<Box<str>>,
}

impl LayerInfo {
    /// The one `LayerInfo` with these contents. Distinct infos are few
    /// (layers times policy changes), and each is kept for good: a
    /// [`Decision`] may outlive its limiter (request extensions, caches).
    pub(crate) fn interned(info: LayerInfo) -> &'static LayerInfo {
        static INFOS: Mutex<BTreeSet<&'static LayerInfo>> = Mutex::new(BTreeSet::new());
        let mut infos = INFOS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = infos.get(&info) {
            return found;
        }
        let leaked: &'static LayerInfo = Box::leak(Box::new(info));
        infos.insert(leaked);
        leaked
    }
}

/// One layer's part of a [`Decision`]: numbers, and a reference to what
/// the layer is (its name, its policy's name, mode and window).
///
/// ```
/// # use std::time::Duration;
/// # use tollgate_limiter::*;
/// let policy = Policy::new("search", Limit::fixed_window(100, Duration::from_secs(60))?)?;
/// let layer = Layer::new("key", Scope::Subject, policy);
/// let verdict = Verdict { allowed: true, limit: 100, remaining: 42,
///     reset_after: Duration::from_secs(12), retry_after: None };
/// let d = LayerDecision::new(&layer, verdict, Source::Store);
/// assert_eq!((d.layer(), d.policy(), d.verdict().remaining), ("key", "search", 42));
/// assert_eq!(d.window(), Some(Duration::from_secs(60)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq)]
pub struct LayerDecision {
    pub(crate) info: &'static LayerInfo,
    // The layer's verdict, packed: a decision is moved on every answer,
    // and the `Verdict` with its two `Duration`s and its flag padded to
    // eight bytes would make each layer half as large again.
    limit: u64,
    remaining: u64,
    reset_after: u64,
    retry_after: u64,
    allowed: bool,
    /// Where the answer came from.
    pub source: Source,
}

/// A packed `retry_after` of `None`.
const NO_RETRY: u64 = u64::MAX;

/// `d` in whole nanoseconds, at most `most` (about 584 years: no window
/// reaches it), which reads back as forever ([`Duration::MAX`]: a breaker
/// open for good).
#[inline]
fn packed(d: Duration, most: u64) -> u64 {
    d.as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(u64::from(d.subsec_nanos())))
        .map_or(most, |n| n.min(most))
}

/// A packed duration read back: `most` is forever.
#[inline]
fn unpacked(nanos: u64, most: u64) -> Duration {
    if nanos == most {
        Duration::MAX
    } else {
        Duration::from_nanos(nanos)
    }
}

impl std::fmt::Debug for LayerDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerDecision")
            .field("info", self.info)
            .field("verdict", &self.verdict())
            .field("source", &self.source)
            .finish()
    }
}

impl LayerDecision {
    /// `layer`'s part of a decision: `verdict`, from `source`. Durations
    /// of about 584 years or more read back as forever ([`Duration::MAX`]).
    #[inline]
    pub fn new(layer: &Layer, verdict: Verdict, source: Source) -> Self {
        Self::of(layer.info, &verdict, source)
    }

    /// As [`new`](Self::new), from a layer's interned info.
    #[inline]
    pub(crate) fn of(info: &'static LayerInfo, verdict: &Verdict, source: Source) -> Self {
        LayerDecision {
            info,
            limit: verdict.limit,
            remaining: verdict.remaining,
            reset_after: packed(verdict.reset_after, u64::MAX),
            retry_after: verdict
                .retry_after
                .map_or(NO_RETRY, |d| packed(d, NO_RETRY - 1)),
            allowed: verdict.allowed,
            source,
        }
    }

    /// The layer's answer: admitted or not, its limit, what is left, when
    /// it is full again and, when it denies, when to retry. When another
    /// layer denies the request this layer was not charged, and its
    /// `remaining` shows what it still has ([`Verdict::uncharged`]).
    #[inline]
    pub fn verdict(&self) -> Verdict {
        Verdict {
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            reset_after: unpacked(self.reset_after, u64::MAX),
            retry_after: (self.retry_after != NO_RETRY)
                .then(|| unpacked(self.retry_after, NO_RETRY - 1)),
        }
    }

    /// Whether the layer admits the request (`verdict().allowed`).
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// What the layer has left right after this decision
    /// (`verdict().remaining`).
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The same layer's part with another verdict (for tests and custom
    /// answers).
    pub fn with_verdict(self, verdict: Verdict) -> Self {
        Self::of(self.info, &verdict, self.source)
    }

    /// The layer's name.
    pub fn layer(&self) -> &'static str {
        &self.info.layer
    }

    /// The name of the layer's policy.
    pub fn policy(&self) -> &'static str {
        &self.info.policy
    }

    /// Whether the layer's policy is in shadow mode: counted, never denying.
    pub fn is_shadow(&self) -> bool {
        self.info.shadow
    }

    /// The window the policy announces ([`Limit::window`](crate::Limit::window)),
    /// or, when the in-process emergency store decided
    /// ([`Source::Fallback`]), the window of the limit it decided by.
    pub fn window(&self) -> Option<Duration> {
        match (self.source, self.info.fallback_window) {
            (Source::Fallback, Some(window)) => Some(window),
            _ => self.info.window,
        }
    }

    /// Whether the layer limits requests in flight
    /// ([`Limit::concurrency`](crate::Limit::concurrency)), not requests
    /// over time: its limit is a number of places, its window a lease.
    pub fn is_concurrency(&self) -> bool {
        self.info.in_flight
    }

    /// How long until the layer admits again when it denies (its
    /// `retry_after`, else the time until it is full again), until it is
    /// full again when it admits.
    pub fn wait(&self) -> Duration {
        let verdict = self.verdict();
        verdict.retry_after.unwrap_or(verdict.reset_after)
    }

    /// The order in which headers report layers, tightest first: enforced
    /// before shadow, denying before admitting; among denying layers the
    /// longest wait first (so a single `Reset` agrees with `Retry-After`),
    /// among admitting ones the fewest remaining units first.
    pub fn tightness(&self) -> impl Ord {
        let wait = std::cmp::Reverse(self.wait());
        let remaining = if self.allowed { self.remaining } else { 0 };
        (self.is_shadow(), self.allowed, remaining, wait)
    }

    /// The plan whose limit decided this layer, when the limiter has
    /// [`Plans`](crate::Plans).
    pub fn plan(&self) -> Option<&'static str> {
        self.info.plan.as_deref()
    }
}

/// Layers kept inline in a decision; more spill to the heap.
type Layers = SmallVec<[LayerDecision; 4]>;

/// The answer to one request: admitted only if every enforced layer admits,
/// and then every admitting layer was charged; denied otherwise, and no
/// layer was charged.
///
/// A layer whose policy is in shadow mode ([`Policy::shadow`](crate::Policy::shadow)) is decided
/// and counted like the others, but its denial never denies the request:
/// [`is_allowed`](Self::is_allowed), [`denied_layers`](Self::denied_layers)
/// and [`retry_after`](Self::retry_after) leave it out;
/// [`shadow_denied`](Self::shadow_denied) lists it.
///
/// A decision is plain data (numbers and references to what never
/// changes): it is `'static`, cheap to copy into request extensions, and
/// building one allocates nothing for up to four layers.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    layers: Layers,
    store_error: Option<&'static str>,
}

impl Decision {
    /// A decision from its layers.
    pub fn new(layers: impl IntoIterator<Item = LayerDecision>) -> Self {
        Decision {
            layers: layers.into_iter().collect(),
            store_error: None,
        }
    }

    /// The decision of a store's `verdicts` for `layers`, one each, in
    /// order. Written out rather than collected: it runs on every
    /// decision, and a collect moves each layer's answer more than once.
    #[inline]
    pub(crate) fn of_store(layers: &[Layer], verdicts: &[Verdict]) -> Self {
        let mut decision = Decision {
            layers: Layers::new(),
            store_error: None,
        };
        for (layer, verdict) in layers.iter().zip(verdicts) {
            decision
                .layers
                .push(LayerDecision::of(layer.info, verdict, Source::Store));
        }
        decision
    }

    /// A decision made without the store, which failed with an error of
    /// `class` (see [`StoreError::class`](crate::StoreError::class)).
    pub fn degraded(layers: impl IntoIterator<Item = LayerDecision>, class: &'static str) -> Self {
        Decision {
            layers: layers.into_iter().collect(),
            store_error: Some(class),
        }
    }

    /// The layers, and the store error's class when the store failed.
    pub(crate) fn into_parts(self) -> (Layers, Option<&'static str>) {
        (self.layers, self.store_error)
    }

    /// When the store failed: the error class (`timeout`, `unavailable`, …).
    pub fn store_error(&self) -> Option<&'static str> {
        self.store_error
    }

    /// Whether the request is denied because a layer failed closed (HTTP
    /// 503), rather than by a limit (HTTP 429).
    pub fn failed_closed(&self) -> bool {
        self.denied_layers().any(|l| l.source == Source::FailClosed)
    }

    /// Whether the request may proceed: every enforced layer admits.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.layers.iter().all(|l| l.allowed || l.is_shadow())
    }

    /// The shadow layers that would have denied the request.
    pub fn shadow_denied(&self) -> impl Iterator<Item = &LayerDecision> {
        self.layers.iter().filter(|l| !l.allowed && l.is_shadow())
    }

    /// Every layer, in the limiter's order.
    #[inline]
    pub fn layers(&self) -> &[LayerDecision] {
        &self.layers
    }

    /// The enforced layers that denied.
    pub fn denied_layers(&self) -> impl Iterator<Item = &LayerDecision> {
        self.layers.iter().filter(|l| !l.allowed && !l.is_shadow())
    }

    /// When denied: the longest wait among the denying layers
    /// ([`LayerDecision::wait`]; `None` when admitted).
    pub fn retry_after(&self) -> Option<Duration> {
        self.denied_layers().map(LayerDecision::wait).max()
    }

    /// The enforced layer headers report first
    /// ([`LayerDecision::tightness`]): when denied, the denying layer with
    /// the longest wait; else the one with the fewest remaining units.
    pub fn tightest(&self) -> Option<&LayerDecision> {
        self.layers
            .iter()
            .filter(|l| !l.is_shadow())
            .min_by_key(|l| l.tightness())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limit, Policy, Scope};

    fn layer() -> Layer {
        let policy = Policy::new(
            "p",
            Limit::fixed_window(10, Duration::from_secs(1)).unwrap(),
        )
        .unwrap();
        Layer::new("key", Scope::Subject, policy)
    }

    /// A decision moves on every answer: each layer stays six words.
    #[test]
    fn a_layer_decision_is_six_words() {
        assert!(std::mem::size_of::<LayerDecision>() <= 48);
    }

    /// Packed numbers read back as they went in, to the nanosecond; a
    /// zero wait stays a wait, and forever stays forever.
    #[test]
    fn a_packed_verdict_reads_back_exactly() {
        let exact = Verdict {
            allowed: false,
            limit: u64::MAX,
            remaining: 7,
            reset_after: Duration::new(86_400 * 366, 999_999_999),
            retry_after: Some(Duration::ZERO),
        };
        let d = LayerDecision::new(&layer(), exact, Source::Store);
        assert_eq!(d.verdict(), exact);
        let none = Verdict {
            retry_after: None,
            ..exact
        };
        assert_eq!(d.with_verdict(none).verdict(), none);
        let far = Verdict {
            reset_after: Duration::MAX,
            retry_after: Some(Duration::MAX),
            ..exact
        };
        assert_eq!(d.with_verdict(far).verdict(), far, "forever stays forever");
    }
}
