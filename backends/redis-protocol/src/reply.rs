//! What a call answers: five integers per layer, in key order —
//! allowed (1/0), limit, remaining, reset_after µs, retry_after µs (−1
//! when the layer admits). A reservation appends two per layer (the
//! charge's `at` and `mark`); a refund answers one per layer (what it gave
//! back).

use std::time::Duration;

use tollgate_limiter::{Hold, Holds, StoreError, Verdict, Verdicts};

/// Integers per layer in a decision's reply.
pub const REPLY_FIELDS: usize = 5;
/// Integers per layer in a reservation's reply: the verdict's, then the
/// charge's `at` and `mark`.
pub const RESERVE_FIELDS: usize = REPLY_FIELDS + 2;

/// A verdict as the reply's five integers.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::Verdict;
/// let v = Verdict { allowed: true, limit: 10, remaining: 9, reset_after: Duration::from_micros(100), retry_after: None };
/// assert_eq!(tollgate_redis_protocol::verdict_fields(&v), [1, 10, 9, 100, -1]);
/// ```
pub fn verdict_fields(v: &Verdict) -> [i64; REPLY_FIELDS] {
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    [
        i64::from(v.allowed),
        i64::try_from(v.limit).unwrap_or(i64::MAX),
        i64::try_from(v.remaining).unwrap_or(i64::MAX),
        micros(v.reset_after),
        v.retry_after.map_or(-1, micros),
    ]
}

/// One verdict per layer from a reply of [`REPLY_FIELDS`] integers per
/// layer; a reply of another shape, or one admitting a layer with a time
/// to retry at, is a [`StoreError::Protocol`].
pub fn parse_reply(reply: &[i64], layers: usize) -> Result<Verdicts, StoreError> {
    if reply.len() != layers * REPLY_FIELDS {
        return Err(StoreError::Protocol(format!(
            "the script answered {} integers for {layers} layers",
            reply.len()
        )));
    }
    reply.chunks_exact(REPLY_FIELDS).map(verdict).collect()
}

/// The verdict of one layer's five integers.
fn verdict(r: &[i64]) -> Result<Verdict, StoreError> {
    let unsigned = |v: i64, what: &str| {
        u64::try_from(v)
            .map_err(|_| StoreError::Protocol(format!("the script answered {what} = {v}")))
    };
    let allowed = match r[0] {
        0 => false,
        1 => true,
        other => {
            return Err(StoreError::Protocol(format!(
                "the script answered allowed = {other}"
            )))
        }
    };
    let retry_after = match r[4] {
        -1 => None,
        // An admitted layer has no time to retry at: a reply saying both
        // is not understood, and never admits.
        v if allowed => {
            return Err(StoreError::Protocol(format!(
                "the script answered allowed = 1 with retry_after = {v}"
            )))
        }
        v => Some(Duration::from_micros(unsigned(v, "retry_after")?)),
    };
    Ok(Verdict {
        allowed,
        limit: unsigned(r[1], "limit")?,
        remaining: unsigned(r[2], "remaining")?,
        reset_after: Duration::from_micros(unsigned(r[3], "reset_after")?),
        retry_after,
    })
}

/// What a `reserve` call charged one layer: the `at` and `mark` of its
/// charge (`tollgate_algorithms::Charge` says what each holds per
/// algorithm); `(0, 0)` for a layer not charged.
pub type Charged = (u64, u64);

/// The verdicts and charges of a `reserve` reply ([`RESERVE_FIELDS`]
/// integers per layer); a reply of another shape is a
/// [`StoreError::Protocol`].
pub fn parse_reserve(reply: &[i64], layers: usize) -> Result<(Verdicts, Vec<Charged>), StoreError> {
    if reply.len() != layers * RESERVE_FIELDS {
        return Err(StoreError::Protocol(format!(
            "the script answered {} integers for {layers} reserved layers",
            reply.len()
        )));
    }
    let mut verdict_fields = Vec::with_capacity(layers * REPLY_FIELDS);
    let mut charges = Vec::with_capacity(layers);
    for chunk in reply.chunks_exact(RESERVE_FIELDS) {
        verdict_fields.extend_from_slice(&chunk[..REPLY_FIELDS]);
        charges.push((
            unsigned_charge(chunk[REPLY_FIELDS])?,
            unsigned_charge(chunk[REPLY_FIELDS + 1])?,
        ));
    }
    Ok((parse_reply(&verdict_fields, layers)?, charges))
}

/// The holds of a `renew` reply (one integer per layer: the hold's new
/// `at`, 0 when it was lost), for holds of `costs`.
pub fn parse_renewed(reply: &[i64], costs: &[u64]) -> Result<Holds, StoreError> {
    if reply.len() != costs.len() {
        return Err(StoreError::Protocol(format!(
            "the script answered {} integers for {} renewed holds",
            reply.len(),
            costs.len()
        )));
    }
    reply
        .iter()
        .zip(costs)
        .map(|(&at, &cost)| {
            let at = unsigned_charge(at)?;
            Ok((at != 0).then_some(Hold { cost, at }))
        })
        .collect()
}

fn unsigned_charge(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v)
        .map_err(|_| StoreError::Protocol(format!("the script answered a charge of {v}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_bad_replies_are_protocol_errors() {
        let v = parse_reply(&[1, 10, 9, 100_000, -1, 0, 3, 0, 5, 7], 2).unwrap();
        assert!(v[0].allowed && v[0].retry_after.is_none());
        assert_eq!(v[1].retry_after, Some(Duration::from_micros(7)));
        assert_eq!(verdict_fields(&v[1]), [0, 3, 0, 5, 7]);
        assert!(matches!(
            parse_reply(&[1, 2, 3], 1),
            Err(StoreError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(&[1, 10, 9, 5, 7], 1),
            Err(StoreError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(&[2, 1, 1, 1, -1], 1),
            Err(StoreError::Protocol(_))
        ));
    }
}
