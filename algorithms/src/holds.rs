//! What a store does with concurrency holds, over a request's layers:
//! the holds an admitted decision wrote, their release and their renewal
//! (each layer's rule: `concurrency.rs`).

use tollgate_limiter::{Hold, Holds, Limit, State, Stored, Timestamp, Verdicts};

use crate::concurrency::renew;
use crate::layered::{LayerLimit, Layered, Writes};
use crate::refund::{refund, Charge};
use crate::ttl_until;

/// Each layer's hold after `layered` (a decision of `layers`): for an
/// admitted request, the [`Hold`] of each concurrency layer, read from the
/// state it writes; `None` for every other layer and for a denial.
pub fn holds_of<L: LayerLimit>(layers: &[L], layered: &Layered) -> Holds {
    layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let written = layered.writes.get(i).and_then(Option::as_ref)?;
            hold_of(l.limit(), written, l.cost())
        })
        .collect()
}

/// The hold a concurrency layer's admitted decision wrote as `written`.
pub fn hold_of(limit: &Limit, written: &Stored, cost: u64) -> Option<Hold> {
    if !matches!(limit, Limit::Concurrency(_)) {
        return None;
    }
    let charge = Charge::of(limit, &written.state, cost)?;
    Some(Hold {
        cost,
        at: charge.at,
    })
}

/// The writes that release each layer's hold (`holds[i]` for `layers[i]`,
/// `states[i]` its live state; see [`release`]). The verdicts are empty
/// (a release answers none).
pub fn release_layers<L: LayerLimit>(
    layers: &[L],
    states: &[Option<&State>],
    now: Timestamp,
    holds: &[Hold],
) -> Layered {
    let writes = layers
        .iter()
        .zip(states)
        .zip(holds)
        .map(|((l, state), hold)| release(l.limit(), *state, now.as_micros(), *hold))
        .collect();
    Layered {
        verdicts: Verdicts::new(),
        writes: Writes(writes),
    }
}

/// What releasing `hold` from a concurrency layer's `state` writes at
/// `now` (µs): the hold's entries removed, the state living until its
/// newest entry's lease ends (an empty log: the key removed). `None` when
/// nothing is to be written: the hold was lost, or `limit` is no
/// concurrency limit.
///
/// ```
/// use std::collections::VecDeque;
/// use std::time::Duration;
/// use tollgate_algorithms::release;
/// use tollgate_limiter::{Hold, Limit, State};
/// let limit = Limit::concurrency(5, Duration::from_secs(30)).unwrap();
/// let t = 1_800_000_000_000_000;
/// let state = State::Log(VecDeque::from([t, t + 1]));
/// let released = release(&limit, Some(&state), t + 2, Hold { cost: 1, at: t }).unwrap();
/// assert_eq!(released.state, State::Log(VecDeque::from([t + 1])));
/// assert_eq!(released.ttl, Duration::from_secs(30)); // ms, rounded up
/// assert_eq!(release(&limit, Some(&state), t + 2, Hold { cost: 1, at: t + 9 }), None);
/// ```
pub fn release(limit: &Limit, state: Option<&State>, now: u64, hold: Hold) -> Option<Stored> {
    let Limit::Concurrency(p) = limit else {
        return None;
    };
    let charge = Charge {
        cost: hold.cost,
        at: hold.at,
        mark: 0,
    };
    let next = refund(limit, state, now, charge).next?;
    let newest = match &next {
        State::Log(entries) => entries.back().copied().unwrap_or(0),
        _ => 0,
    };
    Some(Stored {
        state: next,
        ttl: ttl_until(newest.saturating_add(p.lease_us()), now),
    })
}

/// The writes that renew each layer's hold (see [`renew`]), and each hold
/// as it now is (`None`: lost). The verdicts are empty.
pub fn renew_layers<L: LayerLimit>(
    layers: &[L],
    states: &[Option<&State>],
    now: Timestamp,
    holds: &[Hold],
) -> (Layered, Holds) {
    let mut renewed = Holds::new();
    let writes = layers
        .iter()
        .zip(states)
        .zip(holds)
        .map(|((l, state), hold)| {
            let charge = Charge {
                cost: hold.cost,
                at: hold.at,
                mark: 0,
            };
            let renewal = renew(l.limit(), *state, now.as_micros(), charge);
            renewed.push((renewal.at != 0).then_some(Hold {
                cost: hold.cost,
                at: renewal.at,
            }));
            renewal.next
        })
        .collect();
    let layered = Layered {
        verdicts: Verdicts::new(),
        writes: Writes(writes),
    };
    (layered, renewed)
}
