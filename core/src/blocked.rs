//! The blocked-key cache: a request the store denied with a long wait is
//! answered locally until then, without a store call.
//!
//! It only ever repeats a denial, and only until the instant the store said
//! the request could pass, so it never admits what the store would deny.
//! It may deny a little longer than needed when this process's clock runs
//! slower than the store's. An operator's reset, reward or block through
//! this limiter forgets every cached denial at once (a denial the store
//! made before the operation, answered after it, may still be remembered:
//! for at most its wait, within [`AT_MOST`]); one made elsewhere (another
//! process, another limiter, by hand) shows within [`AT_MOST`]: a denial
//! is repeated for at most that long, then the store is asked again.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use moka::sync::Cache;
use moka::Expiry;

use crate::algorithm::Verdict;
use crate::decision::{Decision, LayerDecision, Source};
use crate::layer::Layer;
use crate::store::LayerRequest;
use crate::time::{duration_micros, Clock};

/// The longest a denial is repeated without asking the store again (a
/// block can last 14 days; a reset made elsewhere shows within this).
pub(crate) const AT_MOST: Duration = Duration::from_secs(60);

/// Settings of the blocked-key cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedCacheConfig {
    /// Denials whose retry-after is at least this long are cached (default 1 s).
    pub threshold: Duration,
    /// Most request identities remembered at once (default 100,000).
    pub max_entries: u64,
}

impl Default for BlockedCacheConfig {
    fn default() -> Self {
        BlockedCacheConfig {
            threshold: Duration::from_secs(1),
            max_entries: 100_000,
        }
    }
}

#[derive(Clone)]
struct Blocked {
    /// The request's layer keys, rendered: a hash match is confirmed
    /// against them, so two requests whose hashes collide never share a
    /// denial.
    keys: Arc<[Box<str>]>,
    /// When the denial was made and when it ends, on this process's clock (µs).
    denied_at: u64,
    until: u64,
    /// The cost that was denied: a cheaper request may pass sooner, and a
    /// costlier one later than this denial's wait (each asks the store).
    cost: u64,
    decision: Arc<Decision>,
}

struct UntilRetry;

impl Expiry<u64, Blocked> for UntilRetry {
    fn expire_after_create(
        &self,
        _: &u64,
        value: &Blocked,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(Duration::from_micros(value.until - value.denied_at))
    }
}

/// See the [module docs](self).
pub(crate) struct BlockedCache {
    cache: Cache<u64, Blocked>,
    threshold: Duration,
    /// No entry lives past this instant (µs): until something is blocked,
    /// a decision reads this one number and nothing else of the cache.
    live_until: AtomicU64,
    hasher: RandomState,
}

impl std::fmt::Debug for BlockedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockedCache")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

impl BlockedCache {
    pub(crate) fn new(config: BlockedCacheConfig) -> Self {
        BlockedCache {
            cache: Cache::builder()
                .max_capacity(config.max_entries)
                .expire_after(UntilRetry)
                .build(),
            threshold: config.threshold,
            live_until: AtomicU64::new(0),
            hasher: RandomState::new(),
        }
    }

    /// The identity of a request: a hash of its layer keys, in order.
    fn identity(&self, requests: &[LayerRequest<'_>]) -> u64 {
        self.hasher
            .hash_one(requests.iter().map(|r| r.key).collect::<SmallVec<[_; 4]>>())
    }

    /// The cached denial of `requests` at `cost`, aged to now.
    pub(crate) fn get(
        &self,
        layers: &[Layer],
        requests: &[LayerRequest<'_>],
        cost: u64,
        clock: &dyn Clock,
    ) -> Option<Decision> {
        let now = clock.now().as_micros();
        if now >= self.live_until.load(Ordering::Relaxed) {
            return None;
        }
        let blocked = self.cache.get(&self.identity(requests))?;
        let same = blocked.keys.len() == requests.len()
            && requests
                .iter()
                .zip(blocked.keys.iter())
                .all(|(r, k)| r.key.matches(k));
        if !same || now >= blocked.until || cost != blocked.cost {
            return None;
        }
        // Denied under the same limits: a customer whose plan changed since
        // (the plans' limiters share this cache) is decided again.
        let same_limits = blocked.decision.layers().len() == layers.len()
            && blocked
                .decision
                .layers()
                .iter()
                .zip(layers)
                .all(|(d, l)| std::ptr::eq(d.info, l.info));
        if !same_limits {
            return None;
        }
        let elapsed = Duration::from_micros(now.saturating_sub(blocked.denied_at));
        let layers = blocked.decision.layers().iter().map(|l| {
            let verdict = l.verdict();
            let waited = Verdict {
                reset_after: verdict.reset_after.saturating_sub(elapsed),
                retry_after: verdict.retry_after.map(|r| r.saturating_sub(elapsed)),
                ..verdict
            };
            LayerDecision::of(l.info, &waited, Source::Cache)
        });
        Some(Decision::new(layers))
    }

    /// Forget every cached denial (after an operator changed some state:
    /// the operation may name fewer layers than the requests it affects,
    /// say a subject's reset for requests that also carry a client
    /// address, so no single identity can be told).
    pub(crate) fn forget_all(&self) {
        self.cache.invalidate_all();
    }

    /// Remember `decision` of `requests` when the store denied it for long
    /// enough.
    pub(crate) fn remember(
        &self,
        requests: &[LayerRequest<'_>],
        cost: u64,
        decision: &Decision,
        clock: &dyn Clock,
    ) {
        let Some(wait) = decision.retry_after() else {
            return;
        };
        if decision.store_error().is_some() || wait < self.threshold {
            return;
        }
        let now = clock.now().as_micros();
        let until = now + duration_micros(wait.min(AT_MOST));
        let blocked = Blocked {
            keys: requests
                .iter()
                .map(|r| r.key.render().into_boxed_str())
                .collect(),
            denied_at: now,
            until,
            cost,
            decision: Arc::new(decision.clone()),
        };
        self.cache.insert(self.identity(requests), blocked);
        self.live_until.fetch_max(until, Ordering::Relaxed);
    }
}
