//! Review aw (session 46): resource bounds under hostile or heavy input.

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;
#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

use pvp_t140::{Config, Gateway};

/// Found by review aw (session 46). A stream's participants can be 33 at once, not 32: a
/// mixer's 32 sources (RFC 9071 CSRCs, `MAX_SPEAKERS`) and the mixer's own voice, which its
/// CSRC-less packets speak with and which is made past the speaker bound
/// (`stream::new_speaker`). Each is a WebSocket connection of its own, but the open-file
/// limit was raised for 32 a stream (`fdlimit::participants_of`): under `--max-streams N`
/// with every stream such a mixer, N participants found no descriptor, and retried and
/// dropped their transcripts.
#[test]
fn the_open_file_limit_covers_every_participant_a_stream_can_have_at_once() {
    let mut gw = Gateway::new(Config::default());
    let mut seq = 0u16;
    for csrc in 1..=32u32 {
        seq += 1;
        let ts = u32::from(seq) * 300;
        gw.handle_datagram(
            at(u64::from(seq) * 10),
            addr(5000),
            &with_csrc(seq, ts, MIXER, csrc, b"Hi. "),
        );
    }
    seq += 1;
    let mut own = Vec::new();
    pvp_t140::rtp::write_packet(
        &mut own,
        false,
        98,
        seq,
        u32::from(seq) * 300,
        MIXER,
        b"Me too. ",
    );
    gw.handle_datagram(at(u64::from(seq) * 10), addr(5000), &own);
    let out = drain(&mut gw);
    let joined: std::collections::HashSet<&str> = out
        .iter()
        .filter(|e| e.kind == "session.join")
        .map(|e| e.sender.as_str())
        .collect();
    let left = out.iter().filter(|e| e.kind == "session.leave").count();
    assert_eq!((joined.len(), left), (33, 0), "joined at once: {joined:?}");
    assert!(
        pvp_t140::fdlimit::participants_of(1) >= joined.len() as u64,
        "one stream's participants: {} joined at once, the limit raised for {}",
        joined.len(),
        pvp_t140::fdlimit::participants_of(1)
    );
}
