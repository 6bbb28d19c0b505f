//! A second review's tests of three changes: t140llm's RED blocks over 255 bytes read by the
//! packet they repeat (`src/clamped.rs`), a mixer source's leave after its BYE, and a marked
//! packet a BYE overtook. Five failed on 9fdbd66 (a long RED primary in t140llm's
//! multiplexing was never found again; a batch retried the refused packets after later ones,
//! which counted them recovered and stale; other streams' long packets pushed a stream's out; a
//! mixer source's empty packets moved its clock estimate on by the time since its last text).
//! The others check the boundaries. A third review found two more (a RED primary a multiplex
//! prefix takes over 255 bytes was not remembered; the mixer clock counted from when a held
//! packet was placed, not when it came).

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, DropReason, Gateway, red, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

fn t140llm_cfg() -> Config {
    Config {
        compat: pvp_t140::Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    }
}

fn t140llm_plain(seq: u16, csrcs: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0x80 | csrcs.len() as u8, 96];
    d.extend_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&(u32::from(seq) * 160).to_be_bytes());
    d.extend_from_slice(&0x1122_3344u32.to_be_bytes());
    for c in csrcs {
        d.extend_from_slice(&c.to_be_bytes());
    }
    d.extend_from_slice(payload);
    d
}

fn t140llm_red_raw(seq: u16, gens_newest_first: &[&[u8]], primary: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    for (k, g) in gens_newest_first.iter().enumerate() {
        p.push(0xe0);
        p.extend_from_slice(&(160 * (k as u16 + 1)).to_be_bytes());
        p.push(g.len().min(255) as u8);
    }
    p.push(0x60);
    for g in gens_newest_first {
        p.extend_from_slice(g);
    }
    p.extend_from_slice(primary);
    let mut d = Vec::new();
    rtp::write_packet(&mut d, false, 98, seq, u32::from(seq) * 160, 0x11223344, &p);
    d
}

fn adds(out: &[Envelope]) -> Vec<(String, String)> {
    out.iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| {
            (
                e.sender.clone(),
                e.payload["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// t140llm's multiplexer with RED (docs/t140llm.md sections 5 and 6, prefix mode): the RED
/// primary is bare text, its redundant copies carry the `<id>\x1E` prefix. A 300-byte primary
/// in RED packet 1 is repeated clamped (255) in packets 2 and 3. The gateway received packet
/// 1, so by docs/t140llm.md section 5 ("only if that packet was lost is the RED packet still
/// dropped") packets 2 and 3 should be read, not dropped with " ok" and ".".
#[test]
fn prefix_multiplex_red_long_primary_is_unclamped() {
    let mut gw = Gateway::new(t140llm_cfg());
    let long = "x".repeat(300);
    let long_copy = [b"alpha\x1e".as_slice(), long.as_bytes()].concat();
    gw.handle_datagram(at(0), addr(6000), &t140llm_plain(0, &[], b"alpha\x1eHi "));
    gw.handle_datagram(
        at(100),
        addr(6000),
        &t140llm_red_raw(1, &[b"alpha\x1eHi "], long.as_bytes()),
    );
    gw.handle_datagram(
        at(4200),
        addr(6000),
        &t140llm_red_raw(2, &[&long_copy, b"alpha\x1eHi "], b" ok"),
    );
    gw.handle_datagram(
        at(4300),
        addr(6000),
        &t140llm_red_raw(3, &[b"alpha\x1e ok", &long_copy], b"."),
    );
    gw.shutdown(at(9000));
    let got = adds(&drain(&mut gw));
    let s = gw.stats();
    assert_eq!(
        s.drops(DropReason::Red(red::RedError::AmbiguousLength)),
        0,
        "{got:?}"
    );
    let all: String = got.iter().map(|(_, t)| t.as_str()).collect();
    assert!(all.contains("ok"), "{got:?}");
}

/// The same with t140llm's CSRC multiplex mode: the RED primary has CC=0 and bare text, the
/// redundant copy is `packet.slice(12)` of the plain packet: the 4 CSRC bytes, then the text.
#[test]
fn csrc_multiplex_red_long_primary_is_unclamped() {
    let mut gw = Gateway::new(t140llm_cfg());
    let long = "x".repeat(300);
    let copy = |t: &[u8]| [&1u32.to_be_bytes()[..], t].concat();
    gw.handle_datagram(at(0), addr(6000), &t140llm_plain(0, &[1], b"Hi "));
    gw.handle_datagram(
        at(100),
        addr(6000),
        &t140llm_red_raw(1, &[&copy(b"Hi ")], long.as_bytes()),
    );
    gw.handle_datagram(
        at(4200),
        addr(6000),
        &t140llm_red_raw(2, &[&copy(long.as_bytes()), &copy(b"Hi ")], b" ok"),
    );
    gw.handle_datagram(
        at(4300),
        addr(6000),
        &t140llm_red_raw(3, &[&copy(b" ok"), &copy(long.as_bytes())], b"."),
    );
    gw.shutdown(at(9000));
    let got = adds(&drain(&mut gw));
    assert_eq!(
        gw.stats()
            .drops(DropReason::Red(red::RedError::AmbiguousLength)),
        0,
        "{got:?}"
    );
}

/// A lossless, in-order t140llm stream read in one batch (a driver's recvmmsg): 0 is a
/// 330-byte burst, 1 and 2 repeat it clamped, 3 is parseable. Nothing was lost or late on the
/// wire, yet the gateway counts recovered packets and stale drops.
#[test]
fn unclamped_packets_in_one_batch_are_not_counted_as_recovered_and_stale() {
    let mut gw = Gateway::new(t140llm_cfg());
    let burst = "👩\u{200d}💻".repeat(30);
    let b = burst.as_bytes();
    let p0 = t140llm_plain(0, &[], b);
    let p1 = t140llm_red_raw(1, &[b], b" ok");
    let p2 = t140llm_red_raw(2, &[b" ok", b], b".");
    let p3 = t140llm_red_raw(3, &[b".", b" ok"], b" Bye.");
    let batch: Vec<(std::net::SocketAddr, &[u8])> = vec![
        (addr(6000), &p0),
        (addr(6000), &p1),
        (addr(6000), &p2),
        (addr(6000), &p3),
    ];
    gw.handle_batch(at(0), &batch);
    gw.shutdown(at(9000));
    let got = adds(&drain(&mut gw));
    let text: String = got
        .iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let s = gw.stats();
    eprintln!(
        "text {text:?} recovered {} lost {} drops {} stale {} unclamped {}",
        s.recovered,
        s.lost,
        s.drops_total(),
        s.drops(DropReason::Stale),
        s.red_unclamped
    );
    assert_eq!((s.drops_total(), s.recovered, s.lost), (0, 0, 0), "{text}");
}

/// Two mixers. X's sources 2 and 3 say BYE at 100 and 600 (leaves due 1100, 1600); Y's
/// source 5 at 300 (due 1300). The driver stalls and calls handle_timeout once at 5000.
/// Envelopes must not go back in time: 1100, 1300, 1600.
#[test]
fn a_late_timeout_call_keeps_leaves_of_two_mixers_in_time_order() {
    let mut gw = Gateway::new(Config::default());
    let x = addr(5000);
    let y = addr(5001);
    gw.handle_datagram(at(0), x, &with_csrc(1, 1000, 9, 1, b"A1. "));
    gw.handle_datagram(at(1), x, &with_csrc(2, 1001, 9, 2, b"A2. "));
    gw.handle_datagram(at(2), x, &with_csrc(3, 1002, 9, 3, b"A3. "));
    gw.handle_datagram(at(3), y, &with_csrc(1, 1000, 8, 4, b"B4. "));
    gw.handle_datagram(at(4), y, &with_csrc(2, 1001, 8, 5, b"B5. "));
    gw.handle_datagram(at(100), x, &mixer_bye_from(9, 2));
    gw.handle_datagram(at(300), y, &mixer_bye_from(8, 5));
    gw.handle_datagram(at(600), x, &mixer_bye_from(9, 3));
    drain(&mut gw);
    gw.handle_timeout(at(5000));
    let out = drain(&mut gw);
    assert_ts_monotonic(&out);
}

/// The same shape with idle flushes instead of leaves (no BYE at all).
#[test]
fn a_late_timeout_call_keeps_idle_flushes_of_two_mixers_in_time_order() {
    let mut gw = Gateway::new(Config::default());
    let x = addr(5000);
    let y = addr(5001);
    gw.handle_datagram(at(0), x, &with_csrc(1, 1000, 9, 1, b"A1"));
    gw.handle_datagram(at(300), y, &with_csrc(1, 1000, 8, 4, b"B4"));
    gw.handle_datagram(at(600), x, &with_csrc(2, 1600, 9, 2, b"A2"));
    drain(&mut gw);
    gw.handle_timeout(at(9000));
    let out = drain(&mut gw);
    assert_ts_monotonic(&out);
}

/// RFC 4103 5.2 / 4.2: after B's text ("Bravo. ", ts 1010, arriving at 10) its sender sends
/// redundancy-only packets with empty primaries, 300 ms apart (ts 1310 at 310, ts 1610 at
/// 610), as every RED sender does once text stops. B's BYE arrives at 1000 (the mixer's clock
/// then is about 2000). B speaks again at 1300, stamped 2300: after its BYE, so B should leave
/// first and join again (as in mixer_source_bye.rs). The BYE clock estimate counts from the
/// ts of B's last (empty) packet but from the arrival of B's last *text* (`last_text`, 10),
/// 600 ms too early: the BYE was taken as sent at ~2620, "Back." was glued into B's old
/// participation and B was then left at 2000 while it was speaking again.
#[test]
fn a_sources_idle_redundancy_packets_do_not_push_its_bye_clock_past_its_new_words() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), m, &red_csrc(2, 1010, 2, &[], b"Bravo. "));
    gw.handle_datagram(at(310), m, &red_csrc(3, 1310, 2, &[(300, b"Bravo. ")], b""));
    gw.handle_datagram(
        at(610),
        m,
        &red_csrc(4, 1610, 2, &[(600, b"Bravo. "), (300, b"")], b""),
    );
    gw.handle_datagram(at(1000), m, &mixer_bye_from(9, 2));
    gw.handle_datagram(at(1300), m, &with_csrc(5, 2300, 9, 2, b"Back. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "Back."),
        ],
        "{:#?}",
        timeline(&out)
    );
}

/// The same without the empty redundancy packets.
#[test]
fn without_idle_packets_a_source_speaking_after_its_bye_joins_again() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), m, &red_csrc(2, 1010, 2, &[], b"Bravo. "));
    gw.handle_datagram(at(1000), m, &mixer_bye_from(9, 2));
    gw.handle_datagram(at(1300), m, &with_csrc(3, 2300, 9, 2, b"Back. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "Back."),
        ],
        "{:#?}",
        timeline(&out)
    );
}

/// `LongBlocks` kept 64 entries gateway-wide, evicted by count, not age. t140llm's next text
/// after a 30-emoji burst comes some 4 s later (tests/gateway_core.rs); meanwhile 64 other
/// packets over 255 bytes from anywhere (other t140llm streams' bursts, or one sender spraying
/// long datagrams under 64 SSRCs: each is noted before any check of the stream) evict the
/// entry, and this stream's next two primaries are dropped although its long packet came.
#[test]
fn other_streams_long_packets_do_not_evict_a_streams_long_block() {
    let mut gw = Gateway::new(t140llm_cfg());
    let burst = "👩\u{200d}💻".repeat(30);
    let b = burst.as_bytes();
    gw.handle_datagram(at(0), addr(6000), &t140llm_plain(0, &[], b));
    for i in 0..64u16 {
        let mut d = Vec::new();
        rtp::write_packet(&mut d, false, 96, 0, 0, 0x5000 + u32::from(i), b);
        gw.handle_datagram(at(100 + u64::from(i)), addr(7000 + i), &d);
    }
    gw.handle_datagram(at(4200), addr(6000), &t140llm_red_raw(1, &[b], b" ok"));
    gw.handle_datagram(
        at(4300),
        addr(6000),
        &t140llm_red_raw(2, &[b" ok", b], b"."),
    );
    gw.shutdown(at(9000));
    let got = adds(&drain(&mut gw));
    let mine: String = got
        .iter()
        .filter(|(s, _)| s.contains("11223344"))
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let tail: String = mine
        .chars()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert!(
        mine == format!("{burst} ok."),
        "ends {tail:?}, ambiguous drops {}",
        gw.stats()
            .drops(DropReason::Red(red::RedError::AmbiguousLength))
    );
}

/// The batch test's four datagrams handed one by one.
#[test]
fn unclamped_packets_one_by_one_count_nothing() {
    let mut gw = Gateway::new(t140llm_cfg());
    let burst = "👩\u{200d}💻".repeat(30);
    let b = burst.as_bytes();
    gw.handle_datagram(at(0), addr(6000), &t140llm_plain(0, &[], b));
    gw.handle_datagram(at(0), addr(6000), &t140llm_red_raw(1, &[b], b" ok"));
    gw.handle_datagram(at(0), addr(6000), &t140llm_red_raw(2, &[b" ok", b], b"."));
    gw.handle_datagram(
        at(0),
        addr(6000),
        &t140llm_red_raw(3, &[b".", b" ok"], b" Bye."),
    );
    gw.shutdown(at(9000));
    let s = gw.stats();
    assert_eq!(
        (s.drops_total(), s.recovered, s.lost, s.red_unclamped),
        (0, 0, 0, 2)
    );
}

/// With nothing held, a marked packet at most 16 past the last received (1) is the old
/// session's last words (`OVERTAKEN_MARKED`); one further on starts the next session.
#[test]
fn a_marked_packet_16_past_the_last_received_is_the_old_sessions() {
    for (seq, joins_expected) in [(17u16, 1usize), (18, 2)] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. "));
        gw.handle_datagram(at(500), addr(4000), &stream_bye(7));
        gw.handle_datagram(at(510), addr(4000), &t140m(seq, 7, true, "Bye. "));
        gw.shutdown(at(5000));
        let joins = drain(&mut gw)
            .iter()
            .filter(|e| e.kind == "session.join")
            .count();
        assert_eq!(joins, joins_expected, "seq {seq}");
    }
}

// A third review (bd11b09): two more gaps, four tests that failed.

fn joined(got: &[(String, String)]) -> String {
    got.iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("|")
}

/// Prefix mode + RED: the RED primary is bare text of 252 bytes (under 255, so not
/// remembered), but the block repeating it is `alpha\x1E` + text = 258 bytes, clamped to 255.
/// Packet 1 came, so packets 2 and 3 should be read (docs/t140llm.md section 5).
#[test]
fn prefix_multiplex_red_primary_just_under_255_is_unclamped() {
    let mut gw = Gateway::new(t140llm_cfg());
    let long = "x".repeat(252);
    let long_copy = [b"alpha\x1e".as_slice(), long.as_bytes()].concat();
    assert!(long_copy.len() > 255);
    gw.handle_datagram(at(0), addr(6000), &t140llm_plain(0, &[], b"alpha\x1eHi "));
    gw.handle_datagram(
        at(100),
        addr(6000),
        &t140llm_red_raw(1, &[b"alpha\x1eHi "], long.as_bytes()),
    );
    gw.handle_datagram(
        at(4200),
        addr(6000),
        &t140llm_red_raw(2, &[&long_copy, b"alpha\x1eHi "], b" ok"),
    );
    gw.handle_datagram(
        at(4300),
        addr(6000),
        &t140llm_red_raw(3, &[b"alpha\x1e ok", &long_copy], b"."),
    );
    gw.shutdown(at(9000));
    let got = adds(&drain(&mut gw));
    let amb = gw
        .stats()
        .drops(DropReason::Red(red::RedError::AmbiguousLength));
    let all = joined(&got);
    assert!(
        amb == 0 && all.contains("ok"),
        "ambiguous drops {amb}, text {all:?}"
    );
}

/// The same in CSRC mode: bare 253-byte primary, its copy is the 4 CSRC bytes + text = 257.
#[test]
fn csrc_multiplex_red_primary_just_under_255_is_unclamped() {
    let mut gw = Gateway::new(t140llm_cfg());
    let long = "x".repeat(253);
    let copy = |t: &[u8]| [&1u32.to_be_bytes()[..], t].concat();
    gw.handle_datagram(at(0), addr(6000), &t140llm_plain(0, &[1], b"Hi "));
    gw.handle_datagram(
        at(100),
        addr(6000),
        &t140llm_red_raw(1, &[&copy(b"Hi ")], long.as_bytes()),
    );
    gw.handle_datagram(
        at(4200),
        addr(6000),
        &t140llm_red_raw(2, &[&copy(long.as_bytes()), &copy(b"Hi ")], b" ok"),
    );
    gw.handle_datagram(
        at(4300),
        addr(6000),
        &t140llm_red_raw(3, &[&copy(b" ok"), &copy(long.as_bytes())], b"."),
    );
    gw.shutdown(at(9000));
    let got = adds(&drain(&mut gw));
    let amb = gw
        .stats()
        .drops(DropReason::Red(red::RedError::AmbiguousLength));
    let all = joined(&got);
    assert!(
        amb == 0 && all.contains("ok"),
        "ambiguous drops {amb}, text {all:?}"
    );
}

/// A mixer with one active source (CSRC 2), its clock 1000 + t. Packet 4 (ts 1610) arrives
/// on time at 610 and waits for 3, which comes late at 900: both are placed at 900. The BYE
/// comes at 1000 (mixer clock ~2000); packet 5, stamped 1950 (before the BYE was sent),
/// arrives at 1100, overtaken by it. It is the source's last words: one participation.
#[test]
fn a_packet_held_then_placed_late_does_not_slow_the_bye_clock() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &with_csrc(1, 1000, 9, 2, b"Alpha "));
    gw.handle_datagram(at(610), m, &with_csrc(3, 1610, 9, 2, b"two "));
    gw.handle_datagram(at(900), m, &with_csrc(2, 1310, 9, 2, b"one "));
    gw.handle_datagram(at(1000), m, &mixer_bye_from(9, 2));
    gw.handle_datagram(at(1100), m, &with_csrc(4, 1950, 9, 2, b"end. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    let ev = events_of(&out, "csrc:00000002");
    let joins = ev.iter().filter(|(k, _)| k == "session.join").count();
    assert_eq!(joins, 1, "{:#?}", timeline(&out));
}

/// Packet 2 lost: 3 (ts 1610, came at 610) waits the reorder wait (1 s) and is placed at
/// 1610. BYE at 1700 (mixer clock ~2700); 4, stamped 2650, overtaken, arrives at 1800.
#[test]
fn a_packet_placed_after_its_gap_expired_does_not_slow_the_bye_clock() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &with_csrc(1, 1000, 9, 2, b"Alpha "));
    gw.handle_datagram(at(610), m, &with_csrc(3, 1610, 9, 2, b"two "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(1650)) {
        gw.handle_timeout(t);
    }
    gw.handle_datagram(at(1700), m, &mixer_bye_from(9, 2));
    gw.handle_datagram(at(1800), m, &with_csrc(4, 2650, 9, 2, b"end. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(6000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    let ev = events_of(&out, "csrc:00000002");
    let joins = ev.iter().filter(|(k, _)| k == "session.join").count();
    assert_eq!(joins, 1, "{:#?}", timeline(&out));
}

/// The same in order (3 at 610): the control, passes.
#[test]
fn in_order_the_overtaken_packet_is_the_sources() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &with_csrc(1, 1000, 9, 2, b"Alpha "));
    gw.handle_datagram(at(310), m, &with_csrc(2, 1310, 9, 2, b"one "));
    gw.handle_datagram(at(610), m, &with_csrc(3, 1610, 9, 2, b"two "));
    gw.handle_datagram(at(1000), m, &mixer_bye_from(9, 2));
    gw.handle_datagram(at(1100), m, &with_csrc(4, 1950, 9, 2, b"end. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    let ev = events_of(&out, "csrc:00000002");
    let joins = ev.iter().filter(|(k, _)| k == "session.join").count();
    assert_eq!(joins, 1, "{:#?}", timeline(&out));
}
