//! RED payload parsing (RFC 2198, and the t140llm variant) against an independent reference:
//! accepted payloads must be exactly headers + blocks + primary, blocks handed out oldest first
//! (wire order, or reversed when the sender wrote them newest first); RFC 2198 payloads rebuild
//! byte for byte; rejected ones must be rejected for the right reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvp_t140::red::{RedError, RedFormat, RedPayload, write_payload};

/// (ts offset, length) of a redundant block header.
fn header(format: RedFormat, h: &[u8]) -> (u16, usize) {
    match format {
        RedFormat::Rfc2198 => (
            u16::from(h[1]) << 6 | u16::from(h[2] >> 2),
            usize::from(h[2] & 0x03) << 8 | usize::from(h[3]),
        ),
        RedFormat::T140llm => (u16::from_be_bytes([h[1], h[2]]), usize::from(h[3])),
    }
}

/// Block headers `(pt, offset, len)` in wire order, or the error, computed independently.
fn reference(d: &[u8], format: RedFormat) -> Result<Vec<(u8, u16, usize)>, RedError> {
    let mut blocks = Vec::new();
    let mut total = 0;
    loop {
        let at = blocks.len() * 4;
        match d.get(at) {
            None => return Err(RedError::TruncatedHeader),
            Some(b) if b & 0x80 == 0 => {
                return if d.len() - at > total {
                    Ok(blocks)
                } else {
                    Err(RedError::BlockOverrun)
                };
            }
            Some(_) if d.len() < at + 4 => return Err(RedError::TruncatedHeader),
            Some(b) => {
                let (off, len) = header(format, &d[at..at + 4]);
                if format == RedFormat::T140llm && len == 255 {
                    return Err(RedError::AmbiguousLength);
                }
                blocks.push((b & 0x7f, off, len));
                total += len;
            }
        }
    }
}

/// RFC 4103 4.2 orders generations oldest first, so offsets decrease; two or more non-empty
/// blocks with non-zero, strictly increasing offsets are read as newest first.
fn newest_first(format: RedFormat, blocks: &[(u8, u16, usize)]) -> bool {
    if format == RedFormat::T140llm {
        return true;
    }
    let offsets: Vec<u16> = blocks.iter().filter(|b| b.2 > 0).map(|b| b.1).collect();
    offsets.len() >= 2 && offsets[0] > 0 && offsets.windows(2).all(|w| w[0] < w[1])
}

fn check(data: &[u8], format: RedFormat) {
    match (reference(data, format), RedPayload::parse_as(data, format)) {
        (Err(want), Err(e)) => assert_eq!(want, e),
        (Ok(wire), Ok(red)) => {
            let n = wire.len();
            assert_eq!(red.redundant_count(), n);
            let reversed = newest_first(format, &wire);
            assert_eq!(red.was_newest_first(), reversed, "{format:?}");
            let primary = red.primary();
            assert_eq!(primary.ts_offset, 0);
            assert_eq!(primary.payload_type, data[4 * n] & 0x7f);
            // Wire order: the blocks back to back after the headers, then the primary.
            let mut pos = 4 * n + 1;
            let mut expect = Vec::new();
            for &(pt, off, len) in &wire {
                expect.push((pt, off, &data[pos..pos + len]));
                pos += len;
            }
            assert_eq!(primary.data, &data[pos..]);
            if reversed {
                expect.reverse();
            }
            let got: Vec<_> = red
                .redundant_blocks()
                .map(|b| (b.payload_type, b.ts_offset, b.data))
                .collect();
            assert_eq!(got, expect, "{format:?}");
            // RFC 2198 in wire order with one block PT: `write_payload` rebuilds the payload.
            if format == RedFormat::Rfc2198
                && !reversed
                && got.iter().all(|b| b.0 == primary.payload_type)
            {
                let gens: Vec<(u16, &[u8])> = got.iter().map(|b| (b.1, b.2)).collect();
                let mut out = Vec::new();
                write_payload(&mut out, primary.payload_type, &gens, primary.data);
                assert_eq!(out, data);
            }
        }
        (want, got) => panic!(
            "{format:?}: reference {want:?} != parsed {:?}",
            got.map(|r| r.redundant_count())
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, RedFormat::Rfc2198);
    check(data, RedFormat::T140llm);
});
