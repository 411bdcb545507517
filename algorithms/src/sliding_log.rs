//! Sliding log: one timestamp per admitted unit, kept for one window.

use std::collections::VecDeque;
use std::time::Duration;

use tollgate_limiter::{Limit, SlidingLog, State, Stored, Transition, Verdict, Window};

use crate::builtin::Reference;
use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// Sliding log over a non-decreasing list of timestamps.
///
/// An entry counts while it lies in `(t − W, t]`, `t = max(now, newest)`. A
/// request of `cost` passes when `entries + cost ≤ limit` and then adds `cost`
/// entries at `t`. Because `t` never decreases, the list stays sorted and a
/// store can keep it as a plain list. The rule itself is
/// [`sliding_log_step`]'s; this gives its step as the next log.
pub fn sliding_log(p: &Window, state: Option<&VecDeque<u64>>, now: u64, cost: u64) -> Transition {
    let empty = VecDeque::new();
    let entries = state.unwrap_or(&empty);
    let step = sliding_log_step(p, entries, now, cost);
    Transition {
        verdict: step.verdict,
        next: step.append.map(|append| {
            let mut next: VecDeque<u64> = entries.range(append.drop..).copied().collect();
            next.extend(std::iter::repeat_n(append.stamp, append.push as usize));
            Stored {
                state: State::Log(next),
                ttl: append.ttl,
            }
        }),
    }
}

/// A sorted log as [`sliding_log_step`] reads it: its length and its
/// entries by index, oldest first. A decision reads the newest entry and
/// O(log d) of the oldest (d: the entries that aged out), so a store whose
/// every read costs (a Redis list read from inside the server) answers
/// only the entries asked for.
pub trait LogView {
    /// The entries.
    fn len(&self) -> usize;
    /// Entry `i` (`i < len()`), oldest first.
    fn at(&self, i: usize) -> u64;
    /// No entries.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LogView for VecDeque<u64> {
    #[inline]
    fn len(&self) -> usize {
        VecDeque::len(self)
    }
    #[inline]
    fn at(&self, i: usize) -> u64 {
        self[i]
    }
}

/// What an admitted sliding-log decision does to its log: the oldest
/// `drop` entries go, `push` copies of `stamp` are appended, and the log
/// lives `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogAppend {
    /// The oldest entries to drop (they have aged out).
    pub drop: usize,
    /// The time appended.
    pub stamp: u64,
    /// How many times (the cost).
    pub push: u64,
    /// The log's TTL afterwards.
    pub ttl: Duration,
}

impl LogAppend {
    /// The charge this edit makes (what a `reserve` answers and a refund
    /// takes back): the time of the entries it appends, as
    /// `log_charge_marks` reads it from the next log's newest entry.
    pub fn charge(&self) -> Charge {
        Charge {
            cost: self.push,
            at: self.stamp,
            mark: 0,
        }
    }
}

/// The window over which `limit` decides as a sliding log: the sliding
/// log's own, a concurrency limit's lease (its holders are a sliding
/// log's entries); `None` for every other algorithm.
pub fn log_window(limit: &Limit) -> Option<&Window> {
    match limit {
        Limit::SlidingLog(p) => Some(p),
        Limit::Concurrency(p) => Some(p.as_window()),
        _ => None,
    }
}

/// A sliding-log decision: its verdict and, when admitted, its edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStep {
    /// The answer.
    pub verdict: Verdict,
    /// The log's edit (admitted only).
    pub append: Option<LogAppend>,
}

/// The sliding log's rule (see [`sliding_log`]) on any [`LogView`],
/// answered as the edit of the log rather than the next log.
///
/// ```
/// use std::collections::VecDeque;
/// use std::time::Duration;
/// use tollgate_algorithms::sliding_log_step;
/// use tollgate_limiter::SlidingLog;
/// let p = SlidingLog::new(3, Duration::from_secs(1)).unwrap();
/// let t = 1_800_000_000_000_000;
/// let log = VecDeque::from([t, t + 600_000]);
/// let step = sliding_log_step(&p, &log, t + 1_000_000, 1);
/// // The first entry aged out: it goes, and one entry is appended.
/// let append = step.append.unwrap();
/// assert_eq!((append.drop, append.stamp, append.push), (1, t + 1_000_000, 1));
/// assert_eq!(step.verdict.remaining, 1);
/// ```
pub fn sliding_log_step(p: &Window, log: &impl LogView, now: u64, cost: u64) -> LogStep {
    let now = crate::bounded(now);
    let (w, limit) = (p.window_us(), p.limit());
    let n = log.len();
    let newest = (n > 0).then(|| log.at(n - 1));
    let t = newest.map_or(now, |newest| now.max(newest));
    // Entries at or before t - W have aged out.
    let first_live = partition_point(log, |ts| ts.saturating_add(w) <= t);
    let live = (n - first_live) as u64;
    if live + cost <= limit {
        let reset_at = t.saturating_add(w);
        return LogStep {
            verdict: Verdict {
                allowed: true,
                limit,
                remaining: limit - (live + cost),
                reset_after: after(reset_at, now),
                retry_after: None,
            },
            append: Some(LogAppend {
                drop: first_live,
                stamp: t,
                push: cost,
                ttl: ttl_until(reset_at, now),
            }),
        };
    }
    // The k-th oldest live entry must age out, k = live + cost - limit.
    let k = live + cost - limit;
    let retry_at = log.at(first_live + k as usize - 1).saturating_add(w);
    let reset_at = newest.map_or(t, |newest| newest.saturating_add(w));
    LogStep {
        verdict: Verdict {
            allowed: false,
            limit,
            remaining: limit.saturating_sub(live),
            reset_after: after(reset_at, now),
            retry_after: Some(after(retry_at, now)),
        },
        append: None,
    }
}

/// The number of leading entries of `log` for which `pred` holds (it
/// holds for a prefix: the log is sorted). The search gallops from the
/// oldest end (entries 0, 1, 3, 7, …), then bisects: O(log p) reads for
/// a prefix of p, all near that end. In a log in use the entries that
/// have aged out are a few of the oldest, and a Redis list reads an
/// entry in time proportional to its distance from the nearer end.
fn partition_point(log: &impl LogView, pred: impl Fn(u64) -> bool) -> usize {
    let n = log.len();
    // `pred` holds for entries below `lo`; it fails at `hi - 1` unless
    // `hi > n`.
    let (mut lo, mut hi) = (0, 1);
    while hi <= n && pred(log.at(hi - 1)) {
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    let mut hi = (hi - 1).min(n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(log.at(mid)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Up to `cost` entries equal to `at`, newest first (`LREM key -cost at`).
pub fn sliding_log_refund(entries: &VecDeque<u64>, c: Charge) -> Refund {
    let mut next = entries.clone();
    let mut given = 0;
    let mut i = next.len();
    while i > 0 && given < c.cost {
        i -= 1;
        if next[i] == c.at {
            next.remove(i);
            given += 1;
        }
    }
    if given == 0 {
        return Refund::NOTHING;
    }
    Refund {
        given,
        next: Some(State::Log(next)),
    }
}

impl Reference for SlidingLog {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        let log = match state {
            Some(State::Log(entries)) => Some(entries),
            _ => None,
        };
        sliding_log(self, log, now, cost)
    }
    fn refund(&self, state: &State, _now: u64, charge: Charge) -> Refund {
        match state {
            State::Log(entries) => sliding_log_refund(entries, charge),
            _ => Refund::NOTHING,
        }
    }
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        log_charge_marks(next)
    }
    fn reward(&self, state: &State, _now: u64, units: u64) -> Option<State> {
        log_reward(state, units)
    }
}

/// A log's charge: the time of its newest entries (those it appended).
pub(crate) fn log_charge_marks(next: &State) -> Option<(u64, u64)> {
    match next {
        State::Log(entries) => Some((*entries.back()?, 0)),
        _ => None,
    }
}

/// A log's reward: its newest `units` entries go.
pub(crate) fn log_reward(state: &State, units: u64) -> Option<State> {
    let State::Log(entries) = state else {
        return None;
    };
    let keep = entries.len().saturating_sub(units as usize);
    (keep < entries.len())
        .then(|| State::Log(entries.range(..keep).copied().collect::<VecDeque<u64>>()))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A log that counts the entries read.
    struct Counted {
        entries: VecDeque<u64>,
        reads: Cell<usize>,
    }

    impl LogView for Counted {
        fn len(&self) -> usize {
            self.entries.len()
        }
        fn at(&self, i: usize) -> u64 {
            self.reads.set(self.reads.get() + 1);
            self.entries[i]
        }
    }

    /// A decision reads the newest entry and a binary search's, however
    /// long the log, admitted or denied, and decides as on the whole log.
    #[test]
    fn a_step_reads_a_logarithmic_number_of_entries() {
        let t = 1_800_000_000_000_000;
        let p = SlidingLog::new(10_000, Duration::from_secs(10)).unwrap();
        // 10,000 entries 1 ms apart: the oldest 3,000 have aged out at
        // t + 10 s + 3 s.
        let log = Counted {
            entries: (0..10_000).map(|i| t + i * 1_000).collect(),
            reads: Cell::new(0),
        };
        let now = t + 13_000_000;
        for cost in [1, 3_001, 5_000] {
            log.reads.set(0);
            let step = sliding_log_step(&p, &log, now, cost);
            // The newest, 13 gallops and 11 halvings for the 3,001 aged
            // out, one for a denial's retry.
            assert!(log.reads.get() <= 26, "{cost}: {} reads", log.reads.get());
            let whole = sliding_log(&p, Some(&log.entries), now, cost);
            assert_eq!(step.verdict, whole.verdict, "{cost}");
            assert_eq!(step.append.is_some(), whole.next.is_some());
            if let Some(append) = step.append {
                assert_eq!((append.drop, append.stamp, append.push), (3_001, now, cost));
            }
        }
        // One entry aged out: the newest, entries 0 and 1.
        log.reads.set(0);
        let step = sliding_log_step(&p, &log, t + 10_000_000, 1);
        assert_eq!(step.append.map(|a| a.drop), Some(1));
        assert_eq!(log.reads.get(), 3);
        // None aged out, the log full: the newest, the oldest, and the
        // oldest again for the denial's retry.
        log.reads.set(0);
        let step = sliding_log_step(&p, &log, t + 9_000_000, 1);
        assert!(!step.verdict.allowed);
        assert_eq!(log.reads.get(), 3);
    }

    /// The galloping search finds every partition point of every short
    /// log.
    #[test]
    fn the_search_finds_every_prefix() {
        for n in 0..70u64 {
            let log: VecDeque<u64> = (0..n).collect();
            for p in 0..=n {
                assert_eq!(partition_point(&log, |e| e < p), p as usize, "{n} {p}");
            }
        }
    }
}
