//! The answers of a plan source, kept in-process: bounded, each answer
//! for its own time, and read on every decision, so a read is one hash, a
//! shard's read lock and a cycle-counter read (a general-purpose cache that
//! records every read for its eviction policy cost a decision three times
//! as much as the decision itself).

use std::hash::BuildHasher;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use quanta::Instant;

use crate::subject::Subject;

/// Shards of the map: concurrent decisions seldom meet on one lock.
const SHARDS: usize = 64;

/// One kept answer.
struct Kept<V> {
    customer: Subject,
    answer: V,
    expires: Instant,
}

/// Answers per customer, each until its own expiry, at most about
/// `max_entries` (when a shard is full, its expired answers go, then an
/// arbitrary one).
pub(crate) struct AnswerCache<V> {
    shards: Box<[RwLock<HashTable<Kept<V>>>]>,
    hasher: RandomState,
    per_shard: usize,
}

impl<V: Copy> AnswerCache<V> {
    pub(crate) fn new(max_entries: u64) -> Self {
        let per_shard = usize::try_from(max_entries.div_ceil(SHARDS as u64))
            .unwrap_or(usize::MAX)
            .max(1);
        AnswerCache {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            hasher: RandomState::default(),
            per_shard,
        }
    }

    /// The answer kept for `customer`, unless it has expired.
    #[inline]
    pub(crate) fn get(&self, customer: &Subject) -> Option<V> {
        let hash = self.hash(customer);
        let shard = read(self.shard(hash));
        let kept = shard.find(hash, |k| k.customer == *customer)?;
        (Instant::now() < kept.expires).then_some(kept.answer)
    }

    /// Keep `answer` for `customer` for `ttl`.
    pub(crate) fn insert(&self, customer: Subject, answer: V, ttl: Duration) {
        let now = Instant::now();
        let hash = self.hash(&customer);
        let mut shard = write(self.shard(hash));
        let rehash = |k: &Kept<V>| self.hash(&k.customer);
        if let Ok(found) = shard.find_entry(hash, |k| k.customer == customer) {
            found.remove();
        } else if shard.len() >= self.per_shard {
            shard.retain(|k| k.expires > now);
            if shard.len() >= self.per_shard {
                if let Some(some) = shard.iter().next().map(|k| k.customer.clone()) {
                    let some_hash = self.hash(&some);
                    if let Ok(found) = shard.find_entry(some_hash, |k| k.customer == some) {
                        found.remove();
                    }
                }
            }
        }
        let expires = now + ttl;
        shard.insert_unique(
            hash,
            Kept {
                customer,
                answer,
                expires,
            },
            rehash,
        );
    }

    /// How many answers are kept (expired ones included until they go).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| read(s).len()).sum()
    }

    #[inline]
    fn hash(&self, customer: &Subject) -> u64 {
        self.hasher.hash_one(customer.as_str())
    }

    /// The shard of `hash`, by its top bits (the table uses the low ones).
    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<HashTable<Kept<V>>> {
        &self.shards[(hash >> 58) as usize % SHARDS]
    }
}

/// A shard's read lock; a panic elsewhere leaves the table usable (every
/// write is one insert or removal).
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(n: usize) -> Subject {
        Subject::new(format!("s-{n}")).unwrap()
    }

    #[test]
    fn answers_expire_and_the_size_is_bounded() {
        let cache = AnswerCache::new(128);
        cache.insert(subject(0), 7u32, Duration::from_secs(60));
        cache.insert(subject(1), 8u32, Duration::ZERO);
        assert_eq!(cache.get(&subject(0)), Some(7));
        assert_eq!(cache.get(&subject(1)), None, "expired");
        assert_eq!(cache.get(&subject(2)), None, "never kept");
        cache.insert(subject(0), 6u32, Duration::from_secs(60));
        assert_eq!(cache.get(&subject(0)), Some(6), "replaced");
        for n in 0..10_000 {
            cache.insert(subject(n), 1, Duration::from_secs(60));
        }
        // Two per shard.
        assert!(cache.len() <= 128, "{}", cache.len());
        cache.insert(subject(3), 9, Duration::from_secs(60));
        assert_eq!(cache.get(&subject(3)), Some(9), "the newest is kept");
    }
}
