//! A sender restart (RFC 3550 8.2, A.1) in the sans-IO core, with the time passed in: a
//! restart's run waits the reorder wait for its head as a new stream's first packet does, a
//! restart landing 100-3000 ahead on another clock is a jump and not thousands of lost
//! packets, and a run confirmed late, or held behind a gap, is dated from its confirmation.
//!
//! Found by review bc (session 47): time inside the core (reorder and loss waits, idle
//! flushes, stream expiry, wraps, restarts, late timers).

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, DropReason, Gateway, Time, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// A plain T.140 packet (payload type 98) of SSRC 7, with the sequence number, timestamp and
/// marker given.
fn plain(seq: u16, ts: u32, marker: bool, text: &str) -> Vec<u8> {
    let mut d = Vec::new();
    rtp::write_packet(&mut d, marker, 98, seq, ts, 7, text.as_bytes());
    d
}

/// The text of every `context.add`, in order.
fn said(out: &[Envelope]) -> Vec<String> {
    (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| e.payload["content"].as_str().unwrap().to_owned())
        .collect()
}

/// Handles every timer due by `now`, each at its own deadline (as replay does).
fn run_timers(gw: &mut Gateway, now: Time) {
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= now) {
        gw.handle_timeout(t);
    }
}

/// Found by review bc (session 47). A sender restart (RFC 3550 A.1: a jump beyond 3000) on a
/// new clock (RFC 3550 5.1) was delivered as soon as two packets in sequence confirmed it,
/// its first as a stream's head that does not start a session: a U+FFFD for a "lost" head,
/// though the restart's real first packet (marked, RFC 4103 5.2) was only overtaken by the
/// next two, by 20 ms. Come within the reorder wait (RFC 4103 5.4), it was then behind the
/// stream and dropped as stale: its text lost, and a loss marked that never happened. A stream
/// whose first packet does not start a session waits for its head; a restart's run now does
/// too, and its head coming late goes out first.
#[test]
fn a_restarts_first_packet_overtaken_by_the_next_two_is_said_not_marked_lost() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &plain(10, 1000, true, "Hi. "));
    // 2^24 ticks on: a new session's clock.
    let ts = 1000 + (1 << 24);
    gw.handle_datagram(
        at(5000),
        addr(4000),
        &plain(40_001, ts + 300, false, "world"),
    );
    gw.handle_datagram(at(5010), addr(4000), &plain(40_002, ts + 600, false, ". "));
    gw.handle_datagram(at(5020), addr(4000), &plain(40_000, ts, true, "Hello "));
    run_timers(&mut gw, at(20_000));
    gw.shutdown(at(20_000));
    let out = drain(&mut gw);
    assert_eq!(said(&out), ["Hi.", "Hello world."]);
    let stats = gw.stats();
    assert_eq!(stats.restarts, 1);
    assert_eq!((stats.lost, stats.head_lost), (0, 0), "{stats:?}");
    assert_eq!(stats.drops(DropReason::Stale), 0);
}

/// Found by review bc (session 47). With the restart's head waited for (above), one that never
/// comes is marked lost as before, at the end of the reorder wait from the packet that
/// confirmed the run, not later, and the run's text goes out then.
#[test]
fn a_restarts_head_that_never_comes_is_marked_at_the_end_of_the_wait() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &plain(10, 1000, true, "Hi. "));
    let ts = 1000 + (1 << 24);
    gw.handle_datagram(
        at(5000),
        addr(4000),
        &plain(40_001, ts + 300, false, "world"),
    );
    gw.handle_datagram(at(5010), addr(4000), &plain(40_002, ts + 600, false, ". "));
    assert_eq!(
        gw.poll_timeout(),
        Some(at(6010)),
        "the reorder wait from 5,010"
    );
    run_timers(&mut gw, at(6010));
    let out = drain(&mut gw);
    let adds: Vec<(String, String)> = (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| {
            (
                e.payload["content"].as_str().unwrap().to_owned(),
                e.ts.clone(),
            )
        })
        .collect();
    assert_eq!(
        adds,
        [
            ("Hi.".to_owned(), at(0).to_iso8601()),
            ("\u{fffd}world.".to_owned(), at(6010).to_iso8601())
        ]
    );
    assert_eq!(gw.stats().head_lost, 1);
}

/// Found by review bc (session 47). A sender restart whose new random sequence number (RFC
/// 3550 5.1) lands less than 3000 ahead of the old one (one restart in 22) is no jump by RFC
/// 3550 A.1's MAX_DROPOUT: it was taken for a gap of 2,882 lost packets, and the stream wrote
/// 2,882 U+FFFD, one per "lost" packet, though nothing was lost. Its new random timestamp says
/// what it is: stamped behind the last packet delivered, or more than 2^23 past it, the packet
/// is on another clock. Such a packet 100 (A.1's MAX_MISORDER) or more ahead is kept as a
/// jump and believed as a restart when the next follows it, as a restart further off is.
#[test]
fn a_restart_landing_less_than_3000_ahead_on_another_clock_is_no_gap_of_lost_packets() {
    for new_ts in [500u32, 1000 + (1 << 24)] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(at(0), addr(4000), &plain(10, 1000, true, "Hi. "));
        gw.handle_datagram(at(300), addr(4000), &plain(11, 1300, false, ""));
        let seq = 11 + 2883;
        gw.handle_datagram(at(2000), addr(4000), &plain(seq, new_ts, true, "Hello "));
        gw.handle_datagram(
            at(2300),
            addr(4000),
            &plain(seq + 1, new_ts + 300, false, "world. "),
        );
        run_timers(&mut gw, at(20_000));
        gw.shutdown(at(20_000));
        let out = drain(&mut gw);
        assert_eq!(said(&out), ["Hi.", "Hello world."], "stamped {new_ts}");
        let stats = gw.stats();
        assert_eq!((stats.lost, stats.restarts), (0, 1), "stamped {new_ts}");
    }
}

/// Found by review bc (session 47), the other side of the test above: a real gap of 100 or
/// more packets on the stream's own clock (stamped after the last packet delivered) is still
/// loss, marked once per packet (RFC 4103 5.3), after the reorder wait.
#[test]
fn a_wide_gap_on_the_streams_own_clock_is_still_marked_lost() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &plain(10, 1000, true, "Hi "));
    gw.handle_datagram(
        at(40_000),
        addr(4000),
        &plain(10 + 151, 41_000, false, "again. "),
    );
    run_timers(&mut gw, at(60_000));
    gw.shutdown(at(60_000));
    let out = drain(&mut gw);
    assert_eq!(
        said(&out),
        ["Hi".to_owned(), format!("{}again.", "\u{fffd}".repeat(150))]
    );
    assert_eq!((gw.stats().lost, gw.stats().restarts), (150, 0));
}

/// Found by review bc (session 47), in the fix above: a run confirmed more than the reorder
/// wait after its first packet came (a restart's packets seconds apart) waited from that
/// packet, so its wait was over at once and its text, the confirming packet's too, went out as
/// of the wait's end: dated before the packet that carried it came. The run waits from its
/// confirmation.
#[test]
fn a_restart_confirmed_late_is_not_said_before_its_packets_came() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &plain(10, 1000, true, "Hi. "));
    let ts = 1000 + (1 << 24);
    gw.handle_datagram(
        at(5000),
        addr(4000),
        &plain(40_001, ts + 300, false, "world"),
    );
    gw.handle_datagram(at(9000), addr(4000), &plain(40_002, ts + 4300, false, ". "));
    run_timers(&mut gw, at(20_000));
    let out = drain(&mut gw);
    let adds: Vec<(String, String)> = (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| {
            (
                e.payload["content"].as_str().unwrap().to_owned(),
                e.ts.clone(),
            )
        })
        .collect();
    assert_eq!(
        adds,
        [
            ("Hi.".to_owned(), at(0).to_iso8601()),
            ("\u{fffd}world.".to_owned(), at(10_000).to_iso8601())
        ]
    );
}

/// Found by review bc (session 47), as the test above, for a run whose head starts a session
/// (marked, RFC 4103 5.2) and goes out at once: packets of the run behind a gap were held for
/// the reorder wait from when each was kept, so a run confirmed later than that gave the gap
/// up as of the wait's end, its text, the confirming packet's too, dated before that packet
/// came. They wait from the confirmation.
#[test]
fn a_restarts_packets_held_behind_a_gap_are_not_said_before_they_came() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &plain(10, 1000, true, "Hi. "));
    let ts = 1000 + (1 << 24);
    gw.handle_datagram(at(5000), addr(4000), &plain(40_000, ts, true, "Hello "));
    // 40,001 lost.
    gw.handle_datagram(
        at(5100),
        addr(4000),
        &plain(40_002, ts + 600, false, "world"),
    );
    gw.handle_datagram(at(9000), addr(4000), &plain(40_003, ts + 4600, false, ". "));
    run_timers(&mut gw, at(20_000));
    let out = drain(&mut gw);
    let adds: Vec<(String, String)> = (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| {
            (
                e.payload["content"].as_str().unwrap().to_owned(),
                e.ts.clone(),
            )
        })
        .collect();
    assert_eq!(
        adds,
        [
            ("Hi.".to_owned(), at(0).to_iso8601()),
            ("Hello \u{fffd}world.".to_owned(), at(10_000).to_iso8601())
        ]
    );
}
