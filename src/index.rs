//! The stream index: (source address, SSRC) to the stream's slot, looked up once per datagram.
//!
//! With thousands of streams the lookup is a cache miss on every packet, and the first in a
//! chain (the stream's own lines can only be fetched once the slot is known). IPv4 keys, the
//! common case, live in [`V4Table`]: one flat array of 16-byte entries (address, SSRC, port and
//! slot together), probed linearly from the key's hash, so a lookup reads one entry, usually in
//! one cache line, and compares two words. A general-purpose map read a control-byte group,
//! then a bucket, through more code: 64 instructions a lookup against about 25 here (callgrind,
//! docs/performance.md section 20). Other sources (IPv6, including v4-mapped ones from a
//! dual-stack socket) use a map keyed by the whole `StreamKey`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;

use crate::stream::{KeyHasher, StreamKey};

/// An IPv4 stream key: address and SSRC in one word, and the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct V4Key {
    ip_ssrc: u64,
    port: u16,
}

fn v4(key: &StreamKey) -> Option<V4Key> {
    match key.source {
        SocketAddr::V4(a) => Some(V4Key {
            ip_ssrc: u64::from(a.ip().to_bits()) << 32 | u64::from(key.ssrc),
            port: a.port(),
        }),
        SocketAddr::V6(_) => None,
    }
}

/// One place of [`V4Table`]: 16 bytes, four to a cache line.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    ip_ssrc: u64,
    slot: u32,
    port: u16,
    used: bool,
}

impl Entry {
    #[inline]
    fn holds(&self, k: V4Key) -> bool {
        self.used && self.ip_ssrc == k.ip_ssrc && self.port == k.port
    }
}

/// Open addressing with linear probing, at most three quarters full (as full as the map it
/// replaced, so no more memory; a present key is found within two places on average, most
/// often in the same cache line), with backward-shift removal (no tombstones, so lookups never
/// slow down with churn). The hash is keyed per process
/// ([`KeyHasher`]), as the map it replaced: senders choose SSRCs and ports, and must not be
/// able to choose long probe runs.
#[derive(Debug)]
struct V4Table {
    entries: Box<[Entry]>,
    len: usize,
    hasher: KeyHasher,
}

impl Default for V4Table {
    fn default() -> Self {
        V4Table {
            entries: vec![Entry::default(); 8].into_boxed_slice(),
            len: 0,
            hasher: KeyHasher::default(),
        }
    }
}

impl V4Table {
    #[inline]
    fn home(&self, k: V4Key) -> usize {
        let mut h = self.hasher.build_hasher();
        h.write_u128(u128::from(k.ip_ssrc) << 16 | u128::from(k.port));
        h.finish() as usize & self.mask()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.entries.len() - 1
    }

    /// Where `k` is, or the empty place that ends its probe run.
    #[inline]
    fn find(&self, k: V4Key) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(k);
        loop {
            let e = &self.entries[i];
            if !e.used {
                return (i, false);
            }
            if e.holds(k) {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    fn get(&self, k: V4Key) -> Option<u32> {
        match self.find(k) {
            (i, true) => Some(self.entries[i].slot),
            _ => None,
        }
    }

    fn insert(&mut self, k: V4Key, slot: u32) -> Option<u32> {
        if (self.len + 1) * 4 > self.entries.len() * 3 {
            self.grow();
        }
        let (i, found) = self.find(k);
        let e = &mut self.entries[i];
        let old = found.then_some(e.slot);
        if !found {
            self.len += 1;
        }
        *e = Entry {
            ip_ssrc: k.ip_ssrc,
            slot,
            port: k.port,
            used: true,
        };
        old
    }

    fn remove(&mut self, k: V4Key) -> Option<u32> {
        let (mut hole, true) = self.find(k) else {
            return None;
        };
        let slot = self.entries[hole].slot;
        self.len -= 1;
        // Backward shift: each entry after the hole in the same run moves into it unless its
        // home lies cyclically after the hole (it would then be placed before its home).
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let e = self.entries[j];
            if !e.used {
                break;
            }
            let home = self.home(V4Key {
                ip_ssrc: e.ip_ssrc,
                port: e.port,
            });
            // Distance from home to j, and from home to the hole, going forwards.
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.entries[hole] = e;
                hole = j;
            }
        }
        self.entries[hole] = Entry::default();
        Some(slot)
    }

    fn grow(&mut self) {
        let bigger = vec![Entry::default(); self.entries.len() * 2].into_boxed_slice();
        let old = std::mem::replace(&mut self.entries, bigger);
        let mask = self.mask();
        for e in old.iter().filter(|e| e.used) {
            let k = V4Key {
                ip_ssrc: e.ip_ssrc,
                port: e.port,
            };
            let mut i = self.home(k);
            while self.entries[i].used {
                i = (i + 1) & mask;
            }
            self.entries[i] = *e;
        }
    }
}

/// Keyed per process (`KeyHasher`): keys are chosen by remote senders.
#[derive(Debug, Default)]
pub struct StreamIndex {
    v4: V4Table,
    other: HashMap<StreamKey, u32, KeyHasher>,
    /// Inserts and removals so far: a slot found while this is unchanged is still the key's.
    changes: u64,
}

impl StreamIndex {
    #[inline]
    pub fn get(&self, key: &StreamKey) -> Option<u32> {
        match v4(key) {
            Some(k) => self.v4.get(k),
            None => self.get_other(key),
        }
    }

    /// Out of line, so that the IPv4 lookup inlined into the packet path stays small.
    #[cold]
    #[inline(never)]
    fn get_other(&self, key: &StreamKey) -> Option<u32> {
        self.other.get(key).copied()
    }

    pub fn insert(&mut self, key: StreamKey, slot: u32) {
        self.changes = self.changes.wrapping_add(1);
        match v4(&key) {
            Some(k) => self.v4.insert(k, slot),
            None => self.other.insert(key, slot),
        };
    }

    pub fn remove(&mut self, key: &StreamKey) -> Option<u32> {
        self.changes = self.changes.wrapping_add(1);
        match v4(key) {
            Some(k) => self.v4.remove(k),
            None => self.other.remove(key),
        }
    }

    /// Changes when a key is inserted or removed, so that a lookup's answer can be kept for
    /// as long as this stays the same ([`crate::Gateway::handle_batch`]).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn len(&self) -> usize {
        self.v4.len + self.other.len()
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
            key("[::ffff:10.0.0.1]:5004", 1),
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

    #[test]
    fn an_entry_is_a_quarter_of_a_cache_line() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
    }

    /// Random inserts, replacements, removals and lookups over a small key space (long probe
    /// runs, wrap-around and backward shifts), checked against `HashMap` after every step.
    #[test]
    fn the_v4_table_agrees_with_a_map_through_churn() {
        let mut ix = StreamIndex::default();
        let mut model = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // A key from 32 random bits: 12 addresses, 3 ports, 40 SSRCs.
        let pick = |r: u64| {
            let source = format!("10.0.{}.{}:{}", r % 3, (r >> 8) % 4, 5000 + (r >> 16) % 3);
            key(&source, (r >> 24) as u32 % 40)
        };
        for step in 0..20_000u32 {
            let r = next();
            let k = pick(r);
            if r >> 62 == 0 {
                assert_eq!(ix.remove(&k), model.remove(&k), "step {step}");
            } else {
                ix.insert(k, step);
                model.insert(k, step);
            }
            assert_eq!(ix.len(), model.len(), "step {step}");
            let probe = pick(r >> 32);
            assert_eq!(ix.get(&probe), model.get(&probe).copied(), "step {step}");
        }
        for (k, slot) in &model {
            assert_eq!(ix.get(k), Some(*slot));
        }
        // Never more than three quarters full.
        assert!(ix.v4.len * 4 <= ix.v4.entries.len() * 3);
    }
}
