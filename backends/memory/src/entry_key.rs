//! An entry's key text, kept inside the entry when it is short.
//!
//! Why: a lookup compares the key it looks for with each candidate's text.
//! Text on the heap is a pointer to follow, and with many keys visited at
//! random often a cache miss: cachegrind of 10,000 keys at random counted
//! 4.84 last-level misses per decision with the text on the heap, 4.31
//! with it here (docs/benchmarks.md; the wall clock did not show it beyond
//! noise). A usual key (`{<subject>}:<policy>:v1:gcra:s`) is 20–40 bytes:
//! kept in the entry, it is compared where the table's probe already
//! brought the entry into cache. A longer key keeps its text on the heap.
//! Every entry gives its key 48 bytes (a boxed text took 16, and a heap
//! block of its own besides).

/// Key texts up to this many bytes live in the entry (with the length
/// and the variant's tag, 48 bytes: the size of the plan cache's inline
/// customer names too).
const INLINE: usize = 46;

/// See the [module docs](self).
pub(crate) enum EntryKey {
    /// A short key's bytes (`len` of them; the rest are zero).
    Inline { len: u8, bytes: [u8; INLINE] },
    /// A longer key's text.
    Boxed(Box<str>),
}

impl EntryKey {
    /// The key of `text`.
    pub(crate) fn new(text: String) -> Self {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                EntryKey::Inline { len, bytes }
            }
            _ => EntryKey::Boxed(text.into_boxed_str()),
        }
    }

    /// The key's text, as bytes (what a lookup compares: no UTF-8 check).
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            EntryKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            EntryKey::Boxed(text) => text.as_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short keys are kept inline, long ones boxed, and both read back
    /// as they were written, multi-byte characters included.
    #[test]
    fn a_key_reads_back_as_written_inline_or_boxed() {
        for text in [
            String::new(),
            "{k}:p:v1:gcra:s".to_string(),
            "é".repeat(INLINE / 2),
            "x".repeat(INLINE),
            "x".repeat(INLINE + 1),
            "y".repeat(300),
        ] {
            let key = EntryKey::new(text.clone());
            assert_eq!(key.as_bytes(), text.as_bytes());
            let inline = matches!(key, EntryKey::Inline { .. });
            assert_eq!(inline, text.len() <= INLINE, "{} bytes", text.len());
        }
        assert_eq!(std::mem::size_of::<EntryKey>(), 48);
    }
}
