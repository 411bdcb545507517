//! `cargo run --example hash-key`: the subject an API key is counted
//! under, for the `[access]` lists of the configuration file, which never
//! hold the key itself.
//!
//! The hash key (the same bytes the service gives `Identity::api_key`) comes
//! from the `TOLLGATE_HASH_KEY` environment variable; the API keys come on
//! standard input, one per line — never as arguments, which shell history
//! and process lists would keep.
//!
//! ```sh
//! printf '%s\n' "$STOLEN_KEY" | TOLLGATE_HASH_KEY="$(cat hash.key)" cargo run --example hash-key
//! ```

use std::io::{BufRead, Write};
use std::process::ExitCode;

use tollgate::{HashKey, Subject};

fn main() -> ExitCode {
    let Some(secret) = std::env::var_os("TOLLGATE_HASH_KEY") else {
        eprintln!("hash-key: set TOLLGATE_HASH_KEY to the hash key the service uses (16 bytes or more), and give the API keys on standard input, one per line");
        return ExitCode::from(2);
    };
    let key = match HashKey::new(secret.as_encoded_bytes()) {
        Ok(key) => key,
        Err(e) => {
            eprintln!("hash-key: TOLLGATE_HASH_KEY: {e}");
            return ExitCode::from(2);
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else {
            eprintln!("hash-key: standard input is not text");
            return ExitCode::FAILURE;
        };
        // Trimmed as the identity trims a header value.
        let api_key = line.trim_ascii();
        if api_key.is_empty() {
            continue;
        }
        if writeln!(out, "{}", Subject::hashed(api_key, &key)).is_err() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
