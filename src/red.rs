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
}

impl RedError {
    pub const fn as_str(self) -> &'static str {
        match self {
            RedError::TruncatedHeader => "red_truncated_header",
            RedError::BlockOverrun => "red_block_overrun",
        }
    }
}

/// One block of a RED payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedBlock<'a> {
    pub payload_type: u8,
    /// Timestamp offset back from the packet's RTP timestamp (14 bits; 0 for the primary).
    pub ts_offset: u16,
    pub data: &'a [u8],
}

/// A validated RED payload borrowing the datagram.
#[derive(Debug, Clone, Copy)]
pub struct RedPayload<'a> {
    payload: &'a [u8],
    redundant: usize,
    /// Offset of the first data byte (after all headers).
    data_start: usize,
    primary_pt: u8,
}

impl<'a> RedPayload<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Self, RedError> {
        let mut pos = 0;
        let mut redundant = 0usize;
        let mut data_len = 0usize;
        loop {
            let Some(&b) = payload.get(pos) else {
                return Err(RedError::TruncatedHeader);
            };
            if b & 0x80 == 0 {
                let data_start = pos + 1;
                if data_start + data_len > payload.len() {
                    return Err(RedError::BlockOverrun);
                }
                return Ok(RedPayload {
                    payload,
                    redundant,
                    data_start,
                    primary_pt: b & 0x7f,
                });
            }
            if pos + 4 > payload.len() {
                return Err(RedError::TruncatedHeader);
            }
            let len =
                usize::from(u16::from_be_bytes([payload[pos + 2], payload[pos + 3]]) & 0x03ff);
            data_len += len;
            redundant += 1;
            pos += 4;
        }
    }

    /// How many redundant generations the packet carries.
    pub fn redundant_count(&self) -> usize {
        self.redundant
    }

    /// The primary (newest) block.
    pub fn primary(&self) -> RedBlock<'a> {
        let used: usize = self.redundant_blocks().map(|b| b.data.len()).sum();
        RedBlock {
            payload_type: self.primary_pt,
            ts_offset: 0,
            data: &self.payload[self.data_start + used..],
        }
    }

    /// The redundant blocks, oldest first (RFC 2198 section 3 order).
    pub fn redundant_blocks(&self) -> impl Iterator<Item = RedBlock<'a>> + 'a {
        let payload = self.payload;
        let mut data_pos = self.data_start;
        (0..self.redundant).map(move |i| {
            let h = &payload[i * 4..i * 4 + 4];
            let len = usize::from(u16::from_be_bytes([h[2], h[3]]) & 0x03ff);
            let block = RedBlock {
                payload_type: h[0] & 0x7f,
                ts_offset: u16::from_be_bytes([h[1], h[2]]) >> 2,
                data: &payload[data_pos..data_pos + len],
            };
            data_pos += len;
            block
        })
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
