//! Review e: a mixer's source's packets stamped alike (RFC 3550 5.1), as commit 058148c places
//! them (`speaker::place_by_ts`, `place_by_offset`, `place_by_content`): each packet is fed to
//! the sans-IO core as the mixer sends it, time passed in as a value.

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// Every `context.add`'s content, concatenated.
fn text(out: &[Envelope]) -> String {
    (out.iter().filter(|e| e.kind == "context.add"))
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Feeds `(seq, datagram)` pairs, each at 300 ms times its sequence number, then ends.
fn run(packets: &[(u64, Vec<u8>)]) -> (String, Gateway) {
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
    let (said, gw) = run(&packets);
    let s = gw.stats();
    assert_eq!((said.as_str(), s.recovered, s.lost), ("abac", 1, 0));
}
