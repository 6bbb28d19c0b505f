//! The stream index: (source address, SSRC) to the stream's slot, looked up once per datagram.
//!
//! With thousands of streams the lookup's bucket is a cache miss on every packet, and the first
//! in a chain (the stream's own lines can only be fetched once the slot is known), so buckets
//! are kept small: an IPv4 source and its SSRC pack into 12 bytes, a 16-byte bucket with the
//! slot, where a `StreamKey` bucket takes 40. A v4-mapped source from a dual-stack socket is
//! its IPv4 address here (`stream::canonical`); other IPv6 sources use a map keyed by the whole
//! `StreamKey`.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::stream::{KeyHasher, StreamKey};

/// An IPv4 stream key: address, SSRC, port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct V4Key([u32; 3]);

/// One 128-bit word (foldhash folds it in one multiply); equal keys hash equal.
impl std::hash::Hash for V4Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let [ip, ssrc, port] = self.0;
        h.write_u128(u128::from(ip) << 64 | u128::from(ssrc) << 16 | u128::from(port));
    }
}

fn v4(key: &StreamKey) -> Option<V4Key> {
    match key.source {
        SocketAddr::V4(a) => Some(V4Key([a.ip().to_bits(), key.ssrc, u32::from(a.port())])),
        SocketAddr::V6(_) => None,
    }
}

/// As [`v4`], for a v4-mapped IPv6 source too ([`crate::stream::canonical`]): a dual-stack
/// listener's IPv4 sender is the same stream as that sender to an IPv4 listener.
fn v4_or_mapped(key: &StreamKey) -> Option<V4Key> {
    v4(&StreamKey {
        source: crate::stream::canonical(key.source),
        ..*key
    })
}

/// Keyed per process (`KeyHasher`): keys are chosen by remote senders.
#[derive(Debug, Default)]
pub struct StreamIndex {
    v4: HashMap<V4Key, u32, KeyHasher>,
    other: HashMap<StreamKey, u32, KeyHasher>,
    /// Inserts and removals so far: a slot found while this is unchanged is still the key's.
    changes: u64,
}

impl StreamIndex {
    /// Always inlined: the packet path's lookup, and the inliner's choice moved with unrelated
    /// cold code (callgrind, 1 stream: a call cost 6 instructions a packet).
    #[inline(always)]
    pub fn get(&self, key: &StreamKey) -> Option<u32> {
        match v4(key) {
            Some(k) => self.v4.get(&k).copied(),
            None => self.get_other(key),
        }
    }

    /// Out of line, so that the IPv4 lookup inlines into the packet path without the
    /// registers and frame the general map's lookup needs (callgrind: 64 instructions a
    /// lookup before, 21 fewer a packet with it inlined; docs/performance.md section 20).
    #[cold]
    #[inline(never)]
    fn get_other(&self, key: &StreamKey) -> Option<u32> {
        match v4_or_mapped(key) {
            Some(k) => self.v4.get(&k).copied(),
            None => self.other.get(key).copied(),
        }
    }

    pub fn insert(&mut self, key: StreamKey, slot: u32) {
        self.changes = self.changes.wrapping_add(1);
        match v4_or_mapped(&key) {
            Some(k) => self.v4.insert(k, slot),
            None => self.other.insert(key, slot),
        };
    }

    pub fn remove(&mut self, key: &StreamKey) -> Option<u32> {
        self.changes = self.changes.wrapping_add(1);
        match v4_or_mapped(key) {
            Some(k) => self.v4.remove(&k),
            None => self.other.remove(key),
        }
    }

    /// Changes when a key is inserted or removed, so that a lookup's answer can be kept for
    /// as long as this stays the same ([`crate::Gateway::handle_batch`]).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.other.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(source: &str, ssrc: u32) -> StreamKey {
        StreamKey {
            source: source.parse().unwrap(),
            ssrc,
        }
    }

    #[test]
    fn keys_differing_in_any_part_are_distinct() {
        let mut ix = StreamIndex::default();
        let keys = [
            key("10.0.0.1:5004", 1),
            key("10.0.0.1:5004", 2),
            key("10.0.0.1:5006", 1),
            key("10.0.0.2:5004", 1),
            key("[::1]:5004", 1),
            key("[::ffff:10.0.0.3]:5004", 1),
            key("[::1]:5004", 2),
        ];
        for (slot, k) in keys.iter().enumerate() {
            assert_eq!(ix.get(k), None);
            ix.insert(*k, slot as u32);
        }
        assert_eq!(ix.len(), keys.len());
        for (slot, k) in keys.iter().enumerate() {
            assert_eq!(ix.get(k), Some(slot as u32), "{k:?}");
        }
        assert_eq!(ix.remove(&keys[0]), Some(0));
        assert_eq!(ix.remove(&keys[4]), Some(4));
        assert_eq!(ix.get(&keys[0]), None);
        assert_eq!(ix.get(&keys[1]), Some(1));
        assert_eq!(ix.get(&keys[5]), Some(5));
        assert_eq!(ix.len(), keys.len() - 2);
    }

    /// A dual-stack socket's v4-mapped source and the same IPv4 source are one key, whichever
    /// form inserted it; a real IPv6 source is not.
    #[test]
    fn a_v4_mapped_key_is_its_ipv4_key() {
        let mut ix = StreamIndex::default();
        ix.insert(key("10.0.0.1:5004", 1), 7);
        assert_eq!(ix.get(&key("[::ffff:10.0.0.1]:5004", 1)), Some(7));
        assert_eq!(ix.get(&key("[::ffff:10.0.0.1]:5004", 2)), None);
        ix.insert(key("[::ffff:10.0.0.9]:5004", 1), 8);
        assert_eq!(ix.get(&key("10.0.0.9:5004", 1)), Some(8));
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.remove(&key("[::ffff:10.0.0.1]:5004", 1)), Some(7));
        assert_eq!(ix.get(&key("10.0.0.1:5004", 1)), None);
        assert_eq!(ix.get(&key("[::a00:9]:5004", 1)), None);
        assert_eq!(ix.len(), 1);
    }
}
