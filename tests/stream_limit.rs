//! The stream limit (README "Stream limit"): which stream makes room for a new one, and how an
//! evicted stream comes back. The sans-IO core driven directly: datagrams and time in,
//! envelopes out. (More eviction cases live in tests/gateway_core.rs and
//! tests/mixer_source_bye.rs.)

use std::time::Duration;

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Compat, Config, DropReason, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

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

fn raw(seq: u16, ssrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(
        &mut d,
        seq == 1,
        98,
        seq,
        u32::from(seq) * 300,
        ssrc,
        payload,
    );
    d
}

const CALLER: &str = "t140:00000001@127.0.0.1:4000";

/// A caller inside an escape sequence evicted once its last packet is a reorder wait old (at
/// once with a reorder wait of 0) comes back with the rest of the sequence (`31m`) skipped,
/// not shown as text: its own voice's decoder goes with the record of its eviction (README
/// "Stream limit", "Text decoding"). A review found "31mHello." (review, session 34).
#[test]
fn an_escape_sequence_cut_by_an_eviction_does_not_come_back_as_text() {
    // (reorder wait, when the flood's third SSRC comes, when the caller's next packet comes)
    for (wait_ms, flood_at, back_at) in [(0u64, 100u64, 300u64), (1_000, 1_100, 1_200)] {
        let mut gw = Gateway::new(Config {
            max_streams: 3,
            reorder_wait: Duration::from_millis(wait_ms),
            ..Config::default()
        });
        gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{1b}[1;"));
        gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
        gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
        // The limit: the caller (oldest, past its wait) gives its place.
        gw.handle_datagram(at(flood_at), addr(5000), &t140(1, 102, ""));
        let evicted = gw.stats().evicted;
        gw.handle_datagram(at(back_at), addr(4000), &t140(2, 1, "31mHello. "));
        run_timers(&mut gw, back_at + 5_000);
        let got = adds(&drain(&mut gw));
        assert_eq!(
            got,
            vec![(CALLER.to_owned(), "Hello.".to_owned())],
            "reorder wait {wait_ms} ms: the rest of the escape sequence the eviction cut is \
             shown as the caller's text (evicted {evicted} at {flood_at} ms)"
        );
    }
}

/// A caller whose packet ended inside a character (`E2`, the first byte of `€`), evicted past
/// its reorder wait, comes back with the character's rest (`82 AC`): the character is
/// reassembled, nothing shown or counted twice (README "Text decoding"). A review found it
/// shown as two U+FFFD and counted three times (review, session 34).
#[test]
fn a_character_cut_by_an_eviction_is_not_said_twice_nor_counted_three_times() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &raw(1, 1, b"\xe2"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    let evicted = gw.stats().evicted;
    gw.handle_datagram(at(1_200), addr(4000), &raw(2, 1, b"\x82\xacHello. "));
    run_timers(&mut gw, 6_200);
    let got = adds(&drain(&mut gw));
    let text: String = got.iter().map(|(_, t)| t.as_str()).collect();
    let shown = text.chars().filter(|&c| c == '\u{fffd}').count() as u64;
    let counted = gw.stats().decode.invalid_utf8;
    assert!(
        shown <= 1 && counted == shown,
        "one character cut by the eviction: shown as {shown} U+FFFD, counted {counted} times \
         as invalid UTF-8 (evicted {evicted}): {got:?}"
    );
}

/// README "Stream limit": a stream spared for an escape sequence begun takes its turn by age
/// once its reorder wait has passed: the oldest (J, ESC at 0 ms) gives its place at 2 s, not a
/// newer stream that never carried text (L, opened at 150 ms); J's sequence is counted when
/// its record ends. A review found spared streams kept behind every newer candidate (review,
/// session 34).
#[test]
fn past_its_wait_a_spared_stream_is_evicted_in_its_turn_oldest_first() {
    let mut gw = Gateway::new(Config {
        max_streams: 2,
        ..Config::default()
    });
    // J: an escape sequence begun, at 0 ms.
    gw.handle_datagram(at(0), addr(5000), &t140(1, 100, "\u{1b}"));
    // K: a silent stream; the limit is reached.
    gw.handle_datagram(at(100), addr(5001), &t140(1, 101, ""));
    // L at 150 ms: J, within its wait, is spared (moved to `spared`), K gives its place.
    gw.handle_datagram(at(150), addr(5002), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1);
    assert_eq!(gw.stats().decode.sequences_skipped, 0);
    // M at 2 s: J's wait is long over; J is the oldest candidate, L the newer.
    gw.handle_datagram(at(2_000), addr(5003), &t140(1, 103, ""));
    assert_eq!(gw.stats().evicted, 2);
    // L is still live: its next packet needs no room (evicting L, it would have made some).
    gw.handle_datagram(at(2_100), addr(5002), &t140(2, 102, ""));
    assert_eq!(
        gw.stats().evicted,
        2,
        "the oldest candidate, J, gives its place, not L opened 150 ms after it"
    );
    // J's sequence, gone with its record, is counted when the record ends (here, the stop).
    gw.shutdown(at(3_000));
    assert_eq!(gw.stats().decode.sequences_skipped, 1);
}

/// README "Stream limit": a packet a restart's run keeps (RFC 3550 A.1, a sequence jump not
/// confirmed) spares its stream only for a reorder wait after its last packet, as an
/// unfinished character does: junk SSRCs sending an empty packet and then a lone ESC 5,000
/// numbers on held every place for the stream timeout (60 s), a real caller 5 s later refused
/// (review, session 34).
#[test]
fn a_kept_jump_packet_does_not_spare_a_junk_stream_past_the_reorder_wait() {
    let mut gw = Gateway::new(Config {
        max_streams: 2,
        ..Config::default()
    });
    for ssrc in [100, 101] {
        gw.handle_datagram(at(0), addr(5000), &t140(1, ssrc, ""));
        gw.handle_datagram(at(0), addr(5000), &t140m(5_001, ssrc, false, "\u{1b}"));
    }
    run_timers(&mut gw, 5_000);
    let _ = drain(&mut gw);
    assert_eq!(gw.live_streams(), 2);
    gw.handle_datagram(at(5_000), addr(4000), &t140(1, 1, "Hello. "));
    run_timers(&mut gw, 10_000);
    let got = adds(&drain(&mut gw));
    let s = gw.stats();
    assert_eq!(
        got,
        vec![(CALLER.to_owned(), "Hello.".to_owned())],
        "a real caller 5 s after the junk streams' last packets: refused {}, evicted {}",
        s.drops(pvp_t140::DropReason::StreamLimit),
        s.evicted
    );
}

fn refused(gw: &Gateway) -> u64 {
    gw.stats().drops(DropReason::StreamLimit)
}

/// A t140llm packet: no marker, payload type 98 (the gateway's T.140 type), sequence from 0,
/// timestamp 160 a packet (docs/t140llm.md section 3).
fn llm(seq: u16, ssrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, false, 98, seq, u32::from(seq) * 160, ssrc, payload);
    d
}

/// README "Stream limit": "a character or escape sequence its last packet left unfinished goes
/// on" when an evicted stream comes back, for a mixer's sources (CSRC voices) too: the rest of
/// a source's escape sequence (`31m`) is skipped, not its text. A review found only the own
/// voice's decoder kept (review, session 34).
#[test]
fn a_mixer_sources_escape_sequence_cut_by_an_eviction_does_not_come_back_as_text() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    // The mixer (SSRC 9) forwards source 7's first packet: an escape sequence begun.
    gw.handle_datagram(at(0), addr(4000), &with_csrc(1, 1000, MIXER, 7, b"\x1b[1;"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    // Past the mixer's reorder wait: it is the oldest candidate and gives its place.
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1, "the mixer's stream is evicted");
    // It comes back with the rest of the sequence, then text.
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &with_csrc(2, 1300, MIXER, 7, b"31mHello. "),
    );
    run_timers(&mut gw, 7_000);
    let out = drain(&mut gw);
    assert_eq!(
        text_of(&out, "csrc:00000007"),
        "Hello.",
        "the rest of the escape sequence the eviction cut is shown as the source's text: {:#?}",
        timeline(&out)
    );
}

/// The same for a character: source 7's packet ended inside `€` (E2); the rest (82 AC) comes
/// after the mixer's return and completes it. A review found it shown as U+FFFD and counted as
/// invalid UTF-8 twice (review, session 34).
#[test]
fn a_mixer_sources_character_cut_by_an_eviction_is_reassembled() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &with_csrc(1, 1000, MIXER, 7, b"\xe2"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1);
    gw.handle_datagram(
        at(1_200),
        addr(4000),
        &with_csrc(2, 1300, MIXER, 7, b"\x82\xacHello. "),
    );
    run_timers(&mut gw, 7_000);
    let out = drain(&mut gw);
    let text = text_of(&out, "csrc:00000007");
    assert_eq!(
        (text.as_str(), gw.stats().decode.invalid_utf8),
        ("\u{20ac}Hello.", 0),
        "a mixer's source's character cut by the eviction"
    );
}

/// `--compat t140llm`: its streams never mark a start and have no numbering to continue, yet
/// an evicted one's unfinished escape sequence (t140llm cuts text by grapheme, so `ESC [` and
/// `31m` may be two packets, docs/t140llm.md section 4) goes on when it comes back (README
/// "Stream limit"). A review found no record kept, and `31m` shown (review, session 34).
#[test]
fn a_t140llm_escape_sequence_cut_by_an_eviction_does_not_come_back_as_text() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        compat: Compat::T140llm,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &llm(0, 1, b"\x1b[1;"));
    gw.handle_datagram(at(50), addr(5000), &llm(0, 100, b""));
    gw.handle_datagram(at(50), addr(5000), &llm(0, 101, b""));
    gw.handle_datagram(at(1_100), addr(5000), &llm(0, 102, b""));
    assert_eq!(gw.stats().evicted, 1, "the caller is evicted");
    gw.handle_datagram(at(1_200), addr(4000), &llm(1, 1, b"31mHello. "));
    run_timers(&mut gw, 7_000);
    let got = adds(&drain(&mut gw));
    let text: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        text,
        ["Hello."],
        "t140llm: the rest of the escape sequence the eviction cut is shown as text"
    );
}

/// README "Stream limit": a new stream at the limit takes the place of the oldest "that never
/// carried text (no speaker ever joined ...; nothing buffered but loss marks ...)". Junk SSRCs
/// that each send one letter and then a backspace erasing it (nothing sent, no one joined,
/// nothing buffered) stay candidates: a stream holding words is spared until its flush, not
/// dropped from the queues. A review found them dropped for good by a search that saw the
/// letter, holding every place until the stream timeout (review, session 34).
#[test]
fn a_junk_stream_whose_letter_was_erased_is_still_evictable() {
    let mut gw = Gateway::new(Config {
        max_streams: 2,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(5000), &t140(1, 100, "x"));
    gw.handle_datagram(at(0), addr(5000), &t140(1, 101, "y"));
    // A third junk SSRC at the limit: both hold text, the search drops them, it is refused.
    gw.handle_datagram(at(10), addr(5000), &t140(1, 102, ""));
    assert_eq!(refused(&gw), 1);
    // Both erase their letter: nothing buffered, no one joined, nothing will be sent.
    gw.handle_datagram(at(20), addr(5000), &t140(2, 100, "\u{8}"));
    gw.handle_datagram(at(20), addr(5000), &t140(2, 101, "\u{8}"));
    run_timers(&mut gw, 5_000);
    assert!(drain(&mut gw).is_empty(), "the junk streams said nothing");
    // A real caller 5 s later.
    gw.handle_datagram(at(5_000), addr(4000), &t140(1, 1, "Hello. "));
    run_timers(&mut gw, 10_000);
    let got = adds(&drain(&mut gw));
    assert_eq!(
        got,
        vec![(
            "t140:00000001@127.0.0.1:4000".to_owned(),
            "Hello.".to_owned()
        )],
        "the caller is refused ({} refused at the limit, {} evicted) while two streams that \
         never carried text hold the places",
        refused(&gw),
        gw.stats().evicted
    );
}

/// README "Stream limit": an evicted stream is remembered "until [it] would have timed out",
/// and a character or escape sequence its last packet left unfinished is "counted as cut short
/// if it does not come back": counted as the timers run past the record's end, as a stream not
/// evicted has its cut sequence counted at its timeout. A review found it counted only at the
/// gateway's stop (or when 64 later evictions pushed the record out) (review, session 34).
#[test]
fn an_evicted_streams_cut_sequence_is_counted_once_its_record_has_expired() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{1b}[1;"));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 100, ""));
    gw.handle_datagram(at(50), addr(5000), &t140(1, 101, ""));
    gw.handle_datagram(at(1_100), addr(5000), &t140(1, 102, ""));
    assert_eq!(gw.stats().evicted, 1, "the caller is evicted");
    // The stream timeout (60 s) passes for the caller's record and for the junk streams; the
    // gateway goes on receiving.
    run_timers(&mut gw, 70_000);
    gw.handle_datagram(at(70_000), addr(6000), &t140(1, 200, "Hi. "));
    run_timers(&mut gw, 75_000);
    assert_eq!(
        gw.stats().decode.sequences_skipped,
        1,
        "the caller's escape sequence, cut by its eviction, is not counted though its record \
         ended 10 s ago"
    );
}
