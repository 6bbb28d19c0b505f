//! Found by review ac (session 43): reading captures and replaying them, on captures written
//! byte by byte: pcapng Simple Packet Blocks replayed, datagrams cut by the snap length warned
//! about, and what replay reads right (nanosecond pcap, interfaces' resolutions and offsets,
//! UDP Length mismatches, files cut short, not a capture).

use pvp_t140::capture::{CaptureStats, Frame, read_frames_from};
use pvp_t140::time::Time;

#[path = "common/frames.rs"]
mod frames;
use frames::{replay, udp_ipv4};

#[path = "common/pcapng.rs"]
mod pcapng;
use pcapng::Ng;

/// A classic pcap: magic chosen by `nanos`, byte order by `be`; records (sec, frac, caplen,
/// origlen, data).
fn pcap_of(
    be: bool,
    nanos: bool,
    snaplen: u32,
    linktype: u32,
    recs: &[(u32, u32, u32, u32, Vec<u8>)],
) -> Vec<u8> {
    let w32 = |v: u32| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let w16 = |v: u16| if be { v.to_be_bytes() } else { v.to_le_bytes() };
    let mut f = Vec::new();
    f.extend_from_slice(&w32(if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
    f.extend_from_slice(&w16(2));
    f.extend_from_slice(&w16(4));
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&w32(snaplen));
    f.extend_from_slice(&w32(linktype));
    for (s, frac, caplen, orig, data) in recs {
        f.extend_from_slice(&w32(*s));
        f.extend_from_slice(&w32(*frac));
        f.extend_from_slice(&w32(*caplen));
        f.extend_from_slice(&w32(*orig));
        f.extend_from_slice(data);
    }
    f
}

fn ip(payload: &[u8]) -> Vec<u8> {
    udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, payload)
}

fn ethernet(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
    f.extend_from_slice(ip);
    f
}

/// A frame as the reader gives it: (time, interface, payload if UDP).
type Got = (Time, usize, Option<Vec<u8>>);

/// Every frame the reader gives, and how the reading ended.
fn frames_of(bytes: &[u8]) -> (Vec<Got>, Result<CaptureStats, String>) {
    let mut got = Vec::new();
    let r = read_frames_from(bytes, &mut |f| {
        got.push(match f {
            Frame::Udp(d, i) => (d.time, i, Some(d.payload)),
            Frame::Other(t, i) => (t, i, None),
        });
        std::ops::ControlFlow::Continue(())
    })
    .map_err(|e| e.to_string());
    (got, r)
}

fn rtp(seq: u16, ts: u32, text: &str) -> Vec<u8> {
    let mut p = vec![0x80, 0x80 | 98];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&ts.to_be_bytes());
    p.extend_from_slice(&0x1234u32.to_be_bytes());
    p.extend_from_slice(text.as_bytes());
    p
}

/// (content) of every context.add on stdout.
fn adds(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["type"] == "context.add")
        .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
        .collect()
}

/// A pcapng Simple Packet Block (pcapng section 4.4) is a packet of the section's first
/// interface without a timestamp; Wireshark and tshark show and dissect it. Replay dropped
/// it as "skipped" (only an info count on stderr) and exited 0: the text it carried never
/// reached the transcript. It is fed at the time of interface 0's previous packet, so no
/// time passes for it.
#[test]
fn a_simple_packet_blocks_text_is_replayed_at_the_previous_packets_time() {
    let mut ng = Ng::new(true);
    ng.idb(101, &[]); // LINKTYPE_RAW
    ng.epb(0, 10_000_000, &ip(&rtp(1, 0, "Hello ")), 0);
    let spb = ip(&rtp(2, 1000, "there. "));
    ng.spb(&spb);
    ng.epb(0, 12_000_000, &ip(&rtp(3, 3000, "Bye.")), 0);
    let (frames, stats) = frames_of(&ng.out);
    let stats = stats.unwrap();
    assert_eq!(
        (stats.frames, stats.udp, stats.skipped),
        (3, 3, 0),
        "{stats:?}"
    );
    let times: Vec<Time> = frames.iter().map(|f| f.0).collect();
    assert_eq!(
        times,
        [Time(10_000_000), Time(10_000_000), Time(12_000_000)]
    );
    assert_eq!(frames[1].2.as_deref(), Some(&rtp(2, 1000, "there. ")[..]));

    let (code, out, err) = replay("spb", &ng.out, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(adds(&out), ["Hello there.", "Bye."], "{err}");
}

/// A pcapng of Simple Packet Blocks alone (a writer that stamps nothing): the text is
/// replayed, all of it at the one time there is, and the padding of a block is not taken
/// for captured bytes.
#[test]
fn a_pcapng_of_simple_packet_blocks_alone_replays_its_text() {
    let mut ng = Ng::new(false);
    ng.idb(1, &[]); // Ethernet
    ng.spb(&ethernet(&ip(&rtp(1, 0, "One. "))));
    ng.spb(&ethernet(&ip(&rtp(2, 1000, "Two."))));
    let (frames, stats) = frames_of(&ng.out);
    assert_eq!(stats.unwrap().udp, 2);
    assert!(frames.iter().all(|f| f.0 == Time(0)));
    let (code, out, err) = replay("spb-only", &ng.out, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(adds(&out), ["One.", "Two."], "{err}");
}

/// What was checked and found right, kept as a regression test: the nanosecond pcap magic
/// in both byte orders, a huge snap length in the header, a datagram the snap length cut
/// (skipped and counted, not cut text), a UDP Length past the IP payload (skipped) or short
/// of it (the payload cut to it, as Linux does), and a pcapng with three interfaces of two
/// link types, decimal and binary `if_tsresol` and an `if_tsoffset`.
#[test]
fn capture_timestamps_resolutions_and_udp_lengths_are_read_right() {
    for be in [false, true] {
        let d = ip(b"x");
        let n = d.len() as u32;
        let f = pcap_of(be, true, u32::MAX, 101, &[(10, 123_456_789, n, n, d)]);
        let (frames, stats) = frames_of(&f);
        assert_eq!(stats.unwrap().udp, 1);
        assert_eq!(frames[0].0, Time(10_123_456), "big-endian: {be}");
    }
    let whole = ip(b"hello world");
    let mut long = whole.clone();
    long[25] += 4; // UDP Length 4 past the IP payload
    let mut short = whole.clone();
    short[25] -= 4;
    let n = whole.len() as u32;
    let f = pcap_of(
        false,
        false,
        30,
        101,
        &[
            (10, 0, 30, n, whole[..30].to_vec()),
            (11, 0, n, n, long),
            (12, 0, n, n, short),
        ],
    );
    let (frames, stats) = frames_of(&f);
    let stats = stats.unwrap();
    assert_eq!(
        (stats.frames, stats.udp, stats.skipped),
        (3, 1, 2),
        "{stats:?}"
    );
    let payloads: Vec<_> = frames.iter().map(|f| f.2.clone()).collect();
    assert_eq!(payloads, [None, None, Some(b"hello w".to_vec())]);

    let mut ng = Ng::new(true);
    ng.idb(1, &[ng.option(9, &[6])]);
    ng.idb(101, &[ng.option(9, &[9]), ng.option(14, &ng.u64(100))]);
    ng.idb(101, &[ng.option(9, &[0x80 | 10])]);
    ng.epb(0, 1_500_000, &ethernet(&ip(b"a")), 0);
    ng.epb(1, 2_000_000_001, &ip(b"b"), 0);
    ng.epb(2, 3 * 1024 + 512, &ip(b"c"), 0);
    let (frames, stats) = frames_of(&ng.out);
    assert_eq!(stats.unwrap().udp, 3);
    let got: Vec<_> = frames.iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        got,
        [
            (Time(1_500_000), 0),
            (Time(102_000_000), 1),
            (Time(3_500_000), 2)
        ]
    );
}

/// A file that is no capture, and an empty one: a clear error naming the file, exit 1, no
/// output; a pcap cut inside its last record: the records before it replayed, exit 0.
#[test]
fn not_a_capture_an_empty_one_and_one_cut_short() {
    for (name, bytes) in [
        ("text", &b"hello, this is not a capture at all\n"[..]),
        ("empty", &b""[..]),
    ] {
        let (code, out, err) = replay(name, bytes, &[]);
        assert_eq!(code, Some(1), "{err}");
        assert!(out.is_empty());
        assert!(
            err.contains(name) && err.contains("not a readable pcap/pcapng capture"),
            "{err}"
        );
    }
    let a = ip(&rtp(1, 0, "Hello there. "));
    let b = ip(&rtp(2, 100, "More text. "));
    let (na, nb) = (a.len() as u32, b.len() as u32);
    let mut f = pcap_of(
        false,
        false,
        262_144,
        101,
        &[(10, 5, na, na, a), (11, 5, nb, nb, b)],
    );
    f.truncate(f.len() - 5);
    let (code, out, err) = replay("cut", &f, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(adds(&out), ["Hello there."]);
    assert!(err.contains("ends inside a record"), "{err}");
}

fn rtp_from(ssrc: u32, seq: u16, ts: u32, text: &str) -> Vec<u8> {
    let mut p = rtp(seq, ts, text);
    p[8..12].copy_from_slice(&ssrc.to_be_bytes());
    p
}

/// Two pcapng interfaces whose clocks stand two minutes apart (one NIC stamping in hardware,
/// the case capture.rs and the README name for reassembly and for frames not fed), each
/// carrying one speaker's datagrams, interleaved 300 ms apart. Fed, the datagrams of the two
/// interfaces drive the one replay clock: each change from the interface behind to the one
/// ahead moves it two minutes on, and each change back is a "step" whose length is added to
/// every later time, so the clock runs away by two minutes per pair of packets. Each
/// speaker's words are then idle-flushed one by one and its stream times out (60 s) between
/// them: a join and a leave per packet instead of one sentence each, as live.
#[test]
#[ignore = "known gap: fed datagrams of pcapng interfaces stamping a minute or more apart \
            run the one replay clock away; a per-interface mapping to the core's time cannot \
            tell an interface stamping ahead from one that starts later, so the fix is not local"]
fn datagrams_on_two_interfaces_stamping_minutes_apart_keep_their_own_spacing() {
    let mut ng = Ng::new(true);
    ng.idb(101, &[]);
    ng.idb(101, &[]);
    let t0: u64 = 1_700_000_000_000_000;
    let skew: u64 = 120_000_000;
    let a = ["Hello ", "there, ", "my ", "friend."];
    let b = ["Good ", "day ", "to ", "you."];
    for k in 0..4 {
        let at = t0 + k as u64 * 600_000;
        let ts = k as u32 * 600;
        let pa = udp_ipv4(
            [10, 0, 0, 1],
            40000,
            [10, 0, 0, 9],
            5004,
            &rtp_from(1, k as u16 + 1, ts, a[k]),
        );
        let pb = udp_ipv4(
            [10, 0, 0, 2],
            40000,
            [10, 0, 0, 9],
            5004,
            &rtp_from(2, k as u16 + 1, ts, b[k]),
        );
        ng.epb(0, at, &pa, 0);
        ng.epb(1, at + 300_000 + skew, &pb, 0);
    }
    let (code, out, err) = replay("skew", &ng.out, &[]);
    assert_eq!(code, Some(0), "{err}");
    let mut got = adds(&out);
    got.sort();
    assert_eq!(
        got,
        ["Good day to you.", "Hello there, my friend."],
        "{err}"
    );
    let joins = out
        .lines()
        .filter(|l| l.contains("\"session.join\""))
        .count();
    assert_eq!(joins, 2, "{out}");
}

/// A capture taken with too small a snap length (`tcpdump -s 96`, old tcpdump's default of
/// 68 or 96 bytes, `dumpcap -s`) cuts the longer datagrams short. Replay rightly skips them
/// (no cut text), but said nothing more than `skipped=N` at info level, the same count as
/// ARP, TCP or other traffic: a capture whose every datagram was cut replayed to nothing,
/// exit 0, with no hint why. The datagrams cut short are counted apart (a cut TCP segment is
/// not one) and warned about, with the remedy.
#[test]
fn datagrams_cut_short_by_the_snap_length_are_counted_apart_and_warned_about() {
    let long = ethernet(&ip(&rtp(1, 0, "A sentence long enough to be cut. ")));
    let short = ethernet(&ip(&rtp(2, 300, "Ok.")));
    let mut tcp = ethernet(&ip(&[0x55; 60]));
    tcp[14 + 9] = 6; // TCP
    let snap = 60u32;
    let cut = |f: &Vec<u8>| f[..snap as usize].to_vec();
    let (nl, ns, nt) = (long.len() as u32, short.len() as u32, tcp.len() as u32);
    let f = pcap_of(
        false,
        false,
        snap,
        1,
        &[
            (10, 0, snap, nl, cut(&long)),
            (10, 100, snap, nt, cut(&tcp)),
            (10, 300_000, ns, ns, short),
            (11, 0, snap, nl, cut(&long)),
        ],
    );
    let (code, out, err) = replay("snaplen", &f, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(adds(&out), ["Ok."], "{err}");
    let warn = err
        .lines()
        .find(|l| l.contains("WARN") && l.contains("snap length"))
        .unwrap_or_else(|| panic!("no warning about the snap length: {err}"));
    assert!(warn.contains("datagrams=2"), "{warn}");

    // The real dumpcap capture in pcaps/: its three datagrams all cut.
    let (code, _, err) = replay(
        "snaplen-fixture",
        &std::fs::read("pcaps/sll2_cut_by_snaplen.pcapng").unwrap(),
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("WARN") && l.contains("snap length") && l.contains("datagrams=3")),
        "{err}"
    );
}

/// A pcapng of Simple Packet Blocks alone replays at one instant: the per-source rate limit
/// (1,000 packets a second) refuses all but the first 1,000 of a source, as the README says,
/// and `--max-pps-per-source 0` gives them all.
#[test]
fn many_simple_packet_blocks_of_one_source_need_the_rate_limit_lifted() {
    let mut ng = Ng::new(true);
    ng.idb(101, &[]);
    for k in 0..1200u16 {
        ng.spb(&ip(&rtp(k + 1, u32::from(k) * 300, "a")));
    }
    let total = |out: &str| adds(out).iter().map(String::len).sum::<usize>();
    let (code, out, err) = replay("spb-many", &ng.out, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(total(&out), 1000, "{err}");
    let (code, out, err) = replay("spb-many", &ng.out, &["--max-pps-per-source", "0"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(total(&out), 1200, "{err}");
}
