//! The descriptor tree of one domain, and how a request's descriptor finds
//! its limit in it — the reference's lookup: at each entry, the child
//! named `key_value`, else the first wildcard child (in file order) that
//! matches `key_value`, else the child named `key` alone (the default for
//! any value); the limit applies when the descriptor's last entry lands
//! on a descriptor that has one.

use std::collections::HashMap;

/// A descriptor of the tree: its children by their key (`key` or
/// `key_value`, bytes as on Envoy's wire) and, when it has a
/// `rate_limit`, its leaf (an index into the loaded leaves).
#[derive(Debug, Default, Clone)]
pub(crate) struct Node {
    children: HashMap<Vec<u8>, Node>,
    /// Children whose key holds a `*`, split on it, in file order.
    wildcards: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    pub(super) leaf: Option<usize>,
}

impl Node {
    /// Add `child` under `key`; false when one is there already.
    pub(super) fn insert(&mut self, key: &str, child: Node) -> bool {
        let bytes = key.as_bytes().to_vec();
        if self.children.contains_key(&bytes) {
            return false;
        }
        if key.contains('*') {
            let parts = key.split('*').map(|p| p.as_bytes().to_vec()).collect();
            self.wildcards.push((bytes.clone(), parts));
        }
        self.children.insert(bytes, child);
        true
    }

    /// The leaf `entries` lands on, if any.
    pub(crate) fn find(&self, entries: &[(String, Vec<u8>)]) -> Option<usize> {
        let mut node = self;
        let mut full = Vec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            full.clear();
            full.extend_from_slice(key.as_bytes());
            full.push(b'_');
            full.extend_from_slice(value);
            let next = node
                .children
                .get(&full)
                .or_else(|| {
                    let (key, _) = node.wildcards.iter().find(|(_, p)| matches(p, &full))?;
                    node.children.get(key)
                })
                .or_else(|| node.children.get(key.as_bytes()))?;
            if i + 1 == entries.len() {
                return next.leaf;
            }
            if next.children.is_empty() {
                return None;
            }
            node = next;
        }
        None
    }
}

/// Whether `value` matches a pattern split on `*` (each `*` matches any
/// run of bytes, the empty one included).
fn matches(parts: &[Vec<u8>], value: &[u8]) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if !value.starts_with(first) || !value.ends_with(last) {
        return false;
    }
    if value.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle.iter().filter(|p| !p.is_empty()) {
        let Some(at) = rest.windows(part.len()).position(|w| w == part.as_slice()) else {
            return false;
        };
        rest = &rest[at + part.len()..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pattern: &str) -> Vec<Vec<u8>> {
        pattern.split('*').map(|p| p.as_bytes().to_vec()).collect()
    }

    #[test]
    fn wildcards_match_as_the_reference_matches() {
        let cases = [
            ("path_/api/*", "path_/api/users", true),
            ("path_/api/*", "path_/api/", true),
            ("path_/api/*", "path_/apx/users", false),
            ("path_bar*baz*qux", "path_bar1baz2qux", true),
            ("path_bar*baz*qux", "path_barbazqux", true),
            ("path_bar*baz*qux", "path_barquxbaz", false),
            ("path_ab*ba", "path_aba", false),
            ("k_*", "k_", true),
            ("k_a**b", "k_ab", true),
            ("k_a**b", "k_axyb", true),
            ("k_a**", "k_a", true),
            ("k_a**b", "k_ba", false),
        ];
        for (pattern, value, expected) in cases {
            assert_eq!(
                matches(&split(pattern), value.as_bytes()),
                expected,
                "{pattern} ~ {value}"
            );
        }
    }

    #[test]
    fn the_value_wins_over_a_wildcard_and_a_wildcard_over_the_default() {
        let mut root = Node::default();
        let leaf = |i| Node {
            leaf: Some(i),
            ..Node::default()
        };
        assert!(root.insert("k_v", leaf(0)));
        assert!(root.insert("k_v*", leaf(1)));
        assert!(root.insert("k", leaf(2)));
        assert!(!root.insert("k", leaf(3)), "a duplicate key is refused");
        let find = |v: &[u8]| root.find(&[("k".to_string(), v.to_vec())]);
        assert_eq!(find(b"v"), Some(0));
        assert_eq!(find(b"vw"), Some(1));
        assert_eq!(find(b"x"), Some(2));
        assert_eq!(
            find(b"\xe9"),
            Some(2),
            "bytes that are not UTF-8 reach the default"
        );
        let two = [
            ("k".to_string(), b"v".to_vec()),
            ("j".to_string(), b"w".to_vec()),
        ];
        assert_eq!(root.find(&two), None, "more entries than the tree is deep");
    }
}
