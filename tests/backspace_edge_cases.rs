//! T.140 erasure and corrections at their edges (review n): duplicates, RED recovery, flushes,
//! escapes, leaves and restarts, through the sans-IO gateway with time passed in as a value.

use std::time::Duration;

use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

fn idle() -> Gateway {
    Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        ..Config::default()
    })
}

/// A duplicated packet carrying backspaces erases once.
#[test]
fn a_duplicated_backspace_packet_erases_once() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello world"));
    gw.handle_timeout(at(2000));
    let p = t140(2, 7, "\u{8}\u{8}");
    gw.handle_datagram(at(2100), addr(4000), &p);
    gw.handle_datagram(at(2110), addr(4000), &p);
    gw.handle_timeout(at(4000));
    assert_eq!(shown(&drain(&mut gw)), ["Hello wor"]);
}

/// More backspaces than the item holds: removed, the rest counted.
#[test]
fn more_backspaces_than_text_remove_the_item() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hi"));
    gw.handle_timeout(at(2000));
    gw.handle_datagram(at(2100), addr(4000), &t140(2, 7, "\u{8}\u{8}\u{8}\u{8}ok"));
    gw.handle_timeout(at(4000));
    let out = drain(&mut gw);
    assert_eq!(shown(&out), ["ok"]);
    assert_eq!(out.iter().filter(|e| e.kind == "context.remove").count(), 1);
    assert_eq!(gw.stats().corrections, 1);
    assert_eq!(gw.stats().erase_unmatched, 2);
}

/// A size cut then backspaces reaching back into the cut chunk and the item before.
#[test]
fn backspaces_across_a_newline_item() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Line one\r\n"));
    gw.handle_timeout(at(2000));
    gw.handle_datagram(at(2100), addr(4000), &t140(2, 7, "\u{8}\u{8}X"));
    gw.handle_timeout(at(4000));
    assert_eq!(shown(&drain(&mut gw)), ["Line on", "X"]);
}

/// Leading white space of an item: the update keeps what the add showed at its start.
#[test]
fn an_update_after_a_sentence_cut_has_no_leading_space() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "One. Two three"));
    gw.handle_timeout(at(2000));
    gw.handle_datagram(
        at(2100),
        addr(4000),
        &t140(2, 7, "\u{8}\u{8}\u{8}\u{8}\u{8}\u{8}"),
    );
    gw.handle_timeout(at(4000));
    assert_eq!(shown(&drain(&mut gw)), ["One.", "Two"]);
}

/// A loss mark inside the sent item then a backspace.
#[test]
fn a_backspace_after_a_loss_in_sent_text() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "abc"));
    gw.handle_datagram(at(100), addr(4000), &t140(3, 7, "def"));
    gw.handle_timeout(at(2000));
    gw.handle_datagram(at(2100), addr(4000), &t140(4, 7, "\u{8}"));
    gw.handle_timeout(at(4000));
    let s = shown(&drain(&mut gw));
    assert_eq!(s.len(), 1, "{s:?}");
    assert!(s[0].ends_with("de"), "{s:?}");
}

/// A speaker that timed out (left) and came back under the same SSRC: its backspaces must
/// not correct the item of its earlier participation.
#[test]
fn a_backspace_after_a_timeout_and_return_does_not_correct_the_old_item() {
    let mut gw = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        stream_timeout: Duration::from_secs(5),
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello world"));
    gw.handle_timeout(at(1000));
    gw.handle_timeout(at(20_000));
    gw.handle_datagram(at(21_000), addr(4000), &t140(2, 7, "\u{8}\u{8}"));
    gw.handle_timeout(at(23_000));
    let out = drain(&mut gw);
    let kinds: Vec<&str> = out.iter().map(|e| e.kind.as_str()).collect();
    assert!(!kinds.contains(&"context.update"), "{kinds:?}");
    assert_eq!(shown(&out), ["Hello world"]);
}

/// A backspace packet reordered ahead of the text it erases: applied after it.
#[test]
fn a_reordered_backspace_is_applied_in_sequence_order() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hi "));
    gw.handle_datagram(at(10), addr(4000), &t140(3, 7, "\u{8}\u{8}"));
    gw.handle_datagram(at(20), addr(4000), &t140(2, 7, "there"));
    gw.handle_timeout(at(3000));
    gw.handle_timeout(at(6000));
    assert_eq!(shown(&drain(&mut gw)), ["Hi the"]);
}

fn red_packet(marker: bool, seq: u16, ts: u32, gens: &[(u16, &str)], primary: &str) -> Vec<u8> {
    let g: Vec<(u16, &[u8])> = gens.iter().map(|(o, t)| (*o, t.as_bytes())).collect();
    let mut payload = Vec::new();
    pvp_t140::red::write_payload(&mut payload, 98, &g, primary.as_bytes());
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, marker, 100, seq, ts, 7, &payload);
    d
}

/// Backspaces in a packet that was lost, recovered from the next packet's redundancy and
/// repeated in the one after: applied once.
#[test]
fn a_lost_backspace_recovered_from_red_erases_once() {
    let mut gw = idle();
    gw.handle_datagram(
        at(0),
        addr(4000),
        &red_packet(true, 1, 0, &[], "Hello world"),
    );
    gw.handle_timeout(at(1000));
    // seq 2 ("\b\b", ts 1300) lost.
    gw.handle_datagram(
        at(1600),
        addr(4000),
        &red_packet(
            false,
            3,
            1600,
            &[(1600 - 1000, ""), (300, "\u{8}\u{8}")],
            "X",
        ),
    );
    gw.handle_datagram(
        at(1900),
        addr(4000),
        &red_packet(false, 4, 1900, &[(600, "\u{8}\u{8}"), (300, "X")], "Y"),
    );
    gw.handle_timeout(at(5000));
    let out = drain(&mut gw);
    assert_eq!(shown(&out), ["Hello wor", "XY"]);
    assert_eq!(gw.stats().corrections, 1);
}

/// A size cut, then backspaces erasing the buffer and reaching into the cut item.
#[test]
fn backspaces_through_the_buffer_into_a_size_cut_item() {
    let mut gw = Gateway::new(Config {
        idle_flush: Duration::from_millis(500),
        max_chunk_chars: 5,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "abcdefgh"));
    gw.handle_datagram(
        at(100),
        addr(4000),
        &t140(2, 7, "\u{8}\u{8}\u{8}\u{8}\u{8}"),
    );
    gw.handle_timeout(at(3000));
    assert_eq!(shown(&drain(&mut gw)), ["abc"]);
}

/// An SGR sequence between the text and the backspace is skipped, not erased.
#[test]
fn a_backspace_after_an_escape_sequence_erases_the_character_before_it() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "ab\u{1b}[31m"));
    gw.handle_timeout(at(1000));
    gw.handle_datagram(at(1100), addr(4000), &t140(2, 7, "\u{feff}\u{8}"));
    gw.handle_timeout(at(3000));
    assert_eq!(shown(&drain(&mut gw)), ["a"]);
}

/// A CR LF typed then one backspace erases the whole new line, not half of it.
#[test]
fn one_backspace_erases_a_cr_lf() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "ab\r\ncd"));
    gw.handle_timeout(at(1000));
    gw.handle_datagram(at(1100), addr(4000), &t140(2, 7, "\u{8}\u{8}\u{8}"));
    gw.handle_timeout(at(3000));
    let mut out = drain(&mut gw);
    assert_eq!(shown(&out), ["ab"]);
    gw.handle_datagram(at(3100), addr(4000), &t140(3, 7, "\u{8}"));
    gw.handle_timeout(at(5000));
    out.extend(drain(&mut gw));
    assert_eq!(shown(&out), ["a"]);
}

/// Backspaces in the same packet as the sentence end they erase: nothing erased is ever sent.
#[test]
fn a_sentence_end_erased_in_its_own_packet_is_never_sent() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hi. \u{8}\u{8}\u{8}o"));
    gw.handle_timeout(at(3000));
    let out = drain(&mut gw);
    assert_eq!(shown(&out), ["Ho"]);
    assert!(
        out.iter()
            .all(|e| e.kind != "context.update" && e.kind != "context.remove")
    );
}

/// What a sender's restart (new sequence and timestamp base, marked) does to a backspace.
#[test]
fn a_lone_backspace_packet_after_a_sequence_jump_is_counted_dropped_not_applied() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello world"));
    gw.handle_timeout(at(1000));
    gw.handle_datagram(at(1100), addr(4000), &t140m(5000, 7, true, "\u{8}\u{8}"));
    gw.handle_timeout(at(3000));
    gw.handle_timeout(at(100_000));
    let out = drain(&mut gw);
    let kinds: Vec<&str> = out.iter().map(|e| e.kind.as_str()).collect();
    // RFC 3550 A.1: a lone packet after a jump is not taken as a restart; it is counted dropped.
    assert!(!kinds.contains(&"context.update"), "{kinds:?}");
    assert_eq!(shown(&out), ["Hello world"]);
    assert_eq!(gw.stats().drops_total(), 1);
}

/// A sender's restart confirmed by a second packet: both packets are read.
#[test]
fn backspaces_after_a_confirmed_sender_restart_correct_the_last_item() {
    let mut gw = idle();
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello world"));
    gw.handle_timeout(at(1000));
    gw.handle_datagram(at(1100), addr(4000), &t140m(5000, 7, true, "\u{8}\u{8}"));
    gw.handle_datagram(at(1400), addr(4000), &t140m(5001, 7, false, "x"));
    gw.handle_timeout(at(3000));
    gw.handle_timeout(at(100_000));
    let out = drain(&mut gw);
    let kinds: Vec<&str> = out.iter().map(|e| e.kind.as_str()).collect();
    // A confirmed restart continues the speaker: its backspaces correct its last item.
    assert!(kinds.contains(&"context.update"), "{kinds:?}");
    assert_eq!(shown(&out), ["Hello wor", "x"]);
    assert_eq!(gw.stats().restarts, 1);
    assert_eq!(gw.stats().corrections, 1);
}
