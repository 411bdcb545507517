//! The sharded map and the all-or-nothing decision over it.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use async_trait::async_trait;
use foldhash::fast::RandomState;
use std::collections::HashMap;

use crate::entry_key::EntryKey;
use crate::slot::{Slot, Snapshot};
use hashbrown::HashTable;
use smallvec::SmallVec;
use tollgate_algorithms::Layered;
use tollgate_limiter::{
    check_holds, duration_micros, Adjustment, Clock, Decide, Hold, Holds, LayerRequest, Limit,
    MonotonicClock, Policy, State, Store, StoreError, StoreKey, Stored, Timestamp, Verdicts,
    WhenFull,
};

/// A policy's budget for the keys of one version and algorithm.
type Variant = (u32, &'static str, Arc<Budget>);

/// Passes of a decision that found a budget full: each makes room across
/// the store first (reclaiming expired keys, evicting when the budget
/// evicts).
const MAX_ROOM_PASSES: u32 = 4;

/// Expiries raised under a shard's shared lock are rounded up to the end of
/// a grain of this many microseconds (a power of two, about 16 ms): see
/// [`Entry::outlive`].
const EXPIRY_GRAIN: u64 = 1 << 14;

/// Sweep a shard once it holds this many entries, at the least.
const MIN_SWEEP: usize = 64;

/// A bound on live keys: the store's own, or a policy's. Counts are exact:
/// an entry takes one unit when it is inserted and gives it back when it is
/// removed, so `max_keys(N)` holds at most N entries, expired ones included.
struct Budget {
    /// `store`, or `policy <name>`, for errors.
    label: Box<str>,
    /// The policy's name, for a policy's budget.
    policy: Option<Box<str>>,
    max: AtomicUsize,
    held: AtomicUsize,
    /// `WhenFull` as a number (policies can change it on reload).
    when_full: AtomicUsize,
    /// When the budget was last seen full: no key of it expires before this
    /// instant (µs), so a refusal until then needs no scan.
    free_at: AtomicU64,
}

impl Budget {
    fn new(policy: Option<&str>, max: usize, when_full: WhenFull) -> Self {
        let label = match policy {
            Some(name) => format!("policy {name:?}"),
            None => "store".to_string(),
        };
        Budget {
            label: label.into_boxed_str(),
            policy: policy.map(Into::into),
            max: AtomicUsize::new(max),
            held: AtomicUsize::new(0),
            when_full: AtomicUsize::new(when_full as usize),
            free_at: AtomicU64::new(0),
        }
    }

    fn when_full(&self) -> WhenFull {
        if self.when_full.load(Ordering::Relaxed) == WhenFull::Refuse as usize {
            WhenFull::Refuse
        } else {
            WhenFull::EvictNearestExpiry
        }
    }

    /// Take one unit, unless the budget is full.
    fn take(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then_some(held + 1)
            })
            .is_ok()
    }

    fn give_back(&self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
        // Room freed: a cached "full until" no longer holds.
        self.forget_full();
    }

    /// Forget when the budget was seen full until: room was freed, or a
    /// key's expiry was brought forward (a reward, a shorter window), so
    /// a key may expire before it.
    fn forget_full(&self) {
        if self.free_at.load(Ordering::Relaxed) != 0 {
            self.free_at.store(0, Ordering::Relaxed);
        }
    }
}

struct Entry {
    /// The rendered key; compared against a borrowed [`StoreKey`] on lookup.
    key: EntryKey,
    /// The key's hash, kept so the table can grow without rehashing text.
    hash: u64,
    state: Slot,
    /// Microseconds; the entry is gone from this instant on. Only raised
    /// under the shard's shared lock (by a GCRA decision).
    expires_at: AtomicU64,
    /// The policy's own budget, when it has one (the store's always counts).
    budget: Option<Arc<Budget>>,
    /// It holds places of a concurrency limit: never evicted (its holders
    /// are running, and would lose their places while they work).
    pinned: bool,
}

impl Entry {
    /// When the entry expires (µs).
    fn expires_at(&self) -> u64 {
        self.expires_at.load(Ordering::Relaxed)
    }

    /// Replace the state with `next` (under the shard's exclusive lock),
    /// living `next.ttl` from `now_us`; the new expiry (µs). An expiry
    /// brought forward makes the store's budget (`total`) and the
    /// entry's forget when they were seen full until.
    fn replace(&mut self, next: Stored, now_us: u64, total: &Budget) -> u64 {
        let expires_at = now_us.saturating_add(duration_micros(next.ttl));
        self.state.set(next.state);
        let before = std::mem::replace(self.expires_at.get_mut(), expires_at);
        if expires_at < before {
            total.forget_full();
            if let Some(budget) = &self.budget {
                budget.forget_full();
            }
        }
        expires_at
    }

    /// Keep the entry until `at` (µs) at least, under the shard's shared
    /// lock (a GCRA decision). The expiry is raised to the end of `at`'s
    /// [`EXPIRY_GRAIN`], and only when `at` is past it: a hot key's expiry
    /// creeps on by a few microseconds with every decision, and a locked
    /// read-modify-write on each would cost more than the decision. The
    /// entry may outlive its state by up to a grain; a GCRA state whose
    /// TAT has passed decides exactly as no state, so that only delays
    /// reclaiming it.
    fn outlive(&self, at: u64) {
        if self.expires_at.load(Ordering::Relaxed) < at {
            self.expires_at
                .fetch_max(at | (EXPIRY_GRAIN - 1), Ordering::Relaxed);
        }
    }

    /// Whether the entry holds a unit of `budget` (the store's when `None`:
    /// every entry does).
    fn counts_for(&self, budget: Option<&Arc<Budget>>) -> bool {
        match budget {
            None => true,
            Some(b) => self
                .budget
                .as_ref()
                .is_some_and(|mine| Arc::ptr_eq(mine, b)),
        }
    }

    /// Whether the entry may be evicted to make room in `budget`: an entry
    /// of that budget; for the store's, any entry except those of a policy
    /// budget that refuses (its keys are never evicted, or its exactness
    /// would be lost), and never one holding a concurrency limit's places.
    fn evictable_for(&self, budget: Option<&Arc<Budget>>) -> bool {
        !self.pinned
            && self.counts_for(budget)
            && (budget.is_some()
                || !self
                    .budget
                    .as_ref()
                    .is_some_and(|mine| mine.when_full() == WhenFull::Refuse))
    }
}

struct Shard {
    entries: HashTable<Entry>,
    /// Sweep expired entries when an insert finds at least this many.
    sweep_at: usize,
    /// No entry expires before this instant (a lower bound, µs).
    next_expiry: u64,
}

impl Shard {
    fn find(&self, hash: u64, key: &StoreKey<'_>) -> Option<&Entry> {
        self.entries
            .find(hash, |e| key.matches_bytes(e.key.as_bytes()))
    }

    /// Where `key`'s entry is in the table (valid until an insert).
    fn find_index(&self, hash: u64, key: &StoreKey<'_>) -> Option<usize> {
        self.entries
            .find_bucket_index(hash, |e| key.matches_bytes(e.key.as_bytes()))
    }

    /// Replace the state of the entry of `hash` at `index` (found by
    /// [`find_index`](Self::find_index) under this lock) with `next`.
    /// Removing other entries (sweeps, evictions) moves none, and nothing
    /// is inserted before the overwrites; the hash is checked all the
    /// same, so a broken assumption stops the decision instead of writing
    /// another key's state.
    fn overwrite(&mut self, index: usize, hash: u64, next: Stored, now_us: u64, total: &Budget) {
        let expires_at = self
            .entries
            .get_bucket_mut(index)
            .filter(|e| e.hash == hash)
            .expect("an entry found under this lock is still where it was found")
            .replace(next, now_us, total);
        self.next_expiry = self.next_expiry.min(expires_at);
    }

    /// Add an entry for `key`, known to have none (a unit of every budget
    /// was taken for it).
    fn insert(
        &mut self,
        hash: u64,
        (key, key_limit): (&StoreKey<'_>, &Limit),
        next: Stored,
        now_us: u64,
        budget: Option<&Arc<Budget>>,
    ) {
        let expires_at = now_us.saturating_add(duration_micros(next.ttl));
        self.next_expiry = self.next_expiry.min(expires_at);
        let entry = Entry {
            key: EntryKey::new(key.render()),
            hash,
            state: Slot::new(next.state),
            expires_at: AtomicU64::new(expires_at),
            budget: budget.cloned(),
            pinned: matches!(key_limit, Limit::Concurrency(_)),
        };
        self.entries.insert_unique(hash, entry, |e| e.hash);
    }

    /// Drop expired entries (except those of the decision in progress,
    /// `keep`), giving their units back, and set the next sweep point.
    fn sweep(&mut self, now: u64, total: &Budget, keep: &[u64]) {
        if self.next_expiry <= now {
            let mut next = u64::MAX;
            self.entries.retain(|e| {
                if e.expires_at() > now || keep.contains(&e.hash) {
                    next = next.min(e.expires_at());
                    true
                } else {
                    release(e, total);
                    false
                }
            });
            self.next_expiry = next;
        }
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
    }

    /// Drop the entry of `budget` (any entry, for the store's) closest to
    /// expiry, except those of the decision in progress. False when there
    /// is none here.
    fn evict_nearest(
        &mut self,
        budget: Option<&Arc<Budget>>,
        total: &Budget,
        keep: &[u64],
    ) -> bool {
        let nearest = self
            .entries
            .iter()
            .filter(|e| e.evictable_for(budget) && !keep.contains(&e.hash))
            .min_by_key(|e| e.expires_at())
            .map(|e| (e.hash, e.expires_at()));
        let Some((hash, expires_at)) = nearest else {
            return false;
        };
        if let Ok(found) = self.entries.find_entry(hash, |e| {
            e.hash == hash && e.expires_at() == expires_at && e.evictable_for(budget)
        }) {
            let (entry, _) = found.remove();
            release(&entry, total);
            return true;
        }
        false
    }

    /// The first expiry among the entries of `budget`; with `evictable`,
    /// only among those that may be evicted for it, `evictable`'s hashes
    /// (a decision's own keys) aside.
    fn nearest_expiry(
        &self,
        budget: Option<&Arc<Budget>>,
        evictable: Option<&[u64]>,
    ) -> Option<u64> {
        self.entries
            .iter()
            .filter(|e| match evictable {
                Some(keep) => e.evictable_for(budget) && !keep.contains(&e.hash),
                None => e.counts_for(budget),
            })
            .map(|e| e.expires_at())
            .min()
    }
}

/// How many new keys of `budget` (the store's when `None`: every new key)
/// `layered` writes among `at`'s layers.
fn new_keys_of(at: &Placed<'_, '_>, layered: &Layered, budget: Option<&Arc<Budget>>) -> usize {
    (0..at.layers.len())
        .filter(|&i| at.found[i].is_none() && layered.writes[i].is_some())
        .filter(|&i| {
            let policy = at.layers[i].policy;
            budget.is_none_or(|b| {
                policy.key_budget().is_some() && b.policy.as_deref() == Some(policy.name())
            })
        })
        .count()
}

/// Give back the units of a removed entry.
fn release(entry: &Entry, total: &Budget) {
    total.give_back();
    if let Some(b) = &entry.budget {
        b.give_back();
    }
}

/// One shard's lock on cache lines of its own: two threads locking
/// neighbouring shards must not bounce one line between their cores
/// (128 bytes: adjacent-line prefetching pairs 64-byte lines). An in-place
/// decision on an existing key takes it shared ([`Slot::decide_in_place`]); every
/// other decision, exclusive.
#[repr(align(128))]
struct Padded(RwLock<Shard>);

/// The in-process store; see the [crate docs](crate).
pub struct MemoryStore {
    shards: Box<[Padded]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    /// The store-wide bound.
    total: Budget,
    /// Policies' own budgets, by policy name, then by the version and
    /// algorithm its keys carry (see [`budget_of`](Self::budget_of)).
    budgets: Mutex<HashMap<Box<str>, Vec<Variant>>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("max_keys", &self.max_keys())
            .field("when_full", &self.total.when_full())
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
    when_full: WhenFull,
    shards: usize,
    clock: Arc<dyn Clock>,
}

impl MemoryStoreBuilder {
    /// Most keys held at once, exactly (default 1,000,000). A decision that
    /// needs a new key in a full store first reclaims expired keys, then
    /// does what [`when_full`](Self::when_full) says. Policies can also
    /// have budgets of their own
    /// ([`Policy::with_key_budget`](tollgate_limiter::Policy::with_key_budget)),
    /// so one route's traffic cannot take another's room.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// What a full store does (default: evict the key nearest to expiry;
    /// see [`WhenFull`] for the bound on what that can admit).
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// Number of shards, rounded up to a power of two (default 64).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16).next_power_of_two();
        self
    }

    /// Whether `other` builds a store of the same size and rule when full
    /// (the clocks aside).
    #[cfg(feature = "serde")]
    pub(crate) fn same_shape(&self, other: &MemoryStoreBuilder) -> bool {
        (self.max_keys, self.when_full, self.shards)
            == (other.max_keys, other.when_full, other.shards)
    }

    /// The clock (default: a [`MonotonicClock`], read from the CPU's
    /// time-stamp counter). Tests pass a
    /// [`ManualClock`](tollgate_limiter::ManualClock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Build the store.
    pub fn build(self) -> MemoryStore {
        MemoryStore {
            shards: (0..self.shards)
                .map(|_| {
                    Padded(RwLock::new(Shard {
                        entries: HashTable::new(),
                        sweep_at: MIN_SWEEP,
                        next_expiry: u64::MAX,
                    }))
                })
                .collect(),
            hasher: RandomState::default(),
            clock: self.clock,
            total: Budget::new(None, self.max_keys, self.when_full),
            budgets: Mutex::new(HashMap::new()),
        }
    }
}

/// Why a decision could not write: a budget it needs is full.
struct NeedRoom {
    /// The full budget (the store's when `None`).
    budget: Option<Arc<Budget>>,
    /// Units of it the decision takes for its new keys (all given back
    /// when it failed).
    need: usize,
    /// The hashes of the decision's keys: never removed to make room (its
    /// charge on an existing key would be lost, and the key needed anew).
    keep: SmallVec<[u64; 4]>,
}

impl NeedRoom {
    fn new(budget: Option<Arc<Budget>>, keep: &[u64]) -> Self {
        NeedRoom {
            budget,
            need: 1,
            keep: keep.iter().copied().collect(),
        }
    }
}

/// The budgets taken for a decision's new keys: the layer's index, and its
/// policy's budget if it has one.
type Taken = SmallVec<[(usize, Option<Arc<Budget>>); 4]>;

/// Where a decision's layers live: their keys, each one's hash and shard,
/// and its entry's index in the shard's table when it has one.
struct Placed<'l, 'k> {
    layers: &'l [LayerRequest<'k>],
    located: &'l [(u64, usize)],
    found: &'l [Option<usize>],
}

/// The shards of one decision's layers, each locked once, in ascending
/// order: no two decisions deadlock.
struct LockedShards<'s> {
    order: SmallVec<[usize; 4]>,
    guards: SmallVec<[RwLockWriteGuard<'s, Shard>; 4]>,
}

impl<'s> LockedShards<'s> {
    fn lock(store: &'s MemoryStore, located: &[(u64, usize)]) -> Self {
        let mut order: SmallVec<[usize; 4]> = located.iter().map(|&(_, id)| id).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| lock(&store.shards[i])).collect();
        LockedShards { order, guards }
    }

    fn get(&self, id: usize) -> &Shard {
        &self.guards[self.slot(id)]
    }

    fn get_mut(&mut self, id: usize) -> &mut Shard {
        let slot = self.slot(id);
        &mut self.guards[slot]
    }

    fn slot(&self, id: usize) -> usize {
        self.order.binary_search(&id).expect("locked shard")
    }
}

impl MemoryStore {
    /// A builder with the defaults.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: 1_000_000,
            when_full: WhenFull::default(),
            shards: 64,
            clock: Arc::new(MonotonicClock::new()),
        }
    }

    /// Most keys this store holds.
    pub fn max_keys(&self) -> usize {
        self.total.max.load(Ordering::Relaxed)
    }

    /// Entries currently held, expired ones not yet reclaimed included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// Whether the store holds no entry at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reclaim every expired entry now. Never required (a full budget and
    /// growth trigger sweeps); useful to return memory after a burst of
    /// one-off keys.
    pub fn purge_expired(&self) {
        let now = self.clock.now();
        // A clock far off would take every entry for expired, concurrency
        // holds included: decisions refuse such a time, and so does this.
        if !now.is_plausible() {
            return;
        }
        let now = now.as_micros();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.sweep(now, &self.total, &[]);
            // The table's room too: a sweep keeps it for the next burst.
            shard.entries.shrink_to_fit(|e| e.hash);
        }
    }

    /// The key's hash and its shard (the top bits pick the shard, so the
    /// table inside the shard still sees well-mixed low bits).
    fn locate(&self, key: &StoreKey<'_>) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        let shard = (hash >> 48) as usize & (self.shards.len() - 1);
        (hash, shard)
    }

    /// The policy's own budget, if it has one (created on first use; a
    /// changed size or `WhenFull` applies from now on).
    ///
    /// One budget per version and algorithm of a policy, as its keys carry
    /// them: after a reload swaps the algorithm or bumps the version, the
    /// old keys are never read again, and a refusing budget they still
    /// filled would refuse every client until they expired.
    fn budget_of(&self, policy: &Policy) -> Option<Arc<Budget>> {
        let spec = policy.key_budget()?;
        let (version, algorithm) = (policy.version(), policy.limit().key_code());
        let mut budgets = self
            .budgets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let variants = match budgets.get_mut(policy.name()) {
            Some(variants) => variants,
            None => budgets.entry(policy.name().into()).or_default(),
        };
        let found = variants
            .iter()
            .find(|(v, a, _)| (*v, *a) == (version, algorithm))
            .map(|(_, _, b)| b.clone());
        let budget = found.unwrap_or_else(|| {
            let b = Arc::new(Budget::new(
                Some(policy.name()),
                spec.max_keys(),
                spec.when_full(),
            ));
            variants.push((version, algorithm, b.clone()));
            b
        });
        budget.max.store(spec.max_keys(), Ordering::Relaxed);
        budget
            .when_full
            .store(spec.when_full() as usize, Ordering::Relaxed);
        Some(budget)
    }

    /// Take a unit of the store's budget and of `budget` for a new key in
    /// `shard`, making room in that shard when a budget is full: expired
    /// entries first, then (when the budget says so) its entry nearest to
    /// expiry. `keep`: hashes of the decision's own keys, never removed.
    fn take_units(
        &self,
        shard: &mut Shard,
        policy: &Policy,
        now: u64,
        keep: &[u64],
    ) -> Result<Option<Arc<Budget>>, NeedRoom> {
        // Growth reclaims expired entries: no cleanup task is needed.
        if shard.entries.len() >= shard.sweep_at {
            shard.sweep(now, &self.total, keep);
        }
        let budget = self.budget_of(policy);
        let mut swept = false;
        loop {
            // The policy's budget first: when it is full, room is made
            // among its own keys, which frees a unit of the store's too.
            if let Some(b) = &budget {
                if !b.take() {
                    if !swept {
                        shard.sweep(now, &self.total, keep);
                        swept = true;
                    } else if b.when_full() == WhenFull::Refuse
                        || !shard.evict_nearest(Some(b), &self.total, keep)
                    {
                        return Err(NeedRoom::new(Some(b.clone()), keep));
                    }
                    continue;
                }
            }
            if self.total.take() {
                return Ok(budget);
            }
            if let Some(b) = &budget {
                b.give_back();
            }
            if !swept {
                shard.sweep(now, &self.total, keep);
                swept = true;
            } else if self.total.when_full() == WhenFull::Refuse
                || !shard.evict_nearest(None, &self.total, keep)
            {
                return Err(NeedRoom::new(None, keep));
            }
        }
    }

    /// Make room across every shard for the `need` new keys of a decision
    /// that found `budget` full (the store's when `None`), one lock at a
    /// time, never removing the decision's own keys: reclaim expired
    /// entries where a shard may hold some; then, when the budget evicts,
    /// drop its entries nearest to expiry until the keys fit (more than
    /// `need` when the budget shrank below what it holds). False when
    /// nothing could be done: the decision cannot fit, or the budget is
    /// full and refuses, or holds nothing to evict. (True when room was
    /// made: the decision is tried again, and concurrent ones may have
    /// taken that room first.)
    fn make_room(&self, room: &NeedRoom, now: u64) -> bool {
        for shard in self.shards.iter() {
            lock(shard).sweep(now, &self.total, &room.keep);
        }
        let budget = room.budget.as_ref();
        let b = budget.map_or(&self.total, |b| &**b);
        let max = b.max.load(Ordering::Relaxed);
        if room.need > max {
            return false;
        }
        let has_room = || b.held.load(Ordering::Acquire) + room.need <= max;
        let mut evicted = false;
        while !has_room() {
            if b.when_full() == WhenFull::Refuse || !self.evict_nearest(budget, &room.keep) {
                return evicted;
            }
            evicted = true;
        }
        true
    }

    /// Drop the entry of `budget` (any entry, for the store's) nearest to
    /// expiry across the shards, except those of `keep`. False when there
    /// is none.
    fn evict_nearest(&self, budget: Option<&Arc<Budget>>, keep: &[u64]) -> bool {
        let nearest = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(i, s)| lock(s).nearest_expiry(budget, Some(keep)).map(|at| (at, i)))
            .min();
        match nearest {
            Some((_, i)) => lock(&self.shards[i]).evict_nearest(budget, &self.total, keep),
            None => false,
        }
    }

    /// The refusal of a full budget, with the wait until its first key
    /// expires (scanned at most once per such wait).
    fn full(&self, budget: Option<&Arc<Budget>>, now: u64) -> StoreError {
        let b = budget.map_or(&self.total, |b| &**b);
        let mut free_at = b.free_at.load(Ordering::Acquire);
        if free_at <= now {
            free_at = self
                .shards
                .iter()
                .filter_map(|s| lock(s).nearest_expiry(budget, None))
                .min()
                .unwrap_or(now + 1);
            b.free_at.store(free_at, Ordering::Release);
        }
        StoreError::Full {
            budget: b.label.to_string(),
            policy: b.policy.as_deref().map(str::to_string),
            max_keys: b.max.load(Ordering::Relaxed),
            retry_after: Duration::from_micros(free_at.saturating_sub(now)),
        }
    }

    /// Decide all layers into `verdicts` (received empty), making room
    /// across the store when a budget is full (then deciding again: the
    /// first answer was not written).
    fn decide_into(
        &self,
        layers: &[LayerRequest<'_>],
        verdicts: &mut Verdicts,
    ) -> Result<(), StoreError> {
        self.with_room(verdicts, |now, out| self.decide_locked(layers, now, out))
    }

    /// Adjust all layers, making room as [`decide_into`](Self::decide_into)
    /// does (a penalty or block may write a new key).
    fn adjust_all(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        let mut verdicts = Verdicts::new();
        self.with_room(&mut verdicts, |now, out| {
            self.write_locked(layers, now, out, |states| {
                tollgate_algorithms::adjust_layers(layers, states, now, adjustment)
            })
        })
        .map(|()| verdicts)
    }

    /// Run `attempt` at the clock's now until it finds room for the keys
    /// it writes (each failed attempt wrote nothing, not even a verdict
    /// into `verdicts`).
    fn with_room(
        &self,
        verdicts: &mut Verdicts,
        attempt: impl Fn(Timestamp, &mut Verdicts) -> Result<Result<(), StoreError>, NeedRoom>,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        if !now.is_plausible() {
            return Err(StoreError::ImplausibleTime(now));
        }
        let now_us = now.as_micros();
        let mut attempt_no = 0;
        loop {
            match attempt(now, verdicts) {
                Ok(answered) => return answered,
                Err(room) => {
                    // Each pass makes room for the decision's new keys;
                    // concurrent decisions may take it first, so a few
                    // passes are allowed.
                    attempt_no += 1;
                    if attempt_no > MAX_ROOM_PASSES || !self.make_room(&room, now_us) {
                        return Err(self.full(room.budget.as_ref(), now_us));
                    }
                }
            }
        }
    }

    /// Decide all layers under the locks of their shards, writing their
    /// verdicts into `out`.
    fn decide_locked(
        &self,
        layers: &[LayerRequest<'_>],
        now: tollgate_limiter::Timestamp,
        out: &mut Verdicts,
    ) -> Result<Result<(), StoreError>, NeedRoom> {
        let now_us = now.as_micros();
        if let [layer] = layers {
            // One layer, one lock: the common case, without the bookkeeping.
            let (hash, id) = self.locate(&layer.key);
            let limit = layer.policy.limit();
            // (A cost no state can admit is answered by the reference.)
            let admissible = layer.cost != 0 && layer.cost <= limit.capacity();
            let in_place = tollgate_algorithms::in_place(limit).filter(|_| admissible);
            if let Some(how) = in_place {
                let shard = read(&self.shards[id]);
                if let Some(entry) = shard.find(hash, &layer.key) {
                    if let Some(t) = entry.state.decide_in_place(how, now_us, layer.cost) {
                        let ttl = t.next.as_ref().map(|next| next.ttl);
                        if let Some(ttl) = ttl.or(tollgate_algorithms::kept_by_denial(&t.verdict)) {
                            entry.outlive(now_us.saturating_add(duration_micros(ttl)));
                        }
                        out.push(t.verdict);
                        return Ok(Ok(()));
                    }
                }
            }
            let mut shard = lock(&self.shards[id]);
            let shard = &mut *shard;
            // An existing key: one lookup, decided and written in place.
            if let Some(entry) = shard
                .entries
                .find_mut(hash, |e| layer.key.matches_bytes(e.key.as_bytes()))
            {
                let snapshot = entry.state.read();
                let state = (entry.expires_at() > now_us).then(|| snapshot.get());
                let t = tollgate_algorithms::decide(layer.policy.limit(), state, now, layer.cost);
                let read = state.is_some();
                drop(snapshot);
                if let Some(next) = t.next {
                    let expires_at = entry.replace(next, now_us, &self.total);
                    shard.next_expiry = shard.next_expiry.min(expires_at);
                } else if let Some(kept) = tollgate_algorithms::kept_by_denial(&t.verdict) {
                    if read {
                        entry.outlive(now_us.saturating_add(duration_micros(kept)));
                    }
                }
                out.push(t.verdict);
                return Ok(Ok(()));
            }
            let t = tollgate_algorithms::decide(layer.policy.limit(), None, now, layer.cost);
            if let Some(next) = t.next {
                let budget = self.take_units(shard, layer.policy, now_us, &[hash])?;
                let key = (&layer.key, layer.policy.limit());
                shard.insert(hash, key, next, now_us, budget.as_ref());
            }
            out.push(t.verdict);
            return Ok(Ok(()));
        }
        self.write_locked(layers, now, out, |states| {
            Ok(tollgate_algorithms::decide_layers(layers, states, now))
        })
    }

    /// Judge `layers` with `judge` under the exclusive locks of their
    /// shards, then make its writes when it admits (an adjustment always
    /// does); the verdicts go to `out`. Up to four layers: every list here
    /// lives on the stack.
    fn write_locked(
        &self,
        layers: &[LayerRequest<'_>],
        now: Timestamp,
        out: &mut Verdicts,
        judge: impl FnOnce(&[Option<&State>]) -> Result<Layered, StoreError>,
    ) -> Result<Result<(), StoreError>, NeedRoom> {
        debug_assert!(
            layers
                .iter()
                .enumerate()
                .all(|(i, l)| layers[..i].iter().all(|o| o.key != l.key)),
            "the Store contract: a request's layers have distinct keys"
        );
        let now_us = now.as_micros();
        let located: SmallVec<[(u64, usize); 4]> =
            layers.iter().map(|l| self.locate(&l.key)).collect();
        let mut shards = LockedShards::lock(self, &located);
        // Where each layer's entry is in its shard's table, when it has
        // one: its write needs no second lookup. (Under these locks only
        // this call changes the tables, and it inserts last.)
        let mut found: SmallVec<[Option<usize>; 4]> = SmallVec::new();
        let mut layered = {
            let snapshots: SmallVec<[Option<Snapshot<'_>>; 4]> = layers
                .iter()
                .zip(&located)
                .map(|(l, &(hash, id))| {
                    let shard = shards.get(id);
                    let index = shard.find_index(hash, &l.key);
                    found.push(index);
                    index
                        .and_then(|i| shard.entries.get_bucket(i))
                        .filter(|e| e.expires_at() > now_us)
                        .map(|e| e.state.read())
                })
                .collect();
            let states: SmallVec<[Option<&State>; 4]> = snapshots
                .iter()
                .map(|s| s.as_ref().map(Snapshot::get))
                .collect();
            match judge(&states) {
                Ok(layered) => layered,
                Err(e) => return Ok(Err(e)),
            }
        };
        if !layered.admitted() {
            keep_denied(&mut shards, &located, &found, &layered.verdicts, now_us);
            out.extend_from_slice(&layered.verdicts);
            return Ok(Ok(()));
        }
        let placed = Placed {
            layers,
            located: &located,
            found: &found,
        };
        let taken = self.take_room(&mut shards, &placed, &layered, now_us)?;
        self.write(&mut shards, &placed, &mut layered.writes, &taken, now_us);
        out.extend_from_slice(&layered.verdicts);
        Ok(Ok(()))
    }

    /// Units of the key budgets for the new keys `layered` writes, taken
    /// before anything is written and all given back if any budget is
    /// full.
    fn take_room(
        &self,
        shards: &mut LockedShards<'_>,
        at: &Placed<'_, '_>,
        layered: &Layered,
        now_us: u64,
    ) -> Result<Taken, NeedRoom> {
        let mut taken = Taken::new();
        let new_key = |i: usize| at.found[i].is_none() && layered.writes[i].is_some();
        if !(0..at.layers.len()).any(new_key) {
            // Every write is to a key that exists: the usual case.
            return Ok(taken);
        }
        let keep: SmallVec<[u64; 4]> = at.located.iter().map(|&(hash, _)| hash).collect();
        for i in (0..at.layers.len()).filter(|&i| new_key(i)) {
            let shard = shards.get_mut(at.located[i].1);
            match self.take_units(shard, at.layers[i].policy, now_us, &keep) {
                Ok(budget) => taken.push((i, budget)),
                Err(mut room) => {
                    for (_, budget) in taken {
                        self.total.give_back();
                        if let Some(b) = budget {
                            b.give_back();
                        }
                    }
                    room.need = new_keys_of(at, layered, room.budget.as_ref());
                    return Err(room);
                }
            }
        }
        Ok(taken)
    }

    /// Make `writes`, each taken out of the list: existing entries first,
    /// where they were found; then the new ones (an insert may grow a
    /// table and move its entries), each under the budget `taken` holds
    /// for it.
    fn write(
        &self,
        shards: &mut LockedShards<'_>,
        at: &Placed<'_, '_>,
        writes: &mut [Option<Stored>],
        taken: &Taken,
        now_us: u64,
    ) {
        for (i, write) in writes.iter_mut().enumerate() {
            let Some(index) = at.found[i] else { continue };
            if let Some(next) = write.take() {
                let (hash, id) = at.located[i];
                shards
                    .get_mut(id)
                    .overwrite(index, hash, next, now_us, &self.total);
            }
        }
        // What is left is the new keys'.
        for (i, write) in writes.iter_mut().enumerate() {
            let Some(next) = write.take() else { continue };
            let (hash, id) = at.located[i];
            let budget = taken
                .iter()
                .find(|(j, _)| *j == i)
                .and_then(|(_, b)| b.as_ref());
            shards.get_mut(id).insert(
                hash,
                (&at.layers[i].key, at.layers[i].policy.limit()),
                next,
                now_us,
                budget,
            );
        }
    }
}

impl MemoryStore {
    /// Each layer's hash and shard, in layer order (callers lock the
    /// shards sorted and deduplicated, the order every decision locks
    /// them in, so no two calls deadlock).
    fn shards_of(&self, layers: &[LayerRequest<'_>]) -> SmallVec<[(u64, usize); 4]> {
        layers.iter().map(|l| self.locate(&l.key)).collect()
    }

    /// Judge every layer against its state, writing nothing.
    fn peek_all(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        let now = self.clock.now();
        if !now.is_plausible() {
            return Err(StoreError::ImplausibleTime(now));
        }
        let now_us = now.as_micros();
        let located = self.shards_of(layers);
        let mut order: SmallVec<[usize; 4]> = located.iter().map(|&(_, id)| id).collect();
        order.sort_unstable();
        order.dedup();
        let guards: SmallVec<[RwLockReadGuard<'_, Shard>; 4]> =
            order.iter().map(|&i| read(&self.shards[i])).collect();
        let slot = |id: usize| order.binary_search(&id).expect("locked shard");
        let snapshots: SmallVec<[Option<Snapshot<'_>>; 4]> = layers
            .iter()
            .zip(&located)
            .map(|(l, &(hash, id))| {
                guards[slot(id)]
                    .find(hash, &l.key)
                    .filter(|e| e.expires_at() > now_us)
                    .map(|e| e.state.read())
            })
            .collect();
        let states: SmallVec<[Option<&State>; 4]> = snapshots
            .iter()
            .map(|s| s.as_ref().map(Snapshot::get))
            .collect();
        let layered = tollgate_algorithms::decide_layers(layers, &states, now);
        // Nothing was charged: an admitting layer reports what it has now.
        let charged = layered.admitted();
        Ok(layered
            .verdicts
            .into_iter()
            .zip(layers)
            .map(|(v, l)| if charged { v.uncharged(l.cost) } else { v })
            .collect())
    }

    /// Decide all layers as [`decide_into`](Self::decide_into) does, and
    /// answer each concurrency layer's hold.
    fn acquire_all(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        let mut verdicts = Verdicts::new();
        // Written by the attempt that answers (a failed one writes nothing).
        let holds = RefCell::new(Holds::new());
        self.with_room(&mut verdicts, |now, out| {
            self.write_locked(layers, now, out, |states| {
                let layered = tollgate_algorithms::decide_layers(layers, states, now);
                *holds.borrow_mut() = tollgate_algorithms::holds_of(layers, &layered);
                Ok(layered)
            })
        })?;
        Ok((verdicts, holds.into_inner()))
    }

    /// Release or renew every layer's hold under the locks of its shard
    /// (`change`: the reference's writes for the states found).
    fn change_holds(
        &self,
        layers: &[LayerRequest<'_>],
        change: impl Fn(&[Option<&State>], Timestamp) -> Layered,
    ) -> Result<(), StoreError> {
        let mut verdicts = Verdicts::new();
        self.with_room(&mut verdicts, |now, out| {
            self.write_locked(layers, now, out, |states| Ok(change(states, now)))
        })
    }

    /// Remove every layer's entry, giving its units back.
    fn reset_all(&self, layers: &[LayerRequest<'_>]) {
        let located = self.shards_of(layers);
        let mut order: SmallVec<[usize; 4]> = located.iter().map(|&(_, id)| id).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[RwLockWriteGuard<'_, Shard>; 4]> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        for (l, &(hash, id)) in layers.iter().zip(&located) {
            let shard = &mut guards[order.binary_search(&id).expect("locked shard")];
            if let Ok(found) = shard
                .entries
                .find_entry(hash, |e| l.key.matches_bytes(e.key.as_bytes()))
            {
                let (entry, _) = found.remove();
                release(&entry, &self.total);
            }
        }
    }
}

/// Lock a shard, exclusive. The code under the lock is pure arithmetic, so
/// a poisoned lock still guards a consistent map.
fn lock(shard: &Padded) -> RwLockWriteGuard<'_, Shard> {
    shard
        .0
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Lock a shard, shared (for a GCRA decision on an existing key).
fn read(shard: &Padded) -> RwLockReadGuard<'_, Shard> {
    shard
        .0
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn is_in_process(&self) -> bool {
        true
    }

    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        Decide::Now(self.decide_into(layers, verdicts))
    }

    /// Fetches the lines of the first entry whose hash tag matches
    /// `key`'s, found without reading any entry: comparing its key would
    /// wait for the very cache miss this hint is meant to overlap. (Tags
    /// are seven bits: now and then the entry is another key's, and the
    /// hint is wasted.)
    fn prefetch(&self, key: &StoreKey<'_>) {
        let (hash, id) = self.locate(key);
        let shard = read(&self.shards[id]);
        if let Some(entry) = shard
            .entries
            .find_bucket_index(hash, |_| true)
            .and_then(|i| shard.entries.get_bucket(i))
        {
            crate::prefetch::lines_of(entry);
        }
    }

    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        self.peek_all(layers)
    }

    /// Every state here is Tollgate's own (nothing else writes to this
    /// store), so a reset never meets foreign data.
    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        self.reset_all(layers);
        Ok(())
    }

    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        self.adjust_all(layers, adjustment)
    }

    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        self.acquire_all(layers)
    }

    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        check_holds(layers, holds)?;
        self.change_holds(layers, |states, now| {
            tollgate_algorithms::release_layers(layers, states, now, holds)
        })
    }

    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<Holds, StoreError> {
        check_holds(layers, holds)?;
        let renewed = RefCell::new(Holds::new());
        self.change_holds(layers, |states, now| {
            let (layered, holds) = tollgate_algorithms::renew_layers(layers, states, now, holds);
            *renewed.borrow_mut() = holds;
            layered
        })?;
        Ok(renewed.into_inner())
    }
}

/// A layered denial's states outlive its verdicts' resets, each denying
/// layer's that it read (`tollgate_algorithms::kept_by_denial`): nothing
/// else is written.
fn keep_denied(
    shards: &mut LockedShards<'_>,
    located: &[(u64, usize)],
    found: &[Option<usize>],
    verdicts: &[tollgate_limiter::Verdict],
    now_us: u64,
) {
    for ((&(_, id), index), verdict) in located.iter().zip(found).zip(verdicts) {
        let kept = tollgate_algorithms::kept_by_denial(verdict);
        let entry = index.and_then(|i| shards.get(id).entries.get_bucket(i));
        if let (Some(kept), Some(entry)) = (kept, entry) {
            if entry.expires_at() > now_us {
                entry.outlive(now_us.saturating_add(duration_micros(kept)));
            }
        }
    }
}
