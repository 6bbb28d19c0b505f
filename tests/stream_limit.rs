//! The stream limit (README "Stream limit"): which stream makes room for a new one, and how an
//! evicted stream comes back. The sans-IO core driven directly: datagrams and time in,
//! envelopes out. (More eviction cases live in tests/gateway_core.rs and
//! tests/mixer_source_bye.rs.)

use std::time::Duration;

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway, Time, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

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

fn run_timers(gw: &mut Gateway, now: Time) {
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= now) {
        gw.handle_timeout(t);
    }
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
        run_timers(&mut gw, at(back_at + 5_000));
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
    run_timers(&mut gw, at(6_200));
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
    run_timers(&mut gw, at(5_000));
    let _ = drain(&mut gw);
    assert_eq!(gw.live_streams(), 2);
    gw.handle_datagram(at(5_000), addr(4000), &t140(1, 1, "Hello. "));
    run_timers(&mut gw, at(10_000));
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
