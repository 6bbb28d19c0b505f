//! A mixer's clock as the gateway follows it (RFC 9071 section 4: one clock for all its
//! sources): the clock at a source's BYE (`bye_sent_by`, `speaker::Lead`), and the clock
//! restarting or stepping back (`speaker_clock_restarted`). A fifth review's tests, written
//! against 0bbc089 (which reset every speaker at one packet stamped far back, and took the
//! clock from each speaker's newest packet): five failed; one, a register gap, was ignored
//! until the register told late duplicates by their timestamps (review, session 36).
//! Then placement on that clock across the mixer's one sequence: its own packets, and losses
//! no speaker accounted for yet (review, session 35); and packets stamped alike, which RFC
//! 3550 5.1 allows (review, session 38).

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// The mixer's clock steps back 50 s (a mixer stamping from a wall clock that NTP stepped),
/// its sequence running on: no restart, no loss. Each speaker's next packet carries its two
/// previous packets as redundancy (RFC 4103 4.2), already delivered. The step resets every
/// speaker's `last_ts` and `recent`, so both packets' generations are taken as new text.
#[test]
fn a_clock_step_back_does_not_repeat_redundancy_with_offsets() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 100_000, 1, &[], b"Hello "));
    gw.handle_datagram(at(10), m, &red_csrc(2, 100_010, 2, &[], b"Hi "));
    gw.handle_datagram(
        at(300),
        m,
        &red_csrc(3, 100_300, 1, &[(300, b"Hello ")], b"world. "),
    );
    gw.handle_datagram(
        at(310),
        m,
        &red_csrc(4, 100_310, 2, &[(300, b"Hi ")], b"there. "),
    );
    // The clock steps back 50 s.
    gw.handle_datagram(
        at(600),
        m,
        &red_csrc(
            5,
            50_600,
            1,
            &[(600, b"Hello "), (300, b"world. ")],
            b"Bye. ",
        ),
    );
    gw.handle_datagram(
        at(610),
        m,
        &red_csrc(6, 50_610, 2, &[(600, b"Hi "), (300, b"there. ")], b"Ciao. "),
    );
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    let s = gw.stats();
    assert_eq!(
        (
            text_of(&out, "csrc:00000001"),
            text_of(&out, "csrc:00000002"),
            s.lost,
            s.recovered
        ),
        (
            "Hello world. Bye.".to_owned(),
            "Hi there. Ciao.".to_owned(),
            0,
            0
        ),
        "{:#?}",
        timeline(&out)
    );
}

/// The same with generations at timestamp offset 0 (RFC 2198 allows it; placed by content,
/// `place_by_content`): the cleared `recent` makes every generation new.
#[test]
fn a_clock_step_back_does_not_repeat_zero_offset_redundancy() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(
        at(0),
        m,
        &red_csrc(1, 100_000, 1, &[(0, b""), (0, b"")], b"Hello "),
    );
    gw.handle_datagram(
        at(10),
        m,
        &red_csrc(2, 100_010, 2, &[(0, b""), (0, b"")], b"Hi "),
    );
    gw.handle_datagram(
        at(300),
        m,
        &red_csrc(3, 100_300, 1, &[(0, b""), (0, b"Hello ")], b"world. "),
    );
    gw.handle_datagram(
        at(310),
        m,
        &red_csrc(4, 100_310, 2, &[(0, b""), (0, b"Hi ")], b"there. "),
    );
    gw.handle_datagram(
        at(600),
        m,
        &red_csrc(5, 50_600, 1, &[(0, b"Hello "), (0, b"world. ")], b"Bye. "),
    );
    gw.handle_datagram(
        at(610),
        m,
        &red_csrc(6, 50_610, 2, &[(0, b"Hi "), (0, b"there. ")], b"Ciao. "),
    );
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    assert_eq!(
        (
            text_of(&out, "csrc:00000001"),
            text_of(&out, "csrc:00000002")
        ),
        ("Hello world. Bye.".to_owned(), "Hi there. Ciao.".to_owned()),
        "{:#?}",
        timeline(&out)
    );
}

/// Three late duplicates of A's old packets, 30 s stale, arrive together (a duplicating
/// path) while the stream is quiet: not a restart (RFC 3550 A.1's three sequential packets
/// behind), and their text is not said again. Stamped before the last delivered packet and
/// none starting a session (no marker, no BOM, RFC 4103 5.2), they are late copies (README
/// "Sequence"). The fifth review found them taken for a restart and said again; rules by
/// stamps and pace alone lost real restarts' text (a restart stamped behind, or an 8 kHz
/// sender's from timestamp 0, has a copy's header but its marker: `tests/sequence_restarts.rs`
/// and the register's tests) (fixed, review, session 36).
#[test]
fn late_duplicates_taken_for_a_restart_do_not_repeat_old_text() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    let mut t = 0u64;
    for seq in 1..=120u16 {
        let words = format!("w{seq}. ");
        gw.handle_datagram(
            at(t),
            m,
            &with_csrc(seq, 1000 + t as u32, MIXER, 1, words.as_bytes()),
        );
        t += 300;
    }
    run_timers(&mut gw, t);
    let before = drain(&mut gw);
    assert!(text_of(&before, "csrc:00000001").ends_with("w120."));
    // Duplicates of 5, 6, 7 (stamped 2200, 2500, 2800), 34 s late.
    for seq in 5..=7u16 {
        let ts = 1000 + 300 * (u32::from(seq) - 1);
        let words = format!("w{seq}. ");
        gw.handle_datagram(at(t), m, &with_csrc(seq, ts, MIXER, 1, words.as_bytes()));
    }
    run_timers(&mut gw, t + 5000);
    let out = drain(&mut gw);
    let said = text_of(&out, "csrc:00000001");
    assert!(
        !said.contains("w5.") && !said.contains("w6.") && !said.contains("w7."),
        "restarts {}: old text said again: {said:?}",
        gw.stats().restarts
    );
}

/// B's packets are 300 ms apart; its second came 50 ms late (jitter), its third (its last
/// words, stamped 1600, sent just before its BYE) is overtaken by the BYE by 10 ms. The BYE
/// clock estimate counts from B's newest packet only, the late one: 610 + (1310 - 360) + 20 =
/// 1580 < 1600, so B's last words are taken as said after its BYE: B leaves, joins again
/// with them, and stays in the session. cb7b4d1 counted the quickest packet (lead 1000).
#[test]
fn a_late_newest_packet_does_not_split_a_sources_last_words_from_its_bye() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(10), m, &with_csrc(1, 1010, MIXER, 2, b"Bravo "));
    gw.handle_datagram(at(360), m, &with_csrc(2, 1310, MIXER, 2, b"says "));
    gw.handle_datagram(at(610), m, &mixer_bye(2));
    gw.handle_datagram(at(620), m, &with_csrc(3, 1600, MIXER, 2, b"bye. "));
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo says bye."),
            pair("session.leave", ""),
        ],
        "{:#?}",
        timeline(&out)
    );
}

/// A genuine mixer restart under its SSRC (a sequence jump confirmed by the register, new
/// timestamps lower, RFC 3550 5.1), with a fresh mixer: nothing before the restart is
/// repeated. C, a new source, speaks first after it ("One ", "two "); then A, who spoke
/// before the restart, speaks: A's packet, stamped far behind A's old newest, resets every
/// speaker's clock state, C's (new clock) included. C's next packet carries "One " and
/// "two " as redundancy (RFC 4103 4.2, stamped 900 and 600 back: C's own packets), already
/// delivered, and they were said again.
#[test]
fn a_restart_noticed_late_does_not_repeat_a_new_sources_redundancy() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 100_000, 1, &[], b"Alpha. "));
    gw.handle_datagram(at(2000), m, &red_csrc_m(true, 30_000, 500, 3, &[], b"One "));
    gw.handle_datagram(
        at(2300),
        m,
        &red_csrc_m(false, 30_001, 800, 3, &[(300, b"One ")], b"two "),
    );
    gw.handle_datagram(
        at(2600),
        m,
        &red_csrc_m(false, 30_002, 1100, 1, &[], b"Back. "),
    );
    gw.handle_datagram(
        at(2900),
        m,
        &red_csrc_m(
            false,
            30_003,
            1400,
            3,
            &[(900, b"One "), (600, b"two ")],
            b"three. ",
        ),
    );
    run_timers(&mut gw, 6000);
    let out = drain(&mut gw);
    assert_eq!(gw.stats().restarts, 1);
    assert_eq!(
        (
            text_of(&out, "csrc:00000001"),
            text_of(&out, "csrc:00000003")
        ),
        ("Alpha. Back.".to_owned(), "One two three.".to_owned()),
        "{:#?}",
        timeline(&out)
    );
}

/// B's BYE (its leave waits, the BYE clock on the mixer's old clock), then the mixer restarts
/// under its SSRC with lower timestamps (confirmed by the register), and B speaks again in the
/// new session, after its BYE. The restart forgets the speakers' old clock but not B's
/// waiting BYE's: B's new words, stamped below the old clock, are taken for words sent before
/// its BYE, glued into its old participation, and B then leaves while speaking.
#[test]
fn a_restart_while_a_sources_leave_waits_does_not_glue_its_new_words_to_the_old_participation() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &with_csrc(1, 100_000, MIXER, 1, b"Alpha. "));
    gw.handle_datagram(at(10), m, &with_csrc(2, 100_010, MIXER, 2, b"Bravo. "));
    gw.handle_datagram(at(100), m, &mixer_bye(2));
    gw.handle_datagram(at(300), m, &with_csrc_m(true, 30_000, 500, MIXER, 1, b"Re"));
    gw.handle_datagram(
        at(310),
        m,
        &with_csrc_m(false, 30_001, 510, MIXER, 1, b"start. "),
    );
    gw.handle_datagram(
        at(600),
        m,
        &with_csrc_m(true, 30_002, 800, MIXER, 2, b"Back. "),
    );
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    assert_eq!(gw.stats().restarts, 1);
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

/// A mixer's stream (SSRC 9) carries its own RED packets (no CSRC: its own voice) between its
/// source A's (CSRC 1); A's packet 3 ("one. ") is lost. The mixer's own packet 4 carries its own
/// previous block "Note. " as its one generation (RFC 4103 4.2: a source's redundancy is its own
/// earlier text). Placed by counting back sequence numbers, the gap of 1 was "recovered" by it and
/// "Note. " said twice; placed by timestamp, as its sources' packets are, it is a repeat, and A's
/// "one. " comes from A's packet 5 (README "Mixers": text is never delivered twice). A review
/// found it (review, session 35).
#[test]
#[ignore = "known gap (README Speakers): a mixer's own CSRC-less packets are placed by sequence number; placing them by timestamp from the first CSRC packet on lost or repeated own packets reordered across that packet (review, session 35)"]
fn a_mixers_own_red_packet_after_a_sources_loss_does_not_repeat_its_own_text() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &own_red(true, 1, 1000, &[], b"Note. "));
    gw.handle_datagram(at(100), m, &red_csrc(2, 1100, 1, &[], b"Alpha "));
    // 3: A's (1400, [(300, "Alpha ")], "one. ") is lost.
    gw.handle_datagram(
        at(500),
        m,
        &own_red(false, 4, 1500, &[(500, b"Note. ")], b"Again. "),
    );
    gw.handle_datagram(
        at(700),
        m,
        &red_csrc(5, 1700, 1, &[(600, b"Alpha "), (300, b"one. ")], b"two. "),
    );
    run_timers(&mut gw, 5000);
    gw.shutdown(at(6000));
    let out = drain(&mut gw);
    assert_eq!(
        (text_of_exactly(&out, OWN), text_of(&out, "csrc:00000001"),),
        ("Note. Again.".to_owned(), "Alpha one. two.".to_owned()),
        "{:#?}",
        timeline(&out)
    );
}

/// The same stream, the mixer's own packet 4 carrying no generation. A's lost packet 3 is
/// recovered from A's packet 5; nothing is lost beyond recovery, so no U+FFFD on the mixer's own
/// voice, `lost` 0 and `recovered` 1 (README "Loss": U+FFFD only for text lost beyond recovery).
/// Counting sequence numbers gave the gap up behind the own packet and marked it there. A review
/// found it (review, session 35).
#[test]
#[ignore = "known gap (README Speakers): a mixer's own CSRC-less packets are placed by sequence number; placing them by timestamp from the first CSRC packet on lost or repeated own packets reordered across that packet (review, session 35)"]
fn a_sources_recovered_loss_is_not_marked_on_the_mixers_own_voice() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &own_red(true, 1, 1000, &[], b"Note. "));
    gw.handle_datagram(at(100), m, &red_csrc(2, 1100, 1, &[], b"Alpha "));
    // 3: A's (1400, [(300, "Alpha ")], "one. ") is lost.
    gw.handle_datagram(at(500), m, &own_red(false, 4, 1500, &[], b"Again. "));
    gw.handle_datagram(
        at(700),
        m,
        &red_csrc(5, 1700, 1, &[(600, b"Alpha "), (300, b"one. ")], b"two. "),
    );
    run_timers(&mut gw, 5000);
    gw.shutdown(at(6000));
    let out = drain(&mut gw);
    let s = gw.stats();
    assert_eq!(
        (
            text_of_exactly(&out, OWN),
            text_of(&out, "csrc:00000001"),
            s.lost,
            s.recovered
        ),
        (
            "Note. Again.".to_owned(),
            "Alpha one. two.".to_owned(),
            0,
            1
        ),
        "{:#?}",
        timeline(&out)
    );
}

/// A says "Hi. " and goes idle; its idle tail's last packet (4) is lost and A says nothing
/// more. B's packet 5 follows the gap and does not account for it (its generation is its own
/// delivered text): unplaced. 30 s later B loses two packets (7, 8), both carried by its 9: nothing
/// is missing, no U+FFFD, `lost` 0. The old loss lies on the mixer's clock before any packet's
/// redundancy can reach back to it (RED's 14-bit offsets): let go as an idle tail (README "Loss"),
/// not added to B's gap and marked in B's sentence ("How \u{fffd}are you today?"). A review found
/// it (review, session 35).
#[test]
fn an_unplaced_tail_loss_is_not_marked_on_another_speaker_30_s_later() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 1000, 2, &[], b"Hello "));
    gw.handle_datagram(at(100), m, &red_csrc_m(true, 2, 1100, 1, &[], b"Hi. "));
    gw.handle_datagram(at(400), m, &red_csrc(3, 1400, 1, &[(300, b"Hi. ")], b""));
    // 4: A's last tail packet (1700, [(600, "Hi. "), (300, "")], "") is lost.
    gw.handle_datagram(
        at(800),
        m,
        &red_csrc(5, 1800, 2, &[(800, b"Hello ")], b"there. "),
    );
    run_timers(&mut gw, 10_000);
    gw.handle_datagram(at(30_000), m, &red_csrc_m(true, 6, 31_000, 2, &[], b"How "));
    // 7 (31300, "are ") and 8 (31600, "you "), B's, are lost.
    gw.handle_datagram(
        at(30_900),
        m,
        &red_csrc(9, 31_900, 2, &[(600, b"are "), (300, b"you ")], b"today? "),
    );
    run_timers(&mut gw, 40_000);
    let out = drain(&mut gw);
    let s = gw.stats();
    assert_eq!(
        (text_of(&out, "csrc:00000002"), s.lost),
        ("Hello there. How are you today?".to_owned(), 0),
        "{:#?}",
        timeline(&out)
    );
}

/// A and B speak; C's first packet (3, ts 1100) is lost; A's 4 (ts 1300) follows the gap and does
/// not account for it: unplaced. C's 5 carries the lost packet at offset 300 (ts 1100): C's
/// generations count against what the stream delivered before the loss (B's 1050, the mixer's one
/// clock), not its newest (A's 1300), so C's recovers it (`recovered` 1) and the loss is placed;
/// B's later loss, fully carried by its next packet, is not marked. A review found it (review,
/// session 35).
#[test]
fn a_new_speakers_recovered_first_packet_is_accounted_with_another_speaker_after_the_gap() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 1000, 1, &[], b"Hi "));
    gw.handle_datagram(at(50), m, &red_csrc(2, 1050, 2, &[], b"Yo "));
    // 3: C's first packet (1100, "Cee ") is lost.
    gw.handle_datagram(
        at(300),
        m,
        &red_csrc(4, 1300, 1, &[(300, b"Hi ")], b"there. "),
    );
    gw.handle_datagram(
        at(400),
        m,
        &red_csrc(5, 1400, 3, &[(300, b"Cee ")], b"here. "),
    );
    run_timers(&mut gw, 3_000);
    let recovered_by_c = gw.stats().recovered;
    // 6 (B, 3350, "how ") and 7 (B, 3650, "are ") are lost; 8 carries both.
    gw.handle_datagram(
        at(3_950),
        m,
        &red_csrc(8, 3950, 2, &[(600, b"how "), (300, b"are ")], b"you? "),
    );
    run_timers(&mut gw, 6_000);
    let out = drain(&mut gw);
    let s = gw.stats();
    assert_eq!(
        (
            text_of(&out, "csrc:00000003"),
            recovered_by_c,
            any_mark(&out),
            s.lost,
            s.recovered
        ),
        ("Cee here.".to_owned(), 1, false, 0, 3),
        "{:#?}",
        timeline(&out)
    );
}

/// The mirror of `a_clock_step_back_does_not_repeat_redundancy_with_offsets`: the mixer's clock
/// steps forward 50 s, its sequence running on: no restart, no loss. Each speaker's next packet
/// carries its two previous packets (RFC 4103 4.2), already delivered, at offsets 600 and 300:
/// stamped back from the new clock they look newer than what the speaker delivered, but the
/// packet runs 50 s further ahead of our clock than the speaker's did (`speaker::Lead`), so the
/// speaker's place moves on with the clock and nothing is said twice. Only a step back moved it
/// before; a review found it (review, session 35).
#[test]
fn a_clock_step_forward_does_not_repeat_redundancy_with_offsets() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 100_000, 1, &[], b"Hello "));
    gw.handle_datagram(at(10), m, &red_csrc(2, 100_010, 2, &[], b"Hi "));
    gw.handle_datagram(
        at(300),
        m,
        &red_csrc(3, 100_300, 1, &[(300, b"Hello ")], b"world. "),
    );
    gw.handle_datagram(
        at(310),
        m,
        &red_csrc(4, 100_310, 2, &[(300, b"Hi ")], b"there. "),
    );
    // The clock steps forward 50 s.
    gw.handle_datagram(
        at(600),
        m,
        &red_csrc(
            5,
            150_600,
            1,
            &[(600, b"Hello "), (300, b"world. ")],
            b"Bye. ",
        ),
    );
    gw.handle_datagram(
        at(610),
        m,
        &red_csrc(
            6,
            150_610,
            2,
            &[(600, b"Hi "), (300, b"there. ")],
            b"Ciao. ",
        ),
    );
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    assert_eq!(
        (
            text_of(&out, "csrc:00000001"),
            text_of(&out, "csrc:00000002"),
        ),
        ("Hello world. Bye.".to_owned(), "Hi there. Ciao.".to_owned()),
        "{:#?}",
        timeline(&out)
    );
}

/// A mixer's restart (RFC 3550 A.1: its sequence jumps, two in sequence confirm it) comes with a
/// new clock far ahead (RFC 3550 5.1: a new session's first timestamp is random), and its
/// first packet, marked with the BOM, is lost: the next carries it as a generation that starts
/// the session. That generation is the lost packet's text, not a clock step's repeat: the
/// speaker's place is not moved on with the clock at a restart (`Piece::Restart`), so A says
/// "New session." (review, session 35: the forward step's check must spare a restart).
#[test]
fn a_restart_on_a_clock_far_ahead_keeps_its_lost_first_packets_redundancy() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    let new = "\u{feff}New ".as_bytes();
    gw.handle_datagram(at(0), m, &red_csrc_m(true, 1, 1000, 1, &[], b"Hello. "));
    gw.handle_datagram(
        at(300),
        m,
        &red_csrc(2, 1300, 1, &[(300, b"Hello. ")], b"Again. "),
    );
    // 30000 (900_000, marked, "\u{feff}New ") is lost.
    gw.handle_datagram(
        at(5_300),
        m,
        &red_csrc(30_001, 900_300, 1, &[(300, new)], b"session. "),
    );
    gw.handle_datagram(
        at(5_600),
        m,
        &red_csrc(
            30_002,
            900_600,
            1,
            &[(600, new), (300, b"session. ")],
            b"Yes. ",
        ),
    );
    run_timers(&mut gw, 10_000);
    let out = drain(&mut gw);
    assert_eq!(gw.stats().restarts, 1, "{:#?}", timeline(&out));
    assert_eq!(
        text_of(&out, "csrc:00000001"),
        "Hello. Again. New session. Yes.",
        "{:#?}",
        timeline(&out)
    );
}

/// As `an_unplaced_tail_loss_is_not_marked_on_another_speaker_30_s_later`, but the mixer's
/// clock has stepped back 50 s when B speaks again: the unplaced loss lies on the old clock,
/// as far ahead of B's packets as no redundancy reaches, and is let go too; B's fully
/// recovered loss is not marked (review, session 35).
#[test]
fn an_unplaced_loss_before_a_clock_step_back_is_not_marked_after_it() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 100_000, 2, &[], b"Hello "));
    gw.handle_datagram(at(100), m, &red_csrc_m(true, 2, 100_100, 1, &[], b"Hi. "));
    gw.handle_datagram(at(400), m, &red_csrc(3, 100_400, 1, &[(300, b"Hi. ")], b""));
    // 4: A's last tail packet (100_700) is lost.
    gw.handle_datagram(
        at(800),
        m,
        &red_csrc(5, 100_800, 2, &[(800, b"Hello ")], b"there. "),
    );
    run_timers(&mut gw, 3_000);
    // The clock steps back 50 s.
    gw.handle_datagram(at(3_000), m, &red_csrc_m(true, 6, 53_000, 2, &[], b"How "));
    // 7 (53_300, "are ") and 8 (53_600, "you "), B's, are lost.
    gw.handle_datagram(
        at(3_900),
        m,
        &red_csrc(9, 53_900, 2, &[(600, b"are "), (300, b"you ")], b"today? "),
    );
    run_timers(&mut gw, 10_000);
    let out = drain(&mut gw);
    assert_eq!(
        (text_of(&out, "csrc:00000002"), gw.stats().lost),
        ("Hello there. How are you today?".to_owned(), 0),
        "{:#?}",
        timeline(&out)
    );
}

/// As `an_unplaced_tail_loss_is_not_marked_on_another_speaker_30_s_later`, B's loss 2 s
/// after A's lost tail packet, within RED's reach: the unplaced loss came before B's last
/// delivered packet (5, after the gap, and 6), so it is not B's older text, and B's loss, fully
/// carried by its next packet, is not marked (review, session 35).
#[test]
fn an_unplaced_loss_before_a_speakers_last_packet_is_not_marked_as_its_older_text() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 1000, 2, &[], b"Hello "));
    gw.handle_datagram(at(100), m, &red_csrc_m(true, 2, 1100, 1, &[], b"Hi. "));
    gw.handle_datagram(at(400), m, &red_csrc(3, 1400, 1, &[(300, b"Hi. ")], b""));
    // 4: A's last tail packet (1700, [(600, "Hi. "), (300, "")], "") is lost.
    gw.handle_datagram(
        at(800),
        m,
        &red_csrc(5, 1800, 2, &[(800, b"Hello ")], b"there. "),
    );
    gw.handle_datagram(at(2_000), m, &red_csrc_m(true, 6, 3_000, 2, &[], b"How "));
    // 7 (3300, "are ") and 8 (3600, "you "), B's, are lost.
    gw.handle_datagram(
        at(2_900),
        m,
        &red_csrc(9, 3_900, 2, &[(600, b"are "), (300, b"you ")], b"today? "),
    );
    run_timers(&mut gw, 10_000);
    let out = drain(&mut gw);
    assert_eq!(
        (text_of(&out, "csrc:00000002"), gw.stats().lost),
        ("Hello there. How are you today?".to_owned(), 0),
        "{:#?}",
        timeline(&out)
    );
}

/// README "Loss": a mixer's loss no speaker accounts for, let go once no redundancy can reach
/// back to it, is taken for an idle tail, and counted as one (`_idle_tail_packets_total`), as a
/// plain stream's register counts such losses. A review found it counted nowhere (review,
/// session 35).
#[test]
fn an_unplaced_loss_let_go_as_an_idle_tail_is_counted_as_one() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 1000, 2, &[], b"Hello "));
    gw.handle_datagram(at(100), m, &red_csrc_m(true, 2, 1100, 1, &[], b"Hi. "));
    gw.handle_datagram(at(400), m, &red_csrc(3, 1400, 1, &[(300, b"Hi. ")], b""));
    // 4: A's last tail packet (1700, [(600, "Hi. "), (300, "")], "") is lost.
    gw.handle_datagram(
        at(800),
        m,
        &red_csrc(5, 1800, 2, &[(800, b"Hello ")], b"there. "),
    );
    run_timers(&mut gw, 10_000);
    gw.handle_datagram(at(30_000), m, &red_csrc_m(true, 6, 31_000, 2, &[], b"How "));
    // 7 (31300, "are ") and 8 (31600, "you "), B's, are lost.
    gw.handle_datagram(
        at(30_900),
        m,
        &red_csrc(9, 31_900, 2, &[(600, b"are "), (300, b"you ")], b"today? "),
    );
    run_timers(&mut gw, 40_000);
    let out = drain(&mut gw);
    let s = gw.stats();
    assert_eq!(
        (
            text_of(&out, "csrc:00000002"),
            s.lost,
            s.recovered,
            s.idle_tail
        ),
        ("Hello there. How are you today?".to_owned(), 0, 2, 1),
        "{:#?}",
        timeline(&out)
    );
}

/// README "Loss": a mixer's loss no speaker accounted for by the time no later packet can
/// reach back to it is taken for an idle tail, and counted so, also when the stream ends
/// (its timeout) before any later packet. A review found it counted nowhere (review, session
/// 35).
#[test]
fn an_unplaced_loss_let_go_at_the_streams_end_is_counted_as_an_idle_tail() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(5000);
    gw.handle_datagram(at(0), m, &red_csrc(1, 1000, 2, &[], b"Hello "));
    gw.handle_datagram(at(100), m, &red_csrc_m(true, 2, 1100, 1, &[], b"Hi. "));
    gw.handle_datagram(at(400), m, &red_csrc(3, 1400, 1, &[(300, b"Hi. ")], b""));
    // 4: A's last tail packet (1700, [(600, "Hi. "), (300, "")], "") is lost.
    gw.handle_datagram(
        at(800),
        m,
        &red_csrc(5, 1800, 2, &[(800, b"Hello ")], b"there. "),
    );
    // No packet follows: the stream times out (60 s) and ends.
    run_timers(&mut gw, 120_000);
    let out = drain(&mut gw);
    let s = gw.stats();
    assert_eq!(s.streams_live, 0, "control: the stream ended");
    assert_eq!(
        (
            text_of(&out, "csrc:00000002"),
            s.lost,
            s.recovered,
            s.idle_tail
        ),
        ("Hello there.".to_owned(), 0, 0, 1),
        "{:#?}",
        timeline(&out)
    );
}

/// Every `context.add`'s content, concatenated.
fn text(out: &[Envelope]) -> String {
    (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// A mixer's source whose two lost packets were stamped alike (RFC 3550 5.1: packets made at
/// once share a timestamp): the next packet's two generations carry one timestamp, and both
/// are its lost text. The second was judged against the first just placed, taken for a
/// repeat and dropped, though counted recovered.
#[test]
fn a_mixers_generations_stamped_alike_are_both_recovered() {
    let mut gw = Gateway::new(Config::default());
    let packets = [
        red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"a"),
        // 2 ("b") and 3 ("c"), both stamped 1300, lost.
        red_csrc(4, 1600, 1, &[(300, b"b"), (300, b"c")], b"d"),
        red_csrc(5, 1900, 1, &[(300, b"c"), (300, b"d")], b"e"),
    ];
    for (i, d) in packets.iter().enumerate() {
        let now = at(300 * i as u64);
        gw.handle_timeout(now);
        gw.handle_datagram(now, addr(7000), d);
    }
    gw.handle_timeout(at(20_000));
    gw.shutdown(at(30_000));
    let said = text(&drain(&mut gw));
    let s = gw.stats();
    assert_eq!(said, "abcde");
    assert_eq!((s.recovered, s.lost), (2, 0));
}

/// A mixer's source sends two packets stamped alike (RFC 3550 5.1 allows consecutive packets
/// made at once to share a timestamp), both arriving in order: the second's text was dropped
/// as a repeat, and nothing counted it (review, session 38). A primary stamped like the last
/// one is new text unless it is the same text.
#[test]
fn a_mixers_packets_stamped_alike_in_order_are_both_said() {
    let mut gw = Gateway::new(Config::default());
    let packets = [
        with_csrc(1, 1000, MIXER, 1, b"a"),
        with_csrc(2, 1300, MIXER, 1, b"b"),
        with_csrc(3, 1300, MIXER, 1, b"c"),
        with_csrc(4, 1600, MIXER, 1, b"d"),
    ];
    for (i, d) in packets.iter().enumerate() {
        let now = at(300 * i as u64);
        gw.handle_timeout(now);
        gw.handle_datagram(now, addr(7000), d);
    }
    gw.shutdown(at(30_000));
    assert_eq!(text(&drain(&mut gw)), "abcd");
}

/// The same with redundancy (RFC 4103 4.2): the third packet carries the second, stamped
/// alike, at offset 0, and its own primary is new text.
#[test]
fn a_mixers_red_packets_stamped_alike_in_order_are_both_said() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(7000);
    let packets = [
        red_csrc(1, 1000, 1, &[], b"a"),
        red_csrc(2, 1300, 1, &[(300, b"a")], b"b"),
        red_csrc(3, 1300, 1, &[(300, b"a"), (0, b"b")], b"c"),
        red_csrc(4, 1600, 1, &[(300, b"b"), (300, b"c")], b"d"),
    ];
    for (i, d) in packets.iter().enumerate() {
        let now = at(300 * i as u64);
        gw.handle_timeout(now);
        gw.handle_datagram(now, m, d);
    }
    gw.shutdown(at(30_000));
    assert_eq!(text(&drain(&mut gw)), "abcd");
    let s = gw.stats();
    assert_eq!((s.recovered, s.lost), (0, 0));
}

/// A mixer that sends its source's last packet again under a new sequence number: the same
/// text stamped alike is a repeat, not said twice.
#[test]
fn a_mixers_repeat_under_a_new_sequence_number_is_said_once() {
    let mut gw = Gateway::new(Config::default());
    let packets = [
        with_csrc(1, 1000, MIXER, 1, b"a"),
        with_csrc(2, 1300, MIXER, 1, b"b"),
        with_csrc(3, 1300, MIXER, 1, b"b"),
        with_csrc(4, 1600, MIXER, 1, b"c"),
    ];
    for (i, d) in packets.iter().enumerate() {
        let now = at(300 * i as u64);
        gw.handle_timeout(now);
        gw.handle_datagram(now, addr(7000), d);
    }
    gw.shutdown(at(30_000));
    assert_eq!(text(&drain(&mut gw)), "abc");
}

/// The second of two packets stamped alike is lost; the next packet carries both as
/// redundancy, each at offset 300: the lost one is recovered, the other not said again.
#[test]
fn a_lost_packet_stamped_like_the_one_before_it_is_recovered() {
    let mut gw = Gateway::new(Config::default());
    let m = addr(7000);
    let packets = [
        (1, red_csrc(1, 1000, 1, &[], b"a")),
        (2, red_csrc(2, 1300, 1, &[(300, b"a")], b"b")),
        (4, red_csrc(4, 1600, 1, &[(300, b"b"), (300, b"c")], b"d")),
    ];
    for (i, d) in &packets {
        let now = at(300 * i);
        gw.handle_timeout(now);
        gw.handle_datagram(now, m, d);
    }
    gw.shutdown(at(30_000));
    assert_eq!(text(&drain(&mut gw)), "abcd");
    let s = gw.stats();
    assert_eq!((s.recovered, s.lost), (1, 0));
}

// Review e (session 39) of the stamped-alike placement above.

/// Feeds `(seq, datagram)` pairs, each at 300 ms times its sequence number, then ends.
fn run_alike(packets: &[(u64, Vec<u8>)]) -> (String, Gateway) {
    let mut gw = Gateway::new(Config::default());
    for (i, d) in packets {
        let now = at(300 * i);
        gw.handle_timeout(now);
        gw.handle_datagram(now, addr(7000), d);
    }
    gw.handle_timeout(at(20_000));
    gw.shutdown(at(30_000));
    let said = text(&drain(&mut gw));
    (said, gw)
}

/// Three packets stamped alike, "a", "b", "a" (a source typing "aba" within one tick of the
/// mixer's clock); the second is lost, and the third carries both before it at offset 0 (RFC
/// 4103 4.2), placed by content. Delivered in order the three say "aba"; with the second lost
/// and recovered the third's primary was judged against the first (the last *packet*
/// delivered), taken for its repeat, and dropped uncounted: "ab".
#[test]
fn a_primary_stamped_alike_after_a_recovered_generation_is_said() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        // 2: [(300, ""), (0, "a")] "b", lost.
        (3, red_csrc(3, 1000, 1, &[(0, b"a"), (0, b"b")], b"a")),
        (4, red_csrc(4, 1300, 1, &[(300, b"b"), (300, b"a")], b"c")),
    ];
    let (said, gw) = run_alike(&packets);
    let s = gw.stats();
    assert_eq!((said.as_str(), s.recovered, s.lost), ("abac", 1, 0));
}

/// A mixer that sends a source's packet again under a new sequence number, after a second
/// packet stamped alike: the repeat's primary ("a") is not the last delivered primary ("b"),
/// so it is said again, though its redundancy shows it comes before "b" (its generations do
/// not end with "a", "b" as a packet after "b" must, RFC 4103 4.2). The next packet then
/// takes "b" for new again (it follows "a", now the last primary): "ababc".
#[test]
#[ignore = "known gap: a repeat of any but the last packet stamped alike is said again; \
            telling it needs the primary's RED lineup against `Recent` (a design decision, \
            since only repeats under new sequence numbers, which RFC 3550 senders do not \
            make, are affected)"]
fn a_repeat_of_the_packet_before_the_last_stamped_alike_is_not_said_again() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        (2, red_csrc(2, 1000, 1, &[(300, b""), (0, b"a")], b"b")),
        (3, red_csrc(3, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        (4, red_csrc(4, 1300, 1, &[(300, b"a"), (300, b"b")], b"c")),
    ];
    let (said, _) = run_alike(&packets);
    assert_eq!(said, "abc");
}

/// Two packets stamped like the last delivered one ("a" at 1000) are lost; the next packet
/// carries both (RFC 4103 4.2: its generations are the source's packets just before it, so
/// "a" would be among them were either of them "a"'s packet). Neither is taken: "b" and "c"
/// were dropped, no U+FFFD marked them on this speaker, and the two losses were left
/// unplaced, then let go as an idle tail (`idle_tail` 2, `lost` 0). Both are recovered.
#[test]
fn two_lost_packets_stamped_like_the_last_delivered_are_recovered() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        // 2: [(300, ""), (0, "a")] "b" and 3: [(0, "a"), (0, "b")] "c", both stamped 1000, lost.
        (4, red_csrc(4, 1300, 1, &[(300, b"b"), (300, b"c")], b"d")),
    ];
    let (said, gw) = run_alike(&packets);
    let s = gw.stats();
    assert_eq!(
        (said.as_str(), s.recovered, s.lost, s.idle_tail),
        ("abcd", 2, 0, 0)
    );
}

/// A new speaker whose first packet was lost, stamped like another speaker's last delivered
/// packet (one clock, RFC 9071 4; packets made at once share a timestamp, RFC 3550 5.1): its
/// next packet's generation is that lost packet. Its text was said, but not counted as
/// recovered (the `floor` is the other speaker's timestamp, and only newer counted): the loss
/// was left unplaced, then let go as an idle tail.
#[test]
fn a_new_speakers_lost_packet_stamped_like_the_floor_counts_as_recovered() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"x")),
        // 2: speaker 2's [(600, ""), (300, "")] "b1" stamped 1000, lost.
        (3, red_csrc(3, 1300, 2, &[(300, b""), (300, b"b1")], b"b2")),
    ];
    let (said, gw) = run_alike(&packets);
    let s = gw.stats();
    assert_eq!(
        (said.as_str(), s.recovered, s.lost),
        ("xb1b2", 1, 0),
        "idle_tail {}",
        s.idle_tail
    );
}
