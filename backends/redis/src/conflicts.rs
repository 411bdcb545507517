//! Naming the layer whose key holds data Tollgate did not write.
//!
//! The script reports a value it cannot read as `TOLLGATE_CONFLICT <i>`; a
//! key of another type fails the script's first read with Redis's own
//! `WRONGTYPE` (the script does not catch errors: `pcall` would cost every
//! call), which does not say which key. Then, and only then, the store asks
//! `TYPE` of each key of the call to name it.

use redis::aio::ConnectionLike;
use tollgate_limiter::{LayerRequest, Layout, StoreError};

use crate::error::from_redis;
use crate::settings::CheckedSettings;

/// What `from_redis` makes of `WRONGTYPE`: a conflict not yet located (the
/// empty policy name).
pub(crate) fn unlocated() -> StoreError {
    StoreError::Conflict {
        policy: String::new(),
        found: "wrong type".to_string(),
    }
}

/// Whether `e` is a conflict the script could not locate.
pub(crate) fn is_unlocated(e: &StoreError) -> bool {
    matches!(e, StoreError::Conflict { policy, .. } if policy.is_empty())
}

/// The Redis types a layer's state may have: a list for the sliding log,
/// a string or a list for a concurrency limit's holders (text while they
/// are few), a string otherwise.
fn expected_types(layer: &LayerRequest<'_>) -> &'static [&'static str] {
    match layer.policy.limit().layout() {
        Some(Layout::Log) => &["list"],
        Some(Layout::LogText) => &["string", "list"],
        _ => &["string"],
    }
}

/// The conflict naming the first of `layers` whose key (as `checked`
/// renders it) holds another type; a protocol error if none does any more
/// (the key changed again meanwhile). Keys are rendered again here: this
/// runs only after a `WRONGTYPE`.
pub(crate) async fn locate<C: ConnectionLike + Send>(
    con: &mut C,
    layers: &[LayerRequest<'_>],
    checked: &CheckedSettings,
) -> StoreError {
    for layer in layers {
        let kind: String = match redis::cmd("TYPE")
            .arg(checked.key_arg(&layer.key))
            .query_async(con)
            .await
        {
            Ok(kind) => kind,
            Err(e) => return from_redis(e),
        };
        if kind != "none" && !expected_types(layer).contains(&kind.as_str()) {
            return StoreError::Conflict {
                policy: layer.policy.name().to_string(),
                found: "wrong type".to_string(),
            };
        }
    }
    StoreError::Protocol(
        "WRONGTYPE from the script, but no key of the call holds another type now".to_string(),
    )
}
