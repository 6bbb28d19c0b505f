//! Sequence restarts (RFC 3550 A.1) through the core: where a rule telling late duplicates
//! from restarts went wrong (this session's reviews; see `tests/mixer_clock.rs`), and a
//! restart's first packets lost or kept (README "Sequence", "Loss").

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway, red, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// Every word of every `context.add`.
fn words(out: &[Envelope]) -> Vec<String> {
    (out.iter().filter(|e| e.kind == "context.add"))
        .flat_map(|e| {
            e.payload["content"]
                .as_str()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Unpaced t140llm (a packet per chunk, 30 ms apart) sends 150 packets, is quiet 20 s, then
/// its next reply restarts on the same source and SSRC at sequence 0, timestamp 0
/// (docs/t140llm.md): an RFC 3550 A.1 restart, with the same headers as late duplicates of its
/// first reply's first packets. Its timestamps count packets (+160), not time. A rule that read
/// them as a 1000 Hz clock dropped each run of three as late duplicates, then the rest as
/// stale: the reply's 200 packets vanished unmarked. Every word must arrive.
#[test]
fn a_t140llm_restart_is_not_taken_for_late_duplicates() {
    let mut gw = Gateway::new(Config {
        compat: pvp_t140::Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    });
    let mut t = 0u64;
    let mut send = |t: u64, seq: u16, text: String| {
        let mut d = Vec::new();
        let ts = u32::from(seq) * 160;
        rtp::write_packet(&mut d, false, 96, seq, ts, 0x1122_3344, text.as_bytes());
        gw.handle_datagram(at(t), addr(6000), &d);
    };
    for seq in 0..150u16 {
        send(t, seq, format!("a{seq}. "));
        t += 30;
    }
    t += 20_000;
    for seq in 0..200u16 {
        send(t, seq, format!("b{seq}. "));
        t += 30;
    }
    gw.shutdown(at(t + 5_000));
    let said = words(&drain(&mut gw));
    let missing: Vec<u16> = (0..200u16)
        .filter(|k| !said.contains(&format!("b{k}.")))
        .collect();
    let s = (gw.stats().restarts, gw.stats().lost);
    let range = missing.first().zip(missing.last());
    assert!(
        missing.is_empty(),
        "{range:?} missing; (restarts, lost) {s:?}"
    );
}

const SSRC: u32 = 0x5157_0001;

/// A `text/red` packet (payload type 100; RFC 2198, generations oldest first, 300 ms apart) of
/// [`SSRC`], stamped 300 ms a sequence number.
fn red_packet(seq: u16, marker: bool, gens: &[&str], primary: &str) -> Vec<u8> {
    let n = gens.len();
    let blocks: Vec<(u16, &[u8])> = (gens.iter().enumerate())
        .map(|(i, g)| ((300 * (n - i)) as u16, g.as_bytes()))
        .collect();
    let mut payload = Vec::new();
    red::write_payload(&mut payload, 98, &blocks, primary.as_bytes());
    let mut d = Vec::new();
    let ts = u32::from(seq).wrapping_mul(300);
    rtp::write_packet(&mut d, marker, 100, seq, ts, SSRC, &payload);
    d
}

/// A plain `text/t140` packet of [`SSRC`].
fn plain_packet(seq: u16, marker: bool, text: &str) -> Vec<u8> {
    t140m(seq, SSRC, marker, text)
}

/// Feeds `(ms, datagram)` in order, firing the core's timers as time passes, then shuts down
/// well after the last one; returns every `context.add`'s content, joined by a space, and the
/// core.
fn run(packets: &[(u64, Vec<u8>)]) -> (String, Gateway) {
    let mut gw = Gateway::new(Config::default());
    let mut last = 0;
    for (ms, d) in packets {
        gw.handle_timeout(at(*ms));
        gw.handle_datagram(at(*ms), addr(4000), d);
        last = *ms;
    }
    gw.handle_timeout(at(last + 5_000));
    gw.shutdown(at(last + 6_000));
    let text = (drain(&mut gw).iter().filter(|e| e.kind == "context.add"))
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect::<Vec<_>>()
        .join(" ");
    (text, gw)
}

/// A restart's run head that is no session start is a stream's lost head: marked, and
/// delivered with every generation (README "Loss": "a stream whose first packets were lost is
/// marked at its head"; "Sequence": a restart loses no text). RED, two generations: "Hello
/// there." (100, its idle tail 101, 102), then the sender restarts at 40000; 40000-40002 are
/// lost, 40003 carries 40001's and 40002's text. The review (session 32) found the generations
/// dropped and the loss unmarked ("Hello there. Third sentence."); as on a fresh stream, the
/// restart says "\u{fffd}part of it. Third sentence.".
#[test]
fn a_restart_whose_first_packets_were_lost_recovers_their_redundancy_and_marks_the_loss() {
    let mut p = vec![
        (0, red_packet(100, true, &["", ""], "\u{feff}Hello there. ")),
        (
            300,
            red_packet(101, false, &["", "\u{feff}Hello there. "], ""),
        ),
        (
            600,
            red_packet(102, false, &["\u{feff}Hello there. ", ""], ""),
        ),
    ];
    // 40000 "\u{feff}Second " (marked), 40001 "part ", 40002 "of it. " lost.
    p.push((
        10_900,
        red_packet(40_003, false, &["part ", "of it. "], "Third "),
    ));
    p.push((
        11_200,
        red_packet(40_004, false, &["of it. ", "Third "], "sentence. "),
    ));
    p.push((
        11_500,
        red_packet(40_005, false, &["Third ", "sentence. "], ""),
    ));
    p.push((11_800, red_packet(40_006, false, &["sentence. ", ""], "")));
    let (text, gw) = run(&p);
    let s = gw.stats();
    assert_eq!(
        (text.as_str(), s.restarts, s.head_lost, s.recovered),
        ("Hello there. \u{fffd}part of it. Third sentence.", 1, 1, 2)
    );
}

/// The same without redundancy (plain text/t140): the restart's first packet 40000 is lost,
/// and the run 40001, 40002 opens without a session start: its head is marked, as a fresh
/// stream's would be (review, session 32: "More words." came with no mark, head_lost 0).
#[test]
fn a_restart_whose_first_packet_was_lost_marks_the_loss() {
    let mut p = vec![
        (0, plain_packet(100, true, "\u{feff}Hello there. ")),
        (300, plain_packet(101, false, "")),
    ];
    // 40000 "\u{feff}Second sentence. " (marked) lost.
    p.push((10_300, plain_packet(40_001, false, "More words")));
    p.push((10_600, plain_packet(40_002, false, ". ")));
    p.push((10_900, plain_packet(40_003, false, "")));
    let (text, gw) = run(&p);
    let s = gw.stats();
    assert_eq!(
        (text.as_str(), s.restarts, s.head_lost),
        ("Hello there. \u{fffd}More words.", 1, 1)
    );
}

/// A kept packet just before the run that confirms a restart is the restart's: plain
/// text/t140 restart at 40000 (marked, BOM), 40001 lost, 40002 and 40003 confirm. 40000 is
/// delivered and 40001 marked (README "Sequence": every packet of the run is delivered;
/// "Loss": one U+FFFD per lost packet). The review (session 32) found 40000 dropped as a
/// stray (counted `sequence_jump`) and 40001 unmarked: without redundancy nothing carried its
/// text again.
#[test]
fn a_restart_keeps_its_first_packet_when_the_second_is_lost() {
    let p = vec![
        (0, plain_packet(100, true, "\u{feff}Hello there. ")),
        (300, plain_packet(101, false, "")),
        (10_000, plain_packet(40_000, true, "\u{feff}Second ")),
        // 40001 "half " lost.
        (10_600, plain_packet(40_002, false, "part ")),
        (10_900, plain_packet(40_003, false, "two. ")),
        (11_200, plain_packet(40_004, false, "")),
    ];
    let (text, gw) = run(&p);
    let s = gw.stats();
    let jumps = s.drops(pvp_t140::DropReason::SequenceJump);
    assert_eq!(
        (text.as_str(), s.restarts, s.lost, jumps),
        ("Hello there. Second \u{fffd}part two.", 1, 1, 0)
    );
}
