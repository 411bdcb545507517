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

/// Whether `url` asks for TLS: `rediss://` or `valkeys://`, in any case
/// (as the URL parser reads them).
pub(crate) fn is_tls_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
}

/// How `info` connects: with TLS or not, and with TLS whether without
/// verifying the server's name (`#insecure`).
pub(crate) fn tls_mode(info: &ConnectionInfo) -> (bool, bool) {
    match info.addr() {
        #[cfg(feature = "tls")]
        redis::ConnectionAddr::TcpTls { insecure, .. } => (true, *insecure),
        _ => (false, false),
    }
}

/// The parsed URL, checked against the TLS settings. The parser's message
/// does not repeat the URL (it may hold a password).
pub(crate) fn connection_info(
    url: &str,
    settings: &Settings,
) -> Result<ConnectionInfo, StoreError> {
    let tls_url = is_tls_url(url);
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
    let info = url
        .into_connection_info()
        .map_err(|e| RedisStoreError::InvalidUrl(e.to_string()))?;
    if tls_mode(&info).1 {
        // (redis-rs is built without its insecure mode: every such
        // connect would fail.)
        return Err(RedisStoreError::InvalidUrl(
            "#insecure (TLS without verifying the server) is not supported: drop it, and give \
             the server's CA with Tls::ca_pem"
                .into(),
        )
        .into());
    }
    Ok(info)
}

/// A client for `info`, with the store's certificates where it has any.
pub(crate) fn open_info(info: ConnectionInfo, settings: &Settings) -> Result<Client, StoreError> {
    #[cfg(feature = "tls")]
    if tls_mode(&info).0 {
        crate::tls::choose_crypto();
    }
    #[cfg(feature = "tls")]
    if let Some(tls) = &settings.tls {
        return Client::build_with_tls(info, tls.certificates()).map_err(|e| {
            let hint = "check the PEM text passed to Tls::ca_pem and Tls::client_pem";
            RedisStoreError::Tls(format!("{e}; {hint}")).into()
        });
    }
    let _ = settings;
    Client::open(info).map_err(|e| RedisStoreError::InvalidUrl(e.to_string()).into())
}

/// An error met while connecting or loading, with the two causes a user
/// must fix named: a TLS handshake that failed, a missing ACL permission.
/// Everything else is as in a decision.
pub(crate) fn connect_error(e: RedisError) -> StoreError {
    if is_tls_failure(&e) {
        let detail = e.to_string();
        let hint = tls_hint(&detail);
        return RedisStoreError::Tls(format!("{detail}; {hint}")).into();
    }
    if is_no_permission(&e) {
        return RedisStoreError::NoPermission(e.to_string()).into();
    }
    from_redis(e)
}

/// What to do about a failed TLS handshake, by the cause rustls named
/// (its error's text: rustls has no stable kinds for these through
/// redis-rs). Only the fix for that cause, so it never misleads.
fn tls_hint(detail: &str) -> &'static str {
    let names = |words: &[&str]| words.iter().any(|w| detail.contains(w));
    // BadSignature: an issuer of the same name, but another key.
    if names(&["UnknownIssuer", "BadSignature"]) {
        "the server's certificate is signed by a CA this store does not trust: pass that CA with Tls::ca_pem"
    } else if names(&["Expired", "expired", "NotValidYet", "not valid yet"]) {
        "the server's certificate is outside its validity period: renew it on the server (and check both machines' clocks)"
    } else if names(&["NotValidForName", "not valid for name"]) {
        "the server's certificate does not name the host of the URL: connect by a name or address the certificate holds, or reissue it"
    } else if names(&["CertificateRequired"]) {
        "the server requires a client certificate (tls-auth-clients): pass one with Tls::client_pem"
    } else if names(&["BadCertificate", "UnknownCA", "DecryptError"]) {
        "the server refused the client certificate: pass one signed by a CA the server trusts (its tls-ca-cert-file) with Tls::client_pem"
    } else {
        "if the server's certificate is signed by your own CA pass it with Tls::ca_pem, and if the server requires client certificates (tls-auth-clients) pass one with Tls::client_pem"
    }
}

/// A refused command or key (`NOPERM`). redis-rs reports a refused
/// `SELECT` (the URL's database, chosen as it connects) without the
/// server's code, in a text that holds the server's message.
pub(crate) fn is_no_permission(e: &RedisError) -> bool {
    let refused_select = || {
        let text = e.to_string();
        text.contains("switch database") && text.contains("no permissions")
    };
    matches!(
        e.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    ) || e.code() == Some("NOPERM")
        || refused_select()
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

#[cfg(test)]
mod tests {
    #[test]
    fn tls_urls_are_told_by_their_scheme_in_any_case() {
        for url in [
            "rediss://a/",
            "REDISS://a/",
            "valkeys://a/",
            "Valkeys://a:1/#insecure",
        ] {
            assert!(super::is_tls_url(url), "{url}");
        }
        for url in ["redis://a/", "valkey://a/", "redis+unix:///s", "rediss", ""] {
            assert!(!super::is_tls_url(url), "{url}");
        }
    }
}
