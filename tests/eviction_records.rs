//! What an evicted stream's record keeps for its return (README "Stream limit"): its
//! numbering, its own voice's unfinished character or escape sequence, its sources' SDES
//! names; and when the record ends. A mixer's sources and t140llm streams come back through
//! their redundancy, which a kept decoder must not be fed twice. The sans-IO core driven
//! directly. Reviews of this session's eviction records found each case (review, session 34).

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

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
