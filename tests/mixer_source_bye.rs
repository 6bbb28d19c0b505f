//! A mixer's source leaving after an RTCP BYE for its CSRC (RFC 3550 6.6, 6.3.7): its leave
//! waits for packets the BYE overtook, at most the reorder wait, and is said as of then
//! however the gateway is driven. Each of these failed on the first version of that wait
//! (6a32ca8): found in review, fixed together.

use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// The mixer's own packet (SSRC 9, no CSRC).
fn own(seq: u16, ts: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, false, 98, seq, ts, 9, payload);
    d
}

/// B's BYE at 100: its leave is due at 1100 (the reorder wait from the BYE), and
/// `poll_timeout` says so. Then the mixer's own packet (no CSRC) comes in order at 200. The
/// gateway is driven by `poll_timeout` as a shell would: B must have left once the clock
/// reaches 1100, and no envelope may be stamped before an earlier one.
#[test]
fn a_mixers_own_in_order_packet_does_not_push_a_sources_leave_past_its_wait() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    assert_eq!(gw.poll_timeout(), Some(at(1100)));
    gw.handle_datagram(at(200), addr(5000), &own(3, 1200, b"Note. "));
    // Drive the timers as a shell does, up to 1100.
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(1100)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", ""),
        ],
        "B has not left by 1100: {:#?}",
        timeline(&out)
    );
}

/// The same, driven on to 3000: B's leave is stamped at the end of its wait (1100).
#[test]
fn a_sources_leave_after_the_mixers_own_packet_is_stamped_at_its_waits_end() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    gw.handle_datagram(at(200), addr(5000), &own(3, 1200, b"Note. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(3000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    let leave = out
        .iter()
        .find(|e| e.kind == "session.leave" && e.sender.ends_with("csrc:00000002"))
        .expect("B leaves");
    assert_eq!(leave.ts, at(1100).to_iso8601(), "{:#?}", timeline(&out));
}

/// B said "Bravo " (no sentence end: it waits in the chunker for the idle flush at 2010),
/// then its BYE at 120: it leaves at 1120, and its text goes out with the leave. One
/// `handle_timeout` call comes late (at 5000). B's text must not be stamped after its leave,
/// nor go out as an idle flush 900 ms after B left.
#[test]
fn a_late_timeout_call_does_not_stamp_a_leaving_sources_text_after_its_leave() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    gw.handle_datagram(at(120), addr(5000), &mixer_bye(2));
    gw.handle_timeout(at(5000));
    let out = drain(&mut gw);
    assert_ts_monotonic(&out);
    let b: Vec<(String, String)> = out
        .iter()
        .filter(|e| e.sender.ends_with("csrc:00000002") && e.kind != "session.join")
        .map(|e| (e.kind.clone(), e.ts.clone()))
        .collect();
    assert_eq!(
        b,
        [
            ("context.add".to_owned(), at(1120).to_iso8601()),
            ("session.leave".to_owned(), at(1120).to_iso8601()),
        ]
    );
}

/// A mixer repeats its RTCP (RFC 3550 6.6 forwards every BYE): B's BYE at 100 and again at
/// 300, nothing in between. B then speaks again at 500, stamped 1500 (well after both BYEs):
/// it leaves its first participation and joins again, and is in the session (no leave until
/// it says BYE again or the stream ends).
#[test]
fn a_source_speaking_after_a_repeated_bye_is_not_left_again_at_once() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(100), addr(5000), &bye);
    gw.handle_datagram(at(300), addr(5000), &bye);
    gw.handle_datagram(at(500), addr(5000), &with_csrc(3, 1500, 9, 2, b"Back. "));
    gw.handle_timeout(at(2000));
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

/// The mixer's clock as last seen: the mixer's own packet (no CSRC) at 500 is stamped 1500,
/// one clock with its sources' (RFC 9071). B's last packet, stamped 1600 (sent before the BYE,
/// which the mixer sent at about 1620) arrives 5 ms after the BYE. It is B's last words,
/// not a second participation.
#[test]
fn the_bye_clock_estimate_counts_the_mixers_own_packets() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    gw.handle_datagram(at(500), addr(5000), &own(3, 1500, b"Note. "));
    gw.handle_datagram(at(620), addr(5000), &mixer_bye(2));
    gw.handle_datagram(at(625), addr(5000), &with_csrc(4, 1600, 9, 2, b"ends. "));
    gw.handle_timeout(at(3000));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo ends."),
            pair("session.leave", ""),
        ],
        "{:#?}",
        timeline(&out)
    );
}

/// B's BYE at 120 (leave due 1120); the stream then goes silent and one late
/// `handle_timeout` comes after the stream timeout (60 s). B's leave belongs at 1120, before
/// the stream's end, not stamped at the stream timeout.
#[test]
fn a_late_timeout_call_after_the_stream_timeout_stamps_the_leave_at_its_wait_end() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    gw.handle_datagram(at(120), addr(5000), &mixer_bye(2));
    gw.handle_timeout(at(100_000));
    let out = drain(&mut gw);
    let leave = out
        .iter()
        .find(|e| e.kind == "session.leave" && e.sender.ends_with("csrc:00000002"))
        .expect("B leaves");
    assert_eq!(leave.ts, at(1120).to_iso8601(), "{:#?}", timeline(&out));
}

/// B's last packet (4, stamped 1100, sent before its BYE) arrives 50 ms after the BYE and
/// waits behind the lost 3 (A's). B's leave must not come before that packet is delivered
/// (or given up): else B leaves, the packet joins it again, and B stays in the session for
/// good (a second participation, never left).
#[test]
fn a_sources_packet_held_behind_a_gap_that_outlasts_its_bye_wait_does_not_rejoin_it() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    // A's 3 is lost; B's 4 (sent before the BYE) was overtaken and waits for 3 until 1150.
    gw.handle_datagram(at(150), addr(5000), &with_csrc(4, 1100, 9, 2, b"ends. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(3000)) {
        gw.handle_timeout(t);
    }
    // The stream goes on: A speaks again.
    gw.handle_datagram(at(3100), addr(5000), &with_csrc(5, 4100, 9, 1, b"More. "));
    let out = drain(&mut gw);
    let of_b = events_of(&out, "csrc:00000002");
    let joins = of_b.iter().filter(|(k, _)| k == "session.join").count();
    assert!(
        joins == 1 && of_b.last().map(|(k, _)| k.as_str()) == Some("session.leave"),
        "B joins again after its leave and stays: {:#?}",
        timeline(&out)
    );
}

/// `poll_timeout` must never answer a time before the clock. B's BYE at 100 (leave due
/// 1100); the mixer's own packet (no CSRC) in order at 200; then A's BYE at 1500, with every
/// timer due fired before it (as `handle_datagram` does).
#[test]
fn a_bye_after_a_mixers_own_packet_leaves_no_timer_behind_the_clock() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    gw.handle_datagram(at(200), addr(5000), &own(3, 1200, b"Note. "));
    gw.handle_datagram(at(1500), addr(5000), &mixer_bye(1));
    let next = gw.poll_timeout();
    assert!(
        next.is_none_or(|t| t > at(1500)),
        "a timer left behind the clock: {:?} ms",
        next.map(|t| t.as_millis() - T0)
    );
}

/// Timestamps wrapping past 2^32 between B's last packet and its BYE's estimate.
#[test]
fn across_the_timestamp_wrap_an_overtaken_packet_stays_and_a_later_one_rejoins() {
    let mut gw = Gateway::new(Config::default());
    let base = u32::MAX - 50;
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, base, 9, 1, b"Alpha. "));
    gw.handle_datagram(
        at(10),
        addr(5000),
        &with_csrc(2, base.wrapping_add(10), 9, 2, b"Bravo "),
    );
    gw.handle_datagram(at(120), addr(5000), &mixer_bye(2));
    gw.handle_datagram(
        at(125),
        addr(5000),
        &with_csrc(3, base.wrapping_add(115), 9, 2, b"ends. "),
    );
    gw.handle_datagram(
        at(600),
        addr(5000),
        &with_csrc(4, base.wrapping_add(600), 9, 2, b"Back. "),
    );
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo ends."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "Back."),
            pair("session.leave", ""),
        ]
    );
}

/// The mixer's own BYE while B's leave waits, then shutdown: B leaves once, first.
#[test]
fn the_mixers_own_bye_while_a_sources_leave_waits_leaves_it_once_and_first() {
    for shutdown in [false, true] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
        gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
        gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
        if shutdown {
            gw.shutdown(at(500));
        } else {
            gw.handle_datagram(at(300), addr(5000), &mixer_bye(9));
            gw.handle_datagram(at(310), addr(5000), &with_csrc(3, 1100, 9, 2, b"ends. "));
            while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
                gw.handle_timeout(t);
            }
        }
        let out = drain(&mut gw);
        let b = events_of(&out, "csrc:00000002");
        assert_eq!(
            b.iter().filter(|(k, _)| k == "session.join").count(),
            1,
            "{:#?}",
            timeline(&out)
        );
        assert_eq!(b.last().unwrap().0, "session.leave");
        assert_eq!(gw.stats().streams_live, 0);
        let leaves: Vec<String> = out
            .iter()
            .filter(|e| e.kind == "session.leave")
            .map(|e| e.sender.rsplit('/').next().unwrap().to_owned())
            .collect();
        assert_eq!(leaves[0], "csrc:00000002", "{:#?}", timeline(&out));
    }
}

// A fourth review (cb7b4d1): the clock estimate from strays, drift and restarts, and a mixer
// restart dropping its sources' text.

/// A stray packet (RFC 3550 A.1: a sequence jump never confirmed, dropped as a jump) carrying
/// A's CSRC and a timestamp 100 s ahead. It is never delivered, yet B's BYE clock estimate
/// afterwards counts it: B's new words 500 ms after its BYE (stamped 500 ms after it) are put
/// in its old participation, and B then leaves while it is speaking.
#[test]
fn a_stray_jump_packet_does_not_move_the_bye_clock() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    // A stray: far off in sequence and in time; the stream goes on as before.
    gw.handle_datagram(
        at(200),
        addr(5000),
        &with_csrc_m(false, 20_000, 101_200, 9, 1, b"zz"),
    );
    gw.handle_datagram(at(300), addr(5000), &with_csrc(3, 1300, 9, 1, b"More. "));
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    gw.handle_datagram(at(1500), addr(5000), &with_csrc(4, 2500, 9, 2, b"Back. "));
    run_timers(&mut gw, 5000);
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

/// The mixer's clock runs 100 ppm slow against the gateway's (two ordinary crystals; RFC 3550
/// 6.4.1 expects a receiver to live with it). After two hours of A speaking every 30 s, B
/// (which spoke 10 s before) says BYE, and speaks again 500 ms later: its packet is stamped
/// 500 ms after the BYE on the mixer's clock. The lead of A's first packet, two hours old, is
/// 720 ms more than the clock's lead now.
#[test]
fn a_slow_mixer_clock_does_not_keep_a_source_from_rejoining_after_hours() {
    let mut gw = Gateway::new(Config::default());
    let clock = |ms: u64| 1000 + (ms - ms / 10_000) as u32; // 100 ppm slow
    let mut seq = 1u16;
    let mut t = 0u64;
    while t <= 7_200_000 {
        gw.handle_datagram(at(t), addr(5000), &with_csrc(seq, clock(t), 9, 1, b"a. "));
        seq += 1;
        t += 30_000;
    }
    let t = 7_200_000 + 10_000;
    gw.handle_datagram(
        at(t),
        addr(5000),
        &with_csrc(seq, clock(t), 9, 2, b"Bravo. "),
    );
    seq += 1;
    gw.handle_datagram(at(t + 1000), addr(5000), &mixer_bye(2));
    gw.handle_datagram(
        at(t + 1500),
        addr(5000),
        &with_csrc_m(true, seq, clock(t + 1500), 9, 2, b"Back. "),
    );
    run_timers(&mut gw, t + 5000);
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
        &timeline(&out)[timeline(&out).len().saturating_sub(6)..]
    );
}

/// The mixer restarts under its SSRC (RFC 3550 A.1: a sequence jump confirmed by three packets
/// in sequence, which the gateway accepts as a restart): its new timestamps start lower than
/// the old ones (a random base, RFC 3550 5.1). The speakers' text after the restart is
/// delivered.
#[test]
fn after_a_mixer_restart_with_lower_timestamps_its_sources_text_is_delivered() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 100_000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 100_010, 9, 2, b"Bravo. "));
    gw.handle_datagram(
        at(2000),
        addr(5000),
        &with_csrc_m(true, 30_000, 500, 9, 2, b"One. "),
    );
    gw.handle_datagram(
        at(2010),
        addr(5000),
        &with_csrc_m(false, 30_001, 510, 9, 1, b"Two. "),
    );
    gw.handle_datagram(
        at(2020),
        addr(5000),
        &with_csrc_m(false, 30_002, 520, 9, 2, b"Three. "),
    );
    gw.handle_datagram(
        at(2300),
        addr(5000),
        &with_csrc_m(false, 30_003, 800, 9, 2, b"Four. "),
    );
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    let b: String = events_of(&out, "csrc:00000002")
        .into_iter()
        .filter(|(k, _)| k == "context.add")
        .map(|(_, c)| c + " ")
        .collect();
    assert_eq!(gw.stats().restarts, 1);
    assert_eq!(
        b.trim_end(),
        "Bravo. One. Three. Four.",
        "{:#?}",
        timeline(&out)
    );
}

/// A spoke before the mixer restarted under its SSRC (a sequence jump confirmed by three
/// packets; the new timestamps start lower, RFC 3550 5.1), B only after. B's BYE, then B's new
/// words 500 ms later, stamped 500 ms after the BYE on the mixer's new clock: B's old
/// participation leaves, and the new words join it again. A's lead from the old clock must not
/// count.
#[test]
fn after_a_mixer_restart_the_old_clocks_lead_does_not_keep_a_source_from_rejoining() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 100_000, 9, 1, b"Alpha. "));
    gw.handle_datagram(
        at(2000),
        addr(5000),
        &with_csrc_m(true, 30_000, 500, 9, 1, b"x"),
    );
    gw.handle_datagram(
        at(2010),
        addr(5000),
        &with_csrc_m(false, 30_001, 510, 9, 1, b""),
    );
    gw.handle_datagram(
        at(2020),
        addr(5000),
        &with_csrc_m(false, 30_002, 520, 9, 1, b""),
    );
    gw.handle_datagram(
        at(2100),
        addr(5000),
        &with_csrc_m(true, 30_003, 600, 9, 2, b"Bravo. "),
    );
    gw.handle_datagram(at(3000), addr(5000), &mixer_bye(2));
    gw.handle_datagram(
        at(3500),
        addr(5000),
        &with_csrc_m(true, 30_004, 2000, 9, 2, b"Back. "),
    );
    run_timers(&mut gw, 8000);
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

/// A says "Alpha. " at 0 (stamped 1000); the mixer forwards B's BYE at 1000, before any
/// packet of B; B's first packet, marked, comes at `b_at` stamped `b_ts`; then A speaks
/// `a_packets` more times, `a_every` ms apart, stamped as it goes. B's events, and the
/// timeline, once every timer due by `until` has run.
fn b_after_an_early_bye(
    (b_at, b_ts, words): (u64, u32, &[u8]),
    (a_packets, a_every): (u16, u64),
    until: u64,
) -> (Vec<(String, String)>, Timeline) {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Alpha. "));
    gw.handle_datagram(at(1000), addr(5000), &mixer_bye(2));
    gw.handle_datagram(
        at(b_at),
        addr(5000),
        &with_csrc_m(true, 2, b_ts, MIXER, 2, words),
    );
    for i in 0..a_packets {
        let t = 2000 + a_every * u64::from(i);
        let a = with_csrc(3 + i, 1000 + t as u32, MIXER, 1, b"a. ");
        gw.handle_datagram(at(t), addr(5000), &a);
    }
    run_timers(&mut gw, until);
    let out = drain(&mut gw);
    (events_of(&out, "csrc:00000002"), timeline(&out))
}

/// B's BYE overtakes B's only packet (RFC 3550 6.3.7: the case the leave's wait is for), which
/// comes 5 ms after it. B joins, says its words, and leaves; it must not stay in the session
/// while A goes on speaking for a minute, until the mixer's stream ends.
#[test]
fn a_bye_that_overtook_a_sources_only_packet_still_ends_it() {
    let (b, timeline) = b_after_an_early_bye((1005, 1990, b"Bye all. "), (20, 3000), 62_000);
    assert_eq!(
        b,
        [
            pair("session.join", ""),
            pair("context.add", "Bye all."),
            pair("session.leave", ""),
        ],
        "{timeline:#?}"
    );
}

/// B's BYE comes before any packet of B, and B's first packet is stamped well after the BYE
/// was sent (1,000 ms after it on the mixer's clock): said after it, so B is back, and stays.
/// The early BYE must not end it.
#[test]
fn a_sources_first_packet_said_after_its_early_bye_stays() {
    let (b, timeline) = b_after_an_early_bye((1005, 3000, b"Hello again. "), (5, 300), 20_000);
    assert_eq!(
        b,
        [
            pair("session.join", ""),
            pair("context.add", "Hello again.")
        ],
        "{timeline:#?}"
    );
}

/// B's BYE came before any packet of B, and B's first packet comes after the BYE's wait (the
/// reorder wait, 1 s here): nothing the BYE overtook can still come, so this is B's next
/// session, and B stays.
#[test]
fn a_sources_first_packet_after_its_early_byes_wait_stays() {
    let (b, timeline) = b_after_an_early_bye((2500, 1990, b"Late hello. "), (0, 0), 20_000);
    assert_eq!(
        b,
        [pair("session.join", ""), pair("context.add", "Late hello.")],
        "{timeline:#?}"
    );
}

/// B's leave waits, the mixer's own BYE comes, then a new session's packet: B leaves once and
/// first, and joins the new stream.
#[test]
fn a_sources_waiting_leave_then_the_mixers_bye_then_a_new_session() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    gw.handle_datagram(at(300), addr(5000), &mixers_own_bye());
    gw.handle_datagram(
        at(600),
        addr(5000),
        &with_csrc_m(true, 40_000, 77, 9, 2, b"New. "),
    );
    run_timers(&mut gw, 5000);
    gw.shutdown(at(6000));
    let out = drain(&mut gw);
    assert_ts_monotonic(&out);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo"),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "New."),
            pair("session.leave", ""),
        ],
        "{:#?}",
        timeline(&out)
    );
    assert_eq!(gw.stats().streams_live, 0);
    assert_eq!(gw.live_streams(), 0);
}

/// A stream opening without its head (HEAD_WAIT), and B's BYE while the head is awaited.
#[test]
fn a_sources_waiting_leave_while_the_streams_head_is_awaited() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(
        at(0),
        addr(5000),
        &with_csrc_m(false, 2, 1010, 9, 2, b"Bravo. "),
    );
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    gw.handle_datagram(at(200), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    let mut last = at(200);
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
        assert!(t >= last);
        last = t;
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    assert_ts_monotonic(&out);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", "")
        ],
        "{:#?}",
        timeline(&out)
    );
}

/// pvp-spec 9.1: context keys are unique in the session. A speaker that took a recycled place
/// keys its items from the millisecond it came (`key_since`), not the stream's start; the
/// gateway remembered only an ended stream's start (`ended`) to keep a restarted stream's keys
/// apart. A mixer's source recycled in at ms S, then the stream ends (BYE) and the mixer's
/// next session starts in the same millisecond (one receive batch): the new stream starts at
/// S, and the source's first item there repeats its key from the old stream.
#[test]
fn a_recycled_source_in_a_restarted_stream_does_not_repeat_its_context_key() {
    let mut gw = Gateway::new(Config {
        reorder_wait: std::time::Duration::ZERO,
        ..Config::default()
    });
    let mut seq = 0u16;
    for c in 1..=32u32 {
        seq += 1;
        let d = with_csrc(seq, u32::from(seq) * 100, 9, c, b"Hello. ");
        gw.handle_datagram(at(u64::from(c) * 10), addr(5000), &d);
    }
    // Source 0x21 takes source 1's place at t=1000.
    seq += 1;
    let d = with_csrc(seq, u32::from(seq) * 100, 9, 0x21, b"New here. ");
    gw.handle_datagram(at(1_000), addr(5000), &d);
    // The mixer's BYE (rtcp-mux) and its next session's first packet, in the same batch.
    gw.handle_datagram(at(1_000), addr(5000), &stream_bye(9));
    let d = with_csrc(1, 50_000, 9, 0x21, b"Again. ");
    gw.handle_datagram(at(1_000), addr(5000), &d);
    gw.shutdown(at(10_000));
    let out = drain(&mut gw);
    let who = "t140:00000009@127.0.0.1:5000/csrc:00000021";
    let keys: Vec<String> = out
        .iter()
        .filter(|e| e.kind == "context.add" && e.sender == who)
        .map(|e| e.payload["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_ne!(keys[0], keys[1], "the same context key twice: {keys:?}");
}

/// Eviction at the stream limit spares a stream holding part of a character (it may yet
/// speak), as it spares one holding a restart's run, and both go back in the eviction queue:
/// the partial character's was dropped from it for good, so once its character came to
/// nothing (a U+FFFD alone, which joins no one), a new caller at the limit was refused for a
/// stream that never joined and held nothing.
#[test]
fn a_stream_spared_for_a_partial_character_is_evictable_once_it_came_to_nothing() {
    // Without the scan (no eviction tried while the character was partial) the caller gets
    // stream 2's place: the control.
    for scan in [false, true] {
        let mut gw = Gateway::new(Config {
            max_streams: 2,
            idle_flush: std::time::Duration::from_millis(500),
            ..Config::default()
        });
        gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "Talker. "));
        // Stream 2: the first byte of a three-byte character.
        let mut d = Vec::new();
        pvp_t140::rtp::write_packet(&mut d, true, 98, 1, 0, 2, b"\xE2");
        gw.handle_datagram(at(0), addr(4002), &d);
        // A scan at the limit: stream 2 is spared (it may yet speak), the scan refused.
        if scan {
            gw.handle_datagram(at(100), addr(9999), &t140m(5, 99, true, ""));
            assert_eq!(gw.stats().evicted, 0);
        }
        // Stream 2's next packet is a BOM (a keep-alive): the character came to nothing.
        let mut d = Vec::new();
        pvp_t140::rtp::write_packet(&mut d, false, 98, 2, 300, 2, "\u{feff}".as_bytes());
        gw.handle_datagram(at(200), addr(4002), &d);
        run_timers(&mut gw, 1_500);
        // A real caller at the limit: stream 2 never joined and holds nothing now.
        gw.handle_datagram(at(2_000), addr(4004), &t140(1, 3, "Hello there. "));
        gw.shutdown(at(3_000));
        let out = drain(&mut gw);
        let said: Vec<String> = out
            .iter()
            .filter(|e| e.kind == "context.add")
            .map(|e| format!("{} {}", e.sender, e.payload["content"].as_str().unwrap()))
            .collect();
        assert!(
            said.contains(&"t140:00000003@127.0.0.1:4004 Hello there.".to_owned()),
            "scan {scan}: the new caller is refused for a stream that never joined: {said:?}; \
         evicted {}, refused at the limit {}",
            gw.stats().evicted,
            gw.stats().drops(pvp_t140::DropReason::StreamLimit)
        );
    }
}

/// README "Stream limit": a search for a stream to evict that found every candidate sparing
/// itself (it may yet speak) is not made again for 50 ms, so that a flood of new SSRCs at the
/// limit costs one walk of the streams in 50 ms rather than one a datagram (`cargo bench
/// --bench scale`, "limit"). A candidate that came to nothing meanwhile is evicted once the
/// pause is over.
#[test]
fn a_fruitless_search_for_room_pauses_for_50_ms() {
    let mut gw = Gateway::new(Config {
        max_streams: 2,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "Talker. "));
    // Stream 2: the first byte of a three-byte character.
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, true, 98, 1, 0, 2, b"\xE2");
    gw.handle_datagram(at(0), addr(4002), &d);
    let refused = |gw: &Gateway| gw.stats().drops(pvp_t140::DropReason::StreamLimit);
    // The search: stream 2 spared, the new stream refused.
    gw.handle_datagram(at(100), addr(9999), &t140m(5, 99, true, ""));
    assert_eq!((gw.stats().evicted, refused(&gw)), (0, 1));
    // Stream 2 comes to nothing (a BOM after the partial character).
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, false, 98, 2, 300, 2, "\u{feff}".as_bytes());
    gw.handle_datagram(at(110), addr(4002), &d);
    // Within the pause the next new stream is refused without a search...
    gw.handle_datagram(at(149), addr(9998), &t140m(5, 98, true, ""));
    assert_eq!((gw.stats().evicted, refused(&gw)), (0, 2));
    // ...and after it, stream 2 gives it its place.
    gw.handle_datagram(at(150), addr(9997), &t140m(5, 97, true, ""));
    assert_eq!((gw.stats().evicted, refused(&gw)), (1, 2));
}

/// README "Stream limit": a new stream at the limit takes the place of the oldest that never
/// carried text. A mixer's stream whose source B spoke ("Bravo.", joined, sent) and then left
/// after its BYE (RFC 3550 6.6) carried text, and is not evicted. When B speaks again (a
/// packet stamped after its BYE joins it again), the mixer's next packet carries B's last text
/// as RED redundancy (RFC 9071, per source, placed by timestamp), which the stream that kept it
/// knows was delivered. A review found a leave (`joined = false`) made the stream count as
/// never having carried text: it was evicted like a junk SSRC, the stream opened again took
/// the repeat for text it never had, and "Bravo." was said twice (review, session 33).
#[test]
fn a_mixer_stream_whose_source_spoke_and_left_is_not_evicted_as_if_it_never_carried_text() {
    let run = |evict: bool| {
        let mut gw = Gateway::new(Config {
            max_streams: 3,
            ..Config::default()
        });
        gw.handle_datagram(at(0), addr(5000), &red_csrc(1, 1000, 2, &[], b"Bravo. "));
        gw.handle_datagram(at(50), addr(5000), &mixer_bye(2));
        run_timers(&mut gw, 1100);
        let junk = if evict { 100..103 } else { 100..102 };
        for ssrc in junk {
            gw.handle_datagram(at(1200), addr(6000), &t140(1, ssrc, ""));
        }
        let evicted = gw.stats().evicted;
        gw.handle_datagram(
            at(1300),
            addr(5000),
            &red_csrc(2, 1300, 2, &[(300, b"Bravo. ")], b"Charlie. "),
        );
        run_timers(&mut gw, 5000);
        let out = drain(&mut gw);
        (evicted, text_of(&out, "csrc:00000002"))
    };
    assert_eq!(run(false), (0, "Bravo. Charlie.".to_owned()));
    let (evicted, text) = run(true);
    assert_eq!(
        text, "Bravo. Charlie.",
        "the mixer's stream was evicted ({evicted}) as if it never carried text"
    );
}

/// A BYE for an evicted stream forgets what the eviction kept for its return (README "Stream
/// limit": its SDES names are kept "unless a BYE came"), and for a mixer's stream that is its
/// sources' names too, kept under their CSRCs: they end with the mixer (README "RTCP"). The
/// mixer (SSRC 9) names its source CSRC 1 "Alice" in its SDES, is evicted silent, says BYE,
/// and in its next session (a random first sequence number, RFC 3550 5.1) the same source
/// speaks: it joins without the old session's name, as when the BYE finds the mixer's stream
/// live (the control). A review found only the BYE's own SSRC's names were forgotten, and the
/// source joined as "Alice" (review, session 33).
#[test]
fn a_bye_for_an_evicted_mixer_forgets_its_sources_names_too() {
    let run = |evict: bool| {
        let mut gw = Gateway::new(Config {
            max_streams: 3,
            ..Config::default()
        });
        // The mixer, its source CSRC 1 named in its SDES, nobody typing yet.
        gw.handle_datagram(
            at(0),
            addr(4000),
            &with_csrc_m(true, 1, 1000, 9, 1, "\u{feff}".as_bytes()),
        );
        let mut rr_sdes = Vec::new();
        pvp_t140::rtcp::write_rr(&mut rr_sdes, 9);
        pvp_t140::rtcp::write_sdes(&mut rr_sdes, 1, "user@host", Some("Alice"));
        gw.handle_datagram(at(10), addr(4001), &rr_sdes);
        let junk = if evict { 100..103 } else { 100..102 };
        for ssrc in junk {
            gw.handle_datagram(at(100), addr(5000), &t140(1, ssrc, ""));
        }
        assert_eq!(gw.stats().evicted, u64::from(evict));
        gw.handle_datagram(at(200), addr(4001), &stream_bye(9));
        gw.handle_datagram(
            at(1500),
            addr(4000),
            &with_csrc_m(true, 40_000, 90_000, 9, 1, b"Hello. "),
        );
        run_timers(&mut gw, 10_000);
        drain(&mut gw)
            .iter()
            .filter(|e| e.kind == "session.join")
            .map(|e| {
                let name = e.payload["participant"]["name"].as_str().unwrap_or("");
                (e.sender.clone(), name.to_owned())
            })
            .collect::<Vec<_>>()
    };
    let live = run(false);
    assert_eq!(
        live,
        vec![(
            "t140:00000009@127.0.0.1:4000/csrc:00000001".to_owned(),
            "T.140 00000001 via T.140 00000009 (127.0.0.1:4000)".to_owned()
        )],
        "control: the BYE found the mixer's stream live"
    );
    assert_eq!(
        run(true),
        live,
        "the mixer's stream was evicted before its BYE: its next session's source took the old \
         session's SDES name"
    );
}

/// A mixer's stream at its 32 speakers: a new voice takes the place of the longest silent
/// speaker, which leaves. A late duplicate of a packet already delivered (dropped as stale,
/// RFC 3550 A.1) from a source that has since left to make room is no voice: it says nothing.
/// The place was made before the register refused the packet: a quiet speaker left the
/// session for a packet then dropped. A place is made only for a packet not behind the stream.
#[test]
fn a_stale_duplicate_of_a_recycled_source_makes_no_one_leave() {
    let mut gw = Gateway::new(Config::default());
    let mixer = |seq: u16, csrc: u32, text: &str| {
        with_csrc(seq, u32::from(seq) * 100, 9, csrc, text.as_bytes())
    };
    for c in 1..=32u32 {
        gw.handle_datagram(
            at(u64::from(c) * 10),
            addr(5000),
            &mixer(c as u16, c, "Hello. "),
        );
    }
    // Source 33: source 1, the longest silent, leaves to make room.
    gw.handle_datagram(at(1_000), addr(5000), &mixer(33, 33, "New here. "));
    // A duplicate of source 1's packet 1, late: stale.
    gw.handle_datagram(at(1_100), addr(5000), &mixer(1, 1, "Hello. "));
    assert_eq!(gw.stats().drops(pvp_t140::DropReason::Stale), 1);
    let out = drain(&mut gw);
    let left: Vec<String> = out
        .iter()
        .filter(|e| e.kind == "session.leave")
        .map(|e| e.sender.rsplit('/').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        left,
        ["csrc:00000001"],
        "only source 1 left (for 33); recycled: {}",
        gw.stats().speakers_recycled
    );
}
