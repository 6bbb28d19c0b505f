//! What replay skips is counted apart and said (link types it does not read, UDP that is not
//! valid, records on no interface, a port that matched nothing), and a file that is no capture
//! or a compressed one is refused in words.
//!
//! Found by review at (session 46).

use pvp_t140::capture::{CaptureStats, Datagram, read_udp_from};

#[path = "common/frames.rs"]
mod frames;
#[path = "common/pcapng.rs"]
mod pcapng;
use frames::udp_ipv4;

/// A little-endian microsecond pcap of `link` frames: (time in µs, frame).
fn pcap(link: u32, frames: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&262_144u32.to_le_bytes());
    f.extend_from_slice(&link.to_le_bytes());
    for (us, data) in frames {
        f.extend_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
        f.extend_from_slice(&((us % 1_000_000) as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(data);
    }
    f
}

fn rtp(seq: u16, text: &str) -> Vec<u8> {
    let mut p = vec![0x80, 0x80 | 98];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&(u32::from(seq) * 300).to_be_bytes());
    p.extend_from_slice(&0x1234u32.to_be_bytes());
    p.extend_from_slice(text.as_bytes());
    p
}

fn ip(payload: &[u8]) -> Vec<u8> {
    udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, payload)
}

fn read(bytes: &[u8]) -> (Vec<Datagram>, CaptureStats) {
    let mut got = Vec::new();
    let stats = read_udp_from(bytes, &mut |d| got.push(d)).expect("a readable capture");
    (got, stats)
}

/// `pvp-t140 replay` of `capture`: exit code, stdout, stderr.
fn replay(name: &str, capture: &[u8]) -> (Option<i32>, String, String) {
    frames::replay(name, capture, &[])
}

/// Found by review at (session 46). A capture of a link type replay does not read (here
/// LINKTYPE_NFLOG, 239, what `tcpdump -i nflog:N` writes for iptables' NFLOG target; its
/// decoder is left out since pcap-parser's panics on malformed frames) replayed to nothing,
/// exit 0, its frames counted in `skipped` with ARP and TCP and said only as `skipped=N` at
/// info level: no word that the capture's link layer was the cause. They are counted apart,
/// with the link type, and warned about.
#[test]
fn frames_of_a_link_type_replay_does_not_read_are_counted_apart_and_warned_about() {
    const LINKTYPE_NFLOG: u32 = 239;
    // NFLOG: family, version, resource id, then TLVs; the IP packet in an NFULA_PAYLOAD TLV.
    let nflog = |payload: &[u8]| {
        let packet = ip(payload);
        let mut f = vec![2, 0, 0, 0];
        f.extend_from_slice(&((4 + packet.len()) as u16).to_le_bytes());
        f.extend_from_slice(&9u16.to_le_bytes());
        f.extend_from_slice(&packet);
        while f.len() % 4 != 0 {
            f.push(0);
        }
        f
    };
    let capture = pcap(
        LINKTYPE_NFLOG,
        &[
            (1_000_000, nflog(&rtp(1, "Hello there."))),
            (1_300_000, nflog(&rtp(2, " Bye."))),
        ],
    );
    let (got, stats) = read(&capture);
    assert!(got.is_empty());
    assert_eq!((stats.frames, stats.skipped), (2, 2));
    assert_eq!(stats.unsupported_link, 2, "{stats:?}");
    assert_eq!(stats.unsupported_link_type, Some(239), "{stats:?}");

    let (code, out, err) = replay("nflog", &capture);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("link type") && err.contains("239") && err.contains("frames=2"),
        "{err}"
    );
}

fn ethernet(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
    f.extend_from_slice(ip);
    f
}

/// Found by review at (session 46). A UDP datagram whose record is whole but whose UDP Length
/// runs past its IP packet (or is under 8 over IPv4), a datagram the receiving host's stack
/// drops and the live gateway never read, was skipped as it should be but counted only in
/// `skipped`, with ARP and TCP: replay said nothing of it, though a capture of such datagrams
/// (a sender writing its own UDP headers wrong) replays to nothing. They are counted apart, as
/// the datagrams cut by the snap length are, and warned about.
#[test]
fn whole_udp_datagrams_with_a_bad_length_are_counted_apart_and_warned_about() {
    let good = ip(&rtp(1, "Hello there."));
    let mut long = ip(&rtp(2, " Lost."));
    // UDP Length 10 bytes past the IP packet's payload.
    let ulen = u16::from_be_bytes([long[24], long[25]]) + 10;
    long[24..26].copy_from_slice(&ulen.to_be_bytes());
    let mut short = ip(&rtp(3, " Lost too."));
    short[24..26].copy_from_slice(&4u16.to_be_bytes());
    let mut arp = vec![0xff; 12];
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    let capture = pcap(
        1,
        &[
            (1_000_000, ethernet(&good)),
            (1_100_000, ethernet(&long)),
            (1_200_000, ethernet(&short)),
            (1_300_000, arp),
        ],
    );
    let (got, stats) = read(&capture);
    assert_eq!(got.len(), 1);
    assert_eq!((stats.frames, stats.udp, stats.skipped), (4, 1, 3));
    assert_eq!(stats.udp_malformed, 2, "{stats:?}");
    assert_eq!((stats.cut_by_snaplen, stats.unsupported_link), (0, 0));

    let (code, out, err) = replay("udp-length", &capture);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Hello there."), "{out}");
    assert!(
        err.contains("not valid UDP") && err.contains("datagrams=2"),
        "{err}"
    );
}

/// Found by review at (session 46). A compressed capture (`capture.pcapng.gz`: Wireshark,
/// tshark and dumpcap write and read gzip, zstd and lz4 captures; rotated tcpdump captures are
/// often gzipped) or any file that is no capture was refused with pcap-parser's own word,
/// "not a readable pcap/pcapng capture: HeaderNotRecognized", which says neither what the file
/// is nor what to do. A compressed one says how it was compressed and to decompress it; any
/// other, that its first bytes are no pcap or pcapng header.
#[test]
fn a_compressed_capture_says_to_decompress_it() {
    let capture = pcap(1, &[(1_000_000, ethernet(&ip(&rtp(1, "Hello."))))]);
    // A gzip member header (RFC 1952), the rest as a stored deflate block would be.
    let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1];
    gz.extend_from_slice(&(capture.len() as u16).to_le_bytes());
    gz.extend_from_slice(&(!(capture.len() as u16)).to_le_bytes());
    gz.extend_from_slice(&capture);
    let mut zstd = vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0x58];
    zstd.extend_from_slice(&capture);
    for (name, bytes, word) in [("gz", &gz, "gzip"), ("zst", &zstd, "zstd")] {
        let (code, out, err) = replay(name, bytes);
        assert_eq!(code, Some(1), "{err}");
        assert!(out.is_empty());
        assert!(
            err.contains(&format!("compressed with {word}")) && err.contains("decompress it"),
            "{name}: {err}"
        );
        assert!(!err.contains("HeaderNotRecognized"), "{err}");
    }
    let (code, _, err) = replay("text", b"this is not a capture file at all\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("not a readable pcap/pcapng capture")
            && err.contains("no pcap or pcapng header")
            && !err.contains("HeaderNotRecognized"),
        "{err}"
    );
}

/// Found by review at (session 46). `replay --port N` of a capture whose datagrams all went to
/// another port (a port mistyped, or the sender's side given for the gateway's) replayed
/// nothing, exit 0, and the datagrams it left out were counted nowhere: the log said
/// `udp=2` and `datagrams=0` and left the user to work out why. They are counted, and a replay
/// that `--port` left with nothing says so, with how many went elsewhere.
#[test]
fn a_port_that_no_datagram_went_to_says_so() {
    let capture = pcap(
        1,
        &[
            (1_000_000, ethernet(&ip(&rtp(1, "Hello there.")))),
            (1_300_000, ethernet(&ip(&rtp(2, " Bye.")))),
        ],
    );
    let (code, out, err) = frames::replay("port", &capture, &["--port", "5006"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("--port 5006 left out every UDP datagram") && err.contains("datagrams=2"),
        "{err}"
    );
    // To the port: replayed, and nothing said.
    let (code, out, err) = frames::replay("port-right", &capture, &["--port", "5004"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Hello there."), "{out}");
    assert!(!err.contains("left out every UDP datagram"), "{err}");
}

/// Found by review at (session 46). A pcapng packet record on an interface its section did not
/// describe (no Interface Description Block before it, or an interface id past the last: a
/// writer's bug, or blocks spliced from two captures; Wireshark refuses such a file) carries
/// no link type and no time unit, so it cannot be read: it was skipped, counted only in
/// `skipped` with ARP and TCP, and replay said nothing, though the text in it is lost. Such
/// records are counted apart and warned about.
#[test]
fn packets_on_an_interface_the_section_did_not_describe_are_counted_apart_and_warned_about() {
    let mut ng = pcapng::Ng::new(true);
    ng.idb(1, &[]);
    let good = ethernet(&ip(&rtp(1, "Hello there.")));
    let lost = ethernet(&ip(&rtp(2, " Lost.")));
    ng.epb(0, 1_000_000, &good, good.len());
    ng.epb(3, 1_300_000, &lost, lost.len());
    let (got, stats) = read(&ng.out);
    assert_eq!(got.len(), 1);
    assert_eq!((stats.frames, stats.skipped), (2, 1));
    assert_eq!(stats.no_interface, 1, "{stats:?}");

    let (code, out, err) = replay("no-interface", &ng.out);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Hello there."), "{out}");
    assert!(
        err.contains("interface") && err.contains("not describe") && err.contains("records=1"),
        "{err}"
    );
}
