//! Late duplicates far behind (a path that duplicates and delays) against a sequence restart
//! (RFC 3550 A.1), through the core: a review of 3c14c81, which first told them apart.

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, DropReason, Gateway, Stats, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// Every word of every `context.add`.
fn words(out: &[Envelope]) -> Vec<String> {
    (out.iter().filter(|e| e.kind == "context.add"))
        .flat_map(|e| {
            e.payload["content"]
                .as_str()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Unpaced t140llm (a packet per chunk, 30 ms apart) sends 150 packets, is quiet 20 s, then
/// its next reply restarts on the same source and SSRC at sequence 0, timestamp 0
/// (docs/t140llm.md): an RFC 3550 A.1 restart. Its timestamps count packets (+160), not time;
/// read as a 1000 Hz clock, each run of three looked like late duplicates and was dropped,
/// then the rest was stale: the reply's 200 packets vanished unmarked. With `--compat t140llm`
/// timestamps are not taken for a clock.
#[test]
fn a_t140llm_restart_is_not_taken_for_late_duplicates() {
    let mut gw = Gateway::new(Config {
        compat: pvp_t140::Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    });
    let mut t = 0u64;
    let mut send = |t: u64, seq: u16, text: String| {
        let mut d = Vec::new();
        let ts = u32::from(seq) * 160;
        rtp::write_packet(&mut d, false, 96, seq, ts, 0x1122_3344, text.as_bytes());
        gw.handle_datagram(at(t), addr(6000), &d);
    };
    for seq in 0..150u16 {
        send(t, seq, format!("a{seq}. "));
        t += 30;
    }
    t += 20_000;
    for seq in 0..200u16 {
        send(t, seq, format!("b{seq}. "));
        t += 30;
    }
    gw.shutdown(at(t + 5_000));
    let said = words(&drain(&mut gw));
    let missing: Vec<u16> = (0..200u16)
        .filter(|k| !said.contains(&format!("b{k}.")))
        .collect();
    let s = (gw.stats().restarts, gw.stats().lost);
    let range = missing.first().zip(missing.last());
    assert!(
        missing.is_empty(),
        "{range:?} missing; (restarts, lost) {s:?}"
    );
}

/// A plain stream 1..120 paced 300 ms, then late duplicates of 5, 6, 7 together: kept as
/// perhaps late duplicates, never believed (nothing follows them at a sender's pace), not
/// said again, and each counted as a drop when let go (README: duplicates and late packets
/// are counted drops).
#[test]
fn late_duplicates_dropped_as_a_run_are_each_counted() {
    let mut gw = Gateway::new(Config::default());
    for seq in 1..=120u16 {
        let t = at(300 * u64::from(seq));
        gw.handle_datagram(t, addr(4000), &t140(seq, 7, &format!("w{seq}. ")));
    }
    drain(&mut gw);
    let counted = |s: &Stats| s.drops(DropReason::Stale) + s.drops(DropReason::SequenceJump);
    let before = counted(&gw.stats());
    for seq in 5..=7u16 {
        gw.handle_datagram(at(70_000), addr(4000), &t140(seq, 7, &format!("w{seq}. ")));
    }
    gw.handle_datagram(at(70_300), addr(4000), &t140(121, 7, "w121. "));
    gw.shutdown(at(80_000));
    assert_eq!(words(&drain(&mut gw)), ["w121."], "not said again");
    let s = gw.stats();
    assert_eq!(
        counted(&s) - before,
        3,
        "stale_or_duplicate {}, sequence_jump {}",
        s.drops(DropReason::Stale),
        s.drops(DropReason::SequenceJump)
    );
}
