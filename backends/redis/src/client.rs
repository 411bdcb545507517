//! Opening redis-rs clients from a store's URL and settings (TLS when the
//! `tls` feature is on), and naming what went wrong at connect.

use redis::{Client, ConnectionInfo, IntoConnectionInfo, RedisError};
use tollgate_limiter::StoreError;

use crate::error::{from_redis, RedisStoreError};
use crate::settings::Settings;

/// A client for one server at `url`.
pub(crate) fn open(url: &str, settings: &Settings) -> Result<Client, StoreError> {
    let info = connection_info(url, settings)?;
    open_info(info, settings)
}

/// The parsed URL, checked against the TLS settings. The parser's message
/// does not repeat the URL (it may hold a password).
pub(crate) fn connection_info(
    url: &str,
    settings: &Settings,
) -> Result<ConnectionInfo, StoreError> {
    let tls_url = url.starts_with("rediss://");
    if tls_url && !cfg!(feature = "tls") {
        return Err(RedisStoreError::InvalidUrl(
            "rediss:// URLs need TLS: enable the `tls` feature of tollgate-redis (`redis-tls` of tollgate)".into(),
        )
        .into());
    }
    #[cfg(feature = "tls")]
    if settings.tls.is_some() && !tls_url {
        return Err(RedisStoreError::InvalidUrl(
            "TLS settings were given for a redis:// URL: write rediss:// to connect with TLS"
                .into(),
        )
        .into());
    }
    let _ = settings;
    url.into_connection_info()
        .map_err(|e| RedisStoreError::InvalidUrl(e.to_string()).into())
}

/// A client for `info`, with the store's certificates where it has any.
pub(crate) fn open_info(info: ConnectionInfo, settings: &Settings) -> Result<Client, StoreError> {
    #[cfg(feature = "tls")]
    if let Some(tls) = &settings.tls {
        return Client::build_with_tls(info, tls.certificates())
            .map_err(|e| RedisStoreError::Tls(e.to_string()).into());
    }
    let _ = settings;
    Client::open(info).map_err(|e| RedisStoreError::InvalidUrl(e.to_string()).into())
}

/// An error met while connecting or loading, with the two causes a user
/// must fix named: a TLS handshake that failed, a missing ACL permission.
/// Everything else is as in a decision.
pub(crate) fn connect_error(e: RedisError) -> StoreError {
    if is_tls_failure(&e) {
        return RedisStoreError::Tls(e.to_string()).into();
    }
    if is_no_permission(&e) {
        return RedisStoreError::NoPermission(e.to_string()).into();
    }
    from_redis(e)
}

/// A refused command or key (`NOPERM`).
pub(crate) fn is_no_permission(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    ) || e.code() == Some("NOPERM")
}

/// rustls reports a certificate it cannot verify, or an alert from the
/// server (a client certificate missing or refused), as an I/O error.
fn is_tls_failure(e: &RedisError) -> bool {
    let text = e.to_string();
    e.is_io_error()
        && [
            "certificate",
            "Certificate",
            "alert",
            "TLS",
            "tls handshake",
        ]
        .iter()
        .any(|w| text.contains(w))
}
