//! Found by review w: a second look at the register's sequence-restart rules (src/register.rs
//! `Register::jump`), driven through the public API with time passed as a value.

use pvp_t140::register::Outcome;

#[path = "common/register_rig.rs"]
mod register_rig;
use register_rig::Rig;

/// The kept jump packets are "in arrival order" ([`Register`]'s `run`), and a run completed
/// out of order with the kept full is believed only when its last-come packet is later than
/// the first kept. Letting a stray go by `swap_remove` moved the newest kept to the front:
/// a stray (far off) kept, then a restart 200 back arriving n0 n4 n3 n2 n1 n5: n2 let the
/// stray go and put n3 first, so n1 (before n3) confirmed nothing, and the run's packets were
/// let go one by one, its marked first packet n0 among them. Stamped behind, the rest was then taken for late
/// copies and dropped (nothing of the new session said); stamped ahead, n0's text was lost
/// without a mark.
#[test]
fn a_stray_let_go_keeps_the_kept_in_arrival_order() {
    for ts_new in [20u32, 500_000] {
        let mut r = Rig::new();
        r.old_ten();
        assert_eq!(r.raw(3_400, 30_000, 77, false, false, b"X"), Outcome::Jump);
        let base = 1011u16 - 200;
        r.restart_from(3_500, base, ts_new, &[0, 4, 3, 2, 1, 5], true);
        r.expire(100_000);
        let old = Rig::OLD_TEN;
        assert_eq!(
            r.text,
            format!("{old}|\u{feff}n0.n1.n2.n3.n4.n5."),
            "stamped from {ts_new}"
        );
        let s = r.reg.stats();
        assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 1, 0, 0));
    }
}

/// A restart 200 back (three in a row believe it) stamped behind the old clock (a new random
/// clock, RFC 3550 5.1), plain T.140, its third packet lost: n0 (marked, BOM), n1, n3, n4, n5.
/// n0 is kept before the run n3..=n5 and taken as the restart's (it starts a session); n1,
/// between n0 and the run and stamped between them, was let go as a stray (neither marked nor
/// stamped after the old sequence's last), and its text, received, marked lost with n2's.
#[test]
fn a_packet_between_a_restarts_kept_start_and_its_run_is_the_restarts() {
    let mut r = Rig::new();
    r.old_ten();
    let base = 1011u16 - 200;
    r.restart_from(3_500, base, 20, &[0, 1, 3, 4, 5], true);
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(r.text, format!("{old}|\u{feff}n0.n1.~n3.n4.n5."));
    let s = r.reg.stats();
    assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 1));
}

/// A restart 200 back stamped behind whose marked first packet overtook the old sequence's
/// last packet (sent before the restart, delayed): n0, then the old 1011, then n1 n2 n3. The
/// old sequence "went on" since n0 was kept, so n0 was let go as a stray, and n1..=n3,
/// unmarked and stamped behind, were taken for late copies: nothing of the new session said
/// (until its next marked packet). Stamped ahead, n0's text is lost without a mark. (With RED,
/// n1's redundancy carries n0.) The rule guards against late duplicates interleaved with live
/// packets (RFC 3550 A.1's three in a row); a live packet and one sent before the restart but
/// delayed look alike, so exempting a kept session start would widen the known gap of late
/// duplicates that include a marked packet.
#[test]
#[ignore = "known gap: a restart's first packet that overtakes the old sequence's last packets is let go as a stray"]
fn a_restarts_first_packet_that_overtook_the_old_sequences_last_is_kept() {
    let mut r = Rig::new();
    r.old_ten();
    let base = 1011u16 - 200;
    r.restart_from(3_500, base, 20, &[0], true);
    assert_eq!(
        r.raw(3_600, 1011, 3_300, false, false, b"o11."),
        Outcome::Delivered
    );
    r.restart_from(3_800, base, 20, &[1, 2, 3, 4], true);
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(r.text, format!("{old}o11.|\u{feff}n0.n1.n2.n3.n4."));
}

/// The same source restarting twice within the reorder wait, the old sequence holding a gap
/// when the first restart comes: far ahead (two in a row), then a short way back from the
/// first restart (three in a row): each run said once, in order, the gap marked once.
#[test]
fn two_restarts_within_the_reorder_wait_each_say_their_text_once() {
    let mut r = Rig::new();
    r.old_ten();
    // 1011 lost, 1012 held.
    assert_eq!(
        r.raw(3_300, 1012, 3_600, false, false, b"o12."),
        Outcome::Held
    );
    for (k, t) in ["\u{feff}a0.", "a1.", "a2."].into_iter().enumerate() {
        let at = 3_400 + k as u64 * 50;
        r.raw(
            at,
            40_000 + k as u16,
            90_000 + k as u32 * 50,
            k == 0,
            false,
            t.as_bytes(),
        );
    }
    for (k, t) in ["\u{feff}b0.", "b1.", "b2.", "b3."].into_iter().enumerate() {
        let at = 3_600 + k as u64 * 50;
        r.raw(
            at,
            39_500 + k as u16,
            7 + k as u32 * 50,
            k == 0,
            false,
            t.as_bytes(),
        );
    }
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(
        r.text,
        format!("{old}~o12.|\u{feff}a0.a1.a2.|\u{feff}b0.b1.b2.b3.")
    );
    let s = r.reg.stats();
    assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (2, 0, 0, 1));
}

/// A restart far off (two in a row) whose run spans the 16-bit sequence wrap and whose clock
/// is across the 32-bit timestamp wrap from the old one (stamped behind it, by less than
/// 2^31): n0 at 65534 kept before the run (its session start, n1 lost), n5 kept ahead of it,
/// the run n2 (at 0), n3; then n4, n6. n0 and n5 are the restart's; the gap waits and is
/// marked once.
#[test]
fn a_restart_across_both_wraps_keeps_its_start_and_the_packet_ahead() {
    let mut r = Rig::new();
    for s in 1..=10u16 {
        let t = format!("o{s}.");
        let at = u64::from(s) * 300;
        r.raw(
            at,
            20_000 + s,
            u32::from(s) * 300,
            s == 1,
            false,
            t.as_bytes(),
        );
    }
    let ts = 3_000u32.wrapping_sub(1_000_000);
    r.restart_from(3_500, 65_534, ts, &[0, 5, 2, 3, 4, 6], true);
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(r.text, format!("{old}|\u{feff}n0.~n2.n3.n4.n5.n6."));
    let s = r.reg.stats();
    assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 1));
}

/// A restart a short way back (three in a row; here 1013 back, across the 16-bit wrap)
/// stamped behind, plain T.140, its second packet lost and its sixth come early: n0 (marked,
/// BOM), n5, n2, n3, n4, n6. With four kept (n0, n5, n2, n3), n4 did not confirm (the run's
/// newest, n5, came before it), and the farthest from it, n0, the session start, was let go
/// as a stray; n6 then confirmed a run with nothing starting a session, stamped behind: taken
/// for late copies and dropped, nothing of the new session said.
#[test]
fn a_kept_session_start_is_not_let_go_for_a_later_packet_of_its_restart() {
    let mut r = Rig::new();
    r.old_ten();
    let ts = 3_000u32.wrapping_sub(1_000_000);
    r.restart_from(3_500, 65_534, ts, &[0, 5, 2, 3, 4, 6], true);
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(r.text, format!("{old}|\u{feff}n0.~n2.n3.n4.n5.n6."));
    let s = r.reg.stats();
    assert_eq!((s.restarts, s.jumps, s.stale, s.lost), (1, 0, 0, 1));
}

/// A restart's kept packets larger than a spare buffer (2 KiB) are said whole: the copy grows
/// past it (and is freed after, not kept as a spare).
#[test]
fn a_restarts_kept_packets_over_2_kib_are_said_whole() {
    let mut r = Rig::new();
    r.old_ten();
    let big: Vec<String> = (0..3).map(|i| format!("{i}").repeat(5_000)).collect();
    let base = 1011u16 - 500;
    for (i, t) in big.iter().enumerate() {
        let seq = base + i as u16;
        let out = r.raw(
            4_000 + i as u64,
            seq,
            9 + i as u32,
            i == 0,
            false,
            t.as_bytes(),
        );
        assert_eq!(out, [Outcome::Jump, Outcome::Jump, Outcome::Delivered][i]);
    }
    assert_eq!(r.text, format!("{}|{}", Rig::OLD_TEN, big.concat()));
}

/// RED restarts (RFC 2198, RFC 4103 4.2) a short way back: one on a clock behind whose marked
/// first packet is lost (its next's redundancy carries it and its BOM: a session start, not
/// late copies), and one renumbered on the old clock going on (a relay), unmarked, whose
/// first packet's generations repeat text already said: said once.
#[test]
fn red_restarts_say_their_first_packets_once() {
    // Behind, n0 lost: n1 carries it.
    let mut r = Rig::new();
    r.old_ten();
    let base = 1011u16 - 300;
    r.red_at(4_000, base + 1, 20, false, &["", "\u{feff}n0."], "n1.");
    r.red_at(4_300, base + 2, 320, false, &["\u{feff}n0.", "n1."], "n2.");
    r.red_at(4_600, base + 3, 620, false, &["n1.", "n2."], "n3.");
    assert_eq!(r.text, format!("{}|\u{feff}n0.n1.n2.n3.", Rig::OLD_TEN));
    assert_eq!(r.reg.stats().restarts, 1);

    // A relay renumbering, the old clock going on: the first packet's generations are o9, o10.
    let mut r = Rig::new();
    r.old_ten();
    let base = 1011u16 - 300;
    r.red_at(3_300, base, 3_300, false, &["o9.", "o10."], "p1.");
    r.red_at(3_600, base + 1, 3_600, false, &["o10.", "p1."], "p2.");
    r.red_at(3_900, base + 2, 3_900, false, &["p1.", "p2."], "p3.");
    // Its head starts no session: the run waits for packets that may have overtaken it.
    r.expire(10_000);
    assert_eq!(r.text, format!("{}p1.p2.p3.", Rig::OLD_TEN));
    let s = r.reg.stats();
    assert_eq!((s.restarts, s.lost, s.stale), (1, 0, 0));
}

/// Known gap: a restart confirmed while the old sequence waits for a gap gives the gap up at
/// once, so the old sequence's late packet, come within the reorder wait but after the
/// restart's second packet, is marked lost (and then kept as a jump, let go as a stray):
/// 1011 lost for a moment, 1012 held, the restart far off n0 n1, then 1011.
#[test]
#[ignore = "known gap: a restart cuts the old sequence's reorder wait short; its late packet is marked lost"]
fn an_old_gap_filled_within_the_wait_after_a_restart_is_not_marked_lost() {
    let mut r = Rig::new();
    r.old_ten();
    assert_eq!(
        r.raw(3_300, 1012, 3_600, false, false, b"o12."),
        Outcome::Held
    );
    r.raw(3_400, 40_000, 9, true, false, "\u{feff}n0.".as_bytes());
    r.raw(3_500, 40_001, 309, false, false, b"n1.");
    r.raw(3_600, 1011, 3_300, false, false, b"o11.");
    r.expire(100_000);
    let old = Rig::OLD_TEN;
    assert_eq!(r.text, format!("{old}o11.o12.|\u{feff}n0.n1."));
}
