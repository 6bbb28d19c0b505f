//! A mixer's BYE for a source (CSRC) none of whose packets came yet (RFC 3550 6.3.7: the BYE,
//! forwarded in RTCP, overtook them): the source's leave waits as any source's does. A review
//! of 07eecd5 (which kept such a BYE aside and gave it to the source's speaker later) wrote
//! these; five failed on it.

use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// A (CSRC 1) goes on: five packets 300 ms apart from `from` ms, sequence from `seq`, stamped
/// `ts_of(t)`, then every timer to 10 s. B's (CSRC 2) events, and the timeline.
fn a_goes_on(
    gw: &mut Gateway,
    from: u64,
    seq: u16,
    ts_of: impl Fn(u64) -> u32,
) -> (Vec<(String, String)>, Timeline) {
    for i in 0..5u16 {
        let t = from + 300 * u64::from(i);
        let a = with_csrc_m(false, seq + i, ts_of(t), MIXER, 1, b"b. ");
        gw.handle_datagram(at(t), addr(5000), &a);
    }
    run_timers(gw, 10_000);
    let out = drain(gw);
    (events_of(&out, "csrc:00000002"), timeline(&out))
}

fn leaves(words: &str) -> Vec<(String, String)> {
    vec![
        pair("session.join", ""),
        pair("context.add", words),
        pair("session.leave", ""),
    ]
}

/// B's BYE (1000) overtakes B's only packet (stamped 1990, before the BYE: estimate 2020),
/// which arrives at 1005 behind a lost packet of A and is placed when that gap is given up on
/// its timer (1900), inside the BYE's wait (ends 2000). A known source here leaves at its
/// wait's end (RFC 3550 6.3.7); B must leave too, not stay until the mixer's stream ends.
#[test]
fn an_early_byes_source_placed_by_a_gap_timer_within_the_wait_leaves() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Alpha. "));
    // A's 2 is lost; A's 3 waits for it until 1900.
    gw.handle_datagram(at(900), addr(5000), &with_csrc(3, 1900, MIXER, 1, b"a. "));
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    gw.handle_datagram(
        at(1005),
        addr(5000),
        &with_csrc(4, 1990, MIXER, 2, b"Bye all. "),
    );
    run_timers(&mut gw, 2499);
    let (b, tl) = a_goes_on(&mut gw, 2500, 5, |t| 1000 + t as u32);
    assert_eq!(b, leaves("Bye all."), "{tl:#?}");
}

/// B's BYE (1000) overtakes B's only packet (stamped 1990, before the BYE), which arrives at
/// 1005 behind a lost packet and waits for it until 2005, past the BYE's wait (2000). A known
/// source's leave waits for such a packet (`settle_byes`); B must leave once its words are
/// out. (U+FFFD marks the lost packet.)
#[test]
fn an_early_byes_source_held_past_the_wait_still_leaves() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Alpha. "));
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    // A's 2 is lost; B's 3 waits for it until 2005.
    gw.handle_datagram(
        at(1005),
        addr(5000),
        &with_csrc(3, 1990, MIXER, 2, b"Bye all. "),
    );
    run_timers(&mut gw, 2299);
    let (b, tl) = a_goes_on(&mut gw, 2300, 4, |t| 1000 + t as u32);
    assert_eq!(b, leaves("\u{fffd}Bye all."), "{tl:#?}");
}

/// B's BYE comes (1000) before any packet of B; then the mixer restarts under its SSRC (a
/// sequence jump confirmed by three packets, its clock starting again far lower, RFC 3550 5.1)
/// and B speaks on the new clock (stamped 520). The BYE's moment (about 101,020 on the old
/// clock) is not B's new clock: B's first words in the mixer's new session must not take the
/// old session's BYE. A known source's BYE on the old clock is let go at such a jump
/// (`speaker_clock_restarted`). 07eecd5 left B at 2000; before it, the BYE was dropped.
#[test]
fn an_early_bye_on_the_mixers_old_clock_does_not_end_a_source_after_a_restart() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(
        at(0),
        addr(5000),
        &with_csrc(1, 100_000, MIXER, 1, b"Alpha. "),
    );
    gw.handle_datagram(
        at(500),
        addr(5000),
        &with_csrc(2, 100_500, MIXER, 1, b"a. "),
    );
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    let restart = [
        (1100, 30_000, 500, 1, &b"x"[..]),
        (1110, 30_001, 510, 1, b""),
    ];
    for (t, seq, ts, csrc, text) in restart {
        let p = with_csrc_m(seq == 30_000, seq, ts, MIXER, csrc, text);
        gw.handle_datagram(at(t), addr(5000), &p);
    }
    let b = with_csrc_m(false, 30_002, 520, MIXER, 2, b"Hi all. ");
    gw.handle_datagram(at(1120), addr(5000), &b);
    let (b, tl) = a_goes_on(&mut gw, 1400, 30_003, |t| t as u32 - 600);
    assert_eq!(gw.stats().restarts, 1);
    assert_eq!(
        b,
        [pair("session.join", ""), pair("context.add", "Hi all.")],
        "{tl:#?}"
    );
}

/// B's BYE (1000, sent by about 2020 on the mixer's clock) overtakes B's last words before it
/// (2, stamped 1990), and B's first words after it (3, stamped 2400: B is back) overtake those;
/// 2 fills the gap and both are delivered at once. What was sent before the BYE is the old
/// participation's (RFC 3550 6.3.7): B says "Bye all.", leaves, then joins again.
#[test]
fn an_early_bye_splits_words_before_it_from_words_after_it_delivered_together() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Alpha. "));
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    let again = with_csrc(3, 2400, MIXER, 2, b"Hello again. ");
    gw.handle_datagram(at(1300), addr(5000), &again);
    gw.handle_datagram(
        at(1310),
        addr(5000),
        &with_csrc(2, 1990, MIXER, 2, b"Bye all. "),
    );
    let (b, tl) = a_goes_on(&mut gw, 2000, 4, |t| 1000 + t as u32);
    let mut want = leaves("Bye all.");
    want.extend([
        pair("session.join", ""),
        pair("context.add", "Hello again."),
    ]);
    assert_eq!(b, want, "{tl:#?}");
}

/// A RED mixer (RFC 4103, RFC 2198): B's BYE (1000) overtakes B's only words (2, stamped 1990)
/// and that packet is lost; B's next packet (3, stamped 2290) is its idle tail (RFC 4103 5.2:
/// an empty primary) carrying "Bye all." as redundancy, and the words are recovered from it.
/// B said nothing after its BYE: it leaves after its recovered words, once.
#[test]
fn an_early_byes_source_whose_words_are_recovered_from_its_idle_tail_leaves() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &red_csrc(1, 1000, 1, &[], b"Alpha. "));
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    let tail = red_csrc(3, 2290, 2, &[(300, b"Bye all. ")], b"");
    gw.handle_datagram(at(1300), addr(5000), &tail);
    for i in 0..5u16 {
        let t = 1600 + 300 * u64::from(i);
        let a = red_csrc(4 + i, 1000 + t as u32, 1, &[(300, b"")], b"b. ");
        gw.handle_datagram(at(t), addr(5000), &a);
    }
    run_timers(&mut gw, 10_000);
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        leaves("Bye all."),
        "{:#?}",
        timeline(&out)
    );
}

/// A BYE listing two SSRCs that never send in the mixer's stream changes no envelope (with a
/// gap, a late packet, the mixer's own packets, idle flushes): they are those of the same run
/// without it. (The timers differ: each stranger's leave waits its reorder wait, and leaves
/// unseen.)
#[test]
fn a_bye_for_strangers_changes_nothing() {
    let own = |seq: u16, ts: u32, text: &[u8]| {
        let mut d = Vec::new();
        pvp_t140::rtp::write_packet(&mut d, false, 98, seq, ts, MIXER, text);
        d
    };
    let mut strangers = vec![0x80, 201, 0, 1];
    strangers.extend_from_slice(&MIXER.to_be_bytes());
    strangers.extend_from_slice(&[0x82, 203, 0, 2, 0, 0, 0, 77, 0, 0, 0, 78]);
    let run = |with_bye: bool| {
        let mut gw = Gateway::new(Config::default());
        let mut deadlines = Vec::new();
        let packets = [
            (0, with_csrc(1, 1000, MIXER, 1, b"Alpha ")),
            (100, with_csrc(2, 1100, MIXER, 2, b"Bravo ")),
            (400, with_csrc(4, 1400, MIXER, 1, b"two ")),
            (450, with_csrc(3, 1300, MIXER, 2, b"late ")),
            (700, own(5, 1700, b"Note. ")),
            (1000, own(6, 2000, b"More. ")),
            (1500, with_csrc(7, 2500, MIXER, 1, b"three. ")),
            (5000, with_csrc(8, 6000, MIXER, 2, b"four. ")),
        ];
        for (t, p) in packets.into_iter().chain([(70_000, vec![])]) {
            if with_bye && t == 400 {
                gw.handle_datagram(at(390), addr(5000), &strangers);
            }
            while let Some(d) = gw.poll_timeout().filter(|&d| d <= at(t)) {
                deadlines.push(d);
                gw.handle_timeout(d);
            }
            if !p.is_empty() {
                gw.handle_datagram(at(t), addr(5000), &p);
            }
        }
        let out = drain(&mut gw);
        assert_ts_monotonic(&out);
        assert!(deadlines.windows(2).all(|w| w[0] <= w[1]), "{deadlines:?}");
        timeline(&out)
    };
    assert_eq!(run(true), run(false));
}

/// A text mixer (RFC 9071) forwards the BYEs of 15 conference members that never typed (RFC
/// 3550 7.3), early on; then 20 members type, one packet each. Each BYE made a never-joined
/// speaker, and speakers are never removed: 16 of the stream's 32 places went for good, and
/// members 18..20 were folded into the stream's own voice (a third review of 5cd07d8). At most
/// four such speakers are made while none of them is heard.
#[test]
fn byes_of_members_that_never_typed_do_not_take_speaker_places() {
    members_typing_after_strangers_byes(Config::default());
}

/// As above with no reorder wait (`--reorder-wait-ms 0`): a source leaves at its BYE, so none
/// is made for it. (The bound counted only speakers with a waiting BYE, and these had none.)
#[test]
fn with_no_reorder_wait_byes_of_members_that_never_typed_take_no_places() {
    members_typing_after_strangers_byes(Config {
        reorder_wait: std::time::Duration::ZERO,
        ..Config::default()
    });
}

/// 15 silent members' BYEs, then 20 members type: member 20 speaks as itself.
fn members_typing_after_strangers_byes(cfg: Config) {
    let run = |with_byes: bool| {
        let mut gw = Gateway::new(cfg.clone());
        gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"One. "));
        if with_byes {
            for (i, stranger) in (101..=115u32).enumerate() {
                gw.handle_datagram(at(100 + i as u64), addr(5000), &mixer_bye(stranger));
            }
        }
        run_timers(&mut gw, 5_000);
        for k in 2..=20u16 {
            let t = 5_000 + 300 * u64::from(k);
            let p = with_csrc(k, 1000 + t as u32, MIXER, u32::from(k), b"Hi. ");
            gw.handle_datagram(at(t), addr(5000), &p);
        }
        run_timers(&mut gw, 20_000);
        let out = drain(&mut gw);
        text_of(&out, "csrc:00000014")
    };
    assert_eq!(run(false), "Hi.");
    assert_eq!(
        run(true),
        "Hi.",
        "member 20 lost its own voice to strangers' BYEs"
    );
}

/// `--compat t140llm`, a CSRC stream with one voice (A, CSRC 1) that loses a packet: the loss
/// is marked in A's text (its only voice). A BYE for CSRC 2, which never sends, made a speaker
/// that counted as a second voice, and the mark went unattributed (a review of 654da24). No
/// such speaker is made under t140llm, which sends no RTCP.
#[test]
fn t140llm_a_bye_for_a_stranger_does_not_take_the_only_voices_loss_mark() {
    let run = |with_bye: bool| {
        let cfg = Config {
            compat: pvp_t140::Compat::T140llm,
            ..Config::default()
        };
        let mut gw = Gateway::new(cfg);
        gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Alpha "));
        if with_bye {
            gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
        }
        // 2 is lost.
        let beta = with_csrc(3, 4000, MIXER, 1, b"beta. ");
        gw.handle_datagram(at(3000), addr(5000), &beta);
        run_timers(&mut gw, 10_000);
        gw.shutdown(at(10_000));
        let out = drain(&mut gw);
        let s = gw.stats();
        (text_of(&out, "csrc:00000001"), s.lost, s.lost_unattributed)
    };
    let without = run(false);
    assert!(without.0.contains('\u{fffd}'), "{without:?}");
    assert_eq!(run(true), without);
}
