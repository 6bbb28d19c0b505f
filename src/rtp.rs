//! RTP fixed header (RFC 3550 section 5.1) as a borrow-only view over the datagram.
//!
//! The webrtc-rs `rtp` crate panics on malformed header extensions and accepts version 0, and it
//! copies the payload into `Bytes`; this view validates every length against the datagram first
//! and borrows the payload, so a hostile packet costs a counted drop and nothing else.

/// Why a datagram is not an RTP packet we accept. Every variant is a counted drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtpError {
    /// Shorter than the 12-byte fixed header.
    TooShort,
    /// Version field is not 2 (RFC 3550 5.1).
    BadVersion,
    /// The CSRC list (CC * 4 bytes) runs past the end of the datagram.
    CsrcOverrun,
    /// The header extension (RFC 3550 5.3.1) length runs past the end of the datagram.
    ExtensionOverrun,
    /// The padding count is zero or larger than the payload (RFC 3550 5.1, P bit).
    BadPadding,
}

impl RtpError {
    pub const fn as_str(self) -> &'static str {
        match self {
            RtpError::TooShort => "rtp_too_short",
            RtpError::BadVersion => "rtp_bad_version",
            RtpError::CsrcOverrun => "rtp_csrc_overrun",
            RtpError::ExtensionOverrun => "rtp_extension_overrun",
            RtpError::BadPadding => "rtp_bad_padding",
        }
    }
}

/// A validated RTP packet borrowing the datagram it came from.
#[derive(Debug, Clone, Copy)]
pub struct RtpPacket<'a> {
    pub marker: bool,
    pub payload_type: u8,
    pub sequence: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    csrc: &'a [u8],
    /// `(profile, data)` of the header extension, when the X bit is set.
    pub extension: Option<(u16, &'a [u8])>,
    /// The payload with any padding removed.
    pub payload: &'a [u8],
}

impl<'a> RtpPacket<'a> {
    /// Parses and validates a whole datagram. Never panics, never allocates. Inlined into
    /// every caller: as a call from the packet path, once it had a second caller, it cost 59
    /// instructions a packet more (callgrind, `core_drive`).
    #[inline(always)]
    pub fn parse(data: &'a [u8]) -> Result<Self, RtpError> {
        if data.len() < 12 {
            return Err(RtpError::TooShort);
        }
        let b0 = data[0];
        if b0 >> 6 != 2 {
            return Err(RtpError::BadVersion);
        }
        let padding = b0 & 0x20 != 0;
        let has_ext = b0 & 0x10 != 0;
        let cc = usize::from(b0 & 0x0f);
        let b1 = data[1];
        let mut pos = 12;
        let csrc_end = pos + cc * 4;
        if csrc_end > data.len() {
            return Err(RtpError::CsrcOverrun);
        }
        let csrc = &data[pos..csrc_end];
        pos = csrc_end;
        let extension = if has_ext {
            if pos + 4 > data.len() {
                return Err(RtpError::ExtensionOverrun);
            }
            let profile = u16::from_be_bytes([data[pos], data[pos + 1]]);
            let words = usize::from(u16::from_be_bytes([data[pos + 2], data[pos + 3]]));
            let start = pos + 4;
            let end = start + words * 4;
            if end > data.len() {
                return Err(RtpError::ExtensionOverrun);
            }
            pos = end;
            Some((profile, &data[start..end]))
        } else {
            None
        };
        let mut end = data.len();
        if padding {
            let count = usize::from(data[end - 1]);
            if count == 0 || pos + count > end {
                return Err(RtpError::BadPadding);
            }
            end -= count;
        }
        Ok(RtpPacket {
            marker: b1 & 0x80 != 0,
            payload_type: b1 & 0x7f,
            sequence: u16::from_be_bytes([data[2], data[3]]),
            timestamp: u32::from_be_bytes([data[4], data[5], data[6], data[7]]),
            ssrc: u32::from_be_bytes([data[8], data[9], data[10], data[11]]),
            csrc,
            extension,
            payload: &data[pos..end],
        })
    }

    /// Contributing sources (RFC 3550 5.1); an RTT mixer (RFC 9071) names the speaker here.
    pub fn csrcs(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        self.csrc
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// The SSRC where an RTP header keeps it (RFC 3550 5.1), without parsing the rest: a hint
/// for looking a stream up ahead of its packet ([`crate::Gateway::warm`]); junk gives a value
/// no stream has, or `None` when too short.
#[inline]
pub fn peek_ssrc(data: &[u8]) -> Option<u32> {
    let &[a, b, c, d] = data.get(8..12)? else {
        return None;
    };
    Some(u32::from_be_bytes([a, b, c, d]))
}

/// RFC 5761 section 4: with rtcp-mux, a second byte of 192..=223 (marker bit plus payload type
/// 64..=95) is RTCP, since those RTP payload types are reserved to avoid exactly this clash.
/// Its header's 4 octets suffice: a BYE with no sources is 4 octets long (RFC 3550 6.6).
pub fn looks_like_rtcp(data: &[u8]) -> bool {
    data.len() >= 4 && data[0] >> 6 == 2 && (192..=223).contains(&data[1])
}

/// Builds an RTP packet; used by the sender, tests, benches and fuzz seeds. Strict in what we emit:
/// version 2, no padding, no extension.
pub fn write_packet(
    out: &mut Vec<u8>,
    marker: bool,
    payload_type: u8,
    sequence: u16,
    timestamp: u32,
    ssrc: u32,
    payload: &[u8],
) {
    out.push(0x80);
    out.push(payload_type & 0x7f | if marker { 0x80 } else { 0 });
    out.extend_from_slice(&sequence.to_be_bytes());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&ssrc.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Whether RTP timestamp `a` is after `b` (RFC 3550 5.1: timestamps wrap, so modulo 2^32,
/// the nearer way round).
#[inline]
pub fn ts_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(b0: u8) -> Vec<u8> {
        vec![b0, 98, 0x12, 0x34, 0, 0, 0x03, 0xe8, 0xde, 0xad, 0xbe, 0xef]
    }

    #[test]
    fn parses_fixed_header_and_payload() {
        let mut d = Vec::new();
        write_packet(&mut d, true, 98, 0x1234, 1000, 0xdeadbeef, b"hi");
        let p = RtpPacket::parse(&d).unwrap();
        assert!(p.marker);
        assert_eq!(p.payload_type, 98);
        assert_eq!(p.sequence, 0x1234);
        assert_eq!(p.timestamp, 1000);
        assert_eq!(p.ssrc, 0xdeadbeef);
        assert_eq!(p.payload, b"hi");
        assert_eq!(p.csrcs().len(), 0);
        assert!(p.extension.is_none());
    }

    #[test]
    fn parses_csrc_extension_and_padding_together() {
        let mut d = header(0x80 | 0x20 | 0x10 | 2);
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&2u32.to_be_bytes());
        d.extend_from_slice(&[0xbe, 0xde, 0, 1, 0x10, 0xaa, 0, 0]);
        d.extend_from_slice(b"text");
        d.extend_from_slice(&[0, 0, 3]);
        let p = RtpPacket::parse(&d).unwrap();
        assert_eq!(p.csrcs().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(p.extension, Some((0xbede, &[0x10, 0xaa, 0, 0][..])));
        assert_eq!(p.payload, b"text");
    }

    #[test]
    fn rejects_bad_versions_and_short_packets() {
        assert_eq!(
            RtpPacket::parse(&[0x80; 11]).unwrap_err(),
            RtpError::TooShort
        );
        for v in [0x00u8, 0x40, 0xc0] {
            assert_eq!(
                RtpPacket::parse(&header(v)).unwrap_err(),
                RtpError::BadVersion
            );
        }
    }

    /// Regression: the webrtc-rs `rtp` crate 0.17.2 panics ("advance out of bounds" /
    /// "split_to out of bounds") on these malformed extensions; here they are counted drops.
    #[test]
    fn malformed_extensions_are_errors_not_panics() {
        // X bit set but no room for the extension header.
        let d = header(0x90);
        assert_eq!(
            RtpPacket::parse(&d).unwrap_err(),
            RtpError::ExtensionOverrun
        );
        // Extension length of 0xffff words with 4 bytes of data.
        let mut d = header(0x90);
        d.extend_from_slice(&[0xbe, 0xde, 0xff, 0xff, 1, 2, 3, 4]);
        assert_eq!(
            RtpPacket::parse(&d).unwrap_err(),
            RtpError::ExtensionOverrun
        );
        // Extension length one word too long.
        let mut d = header(0x90);
        d.extend_from_slice(&[0x10, 0x00, 0, 2, 1, 2, 3, 4]);
        assert_eq!(
            RtpPacket::parse(&d).unwrap_err(),
            RtpError::ExtensionOverrun
        );
        // CSRC count 15 in a short datagram.
        assert_eq!(
            RtpPacket::parse(&header(0x8f)).unwrap_err(),
            RtpError::CsrcOverrun
        );
    }

    #[test]
    fn bad_padding_is_rejected() {
        let mut d = header(0xa0);
        d.extend_from_slice(b"ab");
        d.push(9);
        assert_eq!(RtpPacket::parse(&d).unwrap_err(), RtpError::BadPadding);
        let mut d = header(0xa0);
        d.push(0);
        assert_eq!(RtpPacket::parse(&d).unwrap_err(), RtpError::BadPadding);
        // Padding that consumes exactly the payload leaves it empty.
        let mut d = header(0xa0);
        d.extend_from_slice(&[0, 2]);
        assert_eq!(RtpPacket::parse(&d).unwrap().payload, b"");
    }

    #[test]
    fn rtcp_is_told_apart_per_rfc5761() {
        let sr = [0x80, 200, 0, 6, 0, 0, 0, 1];
        let bye = [0x81, 203, 0, 1, 0, 0, 0, 1];
        assert!(looks_like_rtcp(&sr));
        assert!(looks_like_rtcp(&bye));
        assert!(
            looks_like_rtcp(&bye[..4]),
            "a BYE with no sources (RFC 3550 6.6)"
        );
        assert!(!looks_like_rtcp(&bye[..3]));
        let mut d = Vec::new();
        write_packet(&mut d, true, 98, 1, 1, 1, b"x");
        assert!(!looks_like_rtcp(&d));
        write_packet(&mut d, true, 100, 1, 1, 1, b"x");
        assert!(!looks_like_rtcp(&d[13..]));
    }
}
