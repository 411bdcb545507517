//! Bearer tokens: the HTTP API's and the gRPC service's.

use axum::http::HeaderValue;

/// Whether `header` (an `Authorization` value) is `Bearer <token>`, the
/// scheme in any case, the token compared in constant time.
pub(crate) fn bearer_matches(header: Option<&HeaderValue>, token: &str) -> bool {
    let sent = header
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim());
    sent.len() == token.len()
        && sent
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The token in the environment variable `name`: set and not empty.
pub(crate) fn token_from_env(name: &str, holds: &str) -> Result<String, crate::ServerError> {
    let env = |reason: String| crate::ServerError::Env {
        name: name.to_string(),
        reason,
    };
    let token = std::env::var(name).map_err(|_| env(format!("not set (it holds {holds})")))?;
    if token.is_empty() {
        return Err(env("empty".into()));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_matches() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        assert!(bearer_matches(Some(&v("Bearer s3cret")), "s3cret"));
        assert!(bearer_matches(Some(&v("bearer s3cret")), "s3cret"));
        for wrong in [
            "Bearer s3cre",
            "Bearer s3cret!",
            "Basic s3cret",
            "s3cret",
            "",
        ] {
            assert!(!bearer_matches(Some(&v(wrong)), "s3cret"), "{wrong:?}");
        }
        assert!(!bearer_matches(None, "s3cret"));
    }
}
