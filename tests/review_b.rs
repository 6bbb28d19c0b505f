//! Review b: pcap/pcapng reading and replay, cases found in review (see the commit messages).

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
/// Captured Packet Length a bit flip made larger than the block, an NRB without its end
/// record) is whole in the file: a corrupt record, as Wireshark reports it. pcap-parser says
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
