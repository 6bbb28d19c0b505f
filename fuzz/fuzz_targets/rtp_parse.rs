//! RTP parsing against an independent reference model of RFC 3550 section 5.1.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvp_t140::rtp::{RtpError, RtpPacket, looks_like_rtcp, write_packet};

/// Payload range or error, computed independently of the code under test.
fn reference(d: &[u8]) -> Result<(usize, usize), RtpError> {
    if d.len() < 12 {
        return Err(RtpError::TooShort);
    }
    if d[0] & 0xc0 != 0x80 {
        return Err(RtpError::BadVersion);
    }
    let mut start = 12 + 4 * usize::from(d[0] & 0x0f);
    if start > d.len() {
        return Err(RtpError::CsrcOverrun);
    }
    if d[0] & 0x10 != 0 {
        if d.len() - start < 4 {
            return Err(RtpError::ExtensionOverrun);
        }
        let words = usize::from(d[start + 2]) << 8 | usize::from(d[start + 3]);
        if d.len() - start - 4 < 4 * words {
            return Err(RtpError::ExtensionOverrun);
        }
        start += 4 + 4 * words;
    }
    let mut end = d.len();
    if d[0] & 0x20 != 0 {
        let pad = usize::from(d[d.len() - 1]);
        if pad == 0 || pad > end - start {
            return Err(RtpError::BadPadding);
        }
        end -= pad;
    }
    Ok((start, end))
}

fuzz_target!(|data: &[u8]| {
    let _ = looks_like_rtcp(data);
    let got = RtpPacket::parse(data);
    match (reference(data), got) {
        (Err(want), Err(e)) => assert_eq!(want, e),
        (Ok((start, end)), Ok(p)) => {
            assert_eq!(p.payload, &data[start..end]);
            assert_eq!(p.payload_type, data[1] & 0x7f);
            assert_eq!(p.marker, data[1] & 0x80 != 0);
            assert_eq!(p.sequence, u16::from_be_bytes([data[2], data[3]]));
            assert_eq!(
                p.ssrc,
                u32::from_be_bytes([data[8], data[9], data[10], data[11]])
            );
            let csrcs: Vec<u32> = p.csrcs().collect();
            assert_eq!(csrcs.len(), usize::from(data[0] & 0x0f));
            for (i, c) in csrcs.iter().enumerate() {
                let o = 12 + 4 * i;
                assert_eq!(c.to_be_bytes(), data[o..o + 4]);
            }
            assert_eq!(p.extension.is_some(), data[0] & 0x10 != 0);
            if let Some((_, ext)) = p.extension {
                assert_eq!(ext.len() % 4, 0);
            }
            // A plain packet (no CSRC, extension or padding) is rebuilt byte for byte.
            if data[0] & 0x3f == 0 {
                let mut out = Vec::new();
                let (m, pt, seq, ts, ssrc) =
                    (p.marker, p.payload_type, p.sequence, p.timestamp, p.ssrc);
                write_packet(&mut out, m, pt, seq, ts, ssrc, p.payload);
                assert_eq!(out, data);
            }
        }
        (want, got) => panic!("reference {want:?} != parsed {got:?}"),
    }
});
