//! The sharded map and the all-or-nothing decision over it.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use foldhash::fast::RandomState;
use hashbrown::HashTable;
use tollgate_core::{
    duration_micros, Clock, LayerRequest, State, Store, StoreError, StoreKey, SystemClock,
    Transition, Verdict,
};

/// Sweep a shard once it holds this many entries, at the least.
const MIN_SWEEP: usize = 64;

struct Entry {
    /// The rendered key; compared against a borrowed [`StoreKey`] on lookup.
    key: Box<str>,
    /// The key's hash, kept so the table can grow without rehashing text.
    hash: u64,
    state: State,
    /// Microseconds; the entry is gone from this instant on.
    expires_at: u64,
}

struct Shard {
    entries: HashTable<Entry>,
    /// Sweep expired entries when an insert finds at least this many.
    sweep_at: usize,
}

impl Shard {
    fn live(&self, hash: u64, key: &StoreKey<'_>, now: u64) -> Option<&State> {
        self.entries
            .find(hash, |e| key.matches(&e.key))
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    /// Drop expired entries and set the next sweep point.
    fn sweep(&mut self, now: u64) {
        self.entries.retain(|e| e.expires_at > now);
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

    /// Store `state` under `key` (room was reserved for a new key).
    fn write(&mut self, hash: u64, key: &StoreKey<'_>, state: State, expires_at: u64) {
        match self.entries.find_mut(hash, |e| key.matches(&e.key)) {
            Some(entry) => {
                entry.state = state;
                entry.expires_at = expires_at;
            }
            None => {
                let entry = Entry {
                    key: key.render().into_boxed_str(),
                    hash,
                    state,
                    expires_at,
                };
                self.entries.insert_unique(hash, entry, |e| e.hash);
            }
        }
    }
}

/// One shard's lock on cache lines of its own: two threads locking
/// neighbouring shards must not bounce one line between their cores
/// (128 bytes: adjacent-line prefetching pairs 64-byte lines).
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// The in-process store; see the [crate docs](crate).
pub struct MemoryStore {
    shards: Box<[Padded]>,
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
                    Padded(Mutex::new(Shard {
                        entries: HashTable::new(),
                        sweep_at: MIN_SWEEP,
                    }))
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

    /// The key's hash and its shard (the top bits pick the shard, so the
    /// table inside the shard still sees well-mixed low bits).
    fn locate(&self, key: &StoreKey<'_>) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        let shard = (hash >> 48) as usize & (self.shards.len() - 1);
        (hash, shard)
    }

    /// Decide all layers under the locks of their shards.
    fn decide_locked(&self, layers: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError> {
        let now = self.clock.now();
        let now_us = now.as_micros();
        if let [layer] = layers {
            // One layer, one lock: the common case, without the bookkeeping.
            let (hash, id) = self.locate(&layer.key);
            let mut shard = lock(&self.shards[id]);
            let state = shard.live(hash, &layer.key, now_us);
            let is_new = state.is_none();
            let t = tollgate_algorithms::decide(layer.policy.limit(), state, now, layer.cost);
            if let Some(next) = t.next {
                if is_new && !shard.reserve(1, now_us, self.shard_capacity) {
                    return Err(StoreError::Full(self.max_keys()));
                }
                shard.write(
                    hash,
                    &layer.key,
                    next.state,
                    now_us + duration_micros(next.ttl),
                );
            }
            return Ok(vec![t.verdict]);
        }
        let located: Vec<(u64, usize)> = layers.iter().map(|l| self.locate(&l.key)).collect();
        let mut order: Vec<usize> = located.iter().map(|&(_, id)| id).collect();
        order.sort_unstable();
        order.dedup();
        // Locks are taken in ascending shard order: no two decisions deadlock.
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        let slot = |id: usize| order.binary_search(&id).expect("locked shard");
        let transitions: Vec<Transition> = layers
            .iter()
            .zip(&located)
            .map(|(l, &(hash, id))| {
                let state = guards[slot(id)].live(hash, &l.key, now_us);
                tollgate_algorithms::decide(l.policy.limit(), state, now, l.cost)
            })
            .collect();
        if !transitions.iter().all(|t| t.verdict.allowed) {
            return Ok(layers
                .iter()
                .zip(transitions)
                .map(|(l, t)| t.verdict.uncharged(l.cost))
                .collect());
        }
        // Room for new keys is checked in every shard before anything is written.
        for (pos, guard) in guards.iter_mut().enumerate() {
            let new_keys = layers
                .iter()
                .zip(&located)
                .filter(|(l, &(hash, id))| {
                    slot(id) == pos && guard.live(hash, &l.key, now_us).is_none()
                })
                .count();
            if new_keys > 0 && !guard.reserve(new_keys, now_us, self.shard_capacity) {
                return Err(StoreError::Full(self.max_keys()));
            }
        }
        let mut verdicts = Vec::with_capacity(layers.len());
        for ((l, &(hash, id)), t) in layers.iter().zip(&located).zip(transitions) {
            if let Some(next) = t.next {
                guards[slot(id)].write(
                    hash,
                    &l.key,
                    next.state,
                    now_us + duration_micros(next.ttl),
                );
            }
            verdicts.push(t.verdict);
        }
        Ok(verdicts)
    }
}

/// Lock a shard. The code under the lock is pure arithmetic, so a poisoned
/// lock still guards a consistent map.
fn lock(shard: &Padded) -> MutexGuard<'_, Shard> {
    shard
        .0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn decide(&self, layers: &[LayerRequest<'_>]) -> Result<Vec<Verdict>, StoreError> {
        self.decide_locked(layers)
    }

    fn decide_now(&self, layers: &[LayerRequest<'_>]) -> Option<Result<Vec<Verdict>, StoreError>> {
        Some(self.decide_locked(layers))
    }
}
