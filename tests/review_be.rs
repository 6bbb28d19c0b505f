//! Found by review be (session 47): interoperation with the real external sender t140llm
//! 0.0.19 (`--compat t140llm`), driven through its public API against the gateway binary, and
//! the exact bytes it sends driven through the core.

use pvp_t140::{Compat, Config, DropReason, Gateway, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::{addr, at, drain, shown};

fn t140llm_cfg() -> Config {
    Config {
        compat: Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    }
}

/// t140llm's packet `seq` of a reply with SSRC `ssrc` (docs/t140llm.md section 3: numbered
/// and stamped from 0, 160 a packet, never marked): plain PT 96 with no generations, else RED
/// PT 98 with them newest first (section 5).
fn t140llm_packet(ssrc: u32, seq: u16, gens_newest_first: &[&str], text: &str) -> Vec<u8> {
    let ts = u32::from(seq) * 160;
    let mut d = Vec::new();
    if gens_newest_first.is_empty() {
        rtp::write_packet(&mut d, false, 96, seq, ts, ssrc, text.as_bytes());
        return d;
    }
    let p = core_helpers::t140llm_red_payload(gens_newest_first, text);
    rtp::write_packet(&mut d, false, 98, seq, ts, ssrc, &p);
    d
}

/// Found by review be (session 47). A sender configured with a fixed `ssrc` sends each reply
/// from a new UDP socket (docs/t140llm.md deviation 20); the gateway takes a reply's start
/// from a new port of the same host as the next reply, ending the last one's stream. It knew
/// that start only as packet 0 (sequence 0, timestamp 0): when packet 0 was lost, the next
/// RED packet, which carries it as redundancy, and every later one of the reply were refused
/// as `ssrc_conflict` until the last reply's stream timed out (60 s), so the whole reply was
/// lost though its redundancy held its head. On the same port such a packet already starts a
/// reply (tests/t140llm_reply_heads.rs).
#[test]
fn a_fixed_ssrc_reply_from_a_new_port_whose_packet_0_was_lost_is_heard() {
    let mut gw = Gateway::new(t140llm_cfg());
    let ssrc = 0x1122_3344;
    for (i, p) in [
        t140llm_packet(ssrc, 0, &[], "Fir"),
        t140llm_packet(ssrc, 1, &["Fir"], "st."),
    ]
    .iter()
    .enumerate()
    {
        gw.handle_datagram(at(100 * i as u64), addr(6000), p);
    }
    // The next reply, from the new socket, 1.5 s on; its packet 0 ("Sec") lost.
    for (i, p) in [
        t140llm_packet(ssrc, 1, &["Sec"], "ond"),
        t140llm_packet(ssrc, 2, &["ond", "Sec"], " one."),
    ]
    .iter()
    .enumerate()
    {
        gw.handle_datagram(at(1600 + 100 * i as u64), addr(6001), p);
    }
    gw.shutdown(at(6000));
    assert_eq!(shown(&drain(&mut gw)), ["First.", "Second one."]);
    assert_eq!(gw.stats().drops(DropReason::SsrcConflict), 0);
}
