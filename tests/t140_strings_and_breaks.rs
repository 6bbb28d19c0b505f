//! T.140 decoding and the chunker: unterminated control strings, VT and FF, a t140llm erase
//! across an idle flush; through the sans-IO core with time as a value.

use std::time::Duration;

use pvp_t140::{Config, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

fn gw(max: usize) -> Gateway {
    Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        max_chunk_chars: max,
        ..Config::default()
    })
}

fn packet(seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(&mut d, seq == 1, 98, seq, u32::from(seq) * 300, 7, payload);
    d
}

/// Packets one after another, 50 ms apart, then the stream's end.
fn say(max: usize, packets: &[&[u8]]) -> Vec<String> {
    let mut g = gw(max);
    let mut ms = 0;
    let mut out = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        g.handle_datagram(at(ms), addr(4000), &packet(i as u16 + 1, p));
        ms += 50;
        g.handle_timeout(at(ms));
        out.extend(drain(&mut g));
    }
    g.shutdown(at(ms + 100_000));
    out.extend(drain(&mut g));
    shown(&out)
}

/// A control string left without its terminator (ST or BEL) ends at the next ESC, which
/// begins an escape sequence of its own: ECMA-48 5.6 allows no ESC in a command string but as
/// ST's first half, and a DEC/xterm parser leaves any string at an ESC. The decoder took the
/// ESC and everything after it for the string's content, so an OSC title whose BEL a relay
/// stripped, followed by an SGR, swallowed the speaker's next 256 characters.
#[test]
fn an_unterminated_osc_string_ends_at_the_next_escape_sequence() {
    let said = say(
        500,
        &[
            b"\x1b]0;my title\x1b[32mHello world, how are you?",
            b" Fine.",
        ],
    );
    assert_eq!(said, ["Hello world, how are you?", "Fine."]);
    // Split between packets, the ESC last in one.
    let said = say(500, &[b"\x1b]0;my title\x1b", b"[32mHello. "]);
    assert_eq!(said, ["Hello."]);
    // ST (ESC \) still ends the string whole, nothing of it left.
    let said = say(500, &[b"\x1b]0;my title\x1b", b"\\Hello. "]);
    assert_eq!(said, ["Hello."]);
}

/// VT (U+000B) and FF (U+000C) are Unicode white space and mandatory line breaks (UAX #14
/// class BK), as LF is: they separate the words on either side. Dropped as other C0 controls
/// are, they joined them ("onetwo"), as a tab once did (README "Text decoding").
#[test]
fn form_feed_and_vertical_tab_keep_the_words_apart() {
    assert_eq!(
        say(500, &[b"one\x0ctwo. Three\x0bfour."]),
        ["one\ntwo.", "Three\nfour."]
    );
}

/// t140llm erases a grapheme cluster a backspace (README "t140llm"). A combining mark that
/// comes after an idle flush sent its base character is one cluster with it, so the
/// backspace after the mark erases both: the sent item must lose its "c". The chunker erases
/// the mark alone (the buffer's one cluster) and the item kept the "c" the sender erased. A
/// mark after white space still erases only that space with it.
#[test]
fn a_cluster_erase_reaches_the_base_a_flush_sent_before_its_mark() {
    let mut g = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        compat: pvp_t140::gateway::Compat::T140llm,
        ..Config::default()
    });
    g.handle_datagram(at(0), addr(4000), &packet(1, b"Hello c"));
    g.handle_timeout(at(1000));
    g.handle_datagram(at(1100), addr(4000), &packet(2, "\u{301}".as_bytes()));
    g.handle_datagram(at(1150), addr(4000), &packet(3, b"\x08"));
    g.shutdown(at(100_000));
    assert_eq!(shown(&drain(&mut g)), ["Hello"]);
    assert_eq!(g.stats().erase_unmatched, 0);
    // The chunker alone: the erase goes on into the text flushed.
    let mut ch = pvp_t140::chunker::Chunker::new();
    let mut cuts = pvp_t140::chunker::Cuts::new(500);
    cuts.erase_clusters(true);
    ch.fed(&mut cuts).push_ascii(b"Hello c");
    let idle = ch.flush(pvp_t140::chunker::FlushCause::Idle).unwrap();
    assert_eq!(idle.text, "Hello c");
    use pvp_t140::t140::TextSink;
    ch.fed(&mut cuts).push_char('\u{301}');
    assert!(ch.fed(&mut cuts).backspace(), "the mark erased");
    assert_eq!(ch.take_erase_sent(), 1, "and the sent c with it");
    // A mark after a space: the space and the mark, nothing sent.
    let mut ch = pvp_t140::chunker::Chunker::new();
    ch.fed(&mut cuts).push_ascii(b"Hi ");
    ch.flush(pvp_t140::chunker::FlushCause::Idle).unwrap();
    ch.fed(&mut cuts).push_char('\u{301}');
    ch.fed(&mut cuts).backspace();
    assert_eq!(ch.take_erase_sent(), 0);
    // A lone mark with nothing cut before it: nothing more to erase, nothing counted.
    let mut ch = pvp_t140::chunker::Chunker::new();
    ch.fed(&mut cuts).push_char('\u{301}');
    assert!(ch.fed(&mut cuts).backspace());
    assert_eq!(ch.take_erase_sent(), 0);
}
