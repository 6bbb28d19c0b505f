//! What an evicted stream's record keeps for its return (README "Stream limit"): its
//! numbering, its own voice's unfinished character or escape sequence, its sources' SDES
//! names; and when the record ends. A mixer's sources and t140llm streams come back through
//! their redundancy, which a kept decoder must not be fed twice. The sans-IO core driven
//! directly. Reviews of this session's eviction records found each case (review, session 34).

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Compat, Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// The mixer's source 7 says its first packet (a RED packet, RFC 2198 / RFC 4103 4.2) ending
/// inside `€` (E2); its next packet carries that block again as redundancy (offset 300) and the
/// rest of the character (82 AC). With `evict`, the mixer's stream is evicted between the two
/// (max 3 streams, junk SSRCs past its reorder wait) and comes back.
fn mixer_red_character(evict: bool) -> (String, u64, Vec<Envelope>) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 7, &[], b"\xe2"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &red_csrc(2, 1300, 7, &[(300, b"\xe2")], b"\x82\xacHello. "),
    );
    run_timers(&mut gw, 7_000);
    let out = drain(&mut gw);
    (
        text_of(&out, "csrc:00000007"),
        gw.stats().decode.invalid_utf8,
        out,
    )
}

/// A mixer's source whose RED packet ended inside `€` (E2), its stream evicted and back: the
/// source's decoder and last timestamp went with the record, so the next packet's redundancy
/// (E2 again, already placed) is skipped and its primary completes the character, as without
/// an eviction (nothing counted invalid). A review found the source's decoder kept in the
/// record and fed E2 a second time by a speaker made afresh: U+FFFD and `€` (review, session
/// 34); the speaker is now made again with its last timestamp (session 35).
#[test]
fn a_mixer_sources_character_cut_by_an_eviction_is_not_fed_twice_from_redundancy() {
    let (control, control_invalid, _) = mixer_red_character(false);
    assert_eq!((control.as_str(), control_invalid), ("\u{20ac}Hello.", 0));
    let (text, invalid, out) = mixer_red_character(true);
    assert_eq!(
        (text.as_str(), invalid),
        ("\u{20ac}Hello.", 0),
        "the evicted mixer's source's cut character, with its redundancy on return: {:#?}",
        timeline(&out)
    );
}

/// A mixer's compound RTCP from the RTP port's next one: an empty RR of the mixer, then an SDES
/// naming its source `csrc` (RFC 3550 6.5: the mixer forwards its sources' SDES).
fn mixer_sdes(csrc: u32, name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, MIXER);
    pvp_t140::rtcp::write_sdes(&mut d, csrc, "user@host", Some(name));
    d
}

/// The `session.join` names of the speakers whose id ends with `suffix`.
fn join_names(out: &[Envelope], suffix: &str) -> Vec<String> {
    out.iter()
        .filter(|e| e.kind == "session.join" && e.sender.ends_with(suffix))
        .map(|e| {
            e.payload["participant"]["name"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

/// The mixer's source 7 is named "Alice" by the mixer's SDES, then its first packet is `first`;
/// the mixer's stream is evicted past its reorder wait and comes back with `back`.
fn named_source_after_eviction(first: &[u8], back: &[u8]) -> Vec<String> {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &with_csrc(1, 1000, MIXER, 7, first));
    gw.handle_datagram(at(10), addr(4001), &mixer_sdes(7, "Alice"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1, "the mixer's stream is evicted");
    gw.handle_datagram(at(1_200), addr(4000), &with_csrc(2, 1300, MIXER, 7, back));
    run_timers(&mut gw, 7_000);
    join_names(&drain(&mut gw), "csrc:00000007")
}

/// README "Stream limit": "An evicted stream's SDES names are kept for its return's join",
/// for a mixer's source whose packet ended inside a character too. A review found its speaker
/// made from the record at the return, before the packet path could give it its early name:
/// it joined as "T.140 00000007 via ..." (review, session 34).
#[test]
fn a_mixer_source_restored_with_its_cut_character_joins_with_its_sdes_name() {
    let control = named_source_after_eviction("\u{feff}".as_bytes(), b"Hello. ");
    assert_eq!(control, ["Alice"], "control: nothing cut, the name is kept");
    assert_eq!(
        named_source_after_eviction(b"\xe2", b"\x82\xacHello. "),
        ["Alice"],
        "the source whose character the eviction cut joins without its SDES name"
    );
}

/// README "Stream limit": an unfinished escape sequence an evicted stream's record keeps is
/// counted as cut short once the record ends, as the timers run past its stream timeout, in
/// whatever order records end (each at its own last packet's timeout). A review found only the
/// oldest record looked at: a later one past its end waited for it (review, session 34).
#[test]
fn an_evicted_record_past_its_timeout_is_counted_though_an_older_one_lives_on() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    // A opens first; B second, with an escape sequence begun at 100 ms.
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{feff}"));
    gw.handle_datagram(at(100), addr(4002), &t140(1, 2, "\u{1b}[1;"));
    // A begins its escape sequence at 30 s (a caller silent since its BOM, nothing sent).
    run_timers(&mut gw, 30_000);
    gw.handle_datagram(at(30_000), addr(4000), &t140(2, 1, "\u{1b}[2;"));
    gw.handle_datagram(at(30_050), addr(5000), &t140(1, 100, ""));
    // Past A's reorder wait: A (the oldest) then B make room for two junk SSRCs.
    run_timers(&mut gw, 31_100);
    gw.handle_datagram(at(31_100), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(31_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 2, "both callers are evicted");
    let before = gw.stats().decode.sequences_skipped;
    // B's record ends at 60.1 s (its last packet at 100 ms, a 60 s stream timeout), A's at 90 s.
    // A live caller keeps the timers running past B's end.
    // (No sentence end: its idle flush at 64 s is a timer.)
    gw.handle_datagram(at(60_000), addr(6000), &t140(1, 200, "Hi"));
    run_timers(&mut gw, 62_000);
    gw.handle_datagram(at(62_000), addr(6000), &t140(2, 200, " there"));
    run_timers(&mut gw, 70_000);
    assert_eq!(
        gw.stats().decode.sequences_skipped - before,
        1,
        "B's escape sequence, cut by its eviction, is not counted though its record ended 10 s \
         ago (A's record, evicted before it, ends later)"
    );
}

/// A t140llm packet (docs/t140llm.md section 3): no marker, timestamp 160 a packet; `red`
/// gives a RED packet (the gateway's RED payload type, 100) in t140llm's layout (section 5:
/// `F | PT:7 | offset:16 | length:8`, newest first) with one redundant block.
fn llm(seq: u16, ssrc: u32, red: Option<&[u8]>, primary: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    let pt = match red {
        None => 98,
        Some(block) => {
            payload.extend_from_slice(&[0x80 | 98, 0, 160, block.len() as u8, 98]);
            payload.extend_from_slice(block);
            100
        }
    };
    payload.extend_from_slice(primary);
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, false, pt, seq, u32::from(seq) * 160, ssrc, &payload);
    d
}

/// `--compat t140llm`: the caller's first packet ends inside `€` (E2); its next, a RED packet,
/// repeats it as redundancy with the rest (82 AC). With `evict`, the caller is evicted between
/// the two and comes back.
fn t140llm_red_character(evict: bool) -> (Vec<String>, u64) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        compat: pvp_t140::Compat::T140llm,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &llm(0, 1, None, b"\xe2"));
    gw.handle_datagram(at(50), addr(5000), &llm(0, 100, None, b""));
    gw.handle_datagram(at(50), addr(5000), &llm(0, 101, None, b""));
    gw.handle_datagram(at(1_100), addr(5000), &llm(0, 102, None, b""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &llm(1, 1, Some(b"\xe2"), b"\x82\xacHello. "),
    );
    run_timers(&mut gw, 7_000);
    let texts = drain(&mut gw)
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect();
    (texts, gw.stats().decode.invalid_utf8)
}

/// `--compat t140llm`: an evicted stream's record keeps its numbering and its unfinished
/// character, so the returning stream's redundancy (E2 again, delivered before) is not
/// delivered again and its primary completes the character, as without an eviction. A review
/// found a kept decoder fed the repeated E2 again when the stream came back as a stream's
/// first packet: U+FFFD and `€` (review, session 34); t140llm streams now keep their
/// numbering too (session 35).
#[test]
fn a_t140llm_character_cut_by_an_eviction_is_not_fed_twice_from_redundancy() {
    let control = t140llm_red_character(false);
    assert_eq!(control, (vec!["\u{20ac}Hello.".to_owned()], 0), "control");
    assert_eq!(
        t140llm_red_character(true),
        (vec!["\u{20ac}Hello.".to_owned()], 0),
        "t140llm: the evicted caller's cut character, with its redundancy on return"
    );
}

/// The mixer's source 7 begins an escape sequence (`ESC [1;`) in a RED packet; with `evict`,
/// the mixer's stream is evicted and comes back with a packet carrying that block again as
/// redundancy, at timestamp offset `offset` (0: placed by content, RFC 2198 allows it), and
/// the sequence's rest (`31m`) then text.
fn mixer_red_escape(evict: bool, offset: u16) -> String {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 7, &[], b"\x1b[1;"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &red_csrc(2, 1300, 7, &[(offset, b"\x1b[1;")], b"31mHello. "),
    );
    run_timers(&mut gw, 7_000);
    text_of(&drain(&mut gw), "csrc:00000007")
}

/// README "Stream limit": a mixer's source's escape sequence cut by the eviction goes on at
/// the return, and its redundancy, placed by timestamp or (offset 0) by content, is not fed
/// to it again: only the text is shown, as without an eviction (session 35).
#[test]
fn a_mixer_sources_escape_sequence_cut_by_an_eviction_goes_on_through_its_redundancy() {
    for offset in [300, 0] {
        assert_eq!(
            mixer_red_escape(false, offset),
            "Hello.",
            "control, offset {offset}"
        );
        assert_eq!(
            mixer_red_escape(true, offset),
            "Hello.",
            "evicted and back, the redundancy at offset {offset}"
        );
    }
}

/// `--compat t140llm` with RED (docs/t140llm.md section 5): an escape sequence begun
/// (`ESC [1;`), the caller evicted, and back with that block again as redundancy and the
/// sequence's rest: the numbering continued skips the redundancy, the kept decoder finishes
/// the sequence, only the text is shown (session 35).
#[test]
fn a_t140llm_red_escape_sequence_cut_by_an_eviction_goes_on_without_repeating() {
    let texts = |evict: bool| {
        let mut gw = Gateway::new(Config {
            max_streams: if evict { 3 } else { 10 },
            compat: pvp_t140::Compat::T140llm,
            ..Config::default()
        });
        gw.handle_datagram(at(0), addr(4000), &llm(0, 1, None, b"\x1b[1;"));
        gw.handle_datagram(at(50), addr(5000), &llm(0, 100, None, b""));
        gw.handle_datagram(at(50), addr(5000), &llm(0, 101, None, b""));
        gw.handle_datagram(at(1_100), addr(5000), &llm(0, 102, None, b""));
        assert_eq!(gw.stats().evicted, u64::from(evict));
        gw.handle_datagram(
            at(1_200),
            addr(4000),
            &llm(1, 1, Some(b"\x1b[1;"), b"31mHello. "),
        );
        run_timers(&mut gw, 7_000);
        let texts: Vec<String> = drain(&mut gw)
            .iter()
            .filter(|e| e.kind == "context.add")
            .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
            .collect();
        (texts, gw.stats().decode.sequences_skipped)
    };
    let control = texts(false);
    assert_eq!(control.0, ["Hello."], "control");
    assert_eq!(texts(true), control, "evicted and back");
}

/// `--compat t140llm`'s multiplexer (docs/t140llm.md section 6: `<id>\x1E` before each
/// packet's text): stream `alpha` begins an escape sequence, the caller is evicted and comes
/// back with the rest; the named stream's decoder went with the record, so only the text is
/// shown, as without an eviction (session 35).
#[test]
fn a_t140llm_named_streams_escape_sequence_cut_by_an_eviction_goes_on() {
    let texts = |evict: bool| {
        let mut gw = Gateway::new(Config {
            max_streams: if evict { 3 } else { 10 },
            compat: pvp_t140::Compat::T140llm,
            ..Config::default()
        });
        gw.handle_datagram(at(0), addr(4000), &llm(0, 1, None, b"alpha\x1e\x1b[1;"));
        gw.handle_datagram(at(50), addr(5000), &llm(0, 100, None, b""));
        gw.handle_datagram(at(50), addr(5000), &llm(0, 101, None, b""));
        gw.handle_datagram(at(1_100), addr(5000), &llm(0, 102, None, b""));
        assert_eq!(gw.stats().evicted, u64::from(evict));
        gw.handle_datagram(
            at(1_200),
            addr(4000),
            &llm(1, 1, None, b"alpha\x1e31mHello. "),
        );
        run_timers(&mut gw, 7_000);
        drain(&mut gw)
            .iter()
            .filter(|e| e.kind == "context.add")
            .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(false), ["Hello."], "control");
    assert_eq!(texts(true), ["Hello."], "evicted and back");
}

/// A plain t140llm packet (docs/t140llm.md section 3): no marker, timestamp 160 a packet.
fn plain_llm(seq: u16, ssrc: u32, payload: &[u8]) -> Vec<u8> {
    llm(seq, ssrc, None, payload)
}

fn contents(out: &[Envelope]) -> Vec<String> {
    out.iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// `--compat t140llm`: the caller's first reply is only t140llm's BOM prewarm and an empty
/// packet (sequences 0, 1), so it never carried text; with `evict` it is evicted by a flood
/// past its reorder wait. Its next reply starts, as every t140llm reply does, at sequence 0
/// and timestamp 0 (docs/t140llm.md section 13, deviation 3), after a quiet spell.
fn t140llm_next_reply(evict: bool) -> (Vec<String>, u64) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        compat: Compat::T140llm,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &plain_llm(0, 1, "\u{feff}".as_bytes()));
    gw.handle_datagram(at(100), addr(4000), &plain_llm(1, 1, b""));
    gw.handle_datagram(at(150), addr(5000), &plain_llm(0, 100, b""));
    gw.handle_datagram(at(150), addr(5000), &plain_llm(0, 101, b""));
    gw.handle_datagram(at(1_200), addr(5000), &plain_llm(0, 102, b""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    // The next reply, 3 s later: sequence 0, timestamp 0 again.
    gw.handle_datagram(at(3_000), addr(4000), &plain_llm(0, 1, b"Hello. "));
    gw.handle_datagram(at(3_100), addr(4000), &plain_llm(1, 1, b"How are you? "));
    run_timers(&mut gw, 10_000);
    let stale = gw.stats().drops(pvp_t140::DropReason::Stale);
    (contents(&drain(&mut gw)), stale)
}

/// `--compat t140llm`: a stream evicted and back continues its numbering, and the quiet before
/// its return is measured from its last packet before the eviction, so a new reply starting at
/// sequence 0 and timestamp 0 after a quiet spell starts anew (`Register::start_anew`), as
/// without the eviction. A review found the return's own arrival taken for the last packet:
/// the reply's packets dropped as stale copies of the old reply's (review, session 35).
#[test]
fn a_returning_t140llm_streams_next_reply_at_sequence_0_is_not_dropped_as_stale() {
    let control = t140llm_next_reply(false);
    assert_eq!(control.0, ["Hello.", "How are you?"], "control");
    let (got, stale) = t140llm_next_reply(true);
    assert_eq!(
        got, control.0,
        "the evicted t140llm caller's next reply (sequence 0 again) after its return; \
         {stale} packet(s) dropped as stale"
    );
}

/// A caller silent since its BOM (SSRC 0xA, plain text/t140, stamped 1000, 1300), with
/// `max_streams` 1 evicted by another source's stream, comes back with a restart on a new
/// clock (RFC 3550 5.1: sequence 40001.., stamped from 20_000_000, far more than 2^23 past its
/// last) whose first packet (marked, BOM) was lost. Every `context.add`'s content, joined by a
/// space, and the core.
fn caller_back_with_a_restart(max_streams: usize) -> (String, Gateway) {
    let mut gw = Gateway::new(Config {
        max_streams,
        ..Config::default()
    });
    let a = |seq: u16, ts: u32, marker: bool, text: &str| {
        let mut d = Vec::new();
        pvp_t140::rtp::write_packet(&mut d, marker, 98, seq, ts, 0xA, text.as_bytes());
        d
    };
    let p = [
        (0u64, addr(4000), a(1, 1000, true, "\u{feff}")),
        (300, addr(4000), a(2, 1300, false, "")),
        // Another source's stream takes its place.
        (5_000, addr(5000), t140m(1, 0xB, true, "")),
        // The caller back, restarted on a new clock; 40000 (marked, BOM) lost.
        (
            10_000,
            addr(4000),
            a(40_001, 20_000_000, false, "More words"),
        ),
        (10_300, addr(4000), a(40_002, 20_000_300, false, ". ")),
        (10_600, addr(4000), a(40_003, 20_000_600, false, "")),
    ];
    for (ms, from, d) in &p {
        gw.handle_timeout(at(*ms));
        gw.handle_datagram(at(*ms), *from, d);
    }
    gw.handle_timeout(at(15_000));
    gw.shutdown(at(16_000));
    (contents(&drain(&mut gw)).join(" "), gw)
}

/// A stream evicted and back judges a restart by its last delivered timestamp as without the
/// eviction (README "Sequence", "Stream limit"): the run on a new clock opens with a lost head,
/// marked, "\u{fffd}More words.", head_lost 1. A review found the record kept the numbering
/// but not the timestamp: the run was taken on the old clock and the lost head went unmarked,
/// "More words.", head_lost 0 (review, session 36).
#[test]
fn a_restart_on_a_new_clock_after_an_evicted_streams_return_marks_its_lost_head() {
    let (control, gw) = caller_back_with_a_restart(10);
    assert_eq!(gw.stats().evicted, 0);
    assert_eq!(
        (control.as_str(), gw.stats().head_lost),
        ("\u{fffd}More words.", 1),
        "control"
    );
    let (text, gw) = caller_back_with_a_restart(1);
    let s = gw.stats();
    assert!(s.evicted >= 1, "the caller was evicted");
    assert_eq!(
        (text.as_str(), s.restarts, s.head_lost),
        ("\u{fffd}More words.", 1, 1),
        "after its return, as without the eviction"
    );
}

/// The mixer's source 7 begins an escape sequence (`ESC [1;`); with `evict` the mixer's stream
/// is evicted past its reorder wait. Then the mixer forwards source 7's BYE (RFC 3550 6.6,
/// 7.3) from its RTCP port, and 3 s later source 7 speaks again (a new session of it,
/// stamped well after the BYE) with "Hello. ".
fn source_bye_while_evicted(evict: bool) -> (String, Vec<Envelope>) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 7, &[], b"\x1b[1;"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(at(1_150), addr(4001), &mixer_bye(7));
    run_timers(&mut gw, 4_000);
    gw.handle_datagram(
        at(4_000),
        addr(4000),
        &red_csrc(2, 5000, 7, &[], b"Hello. "),
    );
    run_timers(&mut gw, 10_000);
    let out = drain(&mut gw);
    (text_of(&out, "csrc:00000007"), out)
}

/// README "Stream limit": "A BYE for it forgets it, and its source's next session starts
/// afresh", for a mixer's source too: a BYE the mixer forwards for source 7 while the mixer's
/// stream is evicted ends source 7's voice in the mixer's record (its unfinished escape
/// sequence counted), so its next session shows "Hello.". A review found the voice kept and
/// its new session decoded inside the old escape sequence: "ello." (review, session 35).
#[test]
fn a_mixer_sources_bye_while_evicted_forgets_its_kept_escape_sequence() {
    let (control, _) = source_bye_while_evicted(false);
    assert_eq!(control, "Hello.", "control");
    let (got, out) = source_bye_while_evicted(true);
    assert_eq!(
        got,
        "Hello.",
        "source 7's new session after its BYE, the mixer evicted at the BYE: {:#?}",
        timeline(&out)
    );
}

/// The mixer's sources 7 and 8: 7 begins an escape sequence (`ESC [1;`), 8 sends a whole one
/// (`ESC [31m`, skipped and counted) and a BOM (RFC 4103 5.2); neither carried text, so the
/// mixer's stream is evicted past its reorder wait (with `evict`). Both come back with their
/// last block again as redundancy (RFC 4103 4.2, offset 300, or 0 with `zero`) and text.
fn mixer_two_sources(evict: bool, zero: bool) -> (String, String, u64, u64) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 7, &[], b"\x1b[1;"));
    let sgr = "\u{feff}\x1b[31m".as_bytes();
    gw.handle_datagram(at(300), addr(4000), &red_csrc(2, 1300, 8, &[], sgr));
    gw.handle_datagram(at(350), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(350), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_400), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(1_500),
        addr(4000),
        &red_csrc(
            3,
            1600,
            7,
            &[(if zero { 0 } else { 600 }, b"\x1b[1;")],
            b"31mHello. ",
        ),
    );
    gw.handle_datagram(
        at(1_600),
        addr(4000),
        &red_csrc(4, 1700, 8, &[(if zero { 0 } else { 400 }, sgr)], b"Hi. "),
    );
    run_timers(&mut gw, 8_000);
    let out = drain(&mut gw);
    let d = gw.stats().decode;
    (
        text_of(&out, "csrc:00000007"),
        text_of(&out, "csrc:00000008"),
        d.sequences_skipped,
        d.bom,
    )
}

/// README "Stream limit": an evicted stream that comes back goes on with "the redundancy it
/// already had not given again", for every source of a mixer, not only one with something
/// unfinished: source 8's whole escape sequence and BOM, given again as redundancy (by
/// timestamp offset, or at offset 0 by content), are counted once, as without the eviction.
/// A review found a source not kept made afresh and fed every generation again: 3 sequences
/// and 2 BOMs counted where the control counts 2 and 1 (review, session 35).
#[test]
fn a_returning_mixers_clean_source_does_not_count_its_redundancy_again() {
    for zero in [false, true] {
        let control = mixer_two_sources(false, zero);
        assert_eq!(
            control,
            ("Hello.".to_owned(), "Hi.".to_owned(), 2, 1),
            "control, offset 0: {zero}"
        );
        assert_eq!(
            mixer_two_sources(true, zero),
            control,
            "evicted and back, offset 0: {zero} (text of 7, text of 8, sequences skipped, \
             BOMs)"
        );
    }
}

/// The mixer's source 7 begins an escape sequence (kept by the eviction record), source 8
/// sends a space (clean, not kept). With `evict` the mixer's stream is evicted. Then, back:
/// mixer packet 3 (source 8's "x", ts 1600) is lost; 4 is source 7's rest of the sequence and
/// "A. " (ts 1900); 5 is source 8's "y. " carrying " " and the lost "x" as redundancy (RFC
/// 4103 4.2, offsets 900 and 600); 6 (source 7's "B", ts 2500) is lost; 7 is source 7's
/// "C. " carrying "B" (offset 300). Every lost packet is recovered from redundancy.
fn mixer_losses_after_return(evict: bool) -> (String, String, u64, u64, Vec<Envelope>) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 7, &[], b"\x1b[1;"));
    gw.handle_datagram(at(300), addr(4000), &red_csrc(2, 1300, 8, &[], b" "));
    gw.handle_datagram(at(350), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(350), addr(5000), &t140(1, 101, ""));
    run_timers(&mut gw, 1_400);
    gw.handle_datagram(at(1_400), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    // Packet 3 is lost: the return's first packet waits for it, then is placed.
    run_timers(&mut gw, 2_000);
    let p4 = red_csrc(4, 1900, 7, &[(900, b"\x1b[1;")], b"31mA. ");
    gw.handle_datagram(at(2_000), addr(4000), &p4);
    run_timers(&mut gw, 3_100);
    let p5 = red_csrc(5, 2200, 8, &[(900, b" "), (600, b"x")], b"y. ");
    gw.handle_datagram(at(3_100), addr(4000), &p5);
    run_timers(&mut gw, 3_400);
    // Packet 6 is lost.
    let p7 = red_csrc(7, 2800, 7, &[(300, b"B")], b"C. ");
    gw.handle_datagram(at(3_400), addr(4000), &p7);
    run_timers(&mut gw, 20_000);
    let out = drain(&mut gw);
    let s = gw.stats();
    (
        text_of(&out, "csrc:00000007"),
        text_of(&out, "csrc:00000008"),
        s.recovered,
        s.lost,
        out,
    )
}

/// README "Loss" / RFC 4103 5.3: a loss is marked only where redundancy cannot recover it.
/// After a mixer's return, source 8 (nothing unfinished) recovers the packet lost at the
/// return from its redundancy, and source 7's later loss is recovered too: "A. BC.", 2
/// recovered, 0 lost, as without the eviction. A review found source 8 made afresh, its
/// recovery placed below the stream's floor and uncounted, and a false U+FFFD in 7's text
/// (review, session 35).
#[test]
fn a_returning_mixers_clean_source_recovering_its_own_loss_leaves_no_false_loss_mark() {
    let (t7, t8, rec, lost, _) = mixer_losses_after_return(false);
    assert_eq!(
        (t7.as_str(), t8.as_str(), rec, lost),
        ("A. BC.", "xy.", 2, 0),
        "control"
    );
    let (t7, t8, rec, lost, out) = mixer_losses_after_return(true);
    assert_eq!(
        (t7.as_str(), t8.as_str(), rec, lost),
        ("A. BC.", "xy.", 2, 0),
        "evicted and back (texts of 7 and 8, recovered, lost): {:#?}",
        timeline(&out)
    );
}

/// A mixer's source 8 sends an escape sequence over two packets (`ESC [1;`, then `31m` with
/// the first as redundancy): whole, nothing unfinished, nothing shown; with `evict` the
/// mixer's stream is evicted right after. Its next packet carries one generation (RFC 4103
/// 4.2 allows one), its last block `31m`, and "Hi. ".
fn mixer_split_sequence(evict: bool) -> String {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &red_csrc(1, 1000, 8, &[], b"\x1b[1;"));
    let p2 = red_csrc(2, 1300, 8, &[(300, b"\x1b[1;")], b"31m");
    gw.handle_datagram(at(300), addr(4000), &p2);
    gw.handle_datagram(at(350), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(350), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(400), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(600),
        addr(4000),
        &red_csrc(3, 1600, 8, &[(300, b"31m")], b"Hi. "),
    );
    run_timers(&mut gw, 8_000);
    text_of(&drain(&mut gw), "csrc:00000008")
}

/// The visible form of the case above: a source's escape sequence's tail (`31m`), given
/// again as its next packet's one generation after the return, is not shown as text. A
/// review found "31mHi." (review, session 35).
#[test]
fn a_returning_mixers_clean_source_does_not_show_its_redundancy_as_text() {
    assert_eq!(mixer_split_sequence(false), "Hi.", "control");
    assert_eq!(
        mixer_split_sequence(true),
        "Hi.",
        "the source's escape sequence's tail, given again as redundancy after the return"
    );
}

/// `--compat t140llm`'s multiplexer (docs/t140llm.md section 6, `<id>\x1E` before each
/// packet's text): stream `alpha` begins an escape sequence, stream `beta` sends a BOM; with
/// `evict` the caller is evicted past its reorder wait. Back, packet 2 is lost, 3 is alpha's
/// rest of the sequence and "Hello. ", 4 is beta's "Hi. ".
fn t140llm_multiplexed_loss(evict: bool) -> (Vec<(String, String)>, u64) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        compat: Compat::T140llm,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &plain_llm(0, 1, b"alpha\x1e\x1b[1;"));
    gw.handle_datagram(
        at(10),
        addr(4000),
        &plain_llm(1, 1, "beta\x1e\u{feff}".as_bytes()),
    );
    gw.handle_datagram(at(50), addr(5000), &plain_llm(0, 100, b""));
    gw.handle_datagram(at(50), addr(5000), &plain_llm(0, 101, b""));
    gw.handle_datagram(at(1_100), addr(5000), &plain_llm(0, 102, b""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &plain_llm(3, 1, b"alpha\x1e31mHello. "),
    );
    gw.handle_datagram(at(1_250), addr(4000), &plain_llm(4, 1, b"beta\x1eHi. "));
    run_timers(&mut gw, 9_000);
    let adds = drain(&mut gw)
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| {
            let who = e.sender.rsplit('/').next().unwrap_or("").to_owned();
            (who, e.payload["content"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    (adds, gw.stats().lost_unattributed)
}

/// README "t140llm": a loss in a multiplexed stream "is marked only where the stream has one
/// voice, else counted". Every stream of the caller goes with the record, so at the return
/// the loss the continued numbering sees is counted unattributed (not marked on `alpha`,
/// which would also end its escape sequence), as without the eviction. A review found only
/// `alpha` made again and the loss marked on it: "\u{FFFD}31mHello." (review, session 35).
#[test]
fn a_returning_t140llm_multiplexers_loss_is_not_pinned_on_its_one_restored_stream() {
    let control = t140llm_multiplexed_loss(false);
    let want = |a: &str, b: &str| {
        vec![
            (a.to_owned(), "Hello.".to_owned()),
            (b.to_owned(), "Hi.".to_owned()),
        ]
    };
    assert_eq!(control, (want("alpha", "beta"), 1), "control");
    assert_eq!(
        t140llm_multiplexed_loss(true),
        control,
        "evicted and back, a packet lost at the return (context.add by stream, unattributed \
         losses)"
    );
}

/// An evicted stream's record ends at its stream timeout, counting what its voices left
/// unfinished, even when no stream is left to run the timers: its end is among the deadlines
/// `poll_timeout` gives. Here the caller's escape sequence begun, evicted, and every other
/// stream ended by its BYE. A review found the records ended only while some stream's timer
/// or a datagram drove `handle_timeout` (review, session 35).
#[test]
fn an_evicted_streams_record_ends_at_its_timeout_with_no_stream_left() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\x1b[1;"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1);
    for ssrc in [100, 101, 102] {
        gw.handle_datagram(at(1_200), addr(5000), &stream_bye(ssrc));
    }
    run_timers(&mut gw, 5_000);
    assert_eq!(gw.stats().streams_live, 0, "every other stream ended");
    assert_eq!(
        gw.stats().decode.sequences_skipped,
        0,
        "the record lives on"
    );
    // The caller's stream timeout (60 s after its last packet) ends its record.
    assert_eq!(gw.poll_timeout(), Some(at(60_000)));
    run_timers(&mut gw, 60_000);
    assert_eq!(
        (gw.poll_timeout(), gw.stats().decode.sequences_skipped),
        (None, 1),
        "the record's end counted the escape sequence its eviction cut"
    );
}

/// `--compat t140llm`, one caller not multiplexing: its BOM prewarm (sequence 0) makes its own
/// voice, its only one. With `evict` a flood evicts it past its reorder wait. Back, packet 1
/// is lost and packet 2 says "Hello. ".
fn t140llm_single_voice_loss(evict: bool) -> (Vec<String>, u64, u64) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        compat: Compat::T140llm,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &plain_llm(0, 1, "\u{feff}".as_bytes()));
    gw.handle_datagram(at(50), addr(5000), &plain_llm(0, 100, b""));
    gw.handle_datagram(at(50), addr(5000), &plain_llm(0, 101, b""));
    gw.handle_datagram(at(1_100), addr(5000), &plain_llm(0, 102, b""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(at(1_200), addr(4000), &plain_llm(2, 1, b"Hello. "));
    run_timers(&mut gw, 9_000);
    let s = gw.stats();
    (contents(&drain(&mut gw)), s.lost, s.lost_unattributed)
}

/// README "Stream limit": an evicted stream's voices, its own included, "are made again as
/// they were"; README "Loss" (t140llm): a loss goes to the stream's only voice if it has one.
/// A t140llm caller whose one clean voice is its own loses a packet at its return: marked on
/// that voice, as without the eviction. A review found a lone clean own voice not kept and
/// the loss counted unattributed (review, session 35).
#[test]
fn t140llm_lone_own_voice_is_made_again_so_a_loss_at_the_return_is_marked() {
    let control = t140llm_single_voice_loss(false);
    assert_eq!(
        control,
        (vec!["\u{fffd}Hello.".to_owned()], 1, 0),
        "control (texts, lost, lost_unattributed)"
    );
    assert_eq!(
        t140llm_single_voice_loss(true),
        control,
        "evicted and back, packet 1 lost at the return (texts, lost, lost_unattributed)"
    );
}

/// A stream's own compound RTCP from its RTP port's next one: an empty RR, then an SDES with
/// its CNAME and NAME `name`.
fn own_sdes(ssrc: u32, name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, ssrc);
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, "user@host", Some(name));
    d
}

/// `unmatched = "refuse"` and one rule for the SDES name "Alice". The caller (SSRC 1) says
/// "Hi. " before its SDES came: the mapping refuses it (no rule matches a nameless speaker).
/// Then its SDES NAME "Alice" comes. With `evict`, a flood evicts the caller (it never joined,
/// and holds nothing); it comes back with "Bye. ".
fn refused_then_named(evict: bool) -> (Vec<(String, String)>, u64) {
    use pvp_t140::mapping::Unmatched;
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        mapping: alice_rule(Unmatched::Refuse),
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "Hi. "));
    run_timers(&mut gw, 5_000);
    assert_eq!(gw.stats().refused_chunks, 1, "refused");
    gw.handle_datagram(at(5_000), addr(4001), &own_sdes(1, "Alice"));
    gw.handle_datagram(at(5_100), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(5_100), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(5_200), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(at(5_300), addr(4000), &t140(2, 1, "Bye. "));
    run_timers(&mut gw, 12_000);
    let out = drain(&mut gw);
    let seen = out
        .iter()
        .map(|e| {
            let c = e.payload["content"].as_str().unwrap_or("").to_owned();
            (e.kind.clone(), c)
        })
        .collect();
    (seen, gw.stats().refused_chunks)
}

/// README "Configuration file": a caller the mapping refused before its SDES name came is
/// taken once a rule matches the name, from its next chunk on (review t; it was refused for
/// good, and an `rtcp_name` rule with `unmatched = "refuse"` lost every word of a sender whose
/// first sentence came before its first RTCP report). Evicted and back, it fares the same: its
/// speaker is moved out whole, not made afresh (review, session 35, found it made afresh and
/// mapped again while the control was refused).
#[test]
fn a_speaker_the_mapping_refused_fares_the_same_after_its_eviction() {
    let control = refused_then_named(false);
    let joined = vec![
        ("session.join".to_owned(), String::new()),
        ("context.add".to_owned(), "Bye.".to_owned()),
    ];
    assert_eq!(control, (joined, 1), "control: taken once named");
    assert_eq!(
        refused_then_named(true),
        control,
        "evicted and back: (envelopes, refused chunks)"
    );
}

/// A mixer (RFC 9071) with one generation of redundancy (RFC 4103 4.2 allows one). Source 7
/// opens with its BOM (packet 1, ts 1000); packets 2 and 3 (7's "a" and "b") and 4 (source 8's
/// "", ts 1900) are lost; packet 5 is source 8's first (ts 2200), its one generation being the
/// lost packet 4: it accounts for one of the three lost, and two are left unplaced for the
/// stream's next speaker ([`pvp_t140::speaker::Output::unplaced`]). With `evict`, a flood
/// evicts the mixer's stream once packet 5 is delivered (nothing held, nothing said). Back,
/// packet 6 is source 7's "Hello. " carrying "b" (offset 900): "a" is lost beyond recovery.
fn mixer_unplaced_losses(evict: bool) -> (String, u64, u64, Vec<Envelope>) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(
        at(0),
        addr(4000),
        &red_csrc(1, 1000, 7, &[], "\u{feff}".as_bytes()),
    );
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &red_csrc(5, 2200, 8, &[(300, b"")], b""),
    );
    // Packet 5 waits for the gap, then is placed.
    run_timers(&mut gw, 2_300);
    gw.handle_datagram(at(2_300), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(2_300), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(2_400), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(
        at(2_500),
        addr(4000),
        &red_csrc(6, 2500, 7, &[(900, b"b")], b"Hello. "),
    );
    run_timers(&mut gw, 9_000);
    let out = drain(&mut gw);
    let s = gw.stats();
    (text_of(&out, "csrc:00000007"), s.lost, s.recovered, out)
}

/// RFC 4103 5.3, README "Loss": text lost beyond recovery is marked. A mixer's losses no
/// speaker has accounted for yet go with its record, so source 7's lost "a" is marked after
/// the return, as without the eviction. A review found them dropped at the eviction: "a"
/// lost silently (review, session 35).
#[test]
fn a_returning_mixer_keeps_its_unplaced_losses() {
    let (text, lost, recovered, _) = mixer_unplaced_losses(false);
    assert_eq!(
        (text.as_str(), lost, recovered),
        ("\u{fffd}bHello.", 1, 2),
        "control (text of 7, lost, recovered)"
    );
    let (text, lost, recovered, out) = mixer_unplaced_losses(true);
    assert_eq!(
        (text.as_str(), lost, recovered),
        ("\u{fffd}bHello.", 1, 2),
        "evicted and back (text of 7, lost, recovered): {:#?}",
        timeline(&out)
    );
}

/// The caller (SSRC 1) opens with its BOM (sequence 1), then restarts its numbering (RFC 3550
/// A.1: a jump) with "He" at sequence 5000, which the register keeps in a restart's run until
/// the next packet confirms it. Its next packet is late: with `evict`, a flood past the reorder
/// wait evicts it meanwhile (the run spares it only for that wait). Then 5001 "llo. " and
/// 5002 (its idle tail, empty) come.
fn restart_run_evicted(evict: bool) -> (Vec<String>, u64) {
    let mut gw = Gateway::new(Config {
        max_streams: if evict { 3 } else { 10 },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{feff}"));
    gw.handle_datagram(at(300), addr(4000), &t140m(5000, 1, false, "He"));
    gw.handle_datagram(at(400), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(400), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_400), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, u64::from(evict));
    gw.handle_datagram(at(1_500), addr(4000), &t140m(5001, 1, false, "llo. "));
    gw.handle_datagram(at(1_800), addr(4000), &t140m(5002, 1, false, ""));
    run_timers(&mut gw, 9_000);
    (contents(&drain(&mut gw)), gw.stats().lost)
}

/// A stream holding a restart's run (`Register::position`: none while a run is kept) keeps no
/// record: evicted and back it is a new stream whose head was lost, and what the dropped run
/// said is marked, never lost silently. A review found the run dropped before the position
/// was asked, the record kept, and "He" lost without a mark (review, session 35).
#[test]
fn a_stream_evicted_with_a_restart_run_kept_does_not_lose_the_run_silently() {
    let control = restart_run_evicted(false);
    assert_eq!(control, (vec!["Hello.".to_owned()], 0), "control");
    let (texts, lost) = restart_run_evicted(true);
    assert!(
        texts == ["Hello."] || (texts.len() == 1 && texts[0].starts_with('\u{fffd}')),
        "evicted while its restart's run waited, and back: {texts:?}, {lost} lost"
    );
}

/// The mixer's source 7 (BOM only) is named "Alice" by the mixer's SDES; the mixer's stream is
/// evicted by three junk streams (max 3), the first of which an SDES names "Junk". Then
/// `others` SDES items for sources not seen on RTP arrive (other hosts' early names). The
/// mixer comes back, source 7 saying "Hello. ": its room is made by evicting junk stream 100,
/// whose name goes among the early names too.
fn returning_source_name(others: u32) -> Vec<String> {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(
        at(0),
        addr(4000),
        &red_csrc(1, 1000, 7, &[], "\u{feff}".as_bytes()),
    );
    gw.handle_datagram(at(10), addr(4001), &mixer_sdes(7, "Alice"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(60), addr(5001), &own_sdes(100, "Junk"));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1, "the mixer's stream is evicted");
    for i in 0..others {
        let from = std::net::SocketAddr::from(([127, 0, 0, 2], 7001));
        gw.handle_datagram(at(1_150), from, &own_sdes(1_000 + i, "Someone"));
    }
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &red_csrc(2, 1300, 7, &[], b"Hello. "),
    );
    assert_eq!(gw.stats().evicted, 2, "junk stream 100 made the room");
    run_timers(&mut gw, 8_000);
    join_names(&drain(&mut gw), "csrc:00000007")
}

/// README "Stream limit": an evicted stream's SDES names are kept for its return's join, a
/// mixer's sources' too: they stay with its record's speakers, so the eviction that makes room
/// for the return cannot push them out of the early names (256). A review found source 7's
/// "Alice" pushed out by the junk stream's name (review, session 35).
#[test]
fn a_returning_mixers_source_name_is_not_pushed_out_by_the_eviction_that_makes_its_room() {
    assert_eq!(
        returning_source_name(254),
        ["Alice"],
        "control: 254 other early names"
    );
    assert_eq!(
        returning_source_name(255),
        ["Alice"],
        "255 other early names: the eviction making room for the return pushed the source's \
         name out"
    );
}
