//! The blocked-key cache: a request the store denied with a long wait is
//! answered locally until then, without a store call.
//!
//! It only ever repeats a denial, and only until the instant the store said
//! the request could pass, so it never admits what the store would deny.
//! It may deny a little longer than needed when this process's clock runs
//! slower than the store's, and it does not see an operator resetting a key
//! by hand (entries live at most until their retry time).

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;
use moka::Expiry;

use crate::decision::{Decision, LayerDecision, Source};
use crate::store::LayerRequest;
use crate::time::{duration_micros, Clock};

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
    /// When the denial was made and when it ends, on this process's clock (µs).
    denied_at: u64,
    until: u64,
    /// The cost that was denied: a cheaper request may pass sooner.
    cost: u64,
    decision: Arc<Decision>,
}

struct UntilRetry;

impl Expiry<Box<str>, Blocked> for UntilRetry {
    fn expire_after_create(
        &self,
        _: &Box<str>,
        value: &Blocked,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(Duration::from_micros(value.until - value.denied_at))
    }
}

/// See the [module docs](self).
pub(crate) struct BlockedCache {
    cache: Cache<Box<str>, Blocked>,
    threshold: Duration,
}

impl std::fmt::Debug for BlockedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockedCache")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

/// The identity of a request: every layer key, in order.
pub(crate) fn identity(requests: &[LayerRequest<'_>]) -> Box<str> {
    let mut out = String::new();
    for r in requests {
        out.push_str(&r.key.render());
        out.push('\n');
    }
    out.into_boxed_str()
}

impl BlockedCache {
    pub(crate) fn new(config: BlockedCacheConfig) -> Self {
        BlockedCache {
            cache: Cache::builder()
                .max_capacity(config.max_entries)
                .expire_after(UntilRetry)
                .build(),
            threshold: config.threshold,
        }
    }

    /// The cached denial of `identity` at `cost`, aged to now.
    pub(crate) fn get(&self, identity: &str, cost: u64, clock: &dyn Clock) -> Option<Decision> {
        let blocked = self.cache.get(identity)?;
        let now = clock.now().as_micros();
        if now >= blocked.until || cost < blocked.cost {
            return None;
        }
        let elapsed = Duration::from_micros(now.saturating_sub(blocked.denied_at));
        let layers = blocked
            .decision
            .layers()
            .iter()
            .map(|l| LayerDecision {
                reset_after: l.reset_after.saturating_sub(elapsed),
                retry_after: l.retry_after.map(|r| r.saturating_sub(elapsed)),
                source: Source::Cache,
                ..l.clone()
            })
            .collect();
        Some(Decision::new(layers))
    }

    /// Remember `decision` when the store denied it for long enough.
    pub(crate) fn remember(
        &self,
        identity: Box<str>,
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
        let blocked = Blocked {
            denied_at: now,
            until: now + duration_micros(wait),
            cost,
            decision: Arc::new(decision.clone()),
        };
        self.cache.insert(identity, blocked);
    }
}
