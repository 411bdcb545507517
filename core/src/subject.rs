//! Subjects: who owns a counter (an API-key id, a user, a tenant, an IP prefix).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::SubjectError;
use crate::key_hash::text_hash;

/// What begins every [`Subject::hashed`] subject.
const HASHED_PREFIX: &str = "h.";

/// Hex digits after the prefix (128 bits).
const HASHED_DIGITS: usize = 32;

/// A validated, normalized identifier that owns a counter.
///
/// Subjects end up inside store keys, so they are checked: surrounding white
/// space is trimmed, and empty values, values over [`Subject::MAX_LEN`] bytes,
/// control characters, inner white space and `{`/`}` are rejected. Secrets
/// (API keys, tokens) must never be used raw: [`Subject::hashed`] turns them
/// into a keyed hash.
///
/// ```
/// use tollgate_limiter::{HashKey, Subject};
///
/// let user = Subject::new("  user-42 ")?;
/// assert_eq!(user.as_str(), "user-42");
/// assert!(Subject::new("bad\nvalue").is_err());
///
/// let key = HashKey::new(b"a server-side secret of 16+ bytes").unwrap();
/// let hashed = Subject::hashed("sk_live_secret", &key);
/// assert!(!hashed.as_str().contains("sk_live"));
/// # Ok::<(), tollgate_limiter::SubjectError>(())
/// ```
#[derive(Clone)]
pub struct Subject {
    text: Arc<str>,
    /// The text's hash ([`text_hash`]), taken once: the store keys of every
    /// decision combine it instead of hashing the text again.
    hash: u64,
}

impl Subject {
    /// Longest accepted subject, in bytes.
    pub const MAX_LEN: usize = 256;

    /// Validate and normalize `value`.
    pub fn new(value: impl AsRef<str>) -> Result<Self, SubjectError> {
        let value = value.as_ref().trim();
        if value.is_empty() {
            return Err(SubjectError::Empty);
        }
        if value.len() > Self::MAX_LEN {
            return Err(SubjectError::TooLong(value.len()));
        }
        if let Some(c) = value
            .chars()
            .find(|c| c.is_control() || c.is_whitespace() || matches!(c, '{' | '}'))
        {
            return Err(SubjectError::BadCharacter(c));
        }
        Ok(Subject::of(value.into()))
    }

    /// A subject derived from a secret by a keyed hash (HMAC-SHA-256, 128 bits
    /// shown as hex, prefixed `h.`). The secret itself never reaches a store
    /// key or a log line; without `key` nobody can test guesses against it.
    pub fn hashed(secret: impl AsRef<[u8]>, key: &HashKey) -> Self {
        let mut mac = Hmac::<Sha256>::new_from_slice(&key.0).expect("HMAC accepts any key length");
        mac.update(secret.as_ref());
        let digest = mac.finalize().into_bytes();
        let mut text = String::with_capacity(HASHED_PREFIX.len() + HASHED_DIGITS);
        text.push_str(HASHED_PREFIX);
        for byte in &digest[..HASHED_DIGITS / 2] {
            text.push(char::from_digit(u32::from(byte >> 4), 16).expect("nibble"));
            text.push(char::from_digit(u32::from(byte & 15), 16).expect("nibble"));
        }
        Subject::of(text.into())
    }

    /// Whether `text` has the form [`Subject::hashed`] writes: `h.` and 32
    /// lower-case hex digits. A list of hashed subjects (a deny list, say)
    /// checks its entries with it: any other text after `h.` matches no
    /// request.
    ///
    /// ```
    /// use tollgate_limiter::{HashKey, Subject};
    /// let key = HashKey::new(b"a server-side secret of 16+ bytes").unwrap();
    /// assert!(Subject::is_hashed_form(Subject::hashed("sk_live", &key).as_str()));
    /// assert!(!Subject::is_hashed_form("h.9F811E4CF32DC31E6F422DAAE9C8C27A"));
    /// ```
    pub fn is_hashed_form(text: &str) -> bool {
        text.strip_prefix(HASHED_PREFIX).is_some_and(|digits| {
            digits.len() == HASHED_DIGITS
                && digits
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
    }

    /// The subject everyone shares, for global layers.
    pub fn global() -> Self {
        Subject::of("global".into())
    }

    /// A subject of `text`, checked by the caller.
    fn of(text: Arc<str>) -> Self {
        let hash = text_hash(&text);
        Subject { text, hash }
    }

    /// The normalized text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The text's hash, for store keys.
    pub(crate) fn text_hash(&self) -> u64 {
        self.hash
    }
}

impl PartialEq for Subject {
    fn eq(&self, other: &Self) -> bool {
        // Equal texts hash alike: most unequal subjects differ here already.
        self.hash == other.hash && self.text == other.text
    }
}

impl Eq for Subject {}

/// The text's hash, taken when the subject was made: a table of subjects
/// hashes eight bytes, not the text.
impl Hash for Subject {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// By text.
impl Ord for Subject {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text.cmp(&other.text)
    }
}

impl PartialOrd for Subject {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Subject({:?})", &*self.text)
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The server-side key of [`Subject::hashed`]; at least 16 bytes. Its `Debug`
/// output hides the bytes.
#[derive(Clone)]
pub struct HashKey(Arc<[u8]>);

impl HashKey {
    /// A key of at least 16 bytes (a shorter one is
    /// [`HashKeyError`](crate::HashKeyError): too easy to guess).
    pub fn new(bytes: &[u8]) -> Result<Self, crate::HashKeyError> {
        if bytes.len() < 16 {
            return Err(crate::HashKeyError(bytes.len()));
        }
        Ok(HashKey(bytes.into()))
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(<hidden>)")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Subjects made apart from one text are one subject (equal, hashed
    /// alike, found in a set); other texts are others; order is the text's.
    #[test]
    fn a_subject_is_its_text() {
        let a = Subject::new("user-42").unwrap();
        let again = Subject::new(" user-42").unwrap();
        let b = Subject::new("user-43").unwrap();
        assert_eq!(a, again);
        assert_eq!(a.text_hash(), again.text_hash());
        assert_ne!(a, b);
        assert_ne!(a.text_hash(), b.text_hash());
        let set: HashSet<Subject> = [a.clone(), again, b.clone()].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert!(set.contains(&Subject::new("user-43").unwrap()));
        assert!(a < b && Subject::new("a").unwrap() < Subject::new("b").unwrap());
        assert_eq!(Subject::global(), Subject::new("global").unwrap());
    }
}
