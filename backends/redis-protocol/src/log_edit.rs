//! The list commands that turn one stored sliding log into another.

use std::collections::VecDeque;

/// How to turn the list holding one log into the list holding the next:
/// a decision drops its oldest entries and appends the newest time; a
/// reward drops the newest entries; a concurrency limit's release removes
/// the entries of one time. Anything else is written whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEdit {
    /// The list is already the next log.
    Keep,
    /// The next log is empty: remove the key.
    Delete,
    /// `LTRIM key drop -1` (when `drop > 0`), then `push` copies of
    /// `stamp` appended (`RPUSH`, in chunks).
    Append {
        /// The oldest entries to drop.
        drop: usize,
        /// The time appended.
        stamp: u64,
        /// How many times.
        push: usize,
    },
    /// `LTRIM key 0 keep-1`: only the oldest `keep` entries stay.
    Truncate {
        /// The entries kept.
        keep: usize,
    },
    /// `LREM key -count value`: `count` entries of the time `value` go
    /// (they are next to one another, and alike: which of them go makes
    /// no difference).
    Remove {
        /// The time removed.
        value: u64,
        /// How many of its entries.
        count: usize,
    },
    /// `DEL key`, then every entry of the next log appended.
    Replace,
}

impl LogEdit {
    /// The edit turning the list `before` into `after` (both oldest
    /// first).
    ///
    /// ```
    /// use std::collections::VecDeque;
    /// use tollgate_redis_protocol::LogEdit;
    /// let before = VecDeque::from([1, 2, 3]);
    /// let after = VecDeque::from([2, 3, 9, 9]);
    /// assert_eq!(LogEdit::between(&before, &after), LogEdit::Append { drop: 1, stamp: 9, push: 2 });
    /// assert_eq!(LogEdit::between(&before, &VecDeque::from([1])), LogEdit::Truncate { keep: 1 });
    /// ```
    pub fn between(before: &VecDeque<u64>, after: &VecDeque<u64>) -> LogEdit {
        if after.is_empty() {
            return if before.is_empty() {
                LogEdit::Keep
            } else {
                LogEdit::Delete
            };
        }
        if after.len() <= before.len() && after.iter().eq(before.range(..after.len())) {
            return match after.len() == before.len() {
                true => LogEdit::Keep,
                false => LogEdit::Truncate { keep: after.len() },
            };
        }
        append(before, after)
            .or_else(|| remove(before, after))
            .unwrap_or(LogEdit::Replace)
    }

    /// This edit applied to `before` (what Redis does with its commands).
    pub fn apply(&self, before: &VecDeque<u64>, after: &VecDeque<u64>) -> VecDeque<u64> {
        match *self {
            LogEdit::Keep => before.clone(),
            LogEdit::Delete => VecDeque::new(),
            LogEdit::Append { drop, stamp, push } => {
                let mut next: VecDeque<u64> = before.iter().skip(drop).copied().collect();
                next.extend(std::iter::repeat_n(stamp, push));
                next
            }
            LogEdit::Truncate { keep } => before.iter().take(keep).copied().collect(),
            LogEdit::Remove { value, count } => {
                let mut left = count;
                let mut next: VecDeque<u64> = VecDeque::with_capacity(before.len());
                for &t in before.iter().rev() {
                    if t == value && left > 0 {
                        left -= 1;
                    } else {
                        next.push_front(t);
                    }
                }
                next
            }
            LogEdit::Replace => after.clone(),
        }
    }
}

/// `after` as the end of `before` followed by copies of its newest time,
/// if it is that. The kept part ends with every copy of that time
/// `before` has, unless nothing older is kept.
fn append(before: &VecDeque<u64>, after: &VecDeque<u64>) -> Option<LogEdit> {
    let stamp = *after.back()?;
    let trailing = |log: &VecDeque<u64>| log.iter().rev().take_while(|&&t| t == stamp).count();
    let (in_after, in_before) = (trailing(after), trailing(before));
    let older = after.len() - in_after;
    if older == 0 {
        // Only copies of the stamp: keep up to as many as there are.
        let kept = in_before.min(in_after);
        return Some(LogEdit::Append {
            drop: before.len() - kept,
            stamp,
            push: in_after - kept,
        });
    }
    let drop = before.len().checked_sub(in_before + older)?;
    let same = before.range(drop..drop + older).eq(after.range(..older));
    (same && in_before <= in_after).then(|| LogEdit::Append {
        drop,
        stamp,
        push: in_after - in_before,
    })
}

/// `after` as `before` without some entries of one time, if it is that.
fn remove(before: &VecDeque<u64>, after: &VecDeque<u64>) -> Option<LogEdit> {
    let count = before.len().checked_sub(after.len()).filter(|&c| c > 0)?;
    let at = before.iter().zip(after).take_while(|(b, a)| b == a).count();
    let value = *before.get(at)?;
    let removed = before.range(at..at + count).all(|&t| t == value);
    let rest = before.range(at + count..).eq(after.range(at..));
    // `LREM` takes the newest copies: none may come later (a sorted log
    // has none).
    let last = !before.range(at + count..).any(|&t| t == value);
    (removed && rest && last).then_some(LogEdit::Remove { value, count })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sorted(mut v: Vec<u64>) -> VecDeque<u64> {
        v.sort_unstable();
        v.into()
    }

    /// A list with the removed time later too (foreign: out of order) is
    /// written whole: `LREM` would take the later copy.
    #[test]
    fn a_removal_with_a_later_copy_is_a_rewrite() {
        let before = VecDeque::from([2, 1, 3, 1, 4]);
        let after = VecDeque::from([2, 3, 1, 4]);
        assert_eq!(LogEdit::between(&before, &after), LogEdit::Replace);
    }

    proptest! {
        /// A decision's next log (oldest dropped, copies of a newer time
        /// appended) and a reward's (newest dropped) are edits, not
        /// rewrites; every edit gives exactly the next log.
        #[test]
        fn edits_give_the_next_log(
            before in prop::collection::vec(0u64..6, 0..12),
            drop in 0usize..14,
            push in 0usize..5,
            ahead in 0u64..2,
            cut in 0usize..14,
        ) {
            let before = sorted(before);
            let stamp = before.back().copied().unwrap_or(0) + ahead;
            let mut decided: VecDeque<u64> = before.iter().skip(drop).copied().collect();
            decided.extend(std::iter::repeat_n(stamp, push));
            let edit = LogEdit::between(&before, &decided);
            prop_assert_ne!(&edit, &LogEdit::Replace);
            prop_assert_eq!(edit.apply(&before, &decided), decided);
            let rewarded: VecDeque<u64> = before.iter().take(before.len().saturating_sub(cut)).copied().collect();
            let edit = LogEdit::between(&before, &rewarded);
            prop_assert_ne!(&edit, &LogEdit::Replace);
            prop_assert_eq!(edit.apply(&before, &rewarded), rewarded);
            // A release: some entries of one time go, wherever they are.
            if let Some(&value) = before.get(cut % before.len().max(1)) {
                let mut released = before.clone();
                for _ in 0..push.max(1) {
                    if let Some(i) = released.iter().position(|&t| t == value) {
                        released.remove(i);
                    }
                }
                let edit = LogEdit::between(&before, &released);
                prop_assert_ne!(&edit, &LogEdit::Replace);
                prop_assert_eq!(edit.apply(&before, &released), released);
            }
        }

        /// Any two lists, sorted or not (a foreign one): the edit gives
        /// the next.
        #[test]
        fn any_list_is_reached(
            before in prop::collection::vec(0u64..4, 0..10),
            after in prop::collection::vec(0u64..4, 0..10),
        ) {
            let (before, after): (VecDeque<u64>, VecDeque<u64>) = (before.into(), after.into());
            prop_assert_eq!(LogEdit::between(&before, &after).apply(&before, &after), after);
        }

        /// Any two logs: the edit (a rewrite at worst) gives the next.
        #[test]
        fn any_log_is_reached(
            before in prop::collection::vec(0u64..6, 0..10),
            after in prop::collection::vec(0u64..6, 0..10),
        ) {
            let (before, after) = (sorted(before), sorted(after));
            prop_assert_eq!(LogEdit::between(&before, &after).apply(&before, &after), after);
        }
    }
}
