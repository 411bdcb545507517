//! Hash slots: which slot a key is on, and a request's layers grouped by
//! slot (one script call per group).

/// Number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16_384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM, the `crc16`
/// crate's, as redis-rs computes it) of its hash tag —
/// the text between the first `{` and the next `}`, when not empty — or of
/// the whole key, modulo 16384.
///
/// ```
/// use tollgate_redis::cluster::hash_slot;
/// // Same tag, same slot: these two layers are decided in one script call.
/// assert_eq!(hash_slot(b"tollgate:{acme}:a"), hash_slot(b"tollgate:{acme}:b"));
/// assert_eq!(hash_slot(b"123456789"), 12739);
/// ```
pub fn hash_slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % SLOT_COUNT
}

fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The layers' indices grouped by the slot of their keys, in slot order
/// (the fixed order reservations are made in), each group in layer order.
pub(super) fn slot_groups(keys: &[String]) -> Vec<Vec<usize>> {
    let mut by_slot: Vec<(u16, usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (hash_slot(k.as_bytes()), i))
        .collect();
    by_slot.sort_unstable();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut last = None;
    for (slot, i) in by_slot {
        match groups.last_mut() {
            Some(group) if last == Some(slot) => group.push(i),
            _ => groups.push(vec![i]),
        }
        last = Some(slot);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_eq!(
            hash_tag(b"foo{}{bar}"),
            b"foo{}{bar}",
            "empty tag: whole key"
        );
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        for key in ["a", "tollgate:{acme}:x", "{}", "{", "}{x}", "p:{t}:{u}"] {
            assert_eq!(
                redis::cluster_routing::Slot::new(hash_slot(key.as_bytes())),
                Some(redis::cluster_routing::Slot::for_key(key)),
                "{key}"
            );
        }
    }

    #[test]
    fn groups_are_in_slot_order_and_keep_layer_order() {
        let keys: Vec<String> = ["p:{b}:1", "p:{a}:1", "p:{b}:2", "p:{a}:2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let groups = slot_groups(&keys);
        assert_eq!(groups.len(), 2);
        let first = hash_slot(keys[groups[0][0]].as_bytes());
        let second = hash_slot(keys[groups[1][0]].as_bytes());
        assert!(first < second);
        for group in &groups {
            assert!(group.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
