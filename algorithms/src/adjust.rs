//! Operators' changes to one layer's state — penalty, reward, block — the
//! reference for every store's [`Store::adjust`](tollgate_limiter::Store::adjust)
//! (the Redis store's Lua code, `lua/layered.lua`'s adjustment modes,
//! gives identical verdicts: `backends/redis/tests/redis/adjust.rs`).

use tollgate_limiter::{
    duration_micros as duration_us, Adjustment, Limit, State, StoreError, Stored, Timestamp,
    Verdict, Verdicts,
};

use crate::layered::{LayerLimit, Layered, Writes};

use crate::builtin;
use crate::{after, decide, ttl_until};

/// One layer adjusted: its verdict for a request of one unit afterwards
/// (nothing charged, as a peek reports it: `remaining` is what the layer
/// holds) and the state to store, if it
/// changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjusted {
    /// The layer's verdict for one unit, after the change.
    pub verdict: Verdict,
    /// The state to store with its TTL; `None`: leave the state as it is.
    pub next: Option<Stored>,
}

/// The verdict of a layer blocked until `until` (µs), at `now`: denied,
/// nothing left, back (full) at `until`.
pub fn blocked(limit: &Limit, until: u64, now: u64) -> Verdict {
    Verdict {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        reset_after: after(until, now),
        retry_after: Some(after(until, now)),
    }
}

/// Apply `adjustment` of `units` (1 ≤ units ≤ capacity; a block ignores
/// them) to one layer's `state` at `now`, as
/// [`Adjustment`](tollgate_limiter::Adjustment) describes:
///
/// - **penalty**: the units a request could take now (its peek's remaining
///   plus one, or none when it denies) bound the charge, which is then an
///   ordinary admitted decision of that many units: saturating at empty,
///   in whole units;
/// - **reward**: each algorithm's refund of a charge that never ages (the
///   token bucket and GCRA move their full-again instant back by the units,
///   never before now; the fixed window counts fewer; the sliding window
///   counts fewer, the current window first; the sliding log drops its
///   newest entries);
/// - **block**: [`State::Blocked`] until `now + duration`, or the later end
///   of a block already there.
///
/// A live block is kept by a penalty or a reward; an expired one counts as
/// no state. A custom algorithm can be penalized and blocked, not rewarded
/// ([`StoreError::Unsupported`]); a block outside 1 ms to 14 days is
/// [`StoreError::InvalidBlock`] ([`Adjustment::check`]).
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Adjustment, Limit, Timestamp};
///
/// let limit = Limit::fixed_window(5, Duration::from_secs(60)).unwrap();
/// let now = Timestamp::from_micros(1_800_000_000_000_000);
/// let penalized = tollgate_algorithms::adjust(&limit, None, now, 3, Adjustment::Penalize).unwrap();
/// assert_eq!(penalized.verdict.remaining, 2, "2 left");
/// let state = penalized.next.unwrap().state;
/// let rewarded = tollgate_algorithms::adjust(&limit, Some(&state), now, 1, Adjustment::Reward).unwrap();
/// assert_eq!(rewarded.verdict.remaining, 3);
/// ```
pub fn adjust(
    limit: &Limit,
    state: Option<&State>,
    now: Timestamp,
    units: u64,
    adjustment: Adjustment,
) -> Result<Adjusted, StoreError> {
    adjustment.check()?;
    let now_us = crate::bounded(now.as_micros());
    let live_block = match state {
        Some(State::Blocked(until)) if *until > now_us => Some(*until),
        _ => None,
    };
    // An expired block is as good as no state.
    let state = match state {
        Some(State::Blocked(_)) => None,
        other => other,
    };
    // The state to write, and the TTL the algorithm gave it (a penalty's).
    let (next, charged_ttl) = match adjustment {
        Adjustment::Block(duration) => {
            let until = now_us
                .saturating_add(duration_us(duration))
                .max(live_block.unwrap_or(0));
            (Some(State::Blocked(until)), None)
        }
        _ if live_block.is_some() => (None, None),
        Adjustment::Penalize => match penalize(limit, state, now, units) {
            Some(stored) => (Some(stored.state), Some(stored.ttl)),
            None => (None, None),
        },
        // A reward that gives nothing back writes nothing.
        Adjustment::Reward => (
            reward(limit, state, now_us, units)?.filter(|n| Some(n) != state),
            None,
        ),
        other => return Err(StoreError::UnsupportedOperation(other.name())),
    };
    let Some(next) = next else {
        return Ok(Adjusted {
            verdict: peek(limit, state_or_block(state, live_block).as_ref(), now),
            next: None,
        });
    };
    let verdict = peek(limit, Some(&next), now);
    let ttl = match &next {
        State::Blocked(until) => ttl_until(*until, now_us),
        // Until the state is as good as none: at most when a request of
        // one unit would have it full again, and never shorter than what
        // the algorithm gave a penalty's charge.
        _ => ttl_until(
            now_us.saturating_add(duration_us(verdict.reset_after)),
            now_us,
        )
        .max(charged_ttl.unwrap_or_default()),
    };
    Ok(Adjusted {
        verdict,
        next: Some(Stored { state: next, ttl }),
    })
}

/// Every layer adjusted (`states[i]` for `layers[i]`, `None` for a key
/// with no live state; the units are each layer's cost): what a store
/// answers and writes for [`Store::adjust`](tollgate_limiter::Store::adjust).
/// `writes` holds one entry per layer (`None`: leave that state as it is).
pub fn adjust_layers<L: LayerLimit>(
    layers: &[L],
    states: &[Option<&State>],
    now: Timestamp,
    adjustment: Adjustment,
) -> Result<Layered, StoreError> {
    let mut verdicts = Verdicts::new();
    let mut writes = Writes::default();
    for (layer, state) in layers.iter().zip(states) {
        let adjusted = adjust(layer.limit(), *state, now, layer.cost(), adjustment)?;
        verdicts.push(adjusted.verdict);
        writes.0.push(adjusted.next);
    }
    Ok(Layered { verdicts, writes })
}

fn state_or_block(state: Option<&State>, block: Option<u64>) -> Option<State> {
    match block {
        Some(until) => Some(State::Blocked(until)),
        None => state.cloned(),
    }
}

/// A request of one unit, judged and not charged.
fn peek(limit: &Limit, state: Option<&State>, now: Timestamp) -> Verdict {
    decide(limit, state, now, 1).verdict.uncharged(1)
}

/// The state after charging what the layer can take of `units`; `None`
/// when it can take nothing.
fn penalize(limit: &Limit, state: Option<&State>, now: Timestamp, units: u64) -> Option<Stored> {
    let probe = decide(limit, state, now, 1).verdict;
    let available = if probe.allowed {
        probe.remaining + 1
    } else {
        0
    };
    let take = units.min(available);
    if take == 0 {
        return None;
    }
    decide(limit, state, now, take).next
}

/// The state after giving `units` back; `None` when nothing changes.
fn reward(
    limit: &Limit,
    state: Option<&State>,
    now: u64,
    units: u64,
) -> Result<Option<State>, StoreError> {
    let Some(state) = state else {
        // No state is a full one.
        return Ok(None);
    };
    builtin::reward(limit, state, now, units)
        .ok_or_else(|| StoreError::Unsupported(limit.algorithm_name()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const T0: u64 = 1_780_000_000_000_000;

    fn limits() -> Vec<Limit> {
        let minute = Duration::from_secs(60);
        vec![
            Limit::token_bucket(5, 5, minute).unwrap(),
            Limit::gcra(5, minute, 5).unwrap(),
            Limit::fixed_window(5, minute).unwrap(),
            Limit::sliding_window(5, minute).unwrap(),
            Limit::sliding_log(5, minute).unwrap(),
        ]
    }

    fn at(us: u64) -> Timestamp {
        Timestamp::from_micros(us)
    }

    /// Penalties saturate at empty, rewards at full, for every algorithm,
    /// and each leaves the count a request then sees.
    #[test]
    fn penalties_and_rewards_move_between_empty_and_full() {
        for limit in limits() {
            let name = limit.algorithm_name();
            let p = adjust(&limit, None, at(T0), 2, Adjustment::Penalize).unwrap();
            assert_eq!(p.verdict.remaining, 3, "{name}: 3 left");
            let s = p.next.unwrap().state;
            let p = adjust(&limit, Some(&s), at(T0), 5, Adjustment::Penalize).unwrap();
            assert!(!p.verdict.allowed, "{name}: saturated at empty");
            let empty = p.next.unwrap().state;
            let again = adjust(&limit, Some(&empty), at(T0), 1, Adjustment::Penalize).unwrap();
            assert_eq!(again.next, None, "{name}: nothing more to take");
            let r = adjust(&limit, Some(&empty), at(T0), 2, Adjustment::Reward).unwrap();
            assert_eq!(r.verdict.remaining, 2, "{name}: 2 back");
            let s = r.next.unwrap().state;
            let r = adjust(&limit, Some(&s), at(T0), 5, Adjustment::Reward).unwrap();
            assert_eq!(r.verdict.remaining, 5, "{name}: full, never above");
            assert!(r.next.unwrap().ttl >= Duration::from_millis(1));
            let none = adjust(&limit, None, at(T0), 1, Adjustment::Reward).unwrap();
            assert_eq!(none.next, None, "{name}: no state is full");
        }
    }

    /// A block denies until its end exactly, whatever the algorithm, is
    /// never shortened, survives penalties and rewards, and ends full.
    #[test]
    fn a_block_denies_until_its_end_then_starts_full() {
        let ten = Duration::from_secs(600);
        for limit in limits() {
            let name = limit.algorithm_name();
            let b = adjust(&limit, None, at(T0), 1, Adjustment::Block(ten)).unwrap();
            assert_eq!(b.verdict.retry_after, Some(ten), "{name}");
            let stored = b.next.unwrap();
            assert_eq!(stored.ttl, ten, "{name}: the TTL covers the block");
            let s = stored.state;
            let shorter = adjust(
                &limit,
                Some(&s),
                at(T0),
                1,
                Adjustment::Block(Duration::from_secs(1)),
            )
            .unwrap();
            assert_eq!(
                shorter.verdict.retry_after,
                Some(ten),
                "{name}: never shortened"
            );
            for kind in [Adjustment::Penalize, Adjustment::Reward] {
                let kept = adjust(&limit, Some(&s), at(T0 + 1), 1, kind).unwrap();
                assert_eq!(kept.next, None, "{name}: {kind:?} keeps the block");
                assert!(!kept.verdict.allowed);
            }
            let just_before = decide(&limit, Some(&s), at(T0 + 599_999_999), 1);
            assert_eq!(
                just_before.verdict.retry_after,
                Some(Duration::from_micros(1)),
                "{name}"
            );
            let after_block = decide(&limit, Some(&s), at(T0 + 600_000_000), 1);
            assert!(after_block.verdict.allowed, "{name}");
            assert_eq!(after_block.verdict.remaining, 4, "{name}: full again");
        }
    }
}
