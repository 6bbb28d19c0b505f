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

/// A mixer that sends a source's packet again under a new sequence number, after a second
/// packet stamped alike: the repeat's primary ("a") is not the last delivered primary ("b"),
/// so it is said again, though its redundancy shows it comes before "b" (its generations do
/// not end with "a", "b" as a packet after "b" must, RFC 4103 4.2). The next packet then
/// takes "b" for new again (it follows "a", now the last primary): "ababc".
#[test]
#[ignore = "known gap: a repeat of any but the last packet stamped alike is said again; \
            telling it needs the primary's RED lineup against `Recent` (a design decision, \
            since only repeats under new sequence numbers, which RFC 3550 senders do not \
            make, are affected)"]
fn a_repeat_of_the_packet_before_the_last_stamped_alike_is_not_said_again() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        (2, red_csrc(2, 1000, 1, &[(300, b""), (0, b"a")], b"b")),
        (3, red_csrc(3, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        (4, red_csrc(4, 1300, 1, &[(300, b"a"), (300, b"b")], b"c")),
    ];
    let (said, _) = run(&packets);
    assert_eq!(said, "abc");
}

/// Two packets stamped like the last delivered one ("a" at 1000) are lost; the next packet
/// carries both (RFC 4103 4.2: its generations are the source's packets just before it, so
/// "a" would be among them were either of them "a"'s packet). Neither is taken: "b" and "c"
/// were dropped, no U+FFFD marked them on this speaker, and the two losses were left
/// unplaced, then let go as an idle tail (`idle_tail` 2, `lost` 0). Both are recovered.
#[test]
fn two_lost_packets_stamped_like_the_last_delivered_are_recovered() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"a")),
        // 2: [(300, ""), (0, "a")] "b" and 3: [(0, "a"), (0, "b")] "c", both stamped 1000, lost.
        (4, red_csrc(4, 1300, 1, &[(300, b"b"), (300, b"c")], b"d")),
    ];
    let (said, gw) = run(&packets);
    let s = gw.stats();
    assert_eq!(
        (said.as_str(), s.recovered, s.lost, s.idle_tail),
        ("abcd", 2, 0, 0)
    );
}

/// A new speaker whose first packet was lost, stamped like another speaker's last delivered
/// packet (one clock, RFC 9071 4; packets made at once share a timestamp, RFC 3550 5.1): its
/// next packet's generation is that lost packet. Its text was said, but not counted as
/// recovered (the `floor` is the other speaker's timestamp, and only newer counted): the loss
/// was left unplaced, then let go as an idle tail.
#[test]
fn a_new_speakers_lost_packet_stamped_like_the_floor_counts_as_recovered() {
    let packets = [
        (1, red_csrc(1, 1000, 1, &[(600, b""), (300, b"")], b"x")),
        // 2: speaker 2's [(600, ""), (300, "")] "b1" stamped 1000, lost.
        (3, red_csrc(3, 1300, 2, &[(300, b""), (300, b"b1")], b"b2")),
    ];
    let (said, gw) = run(&packets);
    let s = gw.stats();
    assert_eq!(
        (said.as_str(), s.recovered, s.lost),
        ("xb1b2", 1, 0),
        "idle_tail {}",
        s.idle_tail
    );
}
