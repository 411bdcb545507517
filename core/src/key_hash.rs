//! Key hashes without key bytes: a subject's text is hashed once, when the
//! subject is made, and a store key's hash combines its layer's hash with
//! the text hashes of its tag and subject (a few multiplications per
//! decision, no rendering and no pass over the subject's bytes).

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use foldhash::fast::RandomState;

/// The process's hasher of texts and keys: seeded at random once per
/// process, so a client cannot choose subjects whose hashes collide, and
/// the same text hashes alike in every subject and key of the process.
fn hasher() -> &'static RandomState {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::default)
}

/// The hash of a subject's (or a tag's) text.
pub(crate) fn text_hash(text: &str) -> u64 {
    hasher().hash_one(text)
}

/// A store key's hash: `layer` (a fixed hash of the layer's policy,
/// version, algorithm and scope) combined with the [`text_hash`]es of its
/// tag and of its subject.
pub(crate) fn key_hash(layer: u64, tag: u64, subject: u64) -> u64 {
    let mut h = hasher().build_hasher();
    h.write_u64(layer);
    h.write_u64(tag);
    h.write_u64(subject);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tag and subject are not interchangeable, and every part counts.
    #[test]
    fn every_part_and_its_place_count() {
        let (a, b) = (text_hash("acme"), text_hash("key-7"));
        assert_eq!(text_hash("acme"), a);
        assert_ne!(a, b);
        assert_ne!(key_hash(1, a, b), key_hash(1, b, a));
        assert_ne!(key_hash(1, a, b), key_hash(2, a, b));
        assert_ne!(key_hash(1, a, a), key_hash(1, a, b));
        assert_eq!(key_hash(1, a, b), key_hash(1, a, b));
    }
}
