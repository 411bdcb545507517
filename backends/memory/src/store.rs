//! The sharded map and the all-or-nothing decision over it.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use foldhash::fast::RandomState;
use tollgate_core::{
    duration_micros, Clock, LayerRequest, State, Store, StoreError, SystemClock, Transition,
    Verdict,
};

/// Sweep a shard once it holds this many entries, at the least.
const MIN_SWEEP: usize = 64;

struct Entry {
    state: State,
    /// Microseconds; the entry is gone from this instant on.
    expires_at: u64,
}

struct Shard {
    entries: HashMap<Box<str>, Entry, RandomState>,
    /// Sweep expired entries when an insert finds at least this many.
    sweep_at: usize,
}

impl Shard {
    fn live(&self, key: &str, now: u64) -> Option<&State> {
        self.entries
            .get(key)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    /// Drop expired entries and set the next sweep point.
    fn sweep(&mut self, now: u64) {
        self.entries.retain(|_, e| e.expires_at > now);
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
    }

    /// Make room for `new_keys` more keys, sweeping when due. False when the
    /// shard is full of live keys.
    fn reserve(&mut self, new_keys: usize, now: u64, capacity: usize) -> bool {
        let wanted = self.entries.len() + new_keys;
        if wanted > capacity || wanted > self.sweep_at {
            self.sweep(now);
        }
        self.entries.len() + new_keys <= capacity
    }
}

/// The in-process store; see the [crate docs](crate).
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    shard_capacity: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_keys", &self.max_keys())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::builder().build()
    }
}

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: usize,
    clock: Arc<dyn Clock>,
}

impl MemoryStoreBuilder {
    /// Most live keys held at once (default 1,000,000), split evenly across
    /// shards. A decision needing a new key in a full shard fails with
    /// [`StoreError::Full`].
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Number of shards, rounded up to a power of two (default 64).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16).next_power_of_two();
        self
    }

    /// The clock (default: the system clock). Tests pass a
    /// [`ManualClock`](tollgate_core::ManualClock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Build the store.
    pub fn build(self) -> MemoryStore {
        let shards = self.shards.min(self.max_keys.next_power_of_two());
        let shard_capacity = self.max_keys.div_ceil(shards);
        MemoryStore {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        entries: HashMap::with_hasher(RandomState::default()),
                        sweep_at: MIN_SWEEP,
                    })
                })
                .collect(),
            hasher: RandomState::default(),
            clock: self.clock,
            shard_capacity,
        }
    }
}

impl MemoryStore {
    /// A builder with the defaults.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: 1_000_000,
            shards: 64,
            clock: Arc::new(SystemClock),
        }
    }

    /// Most live keys this store holds.
    pub fn max_keys(&self) -> usize {
        self.shard_capacity * self.shards.len()
    }

    /// Entries currently held, expired ones not yet reclaimed included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// Whether the store holds no entry at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reclaim every expired entry now. Never required (growth triggers
    /// sweeps); useful to return memory after a burst of one-off keys.
    pub fn purge_expired(&self) {
        let now = self.clock.now().as_micros();
        for shard in self.shards.iter() {
            lock(shard).sweep(now);
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1)
    }

    /// Decide all layers under the locks of their shards.
    fn decide_now(&self, layers: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError> {
        let now = self.clock.now();
        let now_us = now.as_micros();
        if let [layer] = layers {
            // One layer, one lock: the common case, without the bookkeeping.
            let mut shard = lock(&self.shards[self.shard_of(layer.key.as_str())]);
            let t = tollgate_algorithms::decide(
                layer.policy.limit(),
                shard.live(layer.key.as_str(), now_us),
                now,
                layer.cost,
            );
            return self
                .commit_one(&mut shard, layer, t, now_us)
                .map(|v| vec![v]);
        }
        let shard_ids: Vec<usize> = layers
            .iter()
            .map(|l| self.shard_of(l.key.as_str()))
            .collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        // Locks are taken in ascending shard order: no two decisions deadlock.
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let slot = |id: usize| order.binary_search(&id).expect("locked shard");
        let transitions: Vec<Transition> = layers
            .iter()
            .zip(&shard_ids)
            .map(|(l, &id)| {
                let shard = &guards[slot(id)].1;
                tollgate_algorithms::decide(
                    l.policy.limit(),
                    shard.live(l.key.as_str(), now_us),
                    now,
                    l.cost,
                )
            })
            .collect();
        if !transitions.iter().all(|t| t.verdict.allowed) {
            return Ok(layers
                .iter()
                .zip(transitions)
                .map(|(l, t)| t.verdict.uncharged(l.cost))
                .collect());
        }
        {
            // Room for new keys is checked in every shard before anything is written.
            for (pos, (_, guard)) in guards.iter_mut().enumerate() {
                let new_keys = layers
                    .iter()
                    .zip(&shard_ids)
                    .filter(|(l, &id)| {
                        slot(id) == pos && guard.live(l.key.as_str(), now_us).is_none()
                    })
                    .count();
                if new_keys > 0 && !guard.reserve(new_keys, now_us, self.shard_capacity) {
                    return Err(StoreError::Full(self.max_keys()));
                }
            }
            for ((l, &id), t) in layers.iter().zip(&shard_ids).zip(&transitions) {
                if let Some(next) = &t.next {
                    write(
                        &mut guards[slot(id)].1,
                        l.key.as_str(),
                        next.state.clone(),
                        now_us + duration_micros(next.ttl),
                    );
                }
            }
        }
        Ok(transitions.into_iter().map(|t| t.verdict).collect())
    }

    fn commit_one(
        &self,
        shard: &mut Shard,
        layer: &LayerRequest<'_>,
        t: Transition,
        now: u64,
    ) -> Result<Verdict, StoreError> {
        if let Some(next) = t.next {
            let key = layer.key.as_str();
            let expires_at = now + duration_micros(next.ttl);
            if shard.live(key, now).is_none() && !shard.reserve(1, now, self.shard_capacity) {
                return Err(StoreError::Full(self.max_keys()));
            }
            write(shard, key, next.state, expires_at);
        }
        Ok(t.verdict)
    }
}

fn write(shard: &mut Shard, key: &str, state: State, expires_at: u64) {
    match shard.entries.get_mut(key) {
        Some(entry) => *entry = Entry { state, expires_at },
        None => {
            shard
                .entries
                .insert(key.into(), Entry { state, expires_at });
        }
    }
}

/// Lock a shard. The code under the lock is pure arithmetic, so a poisoned
/// lock still guards a consistent map.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn decide(&self, layers: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError> {
        self.decide_now(layers)
    }
}
