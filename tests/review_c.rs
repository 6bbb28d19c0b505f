//! Review c: the text path after RTP/RED (T.140 decoding and chunking), through the sans-IO
//! core.

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// The content of every `context.add`.
fn added(out: &[Envelope]) -> Vec<String> {
    (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// A sender's session ends inside a control string (its last packet, with the ST and the
/// text after it, lost: nothing after it tells the gap), and the sender restarts on the same
/// SSRC with a new session (RFC 3550 A.1 restart, marked and opening with the BOM: RFC 4103
/// 5.2). The new session's text is no part of the old session's string: it was swallowed
/// whole (an OSC string takes up to 256 characters), or its first letter taken for a
/// sequence's final byte ("ello world."). The cut sequence is counted as skipped.
#[test]
fn a_new_session_after_a_restart_is_not_read_as_the_old_sessions_control_string() {
    for (cut, first) in [("\x1b]0;", "Hello"), ("\x1b[1", "Hello"), ("\x1b", "Hello")] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(at(0), addr(4000), &t140(1, 7, &format!("Hi there. {cut}")));
        // Packet 2 lost; the sender restarts 5 s later on a new sequence and clock.
        let restart = |seq: u16, marker: bool, text: &str| t140m(seq, 7, marker, text);
        gw.handle_datagram(
            at(5_000),
            addr(4000),
            &restart(30_000, true, "\u{feff}Hello world. "),
        );
        gw.handle_datagram(at(5_300), addr(4000), &restart(30_001, false, "Again. "));
        gw.shutdown(at(10_000));
        assert_eq!(gw.stats().decode.sequences_skipped, 1, "after {cut:?}");
        let said = added(&drain(&mut gw));
        assert!(
            said.iter()
                .any(|c| c.starts_with(first) && c.contains("world.")),
            "after {cut:?}: {said:?}"
        );
        assert!(
            said.iter().any(|c| c.contains("Again.")),
            "after {cut:?}: {said:?}"
        );
    }
}
