//! Sequence restarts (RFC 3550 A.1) through the core, where a rule telling late duplicates
//! from restarts went wrong (this session's reviews; see `tests/mixer_clock.rs`).

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway, rtp};

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
/// (docs/t140llm.md): an RFC 3550 A.1 restart, with the same headers as late duplicates of its
/// first reply's first packets. Its timestamps count packets (+160), not time. A rule that read
/// them as a 1000 Hz clock dropped each run of three as late duplicates, then the rest as
/// stale: the reply's 200 packets vanished unmarked. Every word must arrive.
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
