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

/// The token in the environment variable `name`: set, not empty, and
/// what a client can send: visible ASCII and inner spaces, nothing
/// around it ([`bearer_matches`] trims what is sent). A token no request
/// can match would refuse every client, and Envoy, failing open, would
/// then admit everything unlimited.
pub(crate) fn token_from_env(name: &str, holds: &str) -> Result<String, crate::ServerError> {
    let env = |reason: String| crate::ServerError::Env {
        name: name.to_string(),
        reason,
    };
    let token = std::env::var(name).map_err(|_| env(format!("not set (it holds {holds})")))?;
    if token.is_empty() {
        return Err(env("empty".into()));
    }
    if token.trim() != token {
        return Err(env(
            "has white space around it (a secret read from a file often ends in a newline): \
             remove it, no client can send it"
                .into(),
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(env(
            "holds a control character or non-ASCII text: a bearer token is visible ASCII".into(),
        ));
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

    /// A token no client could send is refused when it is read, saying
    /// why; one a client can send is taken as it is.
    #[test]
    fn tokens_no_client_can_send_are_refused() {
        let name = "TOLLGATE_TEST_TOKEN_FROM_ENV";
        let read = |value: &str| {
            std::env::set_var(name, value);
            token_from_env(name, "a test token").map_err(|e| e.to_string())
        };
        assert_eq!(read("s3cret-._~+/="), Ok("s3cret-._~+/=".to_string()));
        let newline = read("s3cret\n").unwrap_err();
        assert!(newline.contains("white space around it"), "{newline}");
        let control = read("s3\tcret").unwrap_err();
        assert!(control.contains("visible ASCII"), "{control}");
        assert!(read("s3crét").is_err());
        // An inner space is sent as it is, and matched.
        assert_eq!(read("s3 cret"), Ok("s3 cret".to_string()));
        let sent = HeaderValue::from_static("Bearer s3 cret");
        assert!(bearer_matches(Some(&sent), "s3 cret"));
        std::env::remove_var(name);
    }
}
