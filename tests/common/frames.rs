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

/// A classic little-endian microsecond pcap (LINKTYPE_NULL: BSD loopback) of IPv4/UDP
/// datagrams between ports of 127.0.0.1: (time in µs, source port, destination port, payload).
pub fn pcap_loopback<'a>(records: impl IntoIterator<Item = (u64, u16, u16, &'a [u8])>) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&262_144u32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes()); // LINKTYPE_NULL
    for (us, sport, dport, payload) in records {
        let mut data = 2u32.to_le_bytes().to_vec(); // AF_INET
        data.extend(udp_ipv4(
            [127, 0, 0, 1],
            sport,
            [127, 0, 0, 1],
            dport,
            payload,
        ));
        f.extend_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
        f.extend_from_slice(&((us % 1_000_000) as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&data);
    }
    f
}

/// [`pcap_loopback`] of (time in µs, destination port, UDP payload), each from port 40000.
pub fn pcap_to(packets: &[(u64, u16, Vec<u8>)]) -> Vec<u8> {
    pcap_loopback(
        packets
            .iter()
            .map(|(us, port, p)| (*us, 40000, *port, &p[..])),
    )
}

/// `pvp-t140 replay` of `capture` (written to a scratch file named for `name`) with `args`:
/// exit code, stdout, stderr.
pub fn replay(name: &str, capture: &[u8], args: &[&str]) -> (Option<i32>, String, String) {
    let path = std::env::temp_dir().join(format!(
        "pvp-t140-replay-{name}-{}-{}.pcap",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("main")
            .replace("::", "-")
    ));
    std::fs::write(&path, capture).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .args(args)
        .output()
        .expect("run pvp-t140 replay");
    std::fs::remove_file(&path).ok();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
