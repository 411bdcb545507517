//! The answers of a plan source, kept in-process: bounded, each answer
//! for its own time, and read on every decision, so a read is a shard's
//! read lock and a cycle-counter read (the customer's hash is the one its
//! subject took when it was made) (a general-purpose cache that
//! records every read for its eviction policy cost a decision three times
//! as much as the decision itself).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use hashbrown::HashTable;

use crate::key_hash::text_hash;
use crate::subject::Subject;

/// Shards of the map at most: concurrent decisions seldom meet on one
/// lock. A cache of fewer entries has fewer shards (a power of two), so
/// that every shard has room: a customer whose shard had none was never
/// kept, and asked the source on every decision.
const SHARDS: usize = 64;

/// One kept answer: a cache line, aligned to one, so that a read touches
/// one line of the table's entries, never two.
#[repr(align(64))]
struct Kept<V> {
    customer: Customer,
    answer: V,
    /// Nanoseconds after the cache's start ([`AnswerCache::now`]).
    expires: u64,
}

/// Customer names up to this many bytes are kept inside the entry (with
/// the expiry and a small answer, the entry fills a cache line).
const INLINE: usize = 46;

/// Whom an answer is for. A short name is kept in the entry itself: a
/// read compares it where the table's probe already brought the entry into
/// cache, instead of following a pointer to the subject's text (one more
/// cache miss per decision when the keys are many).
enum Customer {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Subject),
}

impl Customer {
    fn new(subject: Subject) -> Self {
        let text = subject.as_str().as_bytes();
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..text.len()].copy_from_slice(text);
                Customer::Inline { len, bytes }
            }
            _ => Customer::Shared(subject),
        }
    }

    fn text(&self) -> &[u8] {
        match self {
            Customer::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Customer::Shared(subject) => subject.as_str().as_bytes(),
        }
    }

    /// The text's hash, as its subject's (for a table that grows).
    fn text_hash(&self) -> u64 {
        text_hash(std::str::from_utf8(self.text()).expect("a subject's text"))
    }

    fn is(&self, subject: &Subject) -> bool {
        self.text() == subject.as_str().as_bytes()
    }
}

/// Which kept answer a new one replaces.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// Whatever is kept.
    Any,
    /// Only an expired one (a failure does not replace an answer another
    /// request fetched meanwhile).
    Expired,
}

/// Answers per customer, each until its own expiry, at most `max_entries`
/// (when a shard is full, its expired answers go, then an arbitrary one).
pub(crate) struct AnswerCache<V> {
    shards: Box<[RwLock<HashTable<Kept<V>>>]>,
    /// Each shard's room: `per_shard`, one more for the first `one_more`
    /// shards (together exactly `max_entries`).
    per_shard: usize,
    one_more: usize,
    /// The time-stamp counter and its reading when the cache was made:
    /// an expiry is checked on every read, and the counter read directly
    /// costs a fraction of `quanta::Instant::now` (which looks for a
    /// thread's mocked clock first: 9% of a decision's samples).
    clock: quanta::Clock,
    start: u64,
}

impl<V: Copy> AnswerCache<V> {
    pub(crate) fn new(max_entries: u64) -> Self {
        let shards = usize::try_from(max_entries)
            .unwrap_or(SHARDS)
            .clamp(1, SHARDS);
        let shards = 1 << shards.ilog2();
        let per_shard = usize::try_from(max_entries / shards as u64).unwrap_or(usize::MAX);
        let one_more = (max_entries % shards as u64) as usize;
        let clock = quanta::Clock::new();
        AnswerCache {
            shards: (0..shards).map(|_| RwLock::default()).collect(),
            per_shard,
            one_more,
            start: clock.raw(),
            clock,
        }
    }

    /// Nanoseconds since the cache was made.
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.start, self.clock.raw())
    }

    /// The answer kept for `customer`, unless it has expired.
    #[inline]
    pub(crate) fn get(&self, customer: &Subject) -> Option<V> {
        let hash = self.hash(customer);
        let shard = read(self.shard(hash));
        let kept = shard.find(hash, |k| k.customer.is(customer))?;
        (self.now() < kept.expires).then_some(kept.answer)
    }

    /// Keep `answer` for `customer` for `ttl`.
    #[cfg(test)]
    pub(crate) fn insert(&self, customer: Subject, answer: V, ttl: Duration) {
        self.keep(customer, answer, ttl, Over::Any);
    }

    /// Keep `answer` for `customer` for `ttl`, unless `over` says to keep
    /// the answer already there; the answer kept.
    pub(crate) fn keep(&self, customer: Subject, answer: V, ttl: Duration, over: Over) -> V {
        let now = self.now();
        let hash = self.hash(&customer);
        let index = self.shard_index(hash);
        let room = self
            .per_shard
            .saturating_add(usize::from(index < self.one_more));
        if room == 0 {
            return answer;
        }
        let mut shard = write(&self.shards[index]);
        let rehash = |k: &Kept<V>| k.customer.text_hash();
        if let Ok(found) = shard.find_entry(hash, |k| k.customer.is(&customer)) {
            if over == Over::Expired && found.get().expires > now {
                return found.get().answer;
            }
            found.remove();
        } else if shard.len() >= room {
            shard.retain(|k| k.expires > now);
            if shard.len() >= room {
                let some = shard.iter().next();
                if let Some((some, some_hash)) =
                    some.map(|k| (k.customer.text().to_vec(), k.customer.text_hash()))
                {
                    if let Ok(found) = shard.find_entry(some_hash, |k| k.customer.text() == some) {
                        found.remove();
                    }
                }
            }
        }
        // (A TTL past 584 years, "keep it forever", is kept that long.)
        let expires = now.saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX));
        shard.insert_unique(
            hash,
            Kept {
                customer: Customer::new(customer),
                answer,
                expires,
            },
            rehash,
        );
        answer
    }

    /// How many answers are kept (expired ones included until they go).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| read(s).len()).sum()
    }

    /// The hash the subject took of its text when it was made.
    #[inline]
    fn hash(&self, customer: &Subject) -> u64 {
        customer.text_hash()
    }

    /// The shard of `hash`, by its middle bits: the table probes by the
    /// low ones and filters each probe by a tag of the top seven (a shard
    /// picked by the top bits left the tags of one shard one bit to tell
    /// entries apart, and a probe compared names it should have skipped).
    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<HashTable<Kept<V>>> {
        &self.shards[self.shard_index(hash)]
    }

    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
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
        assert_eq!(cache.len(), 128, "two per shard");
        cache.insert(subject(3), 9, Duration::from_secs(60));
        assert_eq!(cache.get(&subject(3)), Some(9), "the newest is kept");
    }

    /// At most `max_entries` answers, however few: none for zero.
    #[test]
    fn fewer_entries_than_shards_are_a_bound_too() {
        for max in [0, 1, 10, 100] {
            let cache = AnswerCache::new(max);
            for n in 0..10_000 {
                cache.insert(subject(n), 1u32, Duration::from_secs(60));
            }
            assert!(cache.len() as u64 <= max, "{} kept of {max}", cache.len());
        }
        let none = AnswerCache::new(0);
        none.insert(subject(0), 1u32, Duration::from_secs(60));
        assert_eq!(none.get(&subject(0)), None);
    }

    /// However few the entries, any customer can be kept (with 64 shards
    /// and room for one, 63 customers in 64 never were).
    #[test]
    fn every_customer_can_be_kept_in_a_small_cache() {
        for max in [1, 3, 10, 63] {
            let cache = AnswerCache::new(max);
            for n in 0..200 {
                cache.insert(subject(n), 1u32, Duration::from_secs(60));
                assert_eq!(
                    cache.get(&subject(n)),
                    Some(1),
                    "customer {n} of a cache of {max}"
                );
            }
        }
    }

    /// A failure keeps an answer fetched meanwhile, unless it expired; a
    /// TTL past the clock's range keeps the answer (no overflow).
    #[test]
    fn a_failure_does_not_replace_a_fresh_answer() {
        let cache = AnswerCache::new(128);
        let ttl = Duration::from_secs(60);
        assert_eq!(cache.keep(subject(0), 7u32, ttl, Over::Any), 7);
        assert_eq!(cache.keep(subject(0), 0, ttl, Over::Expired), 7, "kept");
        assert_eq!(cache.get(&subject(0)), Some(7));
        cache.insert(subject(1), 8u32, Duration::ZERO);
        assert_eq!(
            cache.keep(subject(1), 0, ttl, Over::Expired),
            0,
            "expired: replaced"
        );
        assert_eq!(
            cache.keep(subject(2), 0, ttl, Over::Expired),
            0,
            "none kept"
        );
        cache.insert(subject(3), 9, Duration::MAX);
        assert_eq!(cache.get(&subject(3)), Some(9));
    }

    /// An entry with an answer of up to 8 bytes (the plan source's) is
    /// one cache line.
    #[test]
    fn an_entry_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Kept<u64>>(), 64);
        assert_eq!(std::mem::align_of::<Kept<u64>>(), 64);
    }

    #[test]
    fn long_and_short_names_are_told_apart() {
        let cache = AnswerCache::new(128);
        let short = Subject::new("a".repeat(INLINE)).unwrap();
        let long = Subject::new("a".repeat(INLINE + 1)).unwrap();
        let longer = Subject::new("a".repeat(Subject::MAX_LEN)).unwrap();
        cache.insert(short.clone(), 1u32, Duration::from_secs(60));
        cache.insert(long.clone(), 2u32, Duration::from_secs(60));
        cache.insert(longer.clone(), 3u32, Duration::from_secs(60));
        assert_eq!(cache.get(&short), Some(1));
        assert_eq!(cache.get(&long), Some(2));
        assert_eq!(cache.get(&longer), Some(3));
        assert_eq!(cache.get(&Subject::new("a").unwrap()), None, "a prefix");
        cache.insert(long.clone(), 4u32, Duration::from_secs(60));
        assert_eq!(cache.get(&long), Some(4), "replaced, not added");
        assert_eq!(cache.len(), 3);
    }
}
