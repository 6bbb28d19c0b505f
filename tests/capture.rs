//! `capture::read_udp_from` on captures written byte by byte: the pcap and pcapng cases real
//! capture tools produce that the fixtures in `pcaps/` do not hold.

use std::net::SocketAddr;

use pvp_t140::capture::{
    CaptureError, CaptureStats, Datagram, Frame, MAX_PENDING_REASSEMBLIES,
    MAX_PENDING_REASSEMBLY_BYTES, read_frames_from, read_udp_from,
};
use pvp_t140::time::Time;

#[path = "common/frames.rs"]
mod frames;
use frames::udp_ipv4;

const LINKTYPE_ETHERNET: u16 = 1;
const LINKTYPE_LINUX_SLL: u16 = 113;
const LINKTYPE_LINUX_SLL2: u16 = 276;

fn ethernet(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
    f.extend_from_slice(ip);
    f
}

/// LINKTYPE_LINUX_SLL2 header (20 bytes) in front of an IPv4 packet, as `tcpdump -i any` writes.
fn sll2(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![
        0x08, 0x00, 0, 0, 0, 0, 0, 1, 0x03, 0x04, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    f.extend_from_slice(ip);
    f
}

/// Classic little-endian microsecond pcap: (seconds, microseconds, frame).
fn pcap(linktype: u16, frames: &[(u32, u32, &[u8])]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&262_144u32.to_le_bytes());
    f.extend_from_slice(&u32::from(linktype).to_le_bytes());
    for (sec, usec, data) in frames {
        f.extend_from_slice(&sec.to_le_bytes());
        f.extend_from_slice(&usec.to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(data);
    }
    f
}

#[path = "common/pcapng.rs"]
mod pcapng;
use pcapng::Ng;

fn read(bytes: &[u8]) -> Result<(Vec<Datagram>, CaptureStats), String> {
    let mut got = Vec::new();
    let stats = read_udp_from(bytes, &mut |d| got.push(d)).map_err(|e| e.to_string())?;
    // Every frame counted once, every datagram handed out counted.
    assert_eq!(
        stats.udp - stats.reassembled + stats.skipped + stats.fragments,
        stats.frames,
        "{stats:?}"
    );
    assert_eq!(stats.udp, got.len() as u64, "{stats:?}");
    Ok((got, stats))
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// pcapng allows a binary timestamp resolution (if_tsresol with the top bit set: 2^-n s,
/// pcapng spec section 4.2); pcap-parser calls it invalid, and taking microseconds instead
/// makes every time wrong. Here 2^-20 s units: 5 * 2^20 units must be exactly 5 s.
#[test]
fn pcapng_binary_if_tsresol_gives_the_right_time() {
    let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"abcd");
    let mut ng = Ng::new(true);
    let tsresol = ng.option(9, &[0x80 | 20]);
    ng.idb(LINKTYPE_ETHERNET, &[tsresol]);
    let frame = ethernet(&ip);
    ng.epb(0, 5 << 20, &frame, frame.len());
    let (got, _) = read(&ng.out).expect("readable");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].time.0, 5_000_000, "5 s in 2^-20 s units");
}

/// if_tsoffset (option 14) is a signed 64-bit integer in the section's byte order (pcap-parser
/// reads it little-endian always). In a big-endian section an offset of 100 s must add 100 s.
#[test]
fn big_endian_pcapng_if_tsoffset_is_read_in_the_sections_byte_order() {
    let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"abcd");
    let mut ng = Ng::new(false);
    let offset = ng.option(14, &100i64.to_be_bytes());
    ng.idb(LINKTYPE_ETHERNET, &[offset]);
    let frame = ethernet(&ip);
    ng.epb(0, 2_000_000, &frame, frame.len()); // 2 s in the default microseconds
    let (got, _) = read(&ng.out).expect("readable");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].time.0, 102_000_000, "100 s offset + 2 s");
}

/// A pcapng packet cut by the snap length (caplen < origlen) by fewer bytes than the EPB's
/// padding to 32 bits: with SLL2 (what `tcpdump -i any` / dumpcap write) the padding zeros
/// must not be read as the datagram's last bytes. The datagram is cut short, so it is
/// skipped (and counted), never delivered as if whole with NULs for its missing text.
#[test]
fn pcapng_sll2_datagram_cut_by_snaplen_is_skipped_not_padded_with_zeros() {
    // 20 (SLL2) + 20 (IPv4) + 8 (UDP) + 7 = 55 bytes on the wire; snaplen 53 keeps 53, which
    // the EPB pads with 3 zeros to 56: the IPv4 total length (35) then fits in what follows
    // the SLL2 header, with the last two payload bytes read from the padding.
    let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"HELLO!!");
    let frame = sll2(&ip);
    assert_eq!(frame.len(), 55);
    let kept = &frame[..53];
    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_LINUX_SLL2, &[]);
    ng.epb(0, 1_000_000, kept, frame.len());
    let (got, stats) = read(&ng.out).expect("readable");
    assert!(
        got.iter().all(|d| d.payload != b"HELLO\0\0"),
        "truncated datagram delivered with padding as its last bytes: {got:?}"
    );
    assert_eq!(
        (stats.frames, stats.udp, stats.skipped),
        (1, 0, 1),
        "{got:?}"
    );
}

/// The same with the Ethernet link type (whose decoder always cut at caplen): skipped too.
#[test]
fn pcapng_ethernet_datagram_cut_by_snaplen_is_skipped() {
    let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"HELLO!!");
    let frame = ethernet(&ip);
    assert_eq!(frame.len(), 49);
    let kept = &frame[..47]; // padded with 1 zero
    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET, &[]);
    ng.epb(0, 1_000_000, kept, frame.len());
    let (got, stats) = read(&ng.out).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    assert_eq!((stats.frames, stats.udp, stats.skipped), (1, 0, 1));
}

/// Linux loopback's MTU is 65536: a capture on `lo` (how every fixture here was made) can hold
/// a frame of up to 65550 bytes, e.g. a 65507-byte UDP datagram (the largest over IPv4) from
/// another program. Such a capture is valid: the big datagram and the one after it must be
/// read, in pcap and pcapng, not the whole file refused (the reader's first buffer is 64 KiB).
#[test]
fn a_frame_larger_than_64_kib_does_not_make_the_capture_unreadable() {
    let big = udp_ipv4(
        [127, 0, 0, 1],
        40001,
        [127, 0, 0, 1],
        9999,
        &vec![b'x'; 65_507],
    );
    let small = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"text");
    let (big, small) = (ethernet(&big), ethernet(&small));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &big), (2, 0, &small)]);
    let (got, stats) = read(&file).expect("a valid capture is readable");
    assert_eq!(stats.udp, 2);
    assert_eq!(got[1].payload, b"text");
    assert_eq!(got[1].source, addr("127.0.0.1:40000"));

    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET, &[]);
    ng.epb(0, 1_000_000, &big, big.len());
    ng.epb(0, 2_000_000, &small, small.len());
    let (got, stats) = read(&ng.out).expect("a valid pcapng capture is readable");
    assert_eq!(stats.udp, 2);
    assert_eq!(got[1].payload, b"text");
}

/// The obsolete pcapng Packet Block (type 2; pcapng spec appendix A) carries an interface id,
/// a timestamp and the packet, like an EPB; Wireshark and tshark read it, and so must replay,
/// not drop its datagram without even counting the frame.
#[test]
fn pcapng_obsolete_packet_block_is_read_like_an_enhanced_packet_block() {
    let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, b"abcd");
    let frame = ethernet(&ip);
    for le in [true, false] {
        let mut ng = Ng::new(le);
        ng.idb(LINKTYPE_ETHERNET, &[]);
        let mut body = Vec::new();
        body.extend_from_slice(&ng.u16(0)); // interface id
        body.extend_from_slice(&ng.u16(0)); // drops count
        body.extend_from_slice(&ng.u32(0)); // timestamp high
        body.extend_from_slice(&ng.u32(3_000_000)); // timestamp low: 3 s
        body.extend_from_slice(&ng.u32(frame.len() as u32));
        body.extend_from_slice(&ng.u32(frame.len() as u32));
        body.extend_from_slice(&frame);
        while body.len() % 4 != 0 {
            body.push(0);
        }
        ng.block(2, &body);
        // One that claims more bytes than it holds, and one on an undescribed interface:
        // counted and skipped.
        let mut short = body[..20].to_vec();
        short[12..16].copy_from_slice(&ng.u32(500));
        ng.block(2, &short);
        let mut elsewhere = body.clone();
        elsewhere[..2].copy_from_slice(&ng.u16(7));
        ng.block(2, &elsewhere);
        let (got, stats) = read(&ng.out).expect("readable");
        assert_eq!(
            (stats.frames, stats.udp, stats.skipped),
            (3, 1, 2),
            "little-endian: {le}"
        );
        assert_eq!(got[0].payload, b"abcd");
        assert_eq!(got[0].time.0, 3_000_000);
    }
}

/// A record the reader's buffer cannot hold even grown to its 16 MiB limit (in practice a
/// corrupt length) is a clear error, not a panic and not an attempt to allocate what it claims.
/// A pcap record is refused sooner, past libpcap's largest snap length.
#[test]
fn a_record_past_the_buffer_limit_is_a_clear_error() {
    let mut file = pcap(LINKTYPE_ETHERNET, &[]);
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&0u32.to_le_bytes());
    file.extend_from_slice(&0x7fff_ffffu32.to_le_bytes());
    file.extend_from_slice(&0x7fff_ffffu32.to_le_bytes());
    // Endless data, so the reader never runs out before the record fills its buffer.
    let reader = std::io::Read::chain(&file[..], std::io::repeat(0));
    let err = read_udp_from(reader, &mut |_| {}).expect_err("too big");
    assert!(err.to_string().contains("more than 262144"), "{err}");

    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET, &[]);
    ng.out.extend_from_slice(&6u32.to_le_bytes());
    ng.out.extend_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let reader = std::io::Read::chain(&ng.out[..], std::io::repeat(0));
    let err = read_udp_from(reader, &mut |_| {}).expect_err("too big");
    assert!(err.to_string().contains("more than 16 MiB"), "{err}");
}

/// IPv4 fragments (RFC 791) of one UDP datagram: a datagram larger than the path MTU (1500 on
/// Ethernet), such as a RED packet carrying a pasted paragraph three times or a mixer's
/// compound RTCP with the SDES of many sources, is captured as several frames. The live
/// gateway's socket receives it reassembled; replay, which promises the capture's UDP
/// datagrams through the same core, skipped every fragment, so the text (or the BYE) the live
/// gateway would act on was missing from the replay. The fragments must give the datagram.
#[test]
fn a_udp_datagram_in_ipv4_fragments_is_read_reassembled() {
    let payload: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    // The IP payload (UDP header and data) cut after 24 bytes (3 units of 8).
    let (header, data) = whole.split_at(20);
    let fragment = |offset_units: u16, more: bool, part: &[u8]| {
        let mut h = header.to_vec();
        let total = (20 + part.len()) as u16;
        h[2..4].copy_from_slice(&total.to_be_bytes());
        h[4..6].copy_from_slice(&0x1234u16.to_be_bytes()); // identification
        let flags = if more { 0x2000 } else { 0 } | offset_units;
        h[6..8].copy_from_slice(&flags.to_be_bytes());
        h.extend_from_slice(part);
        ethernet(&h)
    };
    let first = fragment(0, true, &data[..24]);
    let second = fragment(3, false, &data[24..]);
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &first), (1, 10, &second)]);
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(
        got.iter().map(|d| d.payload.clone()).collect::<Vec<_>>(),
        vec![payload],
        "{stats:?}"
    );
    assert_eq!(got[0].source, addr("10.0.0.1:40000"));
    assert_eq!(got[0].destination, addr("10.0.0.2:5004"));
}

/// An Ethernet frame holding one IPv4 fragment of `whole` (an IPv4/UDP packet from
/// `udp_ipv4`, 20-byte header): bytes `from..to` of its IP payload (UDP header and data), with
/// identification `id`; More Fragments set unless `to` is the end.
fn v4_fragment(whole: &[u8], id: u16, from: usize, to: usize) -> Vec<u8> {
    assert_eq!(from % 8, 0);
    let (header, data) = whole.split_at(20);
    let part = &data[from..to];
    let mut h = header.to_vec();
    h[2..4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    let more = if to < data.len() { 0x2000 } else { 0 };
    h[6..8].copy_from_slice(&(more | (from / 8) as u16).to_be_bytes());
    h.extend_from_slice(part);
    ethernet(&h)
}

/// The counters of fragments and reassemblies, in the order `CaptureStats` declares them:
/// fragments, reassembled, duplicates, timeouts, evicted, invalid, unfinished.
fn reassembly(s: &CaptureStats) -> [u64; 7] {
    [
        s.fragments,
        s.reassembled,
        s.fragments_duplicate,
        s.reassembly_timeouts,
        s.reassembly_evicted,
        s.reassembly_invalid,
        s.reassembly_unfinished,
    ]
}

/// `n` bytes of text that differ from one `seed` to another.
fn text(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| b'a' + (i as u8).wrapping_add(seed) % 26)
        .collect()
}

/// Fragments arrive in any order (RFC 791 section 3.2: the offset places them). The
/// datagram comes out where its last fragment arrived, with that fragment's time, after a
/// whole datagram captured between its fragments; its ports are the first fragment's.
#[test]
fn fragments_out_of_order_are_reassembled_at_the_last_ones_time() {
    let payload = text(60, 0);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let other = ethernet(&udp_ipv4(
        [10, 0, 0, 3],
        40002,
        [10, 0, 0, 2],
        5004,
        b"other",
    ));
    let (a, b, c) = (
        v4_fragment(&whole, 7, 0, 24),
        v4_fragment(&whole, 7, 24, 48),
        v4_fragment(&whole, 7, 48, 68),
    );
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[(1, 0, &c), (2, 0, &other), (3, 0, &a), (4, 500, &b)],
    );
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].payload, b"other");
    assert_eq!(got[1].payload, payload);
    assert_eq!(got[1].time.0, 4_000_500, "the completing fragment's time");
    assert_eq!(got[1].source, addr("10.0.0.1:40000"));
    assert_eq!(got[1].destination, addr("10.0.0.2:5004"));
    assert_eq!(
        (stats.frames, stats.udp, stats.skipped),
        (4, 2, 0),
        "{stats:?}"
    );
    assert_eq!(reassembly(&stats), [3, 1, 0, 0, 0, 0, 0]);
}

/// A lost fragment: nothing is handed out, not even the fragments' bytes as a short
/// datagram. The reassembly waits 30 s of capture time from its first fragment (Linux's
/// ipfrag_time), then is dropped and counted; the missing fragment arriving after that starts
/// a new one, which the end of the capture finds unfinished. Within the 30 s it completes.
#[test]
fn a_lost_fragment_gives_nothing_and_its_reassembly_expires_in_capture_time() {
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &text(60, 1));
    let (a, b, c) = (
        v4_fragment(&whole, 9, 0, 24),
        v4_fragment(&whole, 9, 24, 48),
        v4_fragment(&whole, 9, 48, 68),
    );
    let later = ethernet(&udp_ipv4(
        [10, 0, 0, 3],
        40002,
        [10, 0, 0, 2],
        5004,
        b"later",
    ));

    // b never comes: counted as pending, then unfinished at the end.
    let file = pcap(LINKTYPE_ETHERNET, &[(100, 0, &a), (101, 0, &c)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 0, 1]);

    // b comes 30 s after a: too late. The frame before it already expired the reassembly.
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[(100, 0, &a), (101, 0, &c), (130, 0, &later), (130, 1, &b)],
    );
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].payload, b"later");
    assert_eq!(reassembly(&stats), [3, 0, 0, 1, 0, 0, 1]);

    // Just within the 30 s: reassembled.
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[(100, 0, &a), (101, 0, &c), (129, 999_999, &b)],
    );
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].payload, text(60, 1));
    assert_eq!(reassembly(&stats), [3, 1, 0, 0, 0, 0, 0]);
}

/// A fragment captured twice (two interfaces of a bridge, a link that retransmits) is
/// dropped and counted, and the datagram comes out once (RFC 5722 section 4 allows dropping
/// an exact duplicate alone). One that overlaps with other bytes drops the reassembly.
#[test]
fn a_duplicate_fragment_is_dropped_and_an_inconsistent_one_drops_the_datagram() {
    let payload = text(40, 2);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (a, b) = (
        v4_fragment(&whole, 5, 0, 24),
        v4_fragment(&whole, 5, 24, 48),
    );
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &a), (1, 1, &a), (1, 2, &b)]);
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].payload, payload);
    assert_eq!(reassembly(&stats), [3, 1, 1, 0, 0, 0, 0]);
    // The same again after the datagram is complete: a new reassembly, left unfinished.
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &a), (1, 2, &b), (1, 3, &b)]);
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(reassembly(&stats), [3, 1, 0, 0, 0, 0, 1]);

    // Same place, other bytes (a teardrop-style rewrite): neither version is handed out.
    let forged = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &text(40, 3));
    let a2 = v4_fragment(&forged, 5, 0, 24);
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &a), (1, 1, &a2), (1, 2, &b)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    // b starts a new reassembly that never completes.
    assert_eq!(reassembly(&stats), [3, 0, 0, 0, 0, 1, 1]);

    // Overlapping with the same bytes but not at the same place (16..40 over 0..24) is an
    // overlap, not a duplicate: dropped too.
    let mid = v4_fragment(&whole, 5, 16, 40);
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &a), (1, 1, &mid), (1, 2, &b)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(reassembly(&stats), [3, 0, 0, 0, 0, 1, 1]);
}

/// Two datagrams between the same hosts fragmented at once, told apart by their
/// identification (RFC 791 section 3.2): each gets its own bytes, in the order they complete.
#[test]
fn interleaved_fragments_of_two_datagrams_are_kept_apart_by_identification() {
    let (p1, p2) = (text(40, 4), text(50, 5));
    let w1 = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &p1);
    let w2 = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &p2);
    let frames = [
        v4_fragment(&w1, 100, 0, 24),
        v4_fragment(&w2, 200, 0, 24),
        v4_fragment(&w2, 200, 24, 58),
        v4_fragment(&w1, 100, 24, 48),
    ];
    let records: Vec<(u32, u32, &[u8])> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| (1, i as u32, f.as_slice()))
        .collect();
    let (got, stats) = read(&pcap(LINKTYPE_ETHERNET, &records)).expect("readable");
    let payloads: Vec<_> = got.iter().map(|d| d.payload.clone()).collect();
    assert_eq!(payloads, vec![p2, p1]);
    assert_eq!((got[0].time.0, got[1].time.0), (1_000_002, 1_000_003));
    assert_eq!(reassembly(&stats), [4, 2, 0, 0, 0, 0, 0]);
}

/// Memory stays bounded whatever the capture holds: one reassembly past the limit on pending
/// ones drops the oldest (counted), whose last fragment then gives nothing, while the next
/// oldest still completes.
#[test]
fn pending_reassemblies_are_bounded_and_the_oldest_dropped_first() {
    let n = MAX_PENDING_REASSEMBLIES + 1;
    let wholes: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            udp_ipv4(
                [10, 0, 0, 1],
                40000,
                [10, 0, 0, 2],
                5004,
                &text(40, i as u8),
            )
        })
        .collect();
    let mut frames: Vec<Vec<u8>> = wholes
        .iter()
        .enumerate()
        .map(|(i, w)| v4_fragment(w, i as u16, 0, 24))
        .collect();
    // Number 1 completes; number 0 was dropped, so its last fragment starts a new reassembly
    // (no eviction: 1 has left room).
    frames.push(v4_fragment(&wholes[1], 1, 24, 48));
    frames.push(v4_fragment(&wholes[0], 0, 24, 48));
    let records: Vec<(u32, u32, &[u8])> = frames.iter().map(|f| (1, 0, f.as_slice())).collect();
    let (got, stats) = read(&pcap(LINKTYPE_ETHERNET, &records)).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, text(40, 1));
    let left = MAX_PENDING_REASSEMBLIES as u64; // 2..=256 and 0's last fragment
    assert_eq!(reassembly(&stats), [n as u64 + 2, 1, 0, 0, 1, 0, left]);
}

/// The bytes the pending reassemblies hold are bounded too: a fragment near the end of a
/// 64 KiB datagram takes room for all of it, so a few dozen such fragments, far fewer than
/// the bound on reassemblies, already drop the oldest. The newest still completes.
#[test]
fn pending_reassembly_bytes_are_bounded_and_the_oldest_dropped_first() {
    let n = 70;
    let data_len = 65_440; // UDP data: 8 + 65,440 bytes of IP payload, 65,468 with the header
    let wholes: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            udp_ipv4(
                [10, 0, 0, 1],
                40000,
                [10, 0, 0, 2],
                5004,
                &text(data_len, i as u8),
            )
        })
        .collect();
    // The last 8 bytes first, then the rest of the oldest and of the newest.
    let mut frames: Vec<Vec<u8>> = wholes
        .iter()
        .enumerate()
        .map(|(i, w)| v4_fragment(w, i as u16, data_len, data_len + 8))
        .collect();
    frames.push(v4_fragment(&wholes[0], 0, 0, data_len));
    frames.push(v4_fragment(&wholes[n - 1], (n - 1) as u16, 0, data_len));
    let records: Vec<(u32, u32, &[u8])> = frames.iter().map(|f| (1, 0, f.as_slice())).collect();
    let (got, stats) = read(&pcap(LINKTYPE_ETHERNET, &records)).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, text(data_len, (n - 1) as u8));
    assert!(n < MAX_PENDING_REASSEMBLIES);
    // At most this many 64 KiB reassemblies fit: the rest were dropped, the oldest first.
    let fit = (MAX_PENDING_REASSEMBLY_BYTES / (data_len + 8)) as u64;
    assert!(stats.reassembly_evicted >= n as u64 - fit, "{stats:?}");
    assert_eq!(stats.reassembled, 1);
    // The oldest's first part started a reassembly of its own (never completed).
    assert_eq!(
        stats.reassembly_evicted + stats.reassembly_unfinished,
        n as u64,
        "{stats:?}"
    );
}

/// Fragments of other protocols (here ICMP, RFC 792) are skipped and counted like any frame
/// that is not UDP, never kept; a fragment taking its datagram past the 65,535 bytes of the
/// IPv4 Total Length (RFC 791 section 3.1; the "ping of death") drops its reassembly.
#[test]
fn fragments_of_other_protocols_are_skipped_and_oversized_ones_dropped() {
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &text(40, 6));
    let mut icmp = whole.clone();
    icmp[9] = 1;
    let (i1, i2) = (v4_fragment(&icmp, 3, 0, 24), v4_fragment(&icmp, 3, 24, 48));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &i1), (1, 1, &i2)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    assert_eq!((stats.frames, stats.skipped), (2, 2));
    assert_eq!(reassembly(&stats), [0; 7]);

    // 8 bytes at offset 65,512 end at 65,520: with a 20-byte header, past 65,535.
    let mut over = whole[..20].to_vec();
    over[2..4].copy_from_slice(&28u16.to_be_bytes());
    over[4..6].copy_from_slice(&3u16.to_be_bytes());
    over[6..8].copy_from_slice(&(0x2000u16 | (65_512 / 8)).to_be_bytes());
    over.extend_from_slice(&[0; 8]);
    let first = v4_fragment(&whole, 3, 0, 24);
    let last = v4_fragment(&whole, 3, 24, 48);
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[(1, 0, &first), (1, 1, &ethernet(&over)), (1, 2, &last)],
    );
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    // The oversized fragment drops the reassembly; the last fragment starts another.
    assert_eq!(reassembly(&stats), [3, 0, 0, 0, 0, 1, 1]);
}

/// IPv6 fragments (RFC 8200 section 4.5: a Fragment extension header) of one UDP datagram,
/// out of order: reassembled like IPv4's.
#[test]
fn a_udp_datagram_in_ipv6_fragments_is_read_reassembled() {
    let payload = text(40, 7);
    // The UDP header and data of a datagram from udp_ipv4 (no checksum: not checked).
    let udp = udp_ipv4([0; 4], 40000, [0; 4], 5004, &payload)[20..].to_vec();
    let (src, dst) = (
        "2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
        "2001:db8::2"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    let fragment = |from: usize, to: usize| {
        let part = &udp[from..to];
        let mut f = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x86, 0xdd];
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&((8 + part.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[44, 64]); // next header: Fragment; hop limit
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        let more = u16::from(to < udp.len());
        f.extend_from_slice(&[17, 0]); // next header: UDP; reserved
        f.extend_from_slice(&(((from / 8) as u16) << 3 | more).to_be_bytes());
        f.extend_from_slice(&0x0102_0304u32.to_be_bytes());
        f.extend_from_slice(part);
        f
    };
    let (a, b) = (fragment(0, 24), fragment(24, 48));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &b), (2, 0, &a)]);
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, payload);
    assert_eq!(got[0].time.0, 2_000_000);
    assert_eq!(got[0].source, addr("[2001:db8::1]:40000"));
    assert_eq!(got[0].destination, addr("[2001:db8::2]:5004"));
    assert_eq!(reassembly(&stats), [2, 1, 0, 0, 0, 0, 0]);
}

// ---- IP fragment reassembly: review findings ----

/// An IPv4 packet (no Ethernet) holding bytes `from..to` of `whole`'s IP payload (`whole` from
/// `udp_ipv4`, 20-byte header) as one fragment with identification `id`, More Fragments as
/// `more` says, and `options` (a multiple of 4 bytes) added to its header.
fn v4_fragment_ip(
    whole: &[u8],
    id: u16,
    from: usize,
    to: usize,
    more: bool,
    options: &[u8],
) -> Vec<u8> {
    assert_eq!(from % 8, 0);
    assert_eq!(options.len() % 4, 0);
    let (header, data) = whole.split_at(20);
    let part = &data[from..to];
    let mut h = header.to_vec();
    h[0] = 0x40 | ((20 + options.len()) / 4) as u8;
    h[2..4].copy_from_slice(&((20 + options.len() + part.len()) as u16).to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    let flags = if more { 0x2000 } else { 0 };
    h[6..8].copy_from_slice(&(flags | (from / 8) as u16).to_be_bytes());
    h.extend_from_slice(options);
    h.extend_from_slice(part);
    h
}

/// Linux (net/ipv4/ip_fragment.c, `ip_frag_queue`) takes an IPv4 fragment with More Fragments
/// set whose data is not a multiple of 8 bytes and cuts it down to one (`end &= ~7`); only
/// IPv6 (RFC 8200 section 4.5) must discard it. So fragments 0..27 (More Fragments) and
/// 24..48 (the last) reach the gateway's socket as the datagram, and the user expects the
/// replay to give it too.
#[test]
fn a_misaligned_ipv4_fragment_is_cut_to_8_bytes_as_linux_does() {
    let payload = text(40, 10);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let first = ethernet(&v4_fragment_ip(&whole, 31, 0, 27, true, &[]));
    let last = ethernet(&v4_fragment_ip(&whole, 31, 24, 48, false, &[]));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &first), (1, 1, &last)]);
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(
        got.iter().map(|d| d.payload.clone()).collect::<Vec<_>>(),
        vec![payload],
        "{stats:?}"
    );
    assert_eq!(reassembly(&stats), [2, 1, 0, 0, 0, 0, 0]);
}

/// RFC 791 section 3.1: the Total Length, header included, is at most 65,535 bytes, and the
/// reassembled datagram's header is its first fragment's (section 3.2). IP options that are
/// not copied (the copy bit clear, e.g. NOP or Record Route) are in the first fragment only,
/// so its header can be 60 bytes while the others' are 20. Linux checks the reassembled length
/// with the first fragment's header (`ip_frag_reasm`: "Oversized IP packet") and drops it; the
/// README promises a fragment that "makes the datagram longer than 65,535 bytes drops the
/// datagram". Here 60 + 65,512 = 65,572 bytes: the user expects nothing handed out and the
/// reassembly counted invalid, though the last fragment's own 20-byte header would allow
/// 65,515.
#[test]
fn an_oversized_datagram_counts_the_first_fragments_ip_options() {
    let data_len = 65_504; // IP payload 65,512: UDP header and data
    let payload = text(data_len, 9);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let nops = [1u8; 40]; // 40 bytes of NOP: a 60-byte header
    let first = ethernet(&v4_fragment_ip(&whole, 11, 0, 65_472, true, &nops));
    let last = ethernet(&v4_fragment_ip(&whole, 11, 65_472, 65_512, false, &[]));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &first), (1, 1, &last)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(
        got.is_empty(),
        "a 65,572-byte IPv4 datagram was handed out ({} bytes of UDP data): {stats:?}",
        got.first().map_or(0, |d| d.payload.len())
    );
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 1, 0]);
}

/// IPv6 the same way (RFC 8200 section 4.5): the reassembled Payload Length counts the first
/// fragment's extension headers before its Fragment header (the Unfragmentable Part), here a
/// 64-byte Destination Options header the later fragment does not carry. 64 + 65,480 bytes is
/// past 65,535 (Linux's `ip6_frag_reasm`: "payload len too large"): nothing handed out.
#[test]
fn an_oversized_ipv6_datagram_counts_the_first_fragments_extension_headers() {
    let payload = text(65_472, 3);
    let udp = udp_ipv4([0; 4], 40000, [0; 4], 5004, &payload)[20..].to_vec();
    let fragment = |from: usize, to: usize, dest_options: bool| {
        let part = &udp[from..to];
        let exts = if dest_options { 64 } else { 0 };
        let mut f = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x86, 0xdd];
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&((exts + 8 + part.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[if dest_options { 60 } else { 44 }, 64]);
        f.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        if dest_options {
            // Next header Fragment, 64 bytes in all: PadN over the 62 bytes of options.
            f.extend_from_slice(&[44, 7, 1, 60]);
            f.extend_from_slice(&[0; 60]);
        }
        let more = u16::from(to < udp.len());
        f.extend_from_slice(&[17, 0]);
        f.extend_from_slice(&(((from / 8) as u16) << 3 | more).to_be_bytes());
        f.extend_from_slice(&0x0506_0708u32.to_be_bytes());
        f.extend_from_slice(part);
        f
    };
    let (first, last) = (fragment(0, 65_456, true), fragment(65_456, 65_480, false));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &first), (1, 1, &last)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{stats:?}");
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 1, 0]);

    // In the other order too: the first fragment, when it comes, drops the reassembly.
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &last), (1, 1, &first)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{stats:?}");
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 1, 0]);

    // Without the extension header the same fragments make a datagram.
    let first = fragment(0, 65_456, false);
    let (got, stats) =
        read(&pcap(LINKTYPE_ETHERNET, &[(1, 0, &first), (1, 1, &last)])).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, payload);
}

/// LINKTYPE_LINUX_SLL2 header as `tcpdump -i any` writes it: the interface index and the
/// packet type (0 incoming to this host, 4 outgoing) of each packet, then an IPv4 packet.
fn sll2_on(ifindex: u32, packet_type: u8, ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0x08, 0x00, 0, 0];
    f.extend_from_slice(&ifindex.to_be_bytes());
    f.extend_from_slice(&[0x00, 0x01, packet_type, 6]); // ARPHRD_ETHER, 6-byte address
    f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0, 0]);
    f.extend_from_slice(ip);
    f
}

/// `tcpdump -i any` on a router (the usual way to capture there) writes LINKTYPE_LINUX_SLL2,
/// whose header carries the interface index of each packet: every forwarded packet is
/// captured twice, in on eth0 (index 2) and out on eth1 (index 3), fragments one after the
/// other as they are forwarded. A whole datagram is read twice (once per interface), and the
/// same traffic captured with `dumpcap -i eth0 -i eth1` (a pcapng with two interfaces) gives
/// the fragmented datagram twice, since `FragmentKey` keeps "apart the copies of one datagram
/// captured on two" interfaces. The user expects the SLL2 capture to give the same: two
/// copies and no reassembly left unfinished (not the second copy of the first fragment taken
/// for a duplicate and the second copy of the last one left as if a fragment were lost).
#[test]
fn an_sll2_any_capture_keeps_the_copies_on_two_interfaces_apart_like_pcapng() {
    let payload = text(40, 8);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (f1, f2) = (
        v4_fragment_ip(&whole, 21, 0, 24, true, &[]),
        v4_fragment_ip(&whole, 21, 24, 48, false, &[]),
    );

    // The pcapng of two interfaces: both copies, nothing unfinished.
    let mut ng = Ng::new(true);
    ng.idb(LINKTYPE_ETHERNET, &[]);
    ng.idb(LINKTYPE_ETHERNET, &[]);
    for (i, (if_id, ip)) in [(0, &f1), (1, &f1), (0, &f2), (1, &f2)].iter().enumerate() {
        let frame = ethernet(ip);
        ng.epb(*if_id, 1_000_000 + i as u64, &frame, frame.len());
    }
    let (got, stats) = read(&ng.out).expect("readable");
    assert_eq!(got.len(), 2, "{stats:?}");
    assert_eq!(reassembly(&stats), [4, 2, 0, 0, 0, 0, 0]);

    // The same traffic captured with `-i any`.
    let frames = [
        sll2_on(2, 0, &f1),
        sll2_on(3, 4, &f1),
        sll2_on(2, 0, &f2),
        sll2_on(3, 4, &f2),
    ];
    let records: Vec<(u32, u32, &[u8])> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| (1, i as u32, f.as_slice()))
        .collect();
    let (got, stats) = read(&pcap(LINKTYPE_LINUX_SLL2, &records)).expect("readable");
    assert!(got.iter().all(|d| d.payload == payload));
    assert_eq!(
        (got.len(), stats.reassembly_unfinished),
        (2, 0),
        "each interface's copy reassembled, nothing reported lost: {stats:?}"
    );
}

/// One link carries a datagram twice in other ways too: `tcpdump -i any` sees one sent over
/// `lo` going out and coming in (SLL and SLL2 packet types 4 and 0, on one interface), and a
/// router between two VLANs of one trunk sends it back on the other VLAN. Each copy is
/// reassembled on its own; a fragment captured twice the same way is still a duplicate.
#[test]
fn copies_in_two_directions_or_on_two_vlans_are_reassembled_apart() {
    let payload = text(40, 4);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (f1, f2) = (
        v4_fragment_ip(&whole, 41, 0, 24, true, &[]),
        v4_fragment_ip(&whole, 41, 24, 48, false, &[]),
    );
    let file = |linktype: u16, frames: &[Vec<u8>]| {
        let records: Vec<(u32, u32, &[u8])> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| (1, i as u32, f.as_slice()))
            .collect();
        pcap(linktype, &records)
    };

    // SLL2 on lo (index 1): out, in, out, in.
    let frames = [
        sll2_on(1, 4, &f1),
        sll2_on(1, 0, &f1),
        sll2_on(1, 4, &f2),
        sll2_on(1, 0, &f2),
    ];
    let (got, stats) = read(&file(LINKTYPE_LINUX_SLL2, &frames)).expect("readable");
    assert_eq!(got.len(), 2, "{stats:?}");
    assert!(got.iter().all(|d| d.payload == payload));
    assert_eq!(reassembly(&stats), [4, 2, 0, 0, 0, 0, 0]);
    // The first fragment captured twice going out: a duplicate.
    let frames = [sll2_on(1, 4, &f1), sll2_on(1, 4, &f1), sll2_on(1, 4, &f2)];
    let (got, stats) = read(&file(LINKTYPE_LINUX_SLL2, &frames)).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(reassembly(&stats), [3, 1, 1, 0, 0, 0, 0]);

    // SLL (the older `-i any` header): the packet type first.
    let sll = |packet_type: u16, ip: &[u8]| {
        let mut f = packet_type.to_be_bytes().to_vec();
        f.extend_from_slice(&[0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00]);
        f.extend_from_slice(ip);
        f
    };
    let frames = [sll(4, &f1), sll(0, &f1), sll(4, &f2), sll(0, &f2)];
    let (got, stats) = read(&file(LINKTYPE_LINUX_SLL, &frames)).expect("readable");
    assert_eq!(got.len(), 2, "{stats:?}");
    assert_eq!(reassembly(&stats), [4, 2, 0, 0, 0, 0, 0]);

    // Ethernet with 802.1Q tags: VLAN 10, VLAN 20, and untagged, each apart.
    let tagged = |vlan: Option<u16>, ip: &[u8]| {
        let mut f = vec![0; 12];
        if let Some(id) = vlan {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&id.to_be_bytes());
        }
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(ip);
        f
    };
    let frames = [
        tagged(Some(10), &f1),
        tagged(Some(20), &f1),
        tagged(None, &f1),
        tagged(Some(10), &f2),
        tagged(Some(20), &f2),
        tagged(None, &f2),
    ];
    let (got, stats) = read(&file(LINKTYPE_ETHERNET, &frames)).expect("readable");
    assert_eq!(got.len(), 3, "{stats:?}");
    assert!(got.iter().all(|d| d.payload == payload));
    assert_eq!(reassembly(&stats), [6, 3, 0, 0, 0, 0, 0]);
}

/// The capture's clock set back (an NTP step: the README's "step back in the capture's clock
/// of a second or more"), which replay takes as the clock being set: what follows keeps its
/// spacing. Fragment A1 of datagram A is captured, its other fragment lost; the clock is set
/// back an hour; 40 s later datagram B, with the same identification (the sender's counter
/// wrapped, or another process on a host with a global counter), arrives in two fragments. A
/// receiver (Linux times reassemblies on a monotonic clock) gave A up 30 s after A1 and
/// reassembles B; the user expects B from the replay, not A kept (its deadline an hour away
/// in raw capture time) and B's first fragment taken as overlapping A1 with other bytes.
/// How long passed across the step cannot be told, so A is given up there (a timeout).
#[test]
fn a_clock_set_back_does_not_keep_a_stale_reassembly_alive() {
    let a = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &text(40, 1));
    let b_payload = text(40, 2);
    let b = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &b_payload);
    let a1 = v4_fragment(&a, 7, 0, 24);
    let (b1, b2) = (v4_fragment(&b, 7, 0, 24), v4_fragment(&b, 7, 24, 48));
    let t = 1_700_000_000u32;
    // 20 s after A1 a whole datagram, then the clock is set back an hour: 40 s after A1 in
    // real time comes B.
    let mid = ethernet(&udp_ipv4([10, 0, 0, 3], 40002, [10, 0, 0, 2], 5004, b"mid"));
    let back = t - 3600;
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[
            (t, 0, &a1),
            (t + 20, 0, &mid),
            (back + 40, 0, &b1),
            (back + 40, 1, &b2),
        ],
    );
    let (got, stats) = read(&file).expect("readable");
    let payloads: Vec<_> = got.iter().map(|d| d.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec![b"mid".to_vec(), b_payload],
        "datagram B, 40 s after A's lone fragment, lost: {stats:?}"
    );
    assert_eq!(reassembly(&stats), [3, 1, 0, 1, 0, 0, 0]);
}

/// A step back shorter than a second is reordering (the interfaces of a pcapng stamping
/// apart), held at the newest time as replay holds it: a reassembly waits on, and its
/// 30 s run from its first fragment in that time.
#[test]
fn a_short_step_back_is_reordering_and_keeps_the_reassembly() {
    let payload = text(40, 5);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (a, b) = (
        v4_fragment(&whole, 8, 0, 24),
        v4_fragment(&whole, 8, 24, 48),
    );
    let other = ethernet(&udp_ipv4([10, 0, 0, 3], 40002, [10, 0, 0, 2], 5004, b"x"));
    let t = 1_700_000_000u32;
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[(t, 500_000, &a), (t + 1, 0, &other), (t, 200_000, &b)],
    );
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 2, "{stats:?}");
    assert_eq!(got[1].payload, payload);
    assert_eq!(reassembly(&stats), [2, 1, 0, 0, 0, 0, 0]);

    // Its deadline is 30 s after the first fragment in that time: the frame at t + 30.5
    // ends it, and the last fragment, stamped 0.9 s earlier but captured after, is too late.
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[
            (t, 500_000, &a),
            (t + 30, 500_000, &other),
            (t + 29, 600_000, &b),
        ],
    );
    let (_, stats) = read(&file).expect("readable");
    assert_eq!(reassembly(&stats), [2, 0, 0, 1, 0, 0, 1]);
}

/// Each capture interface's reassemblies wait by that interface's own clock (review, session
/// 32): a pcapng of two interfaces whose clocks disagree by a minute (a NIC stamping in
/// hardware), a UDP datagram in two fragments 1 ms apart on interface 0 and between them an
/// ICMP frame (never replayed) on interface 1 stamped a minute ahead or behind. The datagram
/// is reassembled, as the live gateway's socket got it; one clock for both interfaces took
/// that frame for a minute passing (a timeout) or for a clock step, and the text was lost.
#[test]
fn fragments_on_one_interface_survive_a_frame_of_another_interface_stamping_a_minute_off() {
    let payload = text(40, 0);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (f1, f2) = (
        v4_fragment(&whole, 9, 0, 24),
        v4_fragment(&whole, 9, 24, 48),
    );
    // An ICMP echo request from 10.0.0.9 to 10.0.0.2.
    let mut icmp = vec![
        0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 1, 0, 0, 10, 0, 0, 9, 10, 0, 0, 2,
    ];
    icmp.extend_from_slice(&[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
    let other = ethernet(&icmp);
    let t0 = 1_700_000_000_000_000u64;
    for (what, at) in [("ahead", t0 + 61_000_000), ("behind", t0 - 61_000_000)] {
        let mut ng = Ng::new(true);
        ng.idb(LINKTYPE_ETHERNET, &[]);
        ng.idb(LINKTYPE_ETHERNET, &[]);
        ng.epb(0, t0, &f1, f1.len());
        ng.epb(1, at, &other, other.len());
        ng.epb(0, t0 + 1_000, &f2, f2.len());
        let (got, stats) = read(&ng.out).expect("readable");
        let payloads: Vec<_> = got.iter().map(|d| d.payload.clone()).collect();
        assert_eq!(
            payloads,
            vec![payload.clone()],
            "a minute {what}: {stats:?}"
        );
        assert_eq!(
            reassembly(&stats),
            [2, 1, 0, 0, 0, 0, 0],
            "a minute {what}: {stats:?}"
        );
    }
}

/// An I/O error while reading a capture is reported as that error, `CaptureError::Io`, not as
/// a bad format (review, session 32): pcap-parser turns every one into a bare `ReadError`,
/// which read "not a readable pcap/pcapng capture: ReadError", the cause lost and the file's
/// format blamed. Here a reader gives a valid capture's bytes, 30 at a time, then fails.
#[test]
fn an_io_error_while_reading_a_capture_is_reported_as_that_io_error_not_a_bad_format() {
    struct FailsAfter(Vec<u8>, usize);
    impl std::io::Read for FailsAfter {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.0.len() - self.1).min(30);
            if n == 0 {
                return Err(std::io::Error::other("disk on fire"));
            }
            buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }
    let frame = ethernet(&udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, b"Hi"));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &frame)]);
    let mut got = 0;
    let err = read_udp_from(FailsAfter(file, 0), &mut |_| got += 1).expect_err("the read failed");
    assert!(
        matches!(err, CaptureError::Io(_)) && err.to_string() == "disk on fire",
        "{err}"
    );
    assert_eq!(got, 1, "the datagram before the error is handed out");
}

/// A pcapng file may hold several sections (pcapng 4.1; `cat` of two captures makes one), each
/// with its own interfaces numbered from 0: interface 0 of the second is another. A
/// reassembly the first section left pending ends there, unfinished, and the second
/// section's fragments do not complete it; a datagram wholly in the second is reassembled.
#[test]
fn a_new_pcapng_section_leaves_the_pending_reassemblies_unfinished() {
    let payload = text(40, 11);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (f1, f2) = (
        v4_fragment(&whole, 51, 0, 24),
        v4_fragment(&whole, 51, 24, 48),
    );
    let mut first = Ng::new(true);
    first.idb(LINKTYPE_ETHERNET, &[]);
    first.epb(0, 1_000_000, &f1, f1.len());
    let mut second = Ng::new(false);
    second.idb(LINKTYPE_ETHERNET, &[]);
    second.epb(0, 1_000_001, &f2, f2.len());
    let file = [first.out.as_slice(), &second.out].concat();
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 0, 2]);

    let mut second = Ng::new(false);
    second.idb(LINKTYPE_ETHERNET, &[]);
    second.epb(0, 1_000_002, &f1, f1.len());
    second.epb(0, 1_000_003, &f2, f2.len());
    let file = [first.out.as_slice(), &second.out].concat();
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, payload);
    assert_eq!(reassembly(&stats), [3, 1, 0, 0, 0, 0, 1]);
}

/// `tcpdump -i any` (LINKTYPE_LINUX_SLL) on a host with a VLAN: libpcap puts the 802.1Q tag
/// back after the cooked header (the protocol field reads 0x8100, then the tag, then the
/// original ethertype), as the LinkKey commit's VLAN handling expects to see VLANs. A user
/// replaying such a capture expects the UDP datagram on VLAN 10 to be read, as the same
/// frame in an Ethernet capture is (and its fragments kept apart by VLAN). Instead the cooked
/// header's protocol is ignored and the bytes after it are parsed as an IP header
/// (`SlicedPacket::from_ip`): the tagged frame is skipped.
#[test]
fn a_vlan_tagged_datagram_in_a_linux_cooked_capture_is_read() {
    let payload = b"on a vlan".to_vec();
    let ip = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    // Packet type 0 (to us), ARPHRD_ETHER, 6-byte address, then protocol 0x8100, the tag
    // (VLAN 10) and the original protocol.
    let mut f = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x81, 0x00];
    f.extend_from_slice(&[0x00, 0x0a, 0x08, 0x00]);
    f.extend_from_slice(&ip);
    let (got, stats) = read(&pcap(LINKTYPE_LINUX_SLL, &[(1, 0, &f)])).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, payload);
}

/// `LinkKey::vlans` says "0 is no VLAN (untagged, or a priority tag)": an 802.1Q tag with
/// VLAN id 0 (802.1p priority only) puts the frame on no VLAN, the same link as an untagged
/// one. A datagram whose first fragment carries a priority tag and whose last does not (a
/// host tagging by priority, a switch that strips the tag of some frames) is one datagram on
/// one link, and a user expects it reassembled. Instead a priority tag is keyed as VLAN
/// "0 + 1": the two fragments are taken for copies on two VLANs, nothing is reassembled and
/// both halves are left unfinished.
#[test]
fn a_priority_tagged_fragment_and_an_untagged_one_are_one_datagram() {
    let payload = text(40, 6);
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    let (f1, f2) = (
        v4_fragment_ip(&whole, 61, 0, 24, true, &[]),
        v4_fragment_ip(&whole, 61, 24, 48, false, &[]),
    );
    let mut tagged = vec![0; 12];
    tagged.extend_from_slice(&[0x81, 0x00, 0xa0, 0x00, 0x08, 0x00]); // PCP 5, VLAN 0
    tagged.extend_from_slice(&f1);
    let untagged = ethernet(&f2);
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &tagged), (1, 1, &untagged)]);
    let (got, stats) = read(&file).expect("readable");
    assert_eq!(got.len(), 1, "{stats:?}");
    assert_eq!(got[0].payload, payload);
    assert_eq!(reassembly(&stats), [2, 1, 0, 0, 0, 0, 0]);
}

// ---- review 6 ----

/// An IPv4/UDP packet from `udp_ipv4` with its UDP checksum (RFC 768: over the pseudo header,
/// the UDP header and data) filled in, as a sender fragmenting in software writes it.
fn with_udp_checksum(mut ip: Vec<u8>) -> Vec<u8> {
    let sum16 = |bytes: &[u8], mut acc: u32| {
        for c in bytes.chunks(2) {
            acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        acc
    };
    ip[26..28].copy_from_slice(&[0, 0]);
    let udp_len = (ip.len() - 20) as u16;
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&udp_len.to_be_bytes());
    let mut acc = sum16(&ip[20..], sum16(&pseudo, 0));
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    let mut c = !(acc as u16);
    if c == 0 {
        c = 0xffff;
    }
    ip[26..28].copy_from_slice(&c.to_be_bytes());
    ip
}

/// RFC 768 gives the UDP Length as the header and data, at least 8; Linux (`__udp4_lib_rcv`)
/// drops an IPv4 datagram whose Length is under 8 (0 included) as a short packet, and
/// `CaptureStats::reassembly_invalid` says a reassembly "whose datagram is not valid UDP" is
/// dropped. A user replaying a capture expects the reassembled datagram with UDP Length 0 to
/// be dropped and counted invalid. Instead etherparse's `UdpSlice::from_slice` takes Length 0
/// as "use the slice length" (meant for IPv6 jumbograms), and the datagram is handed out.
#[test]
fn a_reassembled_ipv4_datagram_with_udp_length_0_is_invalid() {
    let payload = text(40, 21);
    let mut whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &payload);
    whole[24..26].copy_from_slice(&[0, 0]); // UDP Length 0
    let (f1, f2) = (
        v4_fragment(&whole, 71, 0, 24),
        v4_fragment(&whole, 71, 24, 48),
    );
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &f1), (1, 1, &f2)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "{got:?} {stats:?}");
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 1, 0]);
}

/// RFC 4963 section 3: the 16-bit IPv4 identification wraps within seconds at high rates,
/// so the first fragment of one datagram and the last of another with the same
/// identification (their other fragments lost) reassemble into a datagram neither sent.
/// The UDP checksum is what catches it: Linux verifies it on the reassembled datagram and
/// drops a mismatch (a fragmented datagram's checksum is computed in software, never left to
/// offload, so a capture holds it right). A user expects such a mixed datagram dropped, not
/// replayed as text nobody typed. Instead no checksum is checked and the mix is handed out.
#[test]
fn a_reassembled_datagram_mixed_from_two_datagrams_fails_its_udp_checksum_and_is_dropped() {
    let a = with_udp_checksum(udp_ipv4(
        [10, 0, 0, 1],
        40000,
        [10, 0, 0, 2],
        5004,
        &text(40, 1),
    ));
    let b = with_udp_checksum(udp_ipv4(
        [10, 0, 0, 1],
        40000,
        [10, 0, 0, 2],
        5004,
        &text(40, 2),
    ));
    // Each alone reassembles (the checksums are right).
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[
            (1, 0, &v4_fragment(&a, 9, 0, 24)),
            (1, 1, &v4_fragment(&a, 9, 24, 48)),
        ],
    );
    assert_eq!(read(&file).expect("readable").0.len(), 1);
    // A's first fragment and B's last one, same identification.
    let (f1, f2) = (v4_fragment(&a, 9, 0, 24), v4_fragment(&b, 9, 24, 48));
    let file = pcap(LINKTYPE_ETHERNET, &[(1, 0, &f1), (1, 1, &f2)]);
    let (got, stats) = read(&file).expect("readable");
    assert!(got.is_empty(), "a datagram nobody sent: {got:?} {stats:?}");
    assert_eq!(reassembly(&stats), [2, 0, 0, 0, 0, 1, 0]);
}

/// Linux drops an IPv4 datagram whose UDP Length is under 8 (`__udp4_lib_rcv`), so the live
/// gateway never gets one; etherparse read Length 0 as "the rest of the packet" (an IPv6
/// jumbogram's rule), and replay said text the gateway never received.
#[test]
fn a_whole_ipv4_datagram_with_udp_length_under_8_is_skipped_as_linux_drops_it() {
    for length in [0u16, 7] {
        let mut ip = udp_ipv4([10, 0, 0, 1], 4000, [10, 0, 0, 2], 5004, b"Hello. ");
        ip[24..26].copy_from_slice(&length.to_be_bytes());
        let (got, stats) = read(&pcap(101, &[(1, 0, &ip)])).expect("readable");
        assert!(got.is_empty(), "length {length}: handed out {got:?}");
        assert_eq!(
            (stats.frames, stats.udp, stats.skipped),
            (1, 0, 1),
            "{stats:?}"
        );
    }
}

/// Replay's clock is the capture's: `read_frames_from` reports every timestamped frame once, in
/// file order, with the datagram it gives or with only its time (an ARP frame, the first
/// fragment of a datagram), so time passes on frames that carry nothing replay feeds.
#[test]
fn every_timestamped_frame_reports_its_time_in_file_order() {
    let whole = udp_ipv4([10, 0, 0, 1], 40000, [10, 0, 0, 2], 5004, &text(40, 1));
    let arp = [vec![0xff; 12], vec![0x08, 0x06], vec![0; 28]].concat();
    let udp = ethernet(&whole);
    let first = v4_fragment(&whole, 7, 0, 24);
    let last = v4_fragment(&whole, 7, 24, whole.len() - 20);
    let file = pcap(
        LINKTYPE_ETHERNET,
        &[
            (1, 0, &arp),
            (2, 0, &udp),
            (3, 0, &first),
            (4, 0, &last),
            (70, 0, &arp),
        ],
    );
    let mut frames = Vec::new();
    let stats = read_frames_from(file.as_slice(), &mut |f| {
        frames.push(f);
        std::ops::ControlFlow::Continue(())
    })
    .expect("readable");
    let seen: Vec<(u64, bool)> = frames
        .iter()
        .map(|f| (f.time().0 / 1_000_000, matches!(f, Frame::Udp(..))))
        .collect();
    assert_eq!(
        seen,
        [(1, false), (2, true), (3, false), (4, true), (70, false)],
        "{stats:?}"
    );
    assert_eq!(frames[0], Frame::Other(Time(1_000_000), 0));
    assert_eq!((stats.frames, stats.udp), (5, 2), "{stats:?}");
}
