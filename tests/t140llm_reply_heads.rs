//! `--compat t140llm`: a reply's head (packet 0, sequence 0 and timestamp 0, docs/t140llm.md
//! section 3) lost, late, or carried only as redundancy, on a new stream or after a reply on
//! the same socket.
//!
//! Found by review ar (session 46), reading the receive-path decoders against RFC 3550 5.1,
//! RFC 2198 3, RFC 4103 4-5 and T.140, and the t140llm 0.0.19 sender.

use pvp_t140::{Compat, Config, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::{addr, at, drain, shown};

fn t140llm_cfg() -> Config {
    Config {
        compat: Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    }
}

/// t140llm's packet `seq` of a reply (docs/t140llm.md section 3: numbered and stamped from 0,
/// 160 a packet, never marked): plain PT 96 with no generations, else RED PT 98 with them
/// newest first (section 5).
fn t140llm_packet(seq: u16, gens_newest_first: &[&str], text: &str) -> Vec<u8> {
    let ts = u32::from(seq) * 160;
    let mut d = Vec::new();
    if gens_newest_first.is_empty() {
        rtp::write_packet(&mut d, false, 96, seq, ts, 0x1122_3344, text.as_bytes());
        return d;
    }
    let p = core_helpers::t140llm_red_payload(gens_newest_first, text);
    rtp::write_packet(&mut d, false, 98, seq, ts, 0x1122_3344, &p);
    d
}

/// Runs t140llm packets, 100 ms apart, through a gateway in `--compat t140llm`, then a
/// shutdown: what a reader sees, the count of lost heads and of losses no voice was certain
/// for (README "Loss": in t140llm's multiplexing a loss is marked only on a stream's only
/// voice, else counted; a head has none yet).
fn t140llm_reply(packets: &[Vec<u8>]) -> (String, u64, u64) {
    let mut gw = Gateway::new(t140llm_cfg());
    for (i, p) in packets.iter().enumerate() {
        gw.handle_datagram(at(100 * i as u64), addr(6000), p);
    }
    gw.shutdown(at(10_000));
    let text = shown(&drain(&mut gw)).join(" ");
    let s = gw.stats();
    (text, s.head_lost, s.lost_unattributed)
}

/// Found by review ar (session 46). t140llm never sets the marker bit, so `--compat t140llm`
/// took any stream's first packet for its start (docs/t140llm.md, deviation 2). But t140llm
/// numbers and stamps every reply from 0 (section 3), and a reply whose first packets were lost
/// beyond its redundancy (its default sends none) lost their text without a trace: no
/// `head_lost`, no loss counted, where every later loss is (RFC 4103 5.3, README "Loss"). A
/// head that neither is nor carries packet 0 is now a lost head, as an RFC 4103 stream's
/// unmarked one is: counted, and its loss, with no voice yet to be certain of, counted as
/// `lost_unattributed`, as any t140llm loss no voice is certain for.
#[test]
fn a_t140llm_reply_whose_first_packets_were_lost_counts_its_lost_head() {
    // Plain (t140llm's default): packet 0, "Hello ", lost.
    let plain = [
        t140llm_packet(1, &[], "big "),
        t140llm_packet(2, &[], "world."),
    ];
    assert_eq!(t140llm_reply(&plain), ("big world.".to_owned(), 1, 1));
    // RED with 2 generations: packets 0-2 lost, packet 3 carries 2 and 1 but not 0.
    let red = [t140llm_packet(3, &["fro", "lo "], "m t140llm.")];
    assert_eq!(t140llm_reply(&red), ("lo from t140llm.".to_owned(), 1, 1));
}

/// Found by review ar (session 46). A t140llm reply's head that carries packet 0 in its
/// redundancy starts the reply (nothing marked), and a reply's packet 0 that comes just after
/// packet 1 (reordered) is put in front of it: taken for the start, packet 1 had made packet 0 a
/// late duplicate, dropped as stale with its text.
#[test]
fn a_t140llm_reply_starts_at_its_packet_0_though_it_came_late_or_only_as_redundancy() {
    let recovered = [t140llm_packet(2, &["lo ", "Hel"], "world.")];
    assert_eq!(t140llm_reply(&recovered), ("Hello world.".to_owned(), 0, 0));
    let reordered = [
        t140llm_packet(1, &[], "lo "),
        t140llm_packet(0, &[], "Hel"),
        t140llm_packet(2, &[], "world."),
    ];
    assert_eq!(t140llm_reply(&reordered), ("Hello world.".to_owned(), 0, 0));
}

/// Found by review ar (session 46). t140llm begins every reply at sequence 0 and timestamp 0;
/// a reply through the same socket (a custom transport) after a quiet spell was told only by
/// its packet 0. With that one lost, its next packets, a few numbers behind the last reply's,
/// were late duplicates by RFC 3550 A.1 and dropped as stale, with their text: a whole reply
/// lost to one packet, though its redundancy carried packet 0 (RED with 2 generations). A
/// packet after a quiet spell that is behind the stream and carries packet 0 starts the
/// reply as packet 0 does, and its generations give the reply back whole.
#[test]
fn a_t140llm_reply_whose_packet_0_was_lost_after_a_reply_on_the_same_socket_is_read() {
    let mut gw = Gateway::new(t140llm_cfg());
    // The last reply: "One two three." in 10 packets, the first plain.
    let words = ["On", "e ", "tw", "o ", "th", "re", "e.", " ", " ", " "];
    for (i, w) in words.iter().enumerate() {
        let gens: Vec<&str> = (1..=2).filter(|k| *k <= i).map(|k| words[i - k]).collect();
        let p = t140llm_packet(i as u16, &gens, w);
        gw.handle_datagram(at(100 * i as u64), addr(6000), &p);
    }
    // 3 s later the next reply, "Four five.", through the same socket: its packet 0 lost.
    let next = ["Fo", "ur", " f", "iv", "e."];
    for (i, w) in next.iter().enumerate().skip(1) {
        let gens: Vec<&str> = (1..=2).filter(|k| *k <= i).map(|k| next[i - k]).collect();
        let p = t140llm_packet(i as u16, &gens, w);
        gw.handle_datagram(at(4000 + 100 * i as u64), addr(6000), &p);
    }
    gw.shutdown(at(20_000));
    let text = shown(&drain(&mut gw)).join(" ");
    assert_eq!(text, "One two three. Four five.");
    assert_eq!(gw.stats().drops(pvp_t140::DropReason::Stale), 0);
    // A reply's own packet 1 after a slow start (quiet past the reorder wait) continues it:
    // its generation, packet 0, is not said again.
    let slow = [
        (0, t140llm_packet(0, &[], "Hel")),
        (1500, t140llm_packet(1, &["Hel"], "lo.")),
    ];
    let mut gw = Gateway::new(t140llm_cfg());
    for (ms, p) in &slow {
        gw.handle_datagram(at(*ms), addr(6000), p);
    }
    gw.shutdown(at(20_000));
    assert_eq!(shown(&drain(&mut gw)).join(" "), "Hello.");
}
