//! The chunker's backspace editing at a flush boundary: t140llm's cluster erase after a cut
//! (sentence or size), and a no-break space before invisible text; through the sans-IO core
//! with time as a value, or the chunker alone.
//!
//! Found by review as (session 46).

use std::time::Duration;

use pvp_t140::chunker::{Chunker, Cuts, FlushCause};
use pvp_t140::t140::TextSink;
use pvp_t140::{Config, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

fn packet(seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(&mut d, seq == 1, 98, seq, u32::from(seq) * 300, 7, payload);
    d
}

/// Found by review as (session 46). With `--compat t140llm` a backspace erases a grapheme
/// cluster, as the sender's `processBackspaces` does, and one an idle or sentence cut split
/// goes on into the sent item (README, t140llm). After "Hi. " the sentence is sent and its
/// space is unseen; a backspace erases that space, a combining mark then extends the "." and
/// the next backspace erases the cluster ".\u{301}". The chunker forgot the cut as soon as a
/// backspace reached past its buffer, even one that only erased the space, so it erased the
/// mark alone and the item kept the "." the sender erased.
#[test]
fn a_cluster_erase_after_erasing_the_space_of_a_sentence_cut_reaches_the_sent_item() {
    let mut g = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        compat: pvp_t140::gateway::Compat::T140llm,
        ..Config::default()
    });
    let mut out = Vec::new();
    for (i, p) in ["Hi. ", "\u{8}", "\u{301}", "\u{8}"].iter().enumerate() {
        g.handle_datagram(
            at(50 * i as u64),
            addr(4000),
            &packet(i as u16 + 1, p.as_bytes()),
        );
        out.extend(drain(&mut g));
    }
    g.shutdown(at(100_000));
    out.extend(drain(&mut g));
    assert_eq!(shown(&out), ["Hi"]);
    assert_eq!(g.stats().corrections, 1);
    assert_eq!(g.stats().erase_unmatched, 0);
    // A new line between: erased, the mark extends the "." as well.
    let mut ch = Chunker::new();
    let mut cuts = Cuts::new(500);
    cuts.erase_clusters(true);
    ch.fed(&mut cuts).push_ascii(b"Hi.");
    ch.fed(&mut cuts).new_line();
    assert_eq!(cuts.pop().map(|c| c.text).as_deref(), Some("Hi."));
    ch.fed(&mut cuts).backspace();
    ch.fed(&mut cuts).push_char('\u{301}');
    ch.fed(&mut cuts).backspace();
    assert_eq!(ch.take_erase_sent(), 1, "the sent full stop with its mark");
    // Two spaces, one erased: the mark sits on the other, which it erases, nothing sent.
    let mut ch = Chunker::new();
    ch.fed(&mut cuts).push_ascii(b"Hi.  ");
    cuts.drain().for_each(drop);
    ch.fed(&mut cuts).backspace();
    ch.fed(&mut cuts).push_char('\u{301}');
    ch.fed(&mut cuts).backspace();
    assert_eq!(ch.take_erase_sent(), 0);
    ch.fed(&mut cuts).push_char('x');
    assert_eq!(ch.pending(), "x");
}

/// Found by review as (session 46). What a cluster erase may reach after a cut was remembered
/// only for a chunk cut whole (idle, sentence): after a size cut it still described the chunk
/// before. A chunk ending in a virama (`क्`, which the next consonant joins, UAX #29 GB9c),
/// then a size cut of "abcd" at a space a combining mark followed: once the mark and the space
/// are erased, a consonant typed follows the "d", and its erase took the "d" with it, which
/// the sender never erased.
#[test]
fn a_cluster_erase_after_a_size_cut_follows_the_size_chunk_not_the_one_before() {
    let mut ch = Chunker::new();
    let mut cuts = Cuts::new(6);
    cuts.erase_clusters(true);
    ch.fed(&mut cuts).push_char('\u{915}');
    ch.fed(&mut cuts).push_char('\u{94d}');
    let sent = ch.flush(FlushCause::Idle).map(|c| c.text);
    assert_eq!(sent.as_deref(), Some("\u{915}\u{94d}"));
    ch.fed(&mut cuts).push_ascii(b"abcd ");
    ch.fed(&mut cuts).push_char('\u{301}');
    let size: Vec<_> = cuts.drain().map(|c| (c.text, c.cause)).collect();
    assert_eq!(size, [("abcd".to_owned(), FlushCause::Size)]);
    // The mark with the space it sits on.
    ch.fed(&mut cuts).backspace();
    assert_eq!(ch.pending(), "");
    // A consonant after "d" is a cluster of its own: its erase is its own.
    ch.fed(&mut cuts).push_char('\u{937}');
    assert!(ch.fed(&mut cuts).backspace());
    assert_eq!(ch.take_erase_sent(), 0, "the sent d is not erased");
    assert_eq!(ch.pending(), "");
}

/// Found by review as (session 46). Text of nothing but invisible characters is not cut (a
/// chunk of them is never sent) and is counted as white space typed, which backspaces erase
/// before the text cut before it (README: "a backspace over white space erases it, never a
/// letter beyond"). A no-break space leading such text (after the space a size cut split at)
/// was dropped from that count, so the last backspace erased a sent letter instead of it.
#[test]
fn a_no_break_space_before_invisible_text_is_erased_before_a_sent_letter() {
    let mut g = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        max_chunk_chars: 6,
        ..Config::default()
    });
    // "abc" is cut at the space (size); a no-break space and five zero-width spaces reach the
    // limit with no space to cut at, and "x" cuts them (as nothing).
    let typed = "abc \u{a0}\u{200b}\u{200b}\u{200b}\u{200b}\u{200b}x";
    g.handle_datagram(at(0), addr(4000), &packet(1, typed.as_bytes()));
    // Erase all typed after "abc": x, five zero-width spaces, the no-break space, the space.
    g.handle_datagram(
        at(100),
        addr(4000),
        &packet(2, "\u{8}".repeat(8).as_bytes()),
    );
    g.handle_timeout(at(2_000));
    g.shutdown(at(100_000));
    assert_eq!(shown(&drain(&mut g)), ["abc"]);
    assert_eq!(g.stats().corrections, 0);
    // The chunker alone: one backspace more reaches the sent "c".
    let mut ch = Chunker::new();
    let mut cuts = Cuts::new(6);
    for c in typed.chars() {
        ch.fed(&mut cuts).push_char(c);
    }
    let cut: Vec<_> = cuts.drain().map(|c| (c.text, c.cause)).collect();
    assert_eq!(cut, [("abc".to_owned(), FlushCause::Size)]);
    for _ in 0..8 {
        assert!(ch.fed(&mut cuts).backspace());
    }
    assert_eq!(ch.take_erase_sent(), 0);
    assert!(!ch.fed(&mut cuts).backspace());
    assert_eq!(ch.take_erase_sent(), 1);
}
