//! RFC 2198 redundant audio data, as RFC 4103 section 4 uses it for text.
//!
//! A RED payload is a run of 4-byte headers for the redundant blocks (F=1), a 1-byte header for
//! the primary block (F=0), then the block data in the same order: oldest redundant generation
//! first, primary last. Parsing validates every length against the payload up front, so the
//! block iterator can never run out of bounds; nothing is copied or allocated.

/// Why a RED payload is rejected. Every variant is a counted drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedError {
    /// The payload ends inside the block headers (no F=0 header found).
    TruncatedHeader,
    /// The redundant block lengths add up to more than the data that follows the headers.
    BlockOverrun,
    /// t140llm format only: a length of 255 is a clamp, so the block boundaries are unknown.
    AmbiguousLength,
}

impl RedError {
    pub const fn as_str(self) -> &'static str {
        match self {
            RedError::TruncatedHeader => "red_truncated_header",
            RedError::BlockOverrun => "red_block_overrun",
            RedError::AmbiguousLength => "red_ambiguous_length",
        }
    }
}

/// How the redundant block headers are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RedFormat {
    /// RFC 2198 section 3: `F | PT:7 | offset:14 | length:10`, blocks oldest first.
    #[default]
    Rfc2198,
    /// t140llm 0.0.19 (docs/t140llm.md section 5): `F | PT:7 | offset:16 | length:8`, blocks
    /// newest first, lengths clamped at 255.
    T140llm,
}

/// One block of a RED payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedBlock<'a> {
    pub payload_type: u8,
    /// Timestamp offset back from the packet's RTP timestamp (0 for the primary).
    pub ts_offset: u16,
    pub data: &'a [u8],
}

/// A validated RED payload borrowing the datagram.
#[derive(Debug, Clone, Copy)]
pub struct RedPayload<'a> {
    payload: &'a [u8],
    format: RedFormat,
    redundant: usize,
    /// Offset of the first data byte (after all headers).
    data_start: usize,
    /// Bytes of redundant data.
    redundant_len: usize,
    primary_pt: u8,
    /// Blocks are in newest-first order on the wire.
    newest_first: bool,
    /// Every block's header names the same payload type ([`RedPayload::blocks_all_of`]).
    one_pt: bool,
}

impl<'a> RedPayload<'a> {
    /// Parses an RFC 2198 payload.
    pub fn parse(payload: &'a [u8]) -> Result<Self, RedError> {
        Self::parse_as(payload, RedFormat::Rfc2198)
    }

    #[inline]
    pub fn parse_as(payload: &'a [u8], format: RedFormat) -> Result<Self, RedError> {
        // One loop per layout, so the header decoding has no format branch per block.
        match format {
            RedFormat::Rfc2198 => Self::parse_layout::<false>(payload),
            RedFormat::T140llm => Self::parse_layout::<true>(payload),
        }
    }

    #[inline(always)]
    fn parse_layout<const T140LLM: bool>(payload: &'a [u8]) -> Result<Self, RedError> {
        let format = if T140LLM {
            RedFormat::T140llm
        } else {
            RedFormat::Rfc2198
        };
        let mut pos = 0;
        let mut redundant = 0usize;
        let mut data_len = 0usize;
        let mut order = Order::default();
        // The payload type bits that differ from the first header's, over every header: read
        // as the headers are, not in a second pass.
        let mut differ = 0u8;
        loop {
            let Some(&b) = payload.get(pos) else {
                return Err(RedError::TruncatedHeader);
            };
            differ |= b ^ payload[0];
            if b & 0x80 == 0 {
                let data_start = pos + 1;
                if data_start + data_len > payload.len() {
                    return Err(RedError::BlockOverrun);
                }
                return Ok(RedPayload {
                    payload,
                    format,
                    redundant,
                    data_start,
                    redundant_len: data_len,
                    primary_pt: b & 0x7f,
                    newest_first: T140LLM || order.increasing(),
                    one_pt: differ & 0x7f == 0,
                });
            }
            let Some(h) = payload[pos..].first_chunk::<4>() else {
                return Err(RedError::TruncatedHeader);
            };
            let (offset, len) = header_of::<T140LLM>(h);
            if T140LLM && len == 255 {
                return Err(RedError::AmbiguousLength);
            }
            order.block(offset, len);
            data_len += len;
            redundant += 1;
            pos += 4;
        }
    }

    /// Whether the blocks were newest first on the wire (t140llm, or detected).
    pub fn was_newest_first(&self) -> bool {
        self.newest_first
    }

    /// Whether every block (primary and redundant) names payload type `pt`. RFC 4103 section
    /// 4.1: each block of text/red for T.140 is text/t140, by its negotiated type; the headers
    /// alone are read.
    pub fn blocks_all_of(&self, pt: u8) -> bool {
        self.one_pt && self.primary_pt == pt
    }

    /// How many redundant generations the packet carries.
    pub fn redundant_count(&self) -> usize {
        self.redundant
    }

    /// The primary (newest) block.
    pub fn primary(&self) -> RedBlock<'a> {
        RedBlock {
            payload_type: self.primary_pt,
            ts_offset: 0,
            data: &self.payload[self.data_start + self.redundant_len..],
        }
    }

    /// The redundant blocks, oldest first (RFC 2198 section 3 order), whatever the wire order.
    /// One pass with a running offset: O(blocks), so a datagram packed with empty headers costs
    /// linear time, not quadratic.
    pub fn redundant_blocks(&self) -> impl Iterator<Item = RedBlock<'a>> + 'a {
        let this = *self;
        let n = self.redundant;
        // Forward: data of block i starts after blocks 0..i. Backward: ends before i+1..n.
        let mut start = self.data_start;
        let mut end = self.data_start + self.redundant_len;
        (0..n).map(move |k| {
            let i = if this.newest_first { n - 1 - k } else { k };
            let h = this.payload[i * 4..]
                .first_chunk::<4>()
                .expect("parse_as checked every header");
            let (ts_offset, len) = header(this.format, h);
            let data = if this.newest_first {
                end -= len;
                &this.payload[end..end + len]
            } else {
                start += len;
                &this.payload[start - len..start]
            };
            RedBlock {
                payload_type: h[0] & 0x7f,
                ts_offset,
                data,
            }
        })
    }
}

/// RFC 4103 4.2 puts redundant blocks in age order, so offsets decrease along the headers.
/// Two or more non-empty blocks whose non-zero offsets strictly increase can only be a sender
/// writing newest first (t140llm does): a conformant sender never looks like this. Followed
/// header by header while the payload is parsed.
#[derive(Default)]
struct Order {
    last: u16,
    seen: u32,
    broken: bool,
}

impl Order {
    fn block(&mut self, offset: u16, len: usize) {
        if len == 0 || self.broken {
            return;
        }
        if offset == 0 || offset <= self.last {
            self.broken = true;
            return;
        }
        self.last = offset;
        self.seen += 1;
    }

    fn increasing(&self) -> bool {
        !self.broken && self.seen >= 2
    }
}

/// `(timestamp offset, length)` of a 4-byte redundant block header.
fn header(format: RedFormat, h: &[u8; 4]) -> (u16, usize) {
    match format {
        RedFormat::Rfc2198 => header_of::<false>(h),
        RedFormat::T140llm => header_of::<true>(h),
    }
}

/// [`header`] for one layout, read as one big-endian word: RFC 2198 is `F | PT:7 | offset:14 |
/// length:10`, t140llm `F | PT:7 | offset:16 | length:8`.
#[inline(always)]
fn header_of<const T140LLM: bool>(h: &[u8; 4]) -> (u16, usize) {
    let v = u32::from_be_bytes(*h);
    if T140LLM {
        ((v >> 8) as u16, (v & 0xff) as usize)
    } else {
        (((v >> 10) & 0x3fff) as u16, (v & 0x03ff) as usize)
    }
}

/// Writes a RED payload: `redundant` oldest first as `(ts_offset, data)`, then the primary.
/// Strict in what we emit: offsets fit 14 bits and lengths 10 bits or the call panics in debug
/// builds; the sender never produces larger blocks.
pub fn write_payload(out: &mut Vec<u8>, block_pt: u8, redundant: &[(u16, &[u8])], primary: &[u8]) {
    for (offset, data) in redundant {
        debug_assert!(*offset < 1 << 14 && data.len() < 1 << 10);
        out.push(0x80 | block_pt & 0x7f);
        let v = (u32::from(*offset & 0x3fff) << 10) | (data.len() as u32 & 0x3ff);
        out.extend_from_slice(&v.to_be_bytes()[1..]);
    }
    out.push(block_pt & 0x7f);
    for (_, data) in redundant {
        out.extend_from_slice(data);
    }
    out.extend_from_slice(primary);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 2198 section 3 example header: F=1, PT 0, offset 300 (0x12c) ... lengths checked.
    #[test]
    fn round_trips_two_generations() {
        let mut p = Vec::new();
        write_payload(&mut p, 98, &[(600, b"ab"), (300, b"")], b"cde");
        let red = RedPayload::parse(&p).unwrap();
        assert_eq!(red.redundant_count(), 2);
        let blocks: Vec<_> = red.redundant_blocks().collect();
        assert_eq!(
            blocks[0],
            RedBlock {
                payload_type: 98,
                ts_offset: 600,
                data: b"ab"
            }
        );
        assert_eq!(
            blocks[1],
            RedBlock {
                payload_type: 98,
                ts_offset: 300,
                data: b""
            }
        );
        assert_eq!(
            red.primary(),
            RedBlock {
                payload_type: 98,
                ts_offset: 0,
                data: b"cde"
            }
        );
    }

    /// The RFC 2198 section 3 worked header: F=1, block PT=0, offset=0x12c... bit layout.
    #[test]
    fn header_bit_layout_matches_rfc2198() {
        // F=1 PT=98 offset=1000 len=5 -> 1|1100010 | 00001111101000 | 0000000101
        let mut p = Vec::new();
        write_payload(&mut p, 98, &[(1000, b"hello")], b"");
        assert_eq!(&p[..5], &[0xe2, 0x0f, 0xa0, 0x05, 0x62]);
        let red = RedPayload::parse(&p).unwrap();
        assert_eq!(red.redundant_blocks().next().unwrap().ts_offset, 1000);
    }

    #[test]
    fn newest_first_blocks_are_detected_and_put_in_age_order() {
        // Offsets 300 then 600 along the headers: newest first.
        let mut p = Vec::new();
        write_payload(&mut p, 98, &[(300, b"c"), (600, b"b")], b"d");
        let red = RedPayload::parse(&p).unwrap();
        assert!(red.was_newest_first());
        let data: Vec<_> = red.redundant_blocks().map(|b| b.data).collect();
        assert_eq!(data, vec![&b"b"[..], b"c"]);
        // Zero offsets (Asterisk writes 0) or an empty block: no evidence, wire order kept.
        let mut p = Vec::new();
        write_payload(&mut p, 98, &[(0, b"b"), (0, b"c")], b"d");
        assert!(!RedPayload::parse(&p).unwrap().was_newest_first());
    }

    /// docs/t140llm.md section 5, red3.pcap packet 4.
    #[test]
    fn t140llm_layout_is_read_with_16_bit_offsets_and_8_bit_lengths() {
        let p = [
            0xe0, 0x00, 0xa0, 0x03, 0xe0, 0x01, 0x40, 0x03, 0xe0, 0x01, 0xe0, 0x03, 0x60, b'f',
            b'r', b'o', b'l', b'o', b' ', b'H', b'e', b'l', b'm', b' ', b't',
        ];
        let red = RedPayload::parse_as(&p, RedFormat::T140llm).unwrap();
        let blocks: Vec<_> = red
            .redundant_blocks()
            .map(|b| (b.ts_offset, b.data))
            .collect();
        assert_eq!(
            blocks,
            vec![(480, &b"Hel"[..]), (320, b"lo "), (160, b"fro")]
        );
        assert_eq!(red.primary().data, b"m t");
        assert_eq!(red.primary().payload_type, 96);
        // A clamped length makes the boundaries unknowable.
        let p = [0xe0, 0x00, 0xa0, 0xff, 0x60];
        assert_eq!(
            RedPayload::parse_as(&p, RedFormat::T140llm).unwrap_err(),
            RedError::AmbiguousLength
        );
    }

    #[test]
    fn primary_only_payload() {
        let red = RedPayload::parse(&[98, b'x']).unwrap();
        assert_eq!(red.redundant_count(), 0);
        assert_eq!(red.primary().data, b"x");
        assert_eq!(red.primary().payload_type, 98);
    }

    #[test]
    fn rejects_truncated_and_overrunning_payloads() {
        assert_eq!(
            RedPayload::parse(&[]).unwrap_err(),
            RedError::TruncatedHeader
        );
        assert_eq!(
            RedPayload::parse(&[0xe2, 0, 0]).unwrap_err(),
            RedError::TruncatedHeader
        );
        assert_eq!(
            RedPayload::parse(&[0xe2, 0, 0, 5]).unwrap_err(),
            RedError::TruncatedHeader
        );
        // Block claims 5 bytes, only 2 follow the headers.
        assert_eq!(
            RedPayload::parse(&[0xe2, 0, 0, 5, 98, b'a', b'b']).unwrap_err(),
            RedError::BlockOverrun
        );
        // Max length 1023 against a short payload.
        assert_eq!(
            RedPayload::parse(&[0xe2, 0, 3, 0xff, 98]).unwrap_err(),
            RedError::BlockOverrun
        );
    }
}
