//! Hand-made packets for the capture and replay tests; included by path.
#![allow(dead_code)]

/// An IPv4/UDP packet (no options, no checksums) carrying `payload`.
pub fn udp_ipv4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = vec![
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        1,
        0x40,
        0,
        64,
        17,
        0,
        0,
    ];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    let ulen = 8 + payload.len();
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&(ulen as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]); // no checksum
    p.extend_from_slice(payload);
    p
}
