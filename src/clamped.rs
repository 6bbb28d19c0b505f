//! t140llm's RED blocks over 255 bytes (`--compat t140llm`, docs/t140llm.md section 5).
//!
//! t140llm writes a redundant block's length as `min(len, 255)` in its 8-bit field but appends
//! the whole block, so after a packet over 255 bytes (a first burst of 30 emoji), the next two
//! RED packets cannot be split into blocks: their primaries, new text, were lost with them
//! (`red_ambiguous_length`). A clamped block is a copy of an earlier packet of the stream, the
//! one `k` back for the `k`th header (t140llm numbers them newest first), and the gateway
//! received that packet: [`LongBlocks`] remembers such long packets by length and fingerprint,
//! and [`unclamp`] rewrites a packet whose every clamped block it remembers, each block
//! checked against the fingerprint, into one whose clamped blocks are empty. Their text came
//! with the packet they copy, so nothing the register could recover from them is missing, and
//! each generation keeps its place (RFC 2198: a block is placed by counting back).
//!
//! A block is the plain packet's payload from byte 12 on (`packet.slice(12)`), so in t140llm's
//! multiplexing it starts with the stream's 4 CSRC bytes or its `<id>` 0x1E prefix, which a
//! RED packet's own primary lacks (section 6): a long RED primary is remembered as it came, and
//! found in the block behind such a prefix.

use std::collections::VecDeque;
use std::net::SocketAddr;

use crate::red::RedError;
use crate::speaker::fingerprint;

/// One long block remembered: the stream's source and SSRC, the packet's sequence number,
/// and the block it would be repeated as (length, FNV-1a).
type Entry = (SocketAddr, u32, u16, usize, u32);

/// The longest multiplex prefix looked behind for: an id of [`MAX_CLAMPED_ID`] bytes and 0x1E
/// (a CSRC is 4 bytes).
pub const MAX_PREFIX: usize = MAX_CLAMPED_ID + 1;

/// The longest stream id whose clamped RED blocks are read (t140llm's multiplexing with RED,
/// itself a known gap): a prefix is only looked for that far, so that not every RED packet is
/// remembered as a long one. A stream id may be longer ([`crate::speaker::MAX_NAMED_ID`]);
/// such a stream's clamped blocks stay ambiguous.
pub const MAX_CLAMPED_ID: usize = 64;

/// Long blocks kept, over every stream: only packets over 255 bytes are, and each is needed
/// for the packets after it that repeat it (two with t140llm's default redundancy), which come
/// seconds later after a long burst (its pacing). 40 bytes each.
const KEPT: usize = 1024;

/// Long blocks kept for one stream: a stream's own packets replace its oldest first, so one
/// stream cannot push the others' out. More than t140llm's redundancy level (default 2).
const KEPT_A_STREAM: usize = 8;

/// The longest blocks of the last packets over 255 bytes of `--compat t140llm` streams.
#[derive(Debug, Default)]
pub struct LongBlocks {
    kept: VecDeque<Entry>,
}

impl LongBlocks {
    /// Packet `seq` of (`source`, `ssrc`) would be repeated as `block` in later RED packets,
    /// or as `block` behind a multiplex prefix if it is a RED packet's `bare` primary: kept if
    /// its length may be clamped there.
    #[cold]
    #[inline(never)]
    pub fn note(&mut self, source: SocketAddr, ssrc: u32, seq: u16, block: &[u8], bare: bool) {
        if block.len() + if bare { MAX_PREFIX } else { 0 } < 255 {
            return;
        }
        let mine = |e: &&Entry| e.0 == source && e.1 == ssrc;
        if self.kept.iter().filter(mine).count() >= KEPT_A_STREAM {
            let oldest = self.kept.iter().position(|e| mine(&e));
            self.kept.remove(oldest.expect("counted"));
        } else if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept
            .push_back((source, ssrc, seq, block.len(), fingerprint(block)));
    }

    fn get(&self, source: SocketAddr, ssrc: u32, seq: u16) -> Option<(usize, u32)> {
        (self.kept.iter().rev())
            .find(|e| e.0 == source && e.1 == ssrc && e.2 == seq)
            .map(|e| (e.3, e.4))
    }
}

/// The whole length of a clamped block starting at `at` in `payload`, whose text is a
/// remembered block of `len` bytes and fingerprint `fp`: that block itself, or that text behind
/// a multiplex prefix (4 CSRC bytes, or an id of at most [`MAX_CLAMPED_ID`] bytes and 0x1E).
fn behind_prefix(payload: &[u8], at: usize, len: usize, fp: u32) -> Option<usize> {
    let text = |p: usize| payload.get(at + p..at + p + len);
    (0..=MAX_PREFIX)
        .filter(|&p| p == 0 || p == 4 || payload.get(at + p - 1) == Some(&0x1e))
        .find(|&p| text(p).is_some_and(|t| fingerprint(t) == fp))
        .map(|p| p + len)
}

/// The datagram `data` (RTP packet `seq` of `source`, `ssrc`, whose t140llm RED payload
/// `payload` lies within it) with every clamped block emptied, its header's length 0; or why
/// not: a clamped block not remembered, or not the one remembered, stays ambiguous.
pub fn unclamp(
    long: &LongBlocks,
    source: SocketAddr,
    ssrc: u32,
    seq: u16,
    data: &[u8],
    payload: &[u8],
) -> Result<Vec<u8>, RedError> {
    // The payload's place in the datagram: the RTP header before it, any padding after.
    let start = (payload.as_ptr() as usize).wrapping_sub(data.as_ptr() as usize);
    let end = start.wrapping_add(payload.len());
    if start > data.len() || end > data.len() || data.get(start..end) != Some(payload) {
        return Err(RedError::AmbiguousLength);
    }
    // Headers, newest first: (length, clamped).
    let mut blocks: smallvec::SmallVec<[(usize, bool); 8]> = smallvec::SmallVec::new();
    let mut pos = 0;
    let mut back = 0u16;
    // A clamped block's remembered fingerprint; its length is the remembered one until
    // `behind_prefix` has looked for it.
    let mut remembered: smallvec::SmallVec<[u32; 2]> = smallvec::SmallVec::new();
    loop {
        let Some(&b) = payload.get(pos) else {
            return Err(RedError::TruncatedHeader);
        };
        if b & 0x80 == 0 {
            break;
        }
        let Some(h) = payload[pos..].first_chunk::<4>() else {
            return Err(RedError::TruncatedHeader);
        };
        back = back.wrapping_add(1);
        if h[3] == 255 {
            let (len, fp) = long
                .get(source, ssrc, seq.wrapping_sub(back))
                .ok_or(RedError::AmbiguousLength)?;
            blocks.push((len, true));
            remembered.push(fp);
        } else {
            blocks.push((usize::from(h[3]), false));
        }
        pos += 4;
    }
    let data_start = pos + 1;
    let mut at = data_start;
    let mut fps = remembered.iter();
    for (len, clamped) in &mut blocks {
        if *clamped {
            let fp = *fps.next().expect("one a clamped block");
            *len = behind_prefix(payload, at, *len, fp).ok_or(RedError::AmbiguousLength)?;
        }
        at += *len;
        if at > payload.len() {
            return Err(RedError::BlockOverrun);
        }
    }
    let mut out = Vec::with_capacity(data.len());
    out.extend_from_slice(&data[..start]);
    for (i, &(_, clamped)) in blocks.iter().enumerate() {
        let h = &payload[i * 4..i * 4 + 4];
        out.extend_from_slice(&h[..3]);
        out.push(if clamped { 0 } else { h[3] });
    }
    out.push(payload[pos]);
    let mut at = data_start;
    for &(len, clamped) in &blocks {
        if !clamped {
            out.extend_from_slice(&payload[at..at + len]);
        }
        at += len;
    }
    out.extend_from_slice(&payload[at..]);
    out.extend_from_slice(&data[end..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:6000".parse().unwrap()
    }

    /// A t140llm RED payload: headers newest first, lengths clamped, whole blocks appended.
    fn red(gens_newest_first: &[&[u8]], primary: &[u8]) -> Vec<u8> {
        let mut p = Vec::new();
        for (k, g) in gens_newest_first.iter().enumerate() {
            p.push(0xe0);
            p.extend_from_slice(&(160 * (k as u16 + 1)).to_be_bytes());
            p.push(g.len().min(255) as u8);
        }
        p.push(0x60);
        for g in gens_newest_first {
            p.extend_from_slice(g);
        }
        p.extend_from_slice(primary);
        p
    }

    fn datagram(payload: &[u8]) -> Vec<u8> {
        let mut d = vec![0x80, 98, 0, 2, 0, 0, 1, 64, 0x11, 0x22, 0x33, 0x44];
        d.extend_from_slice(payload);
        d
    }

    #[test]
    fn a_remembered_clamped_block_is_emptied_and_the_rest_kept() {
        let burst = vec![b'x'; 300];
        let mut long = LongBlocks::default();
        long.note(addr(), 0x1122_3344, 0, &burst, false);
        let d = datagram(&red(&[b" ok", &burst], b"."));
        let out = unclamp(&long, addr(), 0x1122_3344, 2, &d, &d[12..]).unwrap();
        assert_eq!(out, datagram(&red(&[b" ok", b""], b".")));
    }

    #[test]
    fn a_clamped_block_not_remembered_or_not_the_one_remembered_stays_ambiguous() {
        let burst = vec![b'x'; 300];
        let d = datagram(&red(&[&burst], b" ok"));
        let none = LongBlocks::default();
        assert_eq!(
            unclamp(&none, addr(), 0x1122_3344, 1, &d, &d[12..]),
            Err(RedError::AmbiguousLength)
        );
        // Same length, other text.
        let mut other = LongBlocks::default();
        other.note(addr(), 0x1122_3344, 0, &[b'y'; 300], false);
        assert_eq!(
            unclamp(&other, addr(), 0x1122_3344, 1, &d, &d[12..]),
            Err(RedError::AmbiguousLength)
        );
        // Another stream's packet with that number.
        let mut elsewhere = LongBlocks::default();
        elsewhere.note(addr(), 7, 0, &burst, false);
        assert_eq!(
            unclamp(&elsewhere, addr(), 0x1122_3344, 1, &d, &d[12..]),
            Err(RedError::AmbiguousLength)
        );
    }

    #[test]
    fn a_remembered_length_past_the_payload_stays_ambiguous_not_a_panic() {
        let mut long = LongBlocks::default();
        long.note(addr(), 0x1122_3344, 0, &[b'x'; 900], false);
        let d = datagram(&red(&[&[b'x'; 300]], b" ok"));
        assert_eq!(
            unclamp(&long, addr(), 0x1122_3344, 1, &d, &d[12..]),
            Err(RedError::AmbiguousLength)
        );
    }

    /// t140llm multiplexing: a RED packet's primary is bare text, the block repeating it
    /// carries the stream's prefix (`<id>` 0x1E, or its 4 CSRC bytes).
    #[test]
    fn a_remembered_primary_is_found_behind_a_multiplex_prefix() {
        let text = vec![b'x'; 300];
        let mut long = LongBlocks::default();
        long.note(addr(), 0x1122_3344, 1, &text, true);
        for prefix in [&b"alpha\x1e"[..], &1u32.to_be_bytes()[..]] {
            let block = [prefix, &text].concat();
            let d = datagram(&red(&[&block, b"alpha\x1eHi "], b" ok"));
            let out = unclamp(&long, addr(), 0x1122_3344, 2, &d, &d[12..]);
            assert_eq!(out, Ok(datagram(&red(&[b"", b"alpha\x1eHi "], b" ok"))));
        }
    }

    #[test]
    fn one_streams_long_packets_do_not_push_anothers_out() {
        let mut long = LongBlocks::default();
        long.note(addr(), 1, 0, &[b'a'; 300], false);
        for seq in 0..2000 {
            long.note(addr(), 2, seq, &[b'b'; 300], false);
        }
        assert_eq!(long.get(addr(), 1, 0).map(|(len, _)| len), Some(300));
        assert!(long.kept.len() <= KEPT_A_STREAM + 1);
    }

    #[test]
    fn short_blocks_are_not_kept() {
        let mut long = LongBlocks::default();
        long.note(addr(), 1, 0, &[b'x'; 254], false);
        long.note(addr(), 1, 1, &[b'x'; 254 - MAX_PREFIX], true);
        assert!(long.kept.is_empty());
        // A bare RED primary that a prefix may take over 255.
        long.note(addr(), 1, 2, &[b'x'; 255 - MAX_PREFIX], true);
        assert_eq!(long.kept.len(), 1);
    }
}
