//! Capture formats and link layers `replay` reads, and damaged captures it must refuse at the
//! damage, written byte by byte (review b, session 39; the commit messages say why each).

use std::net::SocketAddr;

use pvp_t140::capture::{CaptureError, CaptureStats, Datagram, read_udp_from};

#[path = "common/frames.rs"]
mod frames;
use frames::udp_ipv4;

const LINKTYPE_ETHERNET: u16 = 1;

fn ethernet(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
    f.extend_from_slice(ip);
    f
}

fn frame(payload: &[u8]) -> Vec<u8> {
    ethernet(&udp_ipv4(
        [127, 0, 0, 1],
        40000,
        [127, 0, 0, 1],
        5004,
        payload,
    ))
}

/// pcapng writer in either byte order.
struct Ng {
    le: bool,
    out: Vec<u8>,
}

impl Ng {
    fn new(le: bool) -> Self {
        let mut ng = Ng {
            le,
            out: Vec::new(),
        };
        ng.shb();
        ng
    }
    fn shb(&mut self) {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(0x1a2b_3c4d));
        body.extend_from_slice(&self.u16(1));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&self.u64(u64::MAX));
        self.block(0x0a0d_0d0a, &body);
    }
    fn u16(&self, v: u16) -> [u8; 2] {
        if self.le {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
    fn u32(&self, v: u32) -> [u8; 4] {
        if self.le {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
    fn u64(&self, v: u64) -> [u8; 8] {
        if self.le {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
    fn block(&mut self, kind: u32, body: &[u8]) {
        let len = (12 + body.len()) as u32;
        assert_eq!(len % 4, 0);
        let (k, l) = (self.u32(kind), self.u32(len));
        self.out.extend_from_slice(&k);
        self.out.extend_from_slice(&l);
        self.out.extend_from_slice(body);
        self.out.extend_from_slice(&l);
    }
    fn idb(&mut self, linktype: u16) {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u16(linktype));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&self.u32(262_144));
        self.block(1, &body);
    }
    fn epb_body(&self, if_id: u32, us: u64, data: &[u8], caplen: u32) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(if_id));
        body.extend_from_slice(&self.u32((us >> 32) as u32));
        body.extend_from_slice(&self.u32(us as u32));
        body.extend_from_slice(&self.u32(caplen));
        body.extend_from_slice(&self.u32(data.len() as u32));
        body.extend_from_slice(data);
        while body.len() % 4 != 0 {
            body.push(0);
        }
        body
    }
    fn epb(&mut self, us: u64, data: &[u8]) {
        let body = self.epb_body(0, us, data, data.len() as u32);
        self.block(6, &body);
    }
}

fn read(bytes: &[u8]) -> Result<(Vec<Datagram>, CaptureStats), CaptureError> {
    let mut got = Vec::new();
    let stats = read_udp_from(bytes, &mut |d| got.push(d))?;
    Ok((got, stats))
}

#[allow(dead_code)]
fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A pcapng block whose contents claim more than its Block Total Length holds (an EPB whose
/// Captured Packet Length a bit flip made larger than the block) is whole in the file: a
/// corrupt record, as Wireshark reports it. (An NRB without its end record, which Wireshark
/// reads, is skipped: replay uses no block but the section's, interfaces' and packets'.) pcap-parser says
/// it needs more bytes, and the reader read on to the end of the file and called the capture
/// "cut short inside its last record" (a warning, exit status 0), dropping every record after
/// the bad one without an error.
#[test]
fn a_pcapng_block_overrunning_its_own_length_is_corrupt_not_a_capture_cut_short() {
    for le in [true, false] {
        for bad in ["epb", "nrb"] {
            let mut ng = Ng::new(le);
            ng.idb(LINKTYPE_ETHERNET);
            ng.epb(1_000_000, &frame(b"before"));
            let f = frame(b"the bad one");
            match bad {
                "epb" => {
                    // Caplen 64 bytes more than the block holds.
                    let body = ng.epb_body(0, 2_000_000, &f, f.len() as u32 + 64);
                    ng.block(6, &body);
                }
                _ => {
                    // An IPv4 record (type 1) of 8 bytes, and no end-of-records record.
                    let mut body = Vec::new();
                    body.extend_from_slice(&ng.u16(1));
                    body.extend_from_slice(&ng.u16(8));
                    body.extend_from_slice(&[127, 0, 0, 1, b'l', b'o', 0, 0]);
                    ng.block(4, &body);
                }
            }
            for i in 0..3 {
                ng.epb(3_000_000 + i, &frame(b"after"));
            }
            let what = format!("{bad}, little-endian: {le}");
            if bad == "nrb" {
                // A block replay does not use, whose two lengths agree, is skipped (review h:
                // Wireshark reads an NRB without its end record).
                let (got, stats) = read(&ng.out).expect(&what);
                assert_eq!((got.len(), stats.frames), (4, 4), "{what}");
                continue;
            }
            match read(&ng.out) {
                Err(CaptureError::Corrupt { after, .. }) => {
                    assert!((1..=2).contains(&after), "{what}: after {after}")
                }
                other => panic!("{what}: a corrupt block must be an error, got {other:?}"),
            }
        }
    }
}

/// Classic little-endian microsecond pcap of Ethernet frames, (µs, frame).
fn pcap(frames: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&262_144u32.to_le_bytes());
    f.extend_from_slice(&u32::from(LINKTYPE_ETHERNET).to_le_bytes());
    for (us, data) in frames {
        pcap_record(&mut f, *us, data, data.len() as u32);
    }
    f
}

fn pcap_record(f: &mut Vec<u8>, us: u64, data: &[u8], caplen: u32) {
    f.extend_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
    f.extend_from_slice(&((us % 1_000_000) as u32).to_le_bytes());
    f.extend_from_slice(&caplen.to_le_bytes());
    f.extend_from_slice(&(data.len() as u32).to_le_bytes());
    f.extend_from_slice(data);
}

/// A pcap record whose captured length a bit flip made 1 MiB larger: more than libpcap
/// writes or reads (262,144 bytes: tcpdump refuses the file there, "invalid packet capture
/// length"), so a corrupt record. The reader took the records after it as its bytes, ran out
/// of file, and called the capture "cut short inside its last record" (a warning, exit
/// status 0): the datagrams after the damage silently gone.
#[test]
fn a_pcap_record_longer_than_any_snap_length_is_corrupt_not_a_capture_cut_short() {
    let mut file = pcap(&[(1_000_000, frame(b"before"))]);
    let bad = frame(b"the bad one");
    pcap_record(&mut file, 2_000_000, &bad, bad.len() as u32 | 0x10_0000);
    for i in 0..3 {
        pcap_record(
            &mut file,
            3_000_000 + i,
            &frame(b"after"),
            frame(b"after").len() as u32,
        );
    }
    match read(&file) {
        Err(CaptureError::Corrupt { after: 1, detail }) => {
            assert!(detail.contains("262144"), "{detail}")
        }
        other => panic!("a corrupt record must be an error, got {other:?}"),
    }
    // The largest a snap length gives is still read.
    let big = ethernet(&udp_ipv4(
        [127, 0, 0, 1],
        40001,
        [127, 0, 0, 1],
        9999,
        &vec![b'x'; 65_507],
    ));
    let mut file = pcap(&[(1_000_000, frame(b"before"))]);
    let mut huge = big.clone();
    huge.resize(262_144, 0);
    pcap_record(&mut file, 2_000_000, &huge, 262_144);
    pcap_record(
        &mut file,
        3_000_000,
        &frame(b"after"),
        frame(b"after").len() as u32,
    );
    let (got, stats) = read(&file).expect("readable");
    assert_eq!((stats.frames, stats.udp), (3, 3), "{stats:?}");
    assert_eq!(got[2].payload, b"after");
}

/// Runs `pvp-t140 replay` on a file: stdout.
fn replay_file(path: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(path)
        .args(args)
        .output()
        .expect("run pvp-t140 replay");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The README says what of a replay's output varies from run to run: only the random part of
/// each message id (a ULID whose first 10 characters are its time, the capture's). Two runs
/// must give the same bytes once those 16 characters are masked, and the ids must differ in
/// them (the spec's ids are globally unique: a replay run twice into one server is two sets
/// of messages).
#[test]
fn replaying_a_capture_twice_differs_only_in_the_random_part_of_the_message_ids() {
    let pcaps = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pcaps");
    for name in ["two_ssrc.pcap", "rtcp.pcap", "single_any.pcapng"] {
        let (a, b) = (
            replay_file(&pcaps.join(name), &[]),
            replay_file(&pcaps.join(name), &[]),
        );
        assert!(!a.is_empty(), "{name}");
        let masked = |s: &str| -> (String, Vec<String>) {
            let mut out = String::new();
            let mut random = Vec::new();
            for line in s.lines() {
                let i = line.find("\"id\":\"").expect("an id") + 6;
                let id = &line[i..i + 26];
                random.push(id[10..].to_owned());
                out.push_str(&line[..i + 10]);
                out.push_str(&line[i + 26..]);
                out.push('\n');
            }
            (out, random)
        };
        let ((ma, ra), (mb, rb)) = (masked(&a), masked(&b));
        assert_eq!(ma, mb, "{name}: more than the ids' random part varies");
        assert!(ra.iter().zip(&rb).all(|(x, y)| x != y), "{name}");
    }
}

/// A classic pcap in either byte order and time unit: (seconds, fraction, frame).
fn pcap_of(be: bool, nanos: bool, linktype: u32, frames: &[(u32, u32, Vec<u8>)]) -> Vec<u8> {
    let u32b = |v: u32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let u16b = |v: u16| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let mut f = Vec::new();
    f.extend_from_slice(&u32b(if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
    f.extend_from_slice(&u16b(2));
    f.extend_from_slice(&u16b(4));
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&u32b(262_144));
    f.extend_from_slice(&u32b(linktype));
    for (s, frac, data) in frames {
        f.extend_from_slice(&u32b(*s));
        f.extend_from_slice(&u32b(*frac));
        f.extend_from_slice(&u32b(data.len() as u32));
        f.extend_from_slice(&u32b(data.len() as u32));
        f.extend_from_slice(data);
    }
    f
}

/// An IPv6/UDP packet behind `exts` (each an extension header body of 6 bytes + padding to
/// 8, chained by `next`), from [::1]:40000 to [::1]:5004.
fn udp_ipv6(exts: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut udp = Vec::new();
    udp.extend_from_slice(&40000u16.to_be_bytes());
    udp.extend_from_slice(&5004u16.to_be_bytes());
    udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    // Chain: exts are next-header codes of 8-byte extension headers.
    let mut chain = Vec::new();
    for (i, _) in exts.iter().enumerate() {
        let next = exts.get(i + 1).copied().unwrap_or(17);
        chain.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]); // PadN of 4
    }
    let first = exts.first().copied().unwrap_or(17);
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&((chain.len() + udp.len()) as u16).to_be_bytes());
    p.push(first);
    p.push(64);
    let mut lo = [0u8; 16];
    lo[15] = 1;
    p.extend_from_slice(&lo);
    p.extend_from_slice(&lo);
    p.extend_from_slice(&chain);
    p.extend_from_slice(&udp);
    p
}

/// What the README promises replay reads, each checked once: both pcap byte orders in micro-
/// and nanoseconds; BSD loopback with either IPv6 family value and byte order; raw IP (101,
/// 228, 229); 802.1Q and QinQ; IPv4 options; IPv6 extension headers before UDP; Ethernet
/// padding and bytes past the UDP Length left out; a pcapng with two interfaces of different
/// link types and resolutions, blocks of unknown type, and a second section in the other byte
/// order.
#[test]
fn the_formats_and_link_layers_replay_reads() {
    let v4 = |p: &[u8]| udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, p);
    for be in [false, true] {
        for nanos in [false, true] {
            let frac = if nanos { 250_000_000 } else { 250_000 };
            let file = pcap_of(be, nanos, 1, &[(7, frac, ethernet(&v4(b"x")))]);
            let (got, _) = read(&file).unwrap();
            assert_eq!(got[0].time.0, 7_250_000, "be {be} nanos {nanos}");
        }
    }
    // BSD loopback: AF_INET 2; AF_INET6 24, 28, 30; the host's byte order.
    let null = |family: u32, be: bool, ip: Vec<u8>| {
        let mut f = if be {
            family.to_be_bytes()
        } else {
            family.to_le_bytes()
        }
        .to_vec();
        f.extend(ip);
        f
    };
    let frames = vec![
        (1, 0, null(2, false, v4(b"a"))),
        (2, 0, null(30, false, udp_ipv6(&[], b"b"))),
        (3, 0, null(24, true, udp_ipv6(&[], b"c"))),
        (4, 0, null(28, false, udp_ipv6(&[0, 60], b"d"))), // hop-by-hop, dest options
    ];
    let (got, s) = read(&pcap_of(false, false, 0, &frames)).unwrap();
    let texts: Vec<&[u8]> = got.iter().map(|d| &d.payload[..]).collect();
    assert_eq!(texts, [b"a", b"b", b"c", b"d"], "{s:?}");
    assert_eq!(got[1].source, addr("[::1]:40000"));
    for (lt, ip) in [
        (101, v4(b"r")),
        (228, v4(b"r")),
        (229, udp_ipv6(&[43], b"r")),
    ] {
        let (got, s) = read(&pcap_of(false, false, lt, &[(1, 0, ip)])).unwrap();
        assert_eq!(got.len(), 1, "linktype {lt}: {s:?}");
        assert_eq!(got[0].payload, b"r");
    }
    // QinQ, then IPv4 options (IHL 6, a NOP-padded option), Ethernet padding, a UDP Length
    // shorter than the IP payload.
    let mut qinq = vec![0; 12];
    qinq.extend_from_slice(&[0x88, 0xa8, 0, 10, 0x81, 0x00, 0, 20, 0x08, 0x00]);
    qinq.extend(v4(b"q"));
    let mut opts = v4(b"o");
    opts[0] = 0x46;
    opts.splice(20..20, [1, 1, 1, 0]);
    let total = opts.len() as u16;
    opts[2..4].copy_from_slice(&total.to_be_bytes());
    let mut padded = ethernet(&v4(b"p"));
    padded.resize(60, 0xee);
    let mut short_udp = v4(b"uvwxyz");
    short_udp[24..26].copy_from_slice(&9u16.to_be_bytes()); // UDP Length 9: "u" only
    let frames = vec![
        (1, 0, qinq),
        (2, 0, ethernet(&opts)),
        (3, 0, padded),
        (4, 0, ethernet(&short_udp)),
    ];
    let (got, s) = read(&pcap_of(false, false, 1, &frames)).unwrap();
    let texts: Vec<&[u8]> = got.iter().map(|d| &d.payload[..]).collect();
    assert_eq!(texts, [b"q", b"o", b"p", b"u"], "{s:?}");

    // pcapng: interface 0 Ethernet in µs, interface 1 raw IP in ns; unknown blocks; then a
    // big-endian section whose interface 0 is raw IP.
    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET);
    let mut idb = Vec::new();
    idb.extend_from_slice(&ng.u16(101));
    idb.extend_from_slice(&ng.u16(0));
    idb.extend_from_slice(&ng.u32(0));
    idb.extend_from_slice(&ng.u16(9)); // if_tsresol
    idb.extend_from_slice(&ng.u16(1));
    idb.extend_from_slice(&[9, 0, 0, 0]);
    idb.extend_from_slice(&[0; 4]); // opt_endofopt
    ng.block(1, &idb);
    ng.epb(1_000_000, &ethernet(&v4(b"e")));
    ng.block(0x1234_5678, &[1, 2, 3, 4, 5, 6, 7, 8]);
    ng.block(0x8000_4242, &[]);
    let body = ng.epb_body(1, 2_500_000_000, &v4(b"n"), v4(b"n").len() as u32);
    ng.block(6, &body);
    let mut be = Ng::new(false);
    be.idb(101);
    be.epb(3_000_000, &v4(b"B"));
    ng.out.extend_from_slice(&be.out);
    let (got, s) = read(&ng.out).unwrap();
    let got: Vec<(u64, &[u8])> = got.iter().map(|d| (d.time.0, &d.payload[..])).collect();
    assert_eq!(
        got,
        [(1_000_000, &b"e"[..]), (2_500_000, b"n"), (3_000_000, b"B")],
        "{s:?}"
    );
}

/// A pcap header's link type field holds the link type in its low 16 bits; the high bits may
/// say the frames end in an FCS (the pcap spec, draft-ietf-opsawg-pcap section 4: FCS length
/// in bits 28-31, its presence in bit 26; libpcap's LT_LINKTYPE masks them off, and so does
/// Wireshark). An Ethernet capture with FCS (0x2400_0001: two 16-bit words) is Ethernet.
#[test]
fn a_pcap_link_type_with_the_fcs_bits_set_is_still_its_link_type() {
    let mut f = ethernet(&udp_ipv4(
        [127, 0, 0, 1],
        40000,
        [127, 0, 0, 1],
        5004,
        b"fcs",
    ));
    f.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    let file = pcap_of(false, false, 0x2400_0001, &[(1, 0, f)]);
    let (got, s) = read(&file).unwrap();
    assert_eq!(got.len(), 1, "{s:?}");
    assert_eq!(got[0].payload, b"fcs");
}

/// An empty file (tcpdump killed before it wrote its buffer) and one cut inside its file
/// header are not captures: the error must say which, not pcap-parser's "Eof" or
/// "Incomplete(2)".
#[test]
fn an_empty_capture_or_one_cut_in_its_header_says_so() {
    let whole = pcap(&[(1_000_000, frame(b"x"))]);
    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET);
    for (bytes, says) in [
        (&whole[..0], "empty"),
        (&whole[..10], "ends inside its header"),
        (&ng.out[..20], "ends inside its header"),
        (&ng.out[..2], "ends inside its header"),
    ] {
        let err = read(bytes).expect_err("not a capture");
        assert!(
            matches!(err, CaptureError::Format(_)) && err.to_string().contains(says),
            "{err}"
        );
    }
}

/// OpenBSD's loopback (`tcpdump -i lo0`) is LINKTYPE_LOOP (108): BSD loopback with its
/// address family in network byte order (AF_INET 2, AF_INET6 24). The README's "BSD loopback"
/// took only LINKTYPE_NULL (0), and skipped every frame of such a capture.
#[test]
fn an_openbsd_loopback_capture_is_read() {
    let mut a = 2u32.to_be_bytes().to_vec();
    a.extend(udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"a"));
    let mut b = 24u32.to_be_bytes().to_vec();
    b.extend(udp_ipv6(&[], b"b"));
    let file = pcap_of(true, false, 108, &[(1, 0, a), (2, 0, b)]);
    let (got, s) = read(&file).unwrap();
    let texts: Vec<&[u8]> = got.iter().map(|d| &d.payload[..]).collect();
    assert_eq!(texts, [b"a", b"b"], "{s:?}");
}

/// An IPv6 atomic fragment (a Fragment header with offset 0 and no more fragments, RFC 6946:
/// a whole datagram) is read as the datagram it is.
#[test]
fn an_ipv6_atomic_fragment_is_a_whole_datagram() {
    let mut ip = udp_ipv6(&[], b"atomic");
    ip[6] = 44; // next header: Fragment
    ip.splice(40..40, [17, 0, 0, 0, 0, 0, 0, 7]);
    let len = (ip.len() - 40) as u16;
    ip[4..6].copy_from_slice(&len.to_be_bytes());
    let file = pcap_of(false, false, 101, &[(1, 0, ip)]);
    let (got, s) = read(&file).unwrap();
    assert_eq!(got.len(), 1, "{s:?}");
    assert_eq!(got[0].payload, b"atomic");
}

fn rtp98(seq: u16, text: &str) -> Vec<u8> {
    let mut p = vec![0x80, if seq == 1 { 0x80 | 98 } else { 98 }];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&(u32::from(seq) * 300).to_be_bytes());
    p.extend_from_slice(&0x1234_5678u32.to_be_bytes());
    p.extend_from_slice(text.as_bytes());
    p
}

/// A pcapng interface in whole seconds (if_tsresol 0) stamping near 2^64 units: the time
/// saturates, and the replay must not panic on it (timers, ids, ISO 8601 of the far future).
#[test]
fn a_capture_stamped_at_the_end_of_time_replays_without_a_panic() {
    let mut ng = Ng::new(true);
    let mut idb = Vec::new();
    idb.extend_from_slice(&ng.u16(101));
    idb.extend_from_slice(&ng.u16(0));
    idb.extend_from_slice(&ng.u32(0));
    idb.extend_from_slice(&ng.u16(9));
    idb.extend_from_slice(&ng.u16(1));
    idb.extend_from_slice(&[0, 0, 0, 0]); // 10^0: seconds
    idb.extend_from_slice(&[0; 4]);
    ng.block(1, &idb);
    let ip = |seq, text| {
        udp_ipv4(
            [127, 0, 0, 1],
            40000,
            [127, 0, 0, 1],
            5004,
            &rtp98(seq, text),
        )
    };
    ng.epb(u64::MAX - 10, &ip(1, "Hello "));
    ng.epb(u64::MAX - 5, &ip(2, "there. "));
    ng.epb(u64::MAX, &ip(3, "More"));
    let path = std::env::temp_dir().join(format!(
        "pvp-t140-review-b-eot-{}.pcapng",
        std::process::id()
    ));
    std::fs::write(&path, &ng.out).unwrap();
    let out = replay_file(&path, &[]);
    std::fs::remove_file(&path).ok();
    assert!(out.contains("Hello there."), "{out}");
    assert!(out.contains("More"), "{out}");
}

/// `tcpdump -i any` on a host whose T.140 peer is reached over a GRE tunnel (`ip tunnel add
/// gre1 mode gre`): the tunnel device's packets are cooked with ARPHRD_IPGRE (778), the
/// protocol field a GRE protocol type (0x0800, 0x86DD) and the inner packet after the header
/// (LINKTYPE_LINUX_SLL/SLL2 specs; Wireshark reads them so). pcap-parser takes the payload for
/// a GRE header, and replay skipped every such datagram: the stream was missing from it.
#[test]
fn a_cooked_capture_of_a_gre_tunnel_device_is_read() {
    let ip = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, b"gre");
    // SLL2: protocol, reserved, ifindex, ARPHRD, packet type, address length, address.
    let mut sll2 = vec![0x08, 0x00, 0, 0, 0, 0, 0, 9, 0x03, 0x0a, 0, 0];
    sll2.extend_from_slice(&[0; 8]);
    sll2.extend_from_slice(&ip);
    // SLL: packet type, ARPHRD, address length, address, protocol.
    let mut sll = vec![0, 0, 0x03, 0x0a, 0, 0];
    sll.extend_from_slice(&[0; 8]);
    sll.extend_from_slice(&[0x08, 0x00]);
    sll.extend_from_slice(&ip);
    for (lt, f) in [(276, sll2), (113, sll)] {
        let (got, s) = read(&pcap_of(false, false, lt, &[(1, 0, f)])).unwrap();
        assert_eq!(got.len(), 1, "linktype {lt}: {s:?}");
        assert_eq!(got[0].payload, b"gre");
    }
}

/// A reader that gives at most `n` bytes a read, as a pipe does with what its writer wrote so
/// far (`ssh host cat x.pcapng | pvp-t140 replay /dev/stdin`).
struct Trickle<'a> {
    data: &'a [u8],
    n: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.n.min(buf.len()).min(self.data.len());
        buf[..k].copy_from_slice(&self.data[..k]);
        self.data = &self.data[k..];
        Ok(k)
    }
}

/// pcap-parser decides what the file is from its first read alone: a pipe whose first read
/// held less than the file header (24 bytes) or the Section Header Block made a valid capture
/// "not a readable pcap/pcapng capture". Every later record was already read whatever the
/// reads' sizes.
#[test]
fn a_capture_read_in_small_pieces_is_read_whole() {
    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET);
    ng.epb(1_000_000, &frame(b"ng"));
    let classic = pcap(&[(1_000_000, frame(b"classic"))]);
    for (file, text) in [(&ng.out, &b"ng"[..]), (&classic, &b"classic"[..])] {
        for n in [1, 7, 13] {
            let mut got = Vec::new();
            read_udp_from(Trickle { data: file, n }, &mut |d| got.push(d))
                .unwrap_or_else(|e| panic!("{n}-byte reads: {e}"));
            assert_eq!(got.len(), 1, "{n}-byte reads");
            assert_eq!(got[0].payload, text);
        }
    }
}
