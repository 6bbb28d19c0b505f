//! RTCP compounds at the edges: one datagram of thousands of sources, and a BYE that
//! overtakes a plain stream's only packet (review, session 38).

use pvp_t140::{Config, DropReason, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// One datagram of RTCP packets of `pt` (SDES 202 or BYE 203) for `count` sources from
/// `first` on, 31 a packet (`item`: each SDES chunk's items and null, 4 octets), up to about
/// 64 KiB.
fn sources(pt: u8, first: u32, item: &[u8], count: usize) -> Vec<u8> {
    let mut d = Vec::new();
    let mut ssrc = first;
    let per = 4 + item.len();
    let mut left = count;
    while left > 0 && d.len() + 4 + 31 * per <= 65_000 {
        let n = left.min(31);
        let start = d.len();
        d.extend_from_slice(&[0x80 | n as u8, pt, 0, 0]);
        for _ in 0..n {
            d.extend_from_slice(&ssrc.to_be_bytes());
            d.extend_from_slice(item);
            ssrc += 1;
        }
        let words = ((d.len() - start) / 4 - 1) as u16;
        d[start + 2..start + 4].copy_from_slice(&words.to_be_bytes());
        left -= n;
    }
    d
}

/// One UDP datagram (up to 64 KiB, which the receive path takes whole) of SDES chunks or BYE
/// SSRCs for 8,000-16,000 sources cost work quadratic in them (each looked up among those so
/// far; each BYE for a source with no stream walked every early name and eviction record):
/// 20-36 ms a datagram in a release build, so a few dozen a second kept a worker busy. A
/// compound acts on at most `MAX_RTCP_SOURCES` (256) named sources and 256 BYE'd sources that
/// are no stream's own, and counts the rest as `rtcp_too_many_sources`; a stream's own BYE,
/// wherever it stands in the list, still ends it. (The cost itself: `cargo bench --bench
/// core -- rtcp/`.)
#[test]
fn a_compound_of_thousands_of_sources_acts_on_the_first_and_counts_the_rest() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. "));
    let sdes = sources(202, 1000, &[1, 1, b'x', 0], usize::MAX);
    gw.handle_datagram(at(10), addr(4001), &sdes);
    assert_eq!(gw.stats().drops(DropReason::RtcpTooManySources), 1);
    // 256 sources, the most one compound may name: nothing counted.
    gw.handle_datagram(
        at(20),
        addr(4001),
        &sources(202, 1000, &[1, 1, b'x', 0], 256),
    );
    assert_eq!(gw.stats().drops(DropReason::RtcpTooManySources), 1);
    assert_eq!(gw.stats().drops(DropReason::RtcpMalformed), 0);
    // A BYE for 16,000 sources that are no stream's, and the stream's own last.
    let mut bye = sources(203, 100_000, &[], usize::MAX);
    pvp_t140::rtcp::write_bye(&mut bye, 7);
    gw.handle_datagram(at(30), addr(4001), &bye);
    assert_eq!(gw.stats().drops(DropReason::RtcpTooManySources), 2);
    let mut t = 30;
    while t < 3_000 {
        t += 100;
        gw.handle_timeout(at(t));
    }
    let out = drain(&mut gw);
    let leave = (out.iter())
        .find(|e| e.kind == "session.leave")
        .expect("the stream's own BYE ends it");
    assert_eq!(leave.payload["reason"], "rtcp bye");
    assert!(
        (out.iter()).any(|e| e.kind == "context.add" && e.payload["content"] == "Hello."),
        "{out:?}"
    );
}

/// RFC 3550 6.3.7: a BYE may overtake the source's last packets, and a receiver keeps the
/// source a while for them. A plain endpoint's compound (RR, SDES NAME, BYE) on the RTCP port
/// overtakes its only RTP packet, on the RTP port, by 5 ms. The gateway has no stream for the
/// BYE, so it forgets the name and nothing more; the packet then opens a stream that joins
/// under the address-made name ("T.140 00000007 (127.0.0.1:4000)", not "Ada") and leaves 60 s
/// later for `stream timeout`, not for the BYE. A mixer's source gets this (an unheard
/// source's speaker made at its BYE, `unheard_source`); a plain stream does not. Left open:
/// the fix (a BYE for an unknown SSRC remembered, with its compound's name, for the reorder
/// wait, and a stream opened from that host and SSRC within it made lingering) goes against
/// README's "the SSRC is free from the BYE on, and a name that comes meanwhile is the next
/// session's", a choice for the maintainers.
#[test]
#[ignore = "a BYE that overtakes a plain stream's first packet is forgotten: late leave, no name"]
fn a_bye_overtaking_a_plain_streams_only_packet_still_ends_it() {
    let mut gw = Gateway::new(Config::default());
    let mut r = Vec::new();
    pvp_t140::rtcp::write_rr(&mut r, 7);
    pvp_t140::rtcp::write_sdes(&mut r, 7, "ada@host", Some("Ada"));
    pvp_t140::rtcp::write_bye(&mut r, 7);
    gw.handle_datagram(at(0), addr(4001), &r);
    gw.handle_datagram(at(5), addr(4000), &t140(1, 7, "only words"));
    // The BYE's reorder wait (1 s) and an idle flush are over by 2 s.
    let mut t = 5;
    while t < 2_000 {
        t += 100;
        gw.handle_timeout(at(t));
    }
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("joins");
    assert_eq!(join.payload["participant"]["name"], "Ada");
    let text: Vec<_> = (out.iter())
        .filter(|e| e.kind == "context.add")
        .map(|e| e.payload["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text, ["only words"]);
    let leave = out
        .iter()
        .find(|e| e.kind == "session.leave")
        .expect("left by 2 s");
    assert_eq!(leave.payload["reason"], "rtcp bye");
}
