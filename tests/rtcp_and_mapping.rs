//! RTCP (RFC 3550 section 6) and mapping rules through the sans-IO gateway: compound packets
//! of any size, names without control characters, IPv4-mapped networks in rules and allow
//! lists; a mixer's RTCP for its sources (a source's BYE takes its text held behind a gap),
//! and participant ids shared by several speakers or sessions.

use std::net::SocketAddr;

use pvp_t140::mapping::{Mapping, Rule, Unmatched};
use pvp_t140::presence::Presence;
use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, DropReason, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// One SDES packet (RFC 3550 6.5) with a chunk per source, each with a CNAME and a NAME.
fn sdes_chunks(sources: &[(u32, &str, &str)]) -> Vec<u8> {
    let mut d = vec![0x80 | sources.len() as u8, 202, 0, 0];
    for (ssrc, cname, name) in sources {
        let start = d.len();
        d.extend_from_slice(&ssrc.to_be_bytes());
        for (kind, text) in [(1u8, cname), (2, name)] {
            d.push(kind);
            d.push(text.len() as u8);
            d.extend_from_slice(text.as_bytes());
        }
        d.push(0);
        while (d.len() - start) % 4 != 0 {
            d.push(0);
        }
    }
    let words = (d.len() / 4 - 1) as u16;
    d[2..4].copy_from_slice(&words.to_be_bytes());
    d
}

/// RFC 3550 6.1/6.5/7.3: a mixer's compound RTCP carries an SDES chunk for itself and for each
/// contributing source, and a BYE must be the last packet of its compound. Every event of the
/// compound is acted on: with five sources (ten SDES items) before the BYE, the gateway kept
/// only the first eight events, and the BYE was silently dropped (the stream never ended).
#[test]
fn a_bye_after_more_than_eight_sdes_items_still_ends_the_stream() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "bye soon"));
    // Empty RR, SDES for the sender and four others it mixes, then the sender's BYE.
    let mut rtcp = vec![0x80, 201, 0, 1, 0, 0, 0, 7];
    rtcp.extend(sdes_chunks(&[
        (7, "seven@host", "Seven"),
        (101, "a@host", "A"),
        (102, "b@host", "B"),
        (103, "c@host", "C"),
        (104, "d@host", "D"),
    ]));
    pvp_t140::rtcp::write_bye(&mut rtcp, 7);
    // The parser itself sees the BYE.
    let mut byes = 0;
    assert!(pvp_t140::rtcp::parse(&rtcp, &mut |e| {
        if let pvp_t140::rtcp::RtcpEvent::Bye { ssrc: 7 } = e {
            byes += 1;
        }
    }));
    assert_eq!(byes, 1);
    gw.handle_datagram(at(5), addr(4001), &rtcp);
    // The leave comes once the reorder wait from the BYE is over.
    gw.handle_timeout(at(5 + 1000));
    let out = drain(&mut gw);
    assert!(
        out.iter()
            .any(|e| e.kind == "session.leave" && e.payload["reason"] == "rtcp bye"),
        "the BYE was dropped: {:?}",
        out.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>()
    );
    assert_eq!(gw.live_streams(), 0);
}

/// A BYE packet listing several sources (RFC 3550 6.6: a mixer forwards BYEs with the SSRC/CSRC
/// identifiers unchanged; SC may be up to 31) ends each: sources past the eighth were ignored.
#[test]
fn a_bye_listing_nine_sources_ends_the_ninth() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 9, "bye soon"));
    let mut bye = vec![0x80 | 9, 203, 0, 9];
    for ssrc in 1u32..=9 {
        bye.extend_from_slice(&ssrc.to_be_bytes());
    }
    gw.handle_datagram(at(5), addr(4000), &bye);
    // The leave comes once the reorder wait from the BYE is over.
    gw.handle_timeout(at(5 + 1000));
    assert_eq!(gw.live_streams(), 0, "the BYE for SSRC 9 was ignored");
}

/// A gateway whose one mapping rule gives every source on 127.0.0.0/8 the participant id
/// `room`.
fn one_room() -> Gateway {
    Gateway::new(Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_source: Some("127.0.0.0/8".parse().unwrap()),
                participant: Some("room".into()),
                ..Rule::default()
            }],
            ..Mapping::default()
        },
        ..Config::default()
    })
}

/// A `[[stream]]` rule matching a network (README: `source = "10.1.0.0/16"`) with a fixed
/// `participant` id: every stream from it, and every CSRC speaker of a mixer there, takes that
/// id. To the session they are one participant: it joins once and leaves with the last of them
/// (as the envelopes leave the gateway: every sink and replay pass them through one
/// `Presence`), and their context keys differ (pvp-spec 9.1: unique within the session), each
/// scoped by the speaker's own id. (Each speaker joined on its own, and both speakers' first
/// chunks had the key `room/<stream start ms>/1`.)
#[test]
fn one_participant_id_given_to_two_speakers_joins_once_and_keeps_keys_unique() {
    let mut gw = one_room();
    // A mixer's two sources, and a stream of its own from another port.
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(100), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo. "));
    gw.handle_datagram(at(200), addr(5002), &t140(1, 7, "Charlie. "));
    gw.shutdown(at(300));
    let mut presence = Presence::default();
    let out: Vec<Envelope> = std::iter::from_fn(|| gw.poll_output())
        .filter(|e| presence.admit(e))
        .map(|e| e.to_message())
        .collect();
    let kinds: Vec<&str> = out.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "session.join",
            "context.add",
            "context.add",
            "context.add",
            "session.leave"
        ]
    );
    assert!(out.iter().all(|e| e.sender == "room"));
    let keys: Vec<&str> = out
        .iter()
        .filter_map(|e| e.payload["key"].as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "room/t140:00000009@127.0.0.1:5000/csrc:00000001/1700000000000/1",
            "room/t140:00000009@127.0.0.1:5000/csrc:00000002/1700000000000/1",
            "room/t140:00000007@127.0.0.1:5002/1700000000200/1",
        ]
    );
}

/// RFC 3550 6.5/7.3: a mixer forwards the SDES items of its contributing sources (chunk SSRC
/// = the CSRC), in its own compound. A CSRC speaker's NAME names that speaker. (The gateway
/// looked a named SSRC up as a stream's own SSRC only, so the NAME was parked among the "early
/// names" and never reached the speaker: it joined as "T.140 00000001 via ...".)
#[test]
fn a_mixer_speakers_sdes_name_names_that_speaker() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b""));
    gw.handle_datagram(
        at(10),
        addr(5000),
        &sdes_chunks(&[(9, "mixer@host", "Mixer"), (1, "ada@host", "Ada")]),
    );
    gw.handle_datagram(at(20), addr(5000), &with_csrc(2, 1100, 9, 1, b"Hello. "));
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    assert_eq!(join.sender, "t140:00000009@127.0.0.1:5000/csrc:00000001");
    assert_eq!(join.payload["participant"]["name"], "Ada");
}

/// RFC 3550 6.6: "If a BYE packet is received by a mixer, the mixer SHOULD forward the BYE
/// packet with the SSRC/CSRC identifier(s) unchanged." A BYE naming a mixer's contributing
/// source, in the mixer's compound, is that speaker leaving: its pending text is flushed and
/// it leaves, while the mixer and its other speakers go on. (The gateway looked the id up as a
/// stream's SSRC only, so the speaker stayed until the whole mixer stream ended.) The leave
/// comes when the reorder wait from the BYE is over: the BYE may have overtaken B's last packet.
#[test]
fn a_bye_for_a_mixer_csrc_flushes_and_ends_that_speaker() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(
        at(10),
        addr(5000),
        &with_csrc(2, 1100, 9, 2, b"Bravo pending"),
    );
    drain(&mut gw);
    // The mixer's compound (RFC 3550 6.1): its RR first, then the BYE it forwards.
    let bye = mixer_bye(2);
    gw.handle_datagram(at(20), addr(5000), &bye);
    gw.handle_timeout(at(1020));
    let out = drain(&mut gw);
    let b = "t140:00000009@127.0.0.1:5000/csrc:00000002";
    assert!(
        out.iter().any(|e| e.kind == "context.add"
            && e.sender == b
            && e.payload["content"] == "Bravo pending"),
        "B's pending text not flushed by its BYE"
    );
    assert!(
        out.iter()
            .any(|e| e.kind == "session.leave" && e.sender == b),
        "B did not leave"
    );
    // The mixer and speaker A go on.
    assert_eq!(gw.live_streams(), 1);
}

/// A rule's source written as an IPv4-mapped IPv6 network or address (`::ffff:10.1.2.3`, what
/// a dual-stack socket reports) is taken as the IPv4 network it maps: the gateway matches rules
/// against the sender's canonical IPv4 address, so as written the rule never matched and the
/// speaker silently fell to `unmatched` (here: refused). The same for `allow` (next test).
#[test]
fn a_rule_for_an_ipv4_mapped_source_matches_that_ipv4_sender() {
    let (_, mapping, _) = pvp_t140::config_file::parse(
        std::path::Path::new("gw.toml"),
        "unmatched = \"refuse\"\n\n[[stream]]\nsource = \"::ffff:127.0.0.1\"\nparticipant = \"mapped\"\n",
    )
    .unwrap();
    // The rule alone.
    let mut gw = Gateway::new(Config {
        mapping: mapping.clone(),
        ..Config::default()
    });
    // The sender as a dual-stack listener reports it.
    let v6: SocketAddr = "[::ffff:127.0.0.1]:4000".parse().unwrap();
    gw.handle_datagram(at(0), v6, &t140(1, 7, "Hello. "));
    let out = drain(&mut gw);
    assert_eq!(
        out.first().map(|e| e.sender.as_str()),
        Some("mapped"),
        "refused: {} chunks",
        gw.stats().refused_chunks
    );
}

#[test]
fn an_allow_entry_for_an_ipv4_mapped_address_admits_that_ipv4_sender() {
    let (_, _, allow) = pvp_t140::config_file::parse(
        std::path::Path::new("gw.toml"),
        "allow = [\"::ffff:127.0.0.1\"]\n",
    )
    .unwrap();
    let v6: SocketAddr = "[::ffff:127.0.0.1]:4000".parse().unwrap();
    let mut gw = Gateway::new(Config {
        allow,
        ..Config::default()
    });
    gw.handle_datagram(at(0), v6, &t140(1, 7, "Hello. "));
    assert_eq!(gw.stats().drops(pvp_t140::DropReason::NotAllowed), 0);
}

/// An SDES NAME loses its control characters, as text does: it was only trimmed, so ESC
/// sequences, NUL and new lines reached the participant's PVP name and the gateway's log line
/// `participant joins name=...`, where a new line could pass for another line.
#[test]
fn an_sdes_name_carries_no_control_characters() {
    let mut gw = Gateway::new(Config::default());
    let mut d = Vec::new();
    pvp_t140::rtcp::write_sdes(
        &mut d,
        7,
        "ada@host",
        Some("Ada\u{1b}[2J\u{0}\nINFO participant joins name=Admin"),
    );
    gw.handle_datagram(at(0), addr(4001), &d);
    gw.handle_datagram(at(1), addr(4000), &t140(1, 7, "hi. "));
    let out = drain(&mut gw);
    let name = out[0].payload["participant"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !name.chars().any(char::is_control),
        "control characters in the name: {name:?}"
    );
}

/// The name SSRC 7's join gives it once its first packet comes from 127.0.0.1:4000.
fn join_name(gw: &mut Gateway) -> String {
    gw.handle_datagram(at(1), addr(4000), &t140(1, 7, "hi. "));
    let out = drain(gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    join.payload["participant"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A display name with nothing left once cleaned (a mapping rule's `name` of a BEL: a
/// configuration file refuses one, the API does not) is not sent as it came, control
/// characters and all: the speaker gets the name a nameless one gets. And U+2028/U+2029,
/// which the gateway takes for new lines in text (README "Text decoding"), are out of names
/// as other controls are. (Review, session 34.)
#[test]
fn a_name_that_cleans_to_nothing_is_not_sent_and_line_separators_are_out_of_names() {
    let rule_named = |name: &str| {
        Gateway::new(Config {
            mapping: Mapping {
                rules: vec![Rule {
                    match_ssrc: Some(7),
                    name: Some(name.into()),
                    ..Rule::default()
                }],
                ..Mapping::default()
            },
            ..Config::default()
        })
    };
    let nameless = join_name(&mut Gateway::new(Config::default()));
    assert_eq!(nameless, "T.140 00000007 (127.0.0.1:4000)");
    for name in ["\u{7}", "", " \u{2028} "] {
        assert_eq!(join_name(&mut rule_named(name)), nameless, "{name:?}");
    }
    assert_eq!(join_name(&mut rule_named("Ada\u{2028}\u{2029}")), "Ada");
    let mut gw = Gateway::new(Config::default());
    let mut d = Vec::new();
    pvp_t140::rtcp::write_sdes(&mut d, 7, "ada@host", Some("Ada\u{2028}INFO joins"));
    gw.handle_datagram(at(0), addr(4001), &d);
    let name = join_name(&mut gw);
    assert!(
        !name.contains(['\u{2028}', '\u{2029}']),
        "a line separator in the name: {name:?}"
    );
}

/// Bidirectional embedding, override and isolate controls (U+202A-U+202E, U+2066-U+2069) are
/// out of names too: a name is shown beside other text (a member list, a transcript's speaker,
/// the gateway's own log line), where an unclosed RIGHT-TO-LEFT OVERRIDE in `Mallory\u{202e}`
/// turns what follows it around (the Trojan Source trick, CVE-2021-42574). A name of nothing
/// else is no name.
#[test]
fn bidi_controls_are_out_of_names() {
    let named = |name: &str| {
        let mut gw = Gateway::new(Config::default());
        let mut d = Vec::new();
        pvp_t140::rtcp::write_sdes(&mut d, 7, "m@host", Some(name));
        gw.handle_datagram(at(0), addr(4000), &d);
        join_name(&mut gw)
    };
    assert_eq!(named("Mallory\u{202e}"), "Mallory");
    assert_eq!(
        named("\u{2067}Ada\u{2069} L\u{202a}o\u{202c}ve"),
        "Ada Love"
    );
    // Nothing but bidi controls: the CNAME names it, as an empty NAME leaves it.
    assert_eq!(named("\u{202e}\u{202d}\u{2066}"), "m@host");
    // Scripts written right to left keep their letters (and the implicit marks U+200E/U+200F).
    assert_eq!(
        named("\u{5e9}\u{5e8}\u{5d4}\u{200f}"),
        "\u{5e9}\u{5e8}\u{5d4}\u{200f}"
    );
}

/// README: "Rules are evaluated when a speaker is about to join, so an RTCP SDES name that
/// arrived by then can match", and a mixer's SDES for its sources' CSRCs names those speakers
/// (RFC 3550 6.5, 7.3). A mixer's compound carries a chunk for every source it mixes, also the
/// ones that have not spoken yet. A CSRC's NAME that arrives before that source's first packet
/// is parked among the "early names" under (address, CSRC), which only a new *stream* with that
/// SSRC ever takes: the mixer's new speaker joins without its name, and an `rtcp_name` rule
/// written for it never matches (here it joins as `t140:00000009@.../csrc:00000002`, not `bob`).
#[test]
fn a_mixer_sources_sdes_before_its_first_packet_reaches_its_join_and_rules() {
    let mut gw = Gateway::new(Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_rtcp_name: Some("Bob".into()),
                participant: Some("bob".into()),
                ..Rule::default()
            }],
            ..Mapping::default()
        },
        ..Config::default()
    });
    // The mixer's stream, with source 1 speaking.
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    // Its compound (RFC 3550 6.1): RR, then SDES for itself and both its sources.
    let mut rtcp = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
    rtcp.extend(sdes_chunks(&[
        (9, "mixer@host", "Mixer"),
        (1, "ada@host", "Ada"),
        (2, "bob@host", "Bob"),
    ]));
    gw.handle_datagram(at(10), addr(5000), &rtcp);
    // Source 2 speaks for the first time.
    gw.handle_datagram(at(20), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo. "));
    let out = drain(&mut gw);
    let bravo = out
        .iter()
        .find(|e| e.kind == "context.add" && e.payload["content"] == "Bravo.")
        .expect("Bravo. sent");
    let join = out
        .iter()
        .find(|e| e.kind == "session.join" && e.sender == bravo.sender)
        .expect("a join for Bravo's sender");
    assert_eq!(
        (bravo.sender.as_str(), &join.payload["participant"]["name"]),
        ("bob", &serde_json::json!("Bob")),
        "the SDES NAME Bob, received before source 2's first packet, was not used"
    );
}

/// A mixer's source that said something, left (its BYE, forwarded by the mixer, RFC 3550 6.6),
/// and spoke again joins again (`end_speaker`). With a `[[stream]]` rule giving the mixer's
/// sources one participant id, context keys stay apart by the speaker's own id (README:
/// `<participant>/<speaker's own id>/<stream start ms>/<n>`, unique within the session,
/// pvp-spec 9.1). At the second join the "own id" kept for the key is taken from the
/// participant id the first join had already replaced, the rule's: both sources' next chunks
/// get the key `room/room/<ms>/2`, one key for two items.
#[test]
fn a_mixer_source_joining_again_after_its_bye_keeps_its_keys_unique() {
    let mut gw = one_room();
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo. "));
    // The mixer forwards both sources' BYEs in its compound.
    let mut bye = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
    bye.extend_from_slice(&[0x82, 203, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2]);
    gw.handle_datagram(at(20), addr(5000), &bye);
    // Both come back.
    gw.handle_datagram(at(30), addr(5000), &with_csrc(3, 1200, 9, 1, b"Again A. "));
    gw.handle_datagram(at(40), addr(5000), &with_csrc(4, 1300, 9, 2, b"Again B. "));
    gw.shutdown(at(50));
    let out = drain(&mut gw);
    let keys: Vec<&str> = out
        .iter()
        .filter(|e| e.kind == "context.add")
        .filter_map(|e| e.payload["key"].as_str())
        .collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    let mut unique = keys.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "duplicate context keys: {keys:?}");
}

/// A mixer's source's BYE (RFC 3550 6.6) ends that speaker: "what it said and has not been
/// sent goes out, then its leave". A packet of its text that arrived before the BYE but waits
/// behind a gap in the mixer's sequence (RFC 4103 5.4 reorder wait) is not part of that: when
/// the wait ends the text is given to the speaker that left, which joins the session again
/// for it, and then stays a participant until the mixer's stream ends (hours, for a
/// conference). The leave must come after all the text sent before the BYE, and the source
/// must not come back without speaking again.
#[test]
fn a_mixer_sources_bye_takes_its_text_held_behind_a_gap_before_its_leave() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    // Packet 3 is lost; B's packet 4 waits for it.
    gw.handle_datagram(
        at(20),
        addr(5000),
        &with_csrc(4, 1300, 9, 2, b"said this. "),
    );
    // The mixer forwards B's BYE.
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    // The reorder wait passes; A goes on talking in the mixer's stream.
    gw.handle_timeout(at(1100));
    gw.handle_datagram(at(1500), addr(5000), &with_csrc(5, 1400, 9, 1, b"More. "));
    let out = drain(&mut gw);
    let b = "t140:00000009@127.0.0.1:5000/csrc:00000002";
    let of_b: Vec<(&str, String)> = out
        .iter()
        .filter(|e| e.sender == b)
        .map(|e| {
            (
                e.kind.as_str(),
                e.payload["content"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let joins = of_b.iter().filter(|(k, _)| *k == "session.join").count();
    let last = of_b.last().map(|(k, _)| *k);
    assert!(
        joins == 1 && last == Some("session.leave"),
        "B joins again after its BYE, and is left in the session: {of_b:?}"
    );
    // All B said before its BYE, in one item: the lost packet 3 lay between two of B's
    // packets and is marked in B's text (RFC 4103 5.3), where the reorder wait's end would
    // have marked it.
    let said: Vec<&str> = of_b
        .iter()
        .filter(|(k, _)| *k == "context.add")
        .map(|(_, c)| c.as_str())
        .collect();
    assert_eq!(said, ["Bravo \u{fffd}said this."]);
    assert_eq!(gw.stats().lost, 1);
    // A goes on as before.
    let of_a: Vec<String> = out
        .iter()
        .filter(|e| e.sender == "t140:00000009@127.0.0.1:5000/csrc:00000001")
        .filter(|e| e.kind == "context.add")
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(of_a, ["Alpha.", "More."]);
}

/// A mixer source's BYE releases the reorder hold only as far as its own last packet (as the
/// reorder wait would have, earlier): another source's packet held further on still waits for
/// its gap (RFC 4103 5.4), and when the gap fills nothing of it is marked lost.
#[test]
fn a_mixer_sources_bye_leaves_later_held_packets_of_others_waiting() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    // 3 is lost; B's 4 waits. 5 is late; A's 6 waits too.
    gw.handle_datagram(at(20), addr(5000), &with_csrc(4, 1300, 9, 2, b"ends. "));
    gw.handle_datagram(at(25), addr(5000), &with_csrc(6, 1500, 9, 1, b"goes on. "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    // A's late packet 5 arrives within the wait: the rest of A's text follows, unmarked.
    gw.handle_datagram(at(40), addr(5000), &with_csrc(5, 1400, 9, 1, b"still "));
    gw.shutdown(at(2000));
    let out = drain(&mut gw);
    let said = |who: &str| -> Vec<(String, String)> {
        out.iter()
            .filter(|e| e.sender.ends_with(who))
            .filter(|e| e.kind != "session.join")
            .map(|e| {
                let content = e.payload["content"].as_str().unwrap_or("");
                (e.kind.clone(), content.to_owned())
            })
            .collect()
    };
    assert_eq!(
        said("csrc:00000002"),
        [
            pair("context.add", "Bravo \u{fffd}ends."),
            pair("session.leave", "")
        ]
    );
    assert_eq!(
        said("csrc:00000001"),
        [
            pair("context.add", "Alpha still goes on."),
            pair("session.leave", "")
        ]
    );
    assert_eq!(gw.stats().lost, 1);
}

/// "One gateway can feed several sessions" (README, `session` in a `[[stream]]` rule), and a
/// rule's `participant` id may be the same in two rules (one captioner identity in two rooms).
/// `Presence`, which every sink and replay pass envelopes through, counts joins by participant
/// id alone, not by session: the join in the second session is held back as a duplicate, and
/// that session gets the participant's `context.add` with no `session.join` before it
/// (pvp-spec 6.3: a participant joins before anything else it sends there).
#[test]
fn one_participant_id_in_two_sessions_joins_each_session() {
    let rule = |ssrc: u32, session: &str| Rule {
        match_ssrc: Some(ssrc),
        participant: Some("captions".into()),
        session: Some(session.into()),
        ..Rule::default()
    };
    let mut gw = Gateway::new(Config {
        mapping: Mapping {
            rules: vec![rule(7, "room-a"), rule(8, "room-b")],
            ..Mapping::default()
        },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "In room A. "));
    gw.handle_datagram(at(10), addr(4002), &t140(1, 8, "In room B. "));
    gw.shutdown(at(20));
    let mut presence = Presence::default();
    let out: Vec<Envelope> = std::iter::from_fn(|| gw.poll_output())
        .filter(|e| presence.admit(e))
        .map(|e| e.to_message())
        .collect();
    for session in ["room-a", "room-b"] {
        let kinds: Vec<&str> = out
            .iter()
            .filter(|e| e.session == session)
            .map(|e| e.kind.as_str())
            .collect();
        assert_eq!(
            kinds,
            ["session.join", "context.add", "session.leave"],
            "in {session}"
        );
    }
}

/// A mixer source's BYE that comes while its packet waits behind a gap leaves no timer behind
/// the clock. (When the BYE released the hold at once, the stream was re-armed to a deadline
/// already past, another speaker's idle flush the gap had held back, and `poll_timeout`
/// answered a time before the clock.) Here A said "Alpha " at 0 (idle flush due at 2000), B's
/// packet 3 waits behind the lost 2 from 1500, and B's BYE comes at 2200.
#[test]
fn a_mixer_sources_bye_that_releases_the_hold_leaves_no_timer_behind_the_clock() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    // 2 is lost; B's 3 waits for it until 2500.
    gw.handle_datagram(at(1500), addr(5000), &with_csrc(3, 1300, 9, 2, b"Bravo"));
    // A's idle flush falls due, but the gap holds it back.
    gw.handle_timeout(at(2000));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(2200), addr(5000), &bye);
    let next = gw.poll_timeout();
    assert!(
        next.is_none_or(|t| t > at(2200)),
        "a timer left behind the clock after the BYE: {next:?}"
    );
}

/// RFC 4103 5.4: a packet arriving within the reorder wait fills its gap, whatever BYE came
/// meanwhile. Here A's 2 is late, A's 3 and B's 4 wait, and B's BYE comes at 30; A's 2
/// arrives at 40, well within the wait. (When the BYE released the hold through B's last
/// packet at once, A's gap was given up early and A, who did not leave, lost "still " for a
/// U+FFFD because B left.) B's leave waits for its packet instead.
#[test]
fn a_mixer_sources_bye_does_not_lose_another_sources_late_packet_within_the_wait() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(20), addr(5000), &with_csrc(3, 1200, 9, 1, b"goes on. "));
    gw.handle_datagram(
        at(25),
        addr(5000),
        &with_csrc(4, 1300, 9, 2, b"Bravo ends. "),
    );
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    gw.handle_datagram(at(40), addr(5000), &with_csrc(2, 1100, 9, 1, b"still "));
    gw.shutdown(at(2000));
    let out = drain(&mut gw);
    let of_a: Vec<String> = out
        .iter()
        .filter(|e| e.sender.ends_with("csrc:00000001") && e.kind == "context.add")
        .map(|e| e.payload["content"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(of_a, ["Alpha still goes on."]);
    assert_eq!(gw.stats().lost, 0);
}

/// RFC 3550 6.3.7: a source's BYE removes it; a packet it sends after the BYE makes it a
/// participant again. The gateway's own doc for `end_speaker`: "Should the source speak again
/// after its leave, it joins again." Here B's packet 4 waits behind the lost (late) 3 when
/// B's BYE comes, so its leave is deferred; B then speaks again (packet 5, also held behind
/// 3). A user expects B's leave between what it said before its BYE and what it said after
/// (join, "Bravo before bye.", leave, join, "back again.", leave at shutdown). Instead the
/// deferred leave waits for every held packet of B's, the post-BYE one too: B's text from
/// after its BYE goes out before the leave, in the membership the BYE ended, and B then
/// leaves although it is still talking (it joins only once; no leave sits between the two).
#[test]
fn a_mixer_source_speaking_after_its_deferred_bye_joins_again_after_the_leave() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    // 3 (A's) is late; B's 4 waits for it.
    gw.handle_datagram(
        at(20),
        addr(5000),
        &with_csrc(4, 1300, 9, 2, b"before bye. "),
    );
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    // B speaks again after its BYE; 3 is still missing, so this waits too.
    gw.handle_datagram(
        at(40),
        addr(5000),
        &with_csrc(5, 1400, 9, 2, b"back again. "),
    );
    // A's late 3 fills the gap within the wait.
    gw.handle_datagram(at(50), addr(5000), &with_csrc(3, 1200, 9, 1, b"goes on. "));
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    let of_b = events_of(&out, "csrc:00000002");
    assert_eq!(
        of_b,
        [
            pair("session.join", ""),
            pair("context.add", "Bravo before bye."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "back again."),
            pair("session.leave", ""),
        ]
    );
}

/// RFC 3550 6.2.1 / 6.3.4: a BYE may overtake its source's last data packets, so a receiver
/// keeps the source a while after it. Here B's packet 3 ("ends. ", sent before the BYE) is
/// late: A's 4 waits for it when B's BYE comes, so the gateway knows a gap is pending that
/// may be B's. A user expects B to say "Bravo ends." and leave once. Instead nothing of B's is
/// *held*, so B leaves at once ("Bravo"); the late 3 then arrives within the reorder wait, B
/// joins again to say "ends." and stays in the session, never leaving until the stream ends.
#[test]
fn a_mixer_sources_late_packet_after_its_bye_does_not_make_it_join_again() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    // B's 3 is late; A's 4 waits for it.
    gw.handle_datagram(at(20), addr(5000), &with_csrc(4, 1300, 9, 1, b"goes on. "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    // B's 3, sent before its BYE, fills the gap well within the wait.
    gw.handle_datagram(at(40), addr(5000), &with_csrc(3, 1200, 9, 2, b"ends. "));
    gw.handle_timeout(at(3000));
    // B is gone: a user expects its leave before the stream's end.
    let before_end = events_of(&drain(&mut gw), "csrc:00000002");
    assert_eq!(
        before_end,
        [
            pair("session.join", ""),
            pair("context.add", "Bravo ends."),
            pair("session.leave", ""),
        ]
    );
}

/// RFC 3550 6.3.7: a source that spoke again after its BYE is a participant again, and its
/// next BYE ends that participation too. Here B's 4 waits behind A's late 3 when B's first
/// BYE comes (leave deferred to B's 4); B then speaks again (5, held too) and leaves again
/// (a second BYE) before 3 arrives. A user expects join, "Bravo before bye.", leave, join,
/// "back again.", leave. Instead the second BYE overwrites `bye_at` with 5's timestamp: the
/// leave after 4 is lost, and B's two participations merge into one.
#[test]
fn a_mixer_sources_second_bye_keeps_the_leave_of_its_first() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    gw.handle_datagram(
        at(20),
        addr(5000),
        &with_csrc(4, 1300, 9, 2, b"before bye. "),
    );
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    gw.handle_datagram(
        at(40),
        addr(5000),
        &with_csrc(5, 1400, 9, 2, b"back again. "),
    );
    gw.handle_datagram(at(45), addr(5000), &bye);
    gw.handle_datagram(at(50), addr(5000), &with_csrc(3, 1200, 9, 1, b"goes on. "));
    gw.handle_timeout(at(3000));
    let of_b = events_of(&drain(&mut gw), "csrc:00000002");
    assert_eq!(
        of_b,
        [
            pair("session.join", ""),
            pair("context.add", "Bravo before bye."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "back again."),
            pair("session.leave", ""),
        ]
    );
}

/// RFC 9071 lets a mixer send packets of its own with no CSRC (the gateway gives them the
/// mixer's own voice); they take the mixer's sequence numbers and clock like any other. Here
/// B's 3 is late, the mixer's own 4 (no CSRC, ts 1300) waits for it, and B's BYE comes: its
/// leave is deferred to ts 1300, the newest held. B's 3 then fills the gap and 4 is delivered.
/// A user expects B to say "Bravo ends." and leave. Instead a packet without CSRC goes to its
/// speaker as plain text, never as a timestamped packet, so `byes_due` never runs for it: B's
/// leave waits for a later CSRC packet of the mixer that may never come, and B stays in the
/// session until the stream ends.
#[test]
fn a_mixer_sources_deferred_bye_is_due_at_a_held_packet_without_csrc() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    // B's 3 is late; the mixer's own 4 (no CSRC) waits for it.
    let mut own = Vec::new();
    pvp_t140::rtp::write_packet(&mut own, false, 98, 4, 1300, 9, b"Mixer note. ");
    gw.handle_datagram(at(20), addr(5000), &own);
    let bye = mixer_bye(2);
    gw.handle_datagram(at(30), addr(5000), &bye);
    gw.handle_datagram(at(40), addr(5000), &with_csrc(3, 1200, 9, 2, b"ends. "));
    gw.handle_timeout(at(3000));
    let before_end = events_of(&drain(&mut gw), "csrc:00000002");
    assert_eq!(
        before_end,
        [
            pair("session.join", ""),
            pair("context.add", "Bravo ends."),
            pair("session.leave", ""),
        ]
    );
}

/// A gateway with `cfg` to which SSRC 7 (127.0.0.1:4000) said 1 "Hello " and 3 "world. ", 2
/// late, then its BYE (at 610 ms): the BYE waits, 3 held.
fn bye_overtaking_packet_2(cfg: Config) -> Gateway {
    let mut gw = Gateway::new(cfg);
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello "));
    gw.handle_datagram(at(600), addr(4000), &t140(3, 7, "world. "));
    gw.handle_datagram(at(610), addr(4000), &stream_bye(7));
    gw
}

/// RFC 3550 6.3.7: a BYE travels apart from the source's last RTP packets and may overtake
/// them. Here packet 2 ("there ") is reordered behind 3 and arrives 10 ms after the BYE,
/// within the reorder wait (RFC 4103 5.4). The stream ended at the BYE: the gap was given up
/// ("Hello \u{fffd}world."), and the late packet opened a second stream, which joined again to
/// say "\u{fffd}there". The BYE waits for the gap: the packet that fills it delivers
/// everything said, and the stream leaves when the reorder wait from the BYE is over (a packet
/// after the gap may have been overtaken too): one join and one leave.
#[test]
fn a_bye_overtaking_the_sources_last_packet_waits_for_it() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    assert!(
        !drain(&mut gw).iter().any(|e| e.kind == "session.leave"),
        "left with a packet still held"
    );
    gw.handle_datagram(at(620), addr(4000), &t140(2, 7, "there "));
    gw.handle_timeout(at(1609));
    assert_eq!(
        gw.stats().streams_live,
        1,
        "left before the wait from the BYE"
    );
    gw.handle_timeout(at(1610));
    let out = events_of(&drain(&mut gw), "");
    assert_eq!(
        out,
        [
            pair("session.join", ""),
            pair("context.add", "Hello there world."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().streams_live, 0);
    assert_eq!(gw.stats().lost, 0);
}

/// The same when the packet the BYE waits for never comes: the stream ends when the reorder
/// wait gives the gap up (RFC 4103 5.4), the loss marked (5.3), not before and not never.
#[test]
fn a_bye_waiting_for_a_lost_packet_ends_the_stream_at_the_reorder_wait() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    let before = gw.poll_timeout().expect("the reorder wait is armed");
    assert!(before <= at(1600), "{before:?}");
    gw.handle_timeout(at(1500));
    drain(&mut gw);
    assert_eq!(gw.stats().streams_live, 1, "ended before the reorder wait");
    // The gap is given up at 1600, the stream ends at the wait from the BYE, 1610.
    gw.handle_timeout(at(1610));
    let out = events_of(&drain(&mut gw), "");
    assert_eq!(
        out,
        [
            pair("session.join", ""),
            pair("context.add", "Hello \u{fffd}world."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().streams_live, 0);
    assert_eq!(gw.stats().lost, 1);
}

/// The same sender (address and SSRC 7) as [`own_bye`] with its RTCP on port 4001, the next
/// port up (RFC 3550 11).
fn own_bye_from_next_port() -> (std::net::SocketAddr, Vec<u8>) {
    (addr(4001), stream_bye(7))
}

/// RFC 3550 8.2 / 6.3.7: a BYE frees its SSRC. A sender ends (its BYE overtaking its last
/// packet 3, which waits for the lost 2), and a new sender that happens to use the same SSRC 7
/// starts from another port (a client restarted with a configured `--ssrc`). A user expects
/// the new sender's text ("New sender.", "Still here."), as before the BYE waited. Before the fix, the
/// old stream lives on after its BYE until the reorder wait ends, still owning SSRC 7: the new
/// sender's first packets are dropped as SSRC conflicts, and its text after that starts with a
/// loss mark for its own lost head ("\u{fffd}Still here.").
#[test]
fn a_bye_waiting_for_a_gap_still_frees_its_ssrc_for_a_new_sender() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello "));
    gw.handle_datagram(at(600), addr(4000), &t140(3, 7, "world. "));
    let (rtcp_port, bye) = own_bye_from_next_port();
    gw.handle_datagram(at(610), rtcp_port, &bye);
    gw.handle_datagram(at(700), addr(4002), &t140(1, 7, "New "));
    gw.handle_datagram(at(800), addr(4002), &t140(2, 7, "sender. "));
    gw.handle_timeout(at(1600));
    gw.handle_datagram(at(1700), addr(4002), &t140(3, 7, "Still here. "));
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    let new: Vec<(String, String)> = events_of(&out, "")
        .into_iter()
        .zip(&out)
        .filter(|(_, e)| e.sender.ends_with(":4002"))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        new,
        [
            pair("session.join", ""),
            pair("context.add", "New sender."),
            pair("context.add", "Still here."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().drops(pvp_t140::DropReason::SsrcConflict), 0);
}

/// A sender that said BYE and started a new session under the same address and SSRC (a new
/// random first sequence number, RFC 3550 5.1; the gateway documents this case: "a BYE, then
/// the sender's next packet" starts the stream again). Its BYE overtook its last packet 3,
/// which waits for the lost 2. A user expects the old session to end ("Hello \u{fffd}world.")
/// and the new one to say "Hi again." and "More." (before the BYE waited, it did). Before the fix, the new
/// session's packets go to the old stream, still waiting: its first (marked) packet is
/// dropped as a sequence jump, its second is taken as a restart of the old stream (a loss
/// mark for "Hi ", "again." said by the old session before its leave), and the next packet
/// opens a stream whose head is marked lost ("\u{fffd}More.").
#[test]
fn a_new_session_after_a_waiting_bye_is_not_taken_into_the_old_stream() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    gw.handle_datagram(at(700), addr(4000), &t140m(40000, 7, true, "Hi "));
    gw.handle_datagram(at(800), addr(4000), &t140m(40001, 7, false, "again. "));
    gw.handle_datagram(at(900), addr(4000), &t140m(40002, 7, false, "More. "));
    gw.shutdown(at(5000));
    let out = events_of(&drain(&mut gw), "");
    assert_eq!(
        out,
        [
            pair("session.join", ""),
            pair("context.add", "Hello \u{fffd}world."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "Hi again."),
            pair("context.add", "More."),
            pair("session.leave", ""),
        ]
    );
}

/// README: "A source's leave waits for its packets still held behind a gap (at most the
/// reorder wait)"; the stream ends when the gap its BYE overtook is settled. Here packet 3
/// waits for the lost 2 when the BYE comes at 610, so the stream should end at 1600 at the
/// latest. But the source goes on sending after its BYE over a lossy path (every other packet
/// lost): each new packet waits behind a new gap, `bye_waits` ends the stream only when
/// nothing at all is held, and that never happens. 4.4 s after the BYE the stream is still
/// live and has not left.
#[test]
fn a_waiting_bye_ends_the_stream_within_the_reorder_wait_of_the_bye() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    // Sent after the BYE: 5, 7, 9, ... every 400 ms, the even ones lost.
    let (mut seq, mut ms) = (5, 1000);
    while ms < 5000 {
        gw.handle_datagram(at(ms), addr(4000), &t140(seq, 7, "x "));
        seq += 2;
        ms += 400;
    }
    gw.handle_timeout(at(5000));
    let out = drain(&mut gw);
    assert!(
        out.iter()
            .any(|e| e.kind == "session.leave" && e.payload["reason"] == "rtcp bye"),
        "no leave 4.4 s after the BYE: {:?}",
        events_of(&out, "")
    );
}

/// A mixer (SSRC 9) whose source B said BYE while the mixer's own packet 4 (no CSRC) waited
/// for the lost 3, B's leave deferred to it; then the mixer itself says BYE (its stream waits
/// too). When the late 3 fills the gap, B, whose BYE came first, leaves first (`settle_byes`
/// runs before the stream ends). When 3 is lost instead and the reorder wait ends the stream,
/// `handle_timeout` ends it without settling B's BYE: the speakers leave in slot order, A
/// (who never said BYE) before B. A user expects the same order either way: B, then A.
#[test]
fn a_mixer_sources_deferred_bye_leaves_first_when_the_mixers_bye_waits_out_the_gap() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1100, 9, 2, b"Bravo "));
    let mut own = Vec::new();
    pvp_t140::rtp::write_packet(&mut own, false, 98, 4, 1300, 9, b"Mixer note. ");
    gw.handle_datagram(at(20), addr(5000), &own);
    gw.handle_datagram(at(30), addr(5000), &mixer_bye(2));
    let mut bye = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
    pvp_t140::rtcp::write_bye(&mut bye, 9);
    gw.handle_datagram(at(40), addr(5000), &bye);
    // The gap is given up at 1020; the mixer's stream ends at the wait from its BYE, 1040.
    gw.handle_timeout(at(1040));
    let out = drain(&mut gw);
    assert_eq!(gw.stats().streams_live, 0);
    let leaves: Vec<&str> = out
        .iter()
        .filter(|e| e.kind == "session.leave")
        .map(|e| e.sender.rsplit('/').next().unwrap_or(""))
        .collect();
    assert_eq!(
        leaves,
        [
            "csrc:00000002",
            "csrc:00000001",
            "t140:00000009@127.0.0.1:5000"
        ]
    );
}

/// RFC 3550 6.3.7: a BYE may overtake any of its source's last packets, not only those behind
/// the gap. Here the source sent 1 "Hello ", 2 "there ", 3 "world. ", 4 "Bye. ", then its BYE;
/// 2 is late, and the BYE overtakes 4 too. 4 is unmarked and follows 3 at once: the old
/// session's, not a new one's first packet (RFC 4103 5.2 marks that, with a new random
/// sequence number, RFC 3550 5.1). A user expects one participant saying
/// "Hello there world." and "Bye." and leaving once. Before the fix, 4, being beyond the newest held
/// packet, is judged "sent after the BYE": the old stream ends at once with its gap given up
/// ("Hello \u{fffd}world."), and 4 opens a second stream (waiting for its head) in which the
/// late 2 then lands: a ghost participant joins again to say "\u{fffd}there \u{fffd}Bye.",
/// two loss marks where nothing was lost.
#[test]
fn a_packet_the_bye_overtook_beyond_the_newest_held_stays_in_the_old_stream() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    gw.handle_datagram(at(615), addr(4000), &t140(4, 7, "Bye. "));
    gw.handle_datagram(at(620), addr(4000), &t140(2, 7, "there "));
    gw.handle_timeout(at(3000));
    gw.shutdown(at(5000));
    let out = events_of(&drain(&mut gw), "");
    assert_eq!(
        out,
        [
            pair("session.join", ""),
            pair("context.add", "Hello there world."),
            pair("context.add", "Bye."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().lost, 0);
}

/// A sender that said BYE starts its next session under the same address and SSRC (as in
/// [`a_new_session_after_a_waiting_bye_is_not_taken_into_the_old_stream`]). T.140 sends RTP only
/// when there is text, so the new session's first compound RTCP (RR, SDES NAME "Alice") comes
/// before its first RTP packet. The old stream's BYE overtook its packet 3, which waits for
/// the lost 2. A user expects the new session's participant to join as "Alice", as when the
/// old stream ended at its BYE (the SDES then waited in the early names for the new stream).
/// Before the fix, the SDES is routed to the old stream, which said BYE and only waits for its gap:
/// the leaving participant joins (and leaves) as "Alice", and the new session joins with the
/// default name "T.140 00000007 (127.0.0.1:4000)".
#[test]
fn a_new_sessions_sdes_while_the_old_bye_waits_names_the_new_session() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    let mut rtcp = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rtcp, 7);
    rtcp.extend(sdes_chunks(&[(7, "alice@host", "Alice")]));
    gw.handle_datagram(at(650), addr(4000), &rtcp);
    gw.handle_datagram(at(700), addr(4000), &t140m(40000, 7, true, "Hi again. "));
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    let joins: Vec<&serde_json::Value> = out
        .iter()
        .filter(|e| e.kind == "session.join")
        .map(|e| &e.payload["participant"]["name"])
        .collect();
    assert_eq!(joins.len(), 2, "{:?}", events_of(&out, ""));
    assert_eq!(
        joins[1],
        &serde_json::json!("Alice"),
        "the new session's SDES NAME did not name its join: {:?}",
        out.iter()
            .map(|e| (&e.kind, &e.payload))
            .collect::<Vec<_>>()
    );
}

/// While a stream's BYE waits, another source took its SSRC (the BYE freed it). The old
/// source's next session then sends its first (marked) packet: it cannot open a stream (the
/// SSRC is taken: dropped as a conflict), and must not end the old stream early either, whose
/// late packet 2 then still fills its gap: "Hello there world.", no loss.
#[test]
fn a_conflicting_packet_after_a_waiting_bye_leaves_the_old_stream_waiting() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    gw.handle_datagram(at(620), addr(4002), &t140(1, 7, "Other. "));
    gw.handle_datagram(at(630), addr(4000), &t140m(40_000, 7, true, "Next. "));
    assert_eq!(gw.stats().drops(pvp_t140::DropReason::SsrcConflict), 1);
    gw.handle_datagram(at(640), addr(4000), &t140(2, 7, "there "));
    gw.handle_timeout(at(1610));
    let out = drain(&mut gw);
    let old: Vec<(String, String)> = events_of(&out, "")
        .into_iter()
        .zip(&out)
        .filter(|(_, e)| e.sender.ends_with(":4000"))
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        old,
        [
            pair("session.join", ""),
            pair("context.add", "Hello there world."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().lost, 0);
}

/// A marked packet past the last received (here the newest held, 3) by more than a BYE can
/// have overtaken (`OVERTAKEN_MARKED`, 16) starts the source's next session (RFC 4103 5.2), even numbered on
/// from the old one: the old stream ends with its gap given up, and the packet opens the new
/// stream, which joins again. (One marked closer is the old session's last words after a pause:
/// `a_marked_packet_the_bye_overtook_after_a_pause_and_a_loss_is_the_speakers_last_words`.)
#[test]
fn a_marked_packet_well_past_a_waiting_bye_starts_a_new_session() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    gw.handle_datagram(at(700), addr(4000), &t140m(3 + 17, 7, true, "New. "));
    let out = events_of(&drain(&mut gw), "");
    assert_eq!(
        out,
        [
            pair("session.join", ""),
            pair("context.add", "Hello \u{fffd}world."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "New."),
        ]
    );
}

/// RFC 3550 6.3.7 / RFC 4103 5.4: the source sent 1 "Hello ", 2 "there ", 3 "world. ",
/// 4 "now. ", 5 "Bye. ", then its BYE. 2 and 4 are reordered: 3 waits for 2 when the BYE
/// comes (the BYE's wait marks 3), 5 arrives and waits for 4 (unmarked, continuing: the old
/// session's), then 2 and, 10 ms later, 4 arrive, both well within the reorder wait. A user
/// expects one participant saying all of it and leaving once, nothing marked lost. Instead
/// the stream ends the moment 3 is delivered: 4's gap is given up at once although its wait
/// has hardly begun ("\u{fffd}Bye."), and the late 4 opens a second stream: a ghost
/// participant joins again to say "now." after a lost-head mark.
#[test]
fn a_waiting_bye_does_not_give_up_a_later_gap_before_its_reorder_wait() {
    let mut gw = bye_overtaking_packet_2(Config::default());
    gw.handle_datagram(at(615), addr(4000), &t140(5, 7, "Bye. "));
    gw.handle_datagram(at(620), addr(4000), &t140(2, 7, "there "));
    gw.handle_datagram(at(630), addr(4000), &t140(4, 7, "now. "));
    gw.handle_timeout(at(3000));
    gw.shutdown(at(5000));
    let out = events_of(&drain(&mut gw), "");
    assert_eq!(
        out,
        [
            pair("session.join", ""),
            pair("context.add", "Hello there world."),
            pair("context.add", "now."),
            pair("context.add", "Bye."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().lost, 0);
}

/// The mixer counterpart of
/// A mixer (SSRC 9, 127.0.0.1:5000) whose source 1 said "Alpha " and "goes on. " (its packet
/// 2 lost, 3 held) says BYE; its next session's compound RTCP names `source` (CSRC, CNAME,
/// NAME), then its first RTP packet (marked, a new sequence) carries `text` from that source.
/// What the gateway said until its shutdown.
fn mixer_next_session_after_waiting_bye(source: (u32, &str, &str), text: &[u8]) -> Vec<Envelope> {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(600), addr(5000), &with_csrc(3, 1200, 9, 1, b"goes on. "));
    let mut bye = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
    pvp_t140::rtcp::write_bye(&mut bye, 9);
    gw.handle_datagram(at(610), addr(5000), &bye);
    let mut rtcp = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
    rtcp.extend(sdes_chunks(&[(9, "mix@host", "Mixer"), source]));
    gw.handle_datagram(at(650), addr(5000), &rtcp);
    let payload = [&b"\xef\xbb\xbf"[..], text].concat();
    let mut first = with_csrc(40_000, 90_000, 9, source.0, &payload);
    first[1] |= 0x80;
    gw.handle_datagram(at(700), addr(5000), &first);
    gw.shutdown(at(5000));
    drain(&mut gw)
}

/// [`a_new_sessions_sdes_while_the_old_bye_waits_names_the_new_session`]: a mixer (SSRC 9)
/// says BYE while its packet 3 (source 1's) waits for the lost 2, and starts its next session
/// under the same address and SSRC; that session's first compound RTCP carries SDES for the
/// mixer and for its source 1, NAME "Alice" (RFC 3550 6.5, 7.3), before its first RTP packet
/// (marked, new random sequence number). A user expects source 1's participant in the new
/// session to join as "Alice", as the stream's own NAME now does. Before the fix, the CSRC's name is
/// given to the old, leaving stream's speaker of CSRC 1 (its `home` is the waiting stream):
/// the leaving participant takes the name "Alice", and the new session's speaker joins with
/// the default name (here the old speaker, which joins with its first chunk, even joins as
/// "Alice").
#[test]
fn a_mixers_new_session_sdes_for_its_sources_while_its_bye_waits_names_the_new_session() {
    let out = mixer_next_session_after_waiting_bye((1, "alice@host", "Alice"), b"Hi again. ");
    let joins: Vec<&serde_json::Value> = out
        .iter()
        .filter(|e| e.kind == "session.join" && e.sender.ends_with("csrc:00000001"))
        .map(|e| &e.payload["participant"]["name"])
        .collect();
    assert_eq!(joins.len(), 2, "{:?}", events_of(&out, ""));
    assert_eq!(
        joins[1],
        &serde_json::json!("Alice"),
        "the new session's SDES NAME for its source did not name its join: {:?}",
        out.iter()
            .map(|e| (&e.kind, &e.sender, &e.payload))
            .collect::<Vec<_>>()
    );
}

/// The packet that starts the next session after a waiting BYE is received again once the old
/// stream has ended (it opens the new one); what its parse counts is counted once: here a
/// t140llm metadata packet (`MD:{...}`, marked), one in the `metadata` counter.
#[test]
fn a_next_sessions_first_packet_after_a_waiting_bye_is_counted_once() {
    let mut gw = bye_overtaking_packet_2(Config {
        compat: pvp_t140::gateway::Compat::T140llm,
        ..Config::default()
    });
    gw.handle_datagram(at(700), addr(4000), &t140m(40_000, 7, true, "MD:{\"a\":1}"));
    let stats = gw.stats();
    assert_eq!((stats.metadata, stats.streams_live), (1, 1));
}

/// As [`a_mixers_new_session_sdes_for_its_sources_while_its_bye_waits_names_the_new_session`],
/// but the new session's first packet is from a source the old session never had (CSRC 2,
/// NAME "Bob" in the new session's SDES). A user expects Bob to join the new session as
/// "Bob". Before the fix, the packet made CSRC 2's speaker in the old, waiting stream first,
/// which took the early name, and only then ended that stream: Bob joined nameless.
#[test]
fn a_mixers_new_source_after_its_waiting_bye_takes_its_early_name_into_the_new_session() {
    let out = mixer_next_session_after_waiting_bye((2, "bob@host", "Bob"), b"Bravo here. ");
    let joins: Vec<&serde_json::Value> = out
        .iter()
        .filter(|e| e.kind == "session.join" && e.sender.ends_with("csrc:00000002"))
        .map(|e| &e.payload["participant"]["name"])
        .collect();
    assert_eq!(
        joins,
        [&serde_json::json!("Bob")],
        "{:?}",
        out.iter()
            .map(|e| (&e.kind, &e.sender, &e.payload))
            .collect::<Vec<_>>()
    );
}

/// One SDES chunk for `ssrc` with one item (`kind` 1 CNAME, 2 NAME).
fn sdes_item(ssrc: u32, kind: u8, text: &str) -> Vec<u8> {
    let mut d = vec![0x81, 202, 0, 0];
    d.extend_from_slice(&ssrc.to_be_bytes());
    d.push(kind);
    d.push(text.len() as u8);
    d.extend_from_slice(text.as_bytes());
    d.push(0);
    while d.len() % 4 != 0 {
        d.push(0);
    }
    let words = (d.len() / 4 - 1) as u16;
    d[2..4].copy_from_slice(&words.to_be_bytes());
    d
}

/// README and [`Gateway`]'s rule: a NAME is never replaced by a CNAME. A sender whose NAME is
/// the same text as its CNAME ("ada@host") sends the CNAME first, then the NAME: the name does
/// not change, and (before the fix) neither did its rank, so a later CNAME ("ada@laptop", a
/// new host) replaced the NAME.
#[test]
fn a_name_equal_to_the_cname_is_still_a_name_no_cname_replaces() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. "));
    gw.handle_datagram(at(10), addr(4000), &sdes_item(7, 1, "ada@host"));
    gw.handle_datagram(at(20), addr(4000), &sdes_item(7, 2, "ada@host"));
    gw.handle_datagram(at(30), addr(4000), &sdes_item(7, 1, "ada@laptop"));
    let names: Vec<serde_json::Value> = drain(&mut gw)
        .into_iter()
        .filter(|e| e.kind == "participant.announce")
        .map(|e| e.payload["name"].clone())
        .collect();
    assert_eq!(names, [serde_json::json!("ada@host")]);
}

/// A mixer (SSRC 9) that shuts down sends one BYE listing its own SSRC and the CSRCs it
/// handles (RFC 3550 6.6), here the CSRC first; the BYE overtakes the mixer's last packet,
/// source 1's "Bye now.". The mixer's stream lingers for that packet, but the CSRC's BYE ended
/// its speaker at once, so the late packet joined the same participant a second time (join,
/// "Alpha says hi.", leave, join, "Bye now.", leave). The sources leave with the mixer's
/// stream: one join and one leave for source 1, its late words in between.
#[test]
fn a_mixer_shutting_down_lists_its_sources_and_they_leave_once_after_its_late_packet() {
    for own_first in [true, false] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(
            at(0),
            addr(5000),
            &with_csrc(1, 1000, 9, 1, b"Alpha says hi. "),
        );
        let mut bye = Vec::new();
        pvp_t140::rtcp::write_rr(&mut bye, 9);
        bye.extend_from_slice(&[0x82, 203, 0, 2]);
        let (a, b) = if own_first { (9u32, 1u32) } else { (1, 9) };
        bye.extend_from_slice(&a.to_be_bytes());
        bye.extend_from_slice(&b.to_be_bytes());
        gw.handle_datagram(at(100), addr(5001), &bye);
        gw.handle_datagram(at(110), addr(5000), &with_csrc(2, 1300, 9, 1, b"Bye now."));
        gw.handle_timeout(at(1100));
        let out = drain(&mut gw);
        assert_eq!(
            events_of(&out, "1"),
            [
                pair("session.join", ""),
                pair("context.add", "Alpha says hi."),
                pair("context.add", "Bye now."),
                pair("session.leave", ""),
            ],
            "own SSRC listed first: {own_first}"
        );
        assert_eq!(gw.stats().streams_live, 0);
    }
}

/// A BYE that came while packet 3 was held behind the gap of 2; 2 arrives and fills it, then
/// 4, which the sender also sent before its BYE (the BYE overtook 2, 3 and 4). The stream
/// ended the moment the gap filled, so 4 opened a second participant ("\u{fffd}four.", another
/// join and leave). The stream lingers for the whole reorder wait from the BYE: one participant
/// saying "One two three four.", nothing marked lost.
#[test]
fn a_bye_that_overtook_a_gap_and_a_packet_after_it_waits_for_both() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "One "));
    gw.handle_datagram(at(50), addr(4000), &t140(3, 7, "three "));
    gw.handle_datagram(at(100), addr(4001), &stream_bye(7));
    gw.handle_datagram(at(105), addr(4000), &t140(2, 7, "two "));
    gw.handle_datagram(at(110), addr(4000), &t140(4, 7, "four."));
    gw.handle_timeout(at(1100));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, ""),
        [
            pair("session.join", ""),
            pair("context.add", "One two three four."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().streams_live, 0);
    assert_eq!((gw.stats().head_lost, gw.stats().lost), (0, 0));
}

/// RFC 3550 6.3.7: a BYE may overtake its source's last packets. A mixer forwards its
/// source's BYE in its RTCP (RFC 3550 6.6), which travels apart from the mixer's RTP, so B's
/// last packet (3, sent at mixer time 1115, before the BYE) can arrive just after B's BYE
/// while nothing is held: nothing tells the gateway a packet is missing. A user expects B to
/// say "Bravo ends." and leave once. (B left at its BYE, and its late 3 made it join again
/// to say "ends.": a second participation, no leave after it until the stream ended.)
#[test]
fn a_mixer_sources_bye_that_overtook_its_last_packet_with_nothing_held_keeps_it() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(120), addr(5000), &bye);
    gw.handle_datagram(at(125), addr(5000), &with_csrc(3, 1115, 9, 2, b"ends. "));
    // The stream goes on: A speaks again well after the wait.
    gw.handle_timeout(at(3000));
    gw.handle_datagram(at(3100), addr(5000), &with_csrc(4, 4100, 9, 1, b"More. "));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo ends."),
            pair("session.leave", ""),
        ]
    );
    // The leave comes when the reorder wait from the BYE is over, stamped then.
    let leave = out
        .iter()
        .find(|e| e.kind == "session.leave" && e.sender.ends_with("csrc:00000002"))
        .expect("B leaves");
    assert_eq!(leave.ts, at(1120).to_iso8601());
    assert_eq!(gw.live_streams(), 1);
}

/// As above, with packets held when the BYE comes: B's last packet (5) was sent after the
/// newest held (A's 4) and before B's BYE, and the BYE overtook it. A user expects it to be
/// B's last words, not a second participation. (B's leave waited only for the packets held
/// when its BYE came: 5 came after them and joined B again.)
#[test]
fn a_mixer_sources_packet_its_bye_overtook_beyond_the_newest_held_stays_before_its_leave() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    // A's 3 is late; A's 4 waits for it.
    gw.handle_datagram(at(30), addr(5000), &with_csrc(4, 1030, 9, 1, b"goes on. "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(60), addr(5000), &bye);
    // B's 5, sent at 1055 (before the BYE), then A's late 3.
    gw.handle_datagram(at(70), addr(5000), &with_csrc(5, 1055, 9, 2, b"ends. "));
    gw.handle_datagram(at(80), addr(5000), &with_csrc(3, 1020, 9, 1, b"still "));
    gw.handle_timeout(at(3000));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo ends."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.stats().lost, 0);
}

/// A source that speaks again well after its BYE, within the reorder wait, is a participant
/// again (RFC 3550 6.3.7): its text from before the BYE, the leave, then a join and the new
/// text, with nothing held at the BYE. Its timestamp (mixer time 1400, 300 ms after the BYE
/// came) cannot have been sent before the BYE.
#[test]
fn a_mixer_source_speaking_again_after_its_bye_with_nothing_held_joins_again() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(100), addr(5000), &bye);
    gw.handle_datagram(at(400), addr(5000), &with_csrc(3, 1400, 9, 2, b"Back. "));
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", ""),
            pair("session.join", ""),
            pair("context.add", "Back."),
            pair("session.leave", ""),
        ]
    );
}

/// A mixer may send its RTCP compound, BYE included, more than once (RFC 3550 6.6 forwards
/// every BYE it gets). A source's BYE repeated within its wait, with no word in between,
/// ends it once: one leave, at the end of the first BYE's wait.
#[test]
fn a_mixer_sources_repeated_bye_leaves_once() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo. "));
    let bye = mixer_bye(2);
    gw.handle_datagram(at(100), addr(5000), &bye);
    gw.handle_datagram(at(300), addr(5000), &bye);
    gw.handle_timeout(at(5000));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo."),
            pair("session.leave", ""),
        ]
    );
    let leave = out
        .iter()
        .find(|e| e.kind == "session.leave" && e.sender.ends_with("csrc:00000002"))
        .expect("B leaves");
    assert_eq!(leave.ts, at(1100).to_iso8601());
}

/// With no reorder wait (`--reorder-wait-ms 0`: the operator wants no packet waited for), a
/// mixer source's BYE ends it at once.
#[test]
fn a_mixer_sources_bye_with_no_reorder_wait_ends_it_at_once() {
    let mut gw = Gateway::new(Config {
        reorder_wait: std::time::Duration::ZERO,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"Alpha. "));
    gw.handle_datagram(at(10), addr(5000), &with_csrc(2, 1010, 9, 2, b"Bravo "));
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    assert_eq!(
        events_of(&drain(&mut gw), "csrc:00000002"),
        [
            pair("session.join", ""),
            pair("context.add", "Bravo"),
            pair("session.leave", ""),
        ]
    );
}

/// RFC 4103 5.2 marks the first packet after an idle period, so a speaker's last words after a
/// pause come in a marked packet, and a sender that hangs up right after them sends its BYE
/// next. Here the packet before the pause (2, the empty block that begins the idle period) is
/// lost, and the BYE (on the RTCP port, read apart from RTP) overtakes the marked 3. A user
/// expects one participant saying "Hello.", the loss and "Goodbye.", and leaving once. (The
/// marked 3, one past the next expected, was taken for the next session: the old participant
/// left at once, and a second one joined to say "Goodbye." and stayed until its stream timed
/// out.)
#[test]
fn a_marked_packet_the_bye_overtook_after_a_pause_and_a_loss_is_the_speakers_last_words() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. "));
    // 2, the empty block 300 ms later, is lost.
    let (rtcp, bye) = own_bye_from_next_port();
    gw.handle_datagram(at(5000), rtcp, &bye);
    gw.handle_datagram(at(5010), addr(4000), &t140m(3, 7, true, "Goodbye. "));
    gw.handle_timeout(at(7000));
    let out = drain(&mut gw);
    assert_eq!(
        events_of(&out, ""),
        [
            pair("session.join", ""),
            pair("context.add", "Hello."),
            pair("context.add", "\u{fffd}Goodbye."),
            pair("session.leave", ""),
        ]
    );
    assert_eq!(gw.live_streams(), 0);
}

/// README's example rule (`rtcp_name = "Alice"`, a participant id and a display `name`), with
/// `unmatched = "refuse"`. A mixer's source that matched it, left (its BYE, forwarded by the
/// mixer) and speaks again joins again (README: "a packet of it stamped later than that is said
/// after the BYE: it joins again"), as what the rule made it. The mapping was asked again at
/// that join, with the name the rule itself set ("Alice (captions)"): no rule matched, and the
/// speaker was refused for good, everything it said after its BYE lost (review, session 32).
#[test]
fn a_mixer_source_matched_by_rtcp_name_is_not_refused_when_it_joins_again() {
    let mut gw = Gateway::new(Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_rtcp_name: Some("Alice".into()),
                participant: Some("alice".into()),
                name: Some("Alice (captions)".into()),
                ..Rule::default()
            }],
            unmatched: Unmatched::Refuse,
        },
        ..Config::default()
    });
    // The mixer's compound: RR, then SDES for itself and its source 2.
    let mut rtcp = vec![0x80, 201, 0, 1, 0, 0, 0, MIXER as u8];
    rtcp.extend(sdes_chunks(&[
        (MIXER, "mixer@host", "Mixer"),
        (2, "alice@host", "Alice"),
    ]));
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Other. "));
    gw.handle_datagram(at(10), addr(5000), &rtcp);
    gw.handle_datagram(
        at(20),
        addr(5000),
        &with_csrc(2, 1100, MIXER, 2, b"First. "),
    );
    // Source 2 leaves, then speaks again well after its BYE.
    gw.handle_datagram(at(100), addr(5000), &mixer_bye(2));
    run_timers(&mut gw, 1500);
    gw.handle_datagram(
        at(3000),
        addr(5000),
        &with_csrc(3, 4000, MIXER, 2, b"Back again. "),
    );
    gw.handle_datagram(at(3010), addr(5000), &rtcp);
    run_timers(&mut gw, 6000);
    let out = drain(&mut gw);
    assert_eq!(
        text_of(&out, "alice"),
        "First. Back again.",
        "{:#?}",
        timeline(&out)
    );
}

/// `[[stream]] rtcp_name` is "RTCP SDES NAME (or CNAME) to match" (src/config_file.rs), and an
/// SDES item may be up to 255 octets (RFC 3550 6.5). The mapping was handed the display name,
/// cut to 128 characters: a rule naming a sender's 150-character CNAME never matched it, and
/// with `unmatched = "refuse"` the sender's text was dropped (review, session 32). The display
/// name is still cut (`an_sdes_name_carries_no_control_characters`).
#[test]
fn a_rule_matches_an_sdes_cname_longer_than_the_display_name_limit() {
    let cname = format!("{}@example.org", "captioner-".repeat(14));
    assert!(cname.len() > 128 && cname.len() < 255);
    let mut gw = Gateway::new(Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_rtcp_name: Some(cname.clone()),
                participant: Some("captions".into()),
                ..Rule::default()
            }],
            unmatched: Unmatched::Refuse,
        },
        ..Config::default()
    });
    // The sender's compound (RR, SDES CNAME) before its first text.
    let mut rtcp = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rtcp, 7);
    pvp_t140::rtcp::write_sdes(&mut rtcp, 7, &cname, None);
    gw.handle_datagram(at(0), addr(5000), &rtcp);
    gw.handle_datagram(at(10), addr(5000), &t140(1, 7, "Hello there. "));
    run_timers(&mut gw, 5000);
    let out = drain(&mut gw);
    assert_eq!(
        text_of(&out, "captions"),
        "Hello there.",
        "{:#?}",
        timeline(&out)
    );
}

fn sdes_name_of(ssrc: u32, cname: &str, name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, cname, Some(name));
    d
}

/// A speaker's SDES name is kept as it came (for `rtcp_name` rules) and cleaned when shown: a
/// NAME that differs from the last only by what cleaning removes (a control character) is the
/// name the participant already has, and is not announced again (README: "SDES NAME (else
/// CNAME), without control characters, becomes the participant's name"). Raw names were
/// compared, and "Ada" was announced twice (review, session 32).
#[test]
fn an_sdes_name_shown_the_same_is_not_announced_again() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "hi. "));
    gw.handle_datagram(at(1), addr(4000), &sdes_name_of(7, "ada@host", "Ada\u{7}"));
    gw.handle_datagram(at(2), addr(4000), &sdes_name_of(7, "ada@host", "Ada"));
    let out = drain(&mut gw);
    let announced: Vec<_> = out
        .iter()
        .filter(|e| e.kind == "participant.announce")
        .map(|e| e.payload["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        announced,
        ["Ada"],
        "one announce of the name shown: {out:#?}"
    );
}

/// A NAME item of nothing but control characters leaves no name, so the CNAME names the
/// participant, as when the NAME is not UTF-8 (README "RTCP": "SDES NAME (else CNAME), without
/// control characters"). The items were ranked before cleaning: the unusable NAME beat the
/// CNAME and the participant joined unnamed (review, session 36).
#[test]
fn a_name_item_of_only_controls_falls_back_to_the_cname() {
    let mut gw = Gateway::new(Config::default());
    let mut c = Vec::new();
    pvp_t140::rtcp::write_rr(&mut c, 7);
    pvp_t140::rtcp::write_sdes(&mut c, 7, "alice@example.org", Some("\u{7}\u{1b}"));
    gw.handle_datagram(at(0), addr(4000), &c);
    gw.handle_datagram(at(10), addr(4000), &t140(1, 7, "Hello there. "));
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    assert_eq!(join.payload["participant"]["name"], "alice@example.org");
}

/// A mixer's SDES for a source not heard yet is kept for that source's speaker, and only for
/// it: at the speaker bound with no place to make, the source's packet goes to the stream's
/// own voice, made then, which speaks for every source past the bound and does not join under
/// the source's name. It joined as "Zed", and an `rtcp_name = "Zed"` rule would have mapped it
/// (review, session 33).
#[test]
fn a_sources_early_name_does_not_name_the_own_voice_at_the_speaker_bound() {
    let mut gw = Gateway::new(Config::default());
    // Sources 1..=32 type with no sentence end: all 32 places hold text.
    for c in 1..=32u16 {
        let d = with_csrc(c, 1000 + u32::from(c), MIXER, u32::from(c), b"typing");
        gw.handle_datagram(at(u64::from(c)), addr(5000), &d);
    }
    // The mixer's compound: its RR, then SDES for source 33 (RFC 3550 6.5, 7.3).
    let mut rtcp = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rtcp, MIXER);
    pvp_t140::rtcp::write_sdes(&mut rtcp, 33, "zed@host", Some("Zed"));
    gw.handle_datagram(at(100), addr(5000), &rtcp);
    let d = with_csrc(33, 1101, MIXER, 33, b"Zed speaks. ");
    gw.handle_datagram(at(101), addr(5000), &d);
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join" && e.sender == "t140:00000009@127.0.0.1:5000")
        .expect("the own voice speaks for source 33");
    assert_ne!(
        join.payload["participant"]["name"], "Zed",
        "the mixer's own participant took source 33's SDES name"
    );
}

/// RTCP is bounds-checked (rtcp.rs: "a malformed compound packet yields what was valid before
/// the damage and an error count"). A BYE's optional reason is a length octet and that many
/// octets within the packet (RFC 3550 6.6): one whose length (200) runs past its packet (3) is
/// `rtcp_malformed`, and its SSRC list, before the damage, still ends the stream. The reason
/// was not looked at (review, session 33).
#[test]
fn a_bye_whose_reason_runs_past_its_packet_is_counted_malformed() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. "));
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, 7);
    d.extend_from_slice(&[0x81, 203, 0, 2, 0, 0, 0, 7, 200, b'b', b'y', b'e']);
    let mut byes = 0;
    let valid = pvp_t140::rtcp::parse(&d, &mut |e| {
        byes += usize::from(matches!(e, pvp_t140::rtcp::RtcpEvent::Bye { ssrc: 7 }))
    });
    gw.handle_datagram(at(10), addr(4000), &d);
    assert_eq!(
        (valid, byes, gw.stats().drops(DropReason::RtcpMalformed)),
        (false, 1, 1),
        "(parse said valid, BYEs told, rtcp_malformed drops)"
    );
    gw.handle_timeout(at(10 + 1000));
    let out = drain(&mut gw);
    let leave = out
        .iter()
        .find(|e| e.kind == "session.leave")
        .expect("the BYE ends it");
    assert_eq!(leave.payload["reason"], "rtcp bye");
    // A reason that fits, padded to 32 bits, is valid.
    let d = [0x81, 203, 0, 2, 0, 0, 0, 7, 3, b'b', b'y', b'e'];
    assert!(pvp_t140::rtcp::parse(&d, &mut |_| {}));
}

/// The same for reports (RFC 3550 6.4.1, 6.4.2): a sender report whose RC says 2 report
/// blocks of 24 octets and whose length holds none is `rtcp_malformed`. Its sender's SSRC was
/// read and the rest skipped unchecked (review, session 33).
#[test]
fn a_report_claiming_more_blocks_than_it_holds_is_counted_malformed() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Hello. "));
    let mut d = Vec::new();
    pvp_t140::rtcp::write_sr(&mut d, 7, 0, 0, 0, 0);
    d[0] |= 2; // RC = 2
    gw.handle_datagram(at(10), addr(4000), &d);
    let mut rr = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rr, 7);
    rr[0] |= 1; // RC = 1
    gw.handle_datagram(at(20), addr(4000), &rr);
    assert_eq!(gw.stats().drops(DropReason::RtcpMalformed), 2);
}

/// RR + SDES (CNAME, NAME) of `ssrc`, and its BYE when `bye`.
fn sdes(ssrc: u32, name: &str, bye: bool) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, ssrc);
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, "user@192.0.2.7", Some(name));
    if bye {
        pvp_t140::rtcp::write_bye(&mut d, ssrc);
    }
    d
}

/// What the shell does after each batch with `--workers N` (`RtcpShare::hand_on`, then
/// `handle_shared_rtcp` on every other worker): `from`'s kept RTCP handed to `to`.
fn hand_on(from: &mut Gateway, to: &mut Gateway, now: pvp_t140::Time) -> usize {
    let kept = from.take_shared_rtcp();
    for (source, data) in &kept {
        to.handle_shared_rtcp(now, *source, data);
    }
    kept.len()
}

/// The session of SSRC 0x77 from 192.0.2.7: its SDES before its first text (RTCP comes first
/// in a session; a T.140 user is silent until they type), its text, its BYE, all rtcp-mux from
/// one socket (port 5000), then, after the stream is gone, a new session of the same host and
/// SSRC from another port (6000). `a` and `b` stand for two workers: the kernel hashed port
/// 5000 to `a`, port 6000 to `b`; without `workers`, `a` is a single worker given
/// everything. Returns the second session's envelopes (from `b`, or `a`), as JSON text.
fn second_session(workers: bool) -> Vec<String> {
    let (h1, h2): (SocketAddr, SocketAddr) = (
        "192.0.2.7:5000".parse().unwrap(),
        "192.0.2.7:6000".parse().unwrap(),
    );
    let mut a = Gateway::new(Config::default());
    let mut b = Gateway::new(Config::default());
    a.share_rtcp();
    b.share_rtcp();
    let ssrc = 0x77;
    a.handle_datagram(at(0), h1, &sdes(ssrc, "Old Session", false));
    // `a` holds no stream for it yet: it keeps the name and hands it on.
    assert_eq!(hand_on(&mut a, &mut b, at(0)), 1, "premise: handed on");
    a.handle_datagram(at(100), h1, &t140(1, ssrc, "Hello. "));
    a.handle_datagram(at(400), h1, &t140(2, ssrc, "Bye. "));
    a.handle_datagram(at(700), h1, &sdes(ssrc, "Old Session", true));
    // `a` holds the stream and ends it; `b` forgets the name it was handed.
    hand_on(&mut a, &mut b, at(700));
    a.handle_timeout(at(5_000));
    let first: Vec<String> = drain(&mut a)
        .iter()
        .map(|m| serde_json::to_string(m).unwrap())
        .collect();
    assert!(
        first
            .iter()
            .any(|m| m.contains("session.join") && m.contains("Old Session")),
        "premise: the first session joined named: {first:?}"
    );
    assert!(
        first.iter().any(|m| m.contains("session.leave")),
        "premise: the first session left for its BYE: {first:?}"
    );
    // The next session: same host, same SSRC (a client with a configured SSRC), another port.
    let second = if workers { &mut b } else { &mut a };
    second.handle_datagram(at(120_000), h2, &t140(1, ssrc, "New here. "));
    second.handle_timeout(at(125_000));
    drain(second)
        .iter()
        .map(|m| serde_json::to_string(m).unwrap())
        .collect()
}

/// `--workers N`: an SDES name handed to the other workers before its stream's first packet
/// (the worker that read it held no stream for it yet) does not outlive the BYE of the stream
/// the reading worker then opened: the BYE is handed on too, and the others forget their
/// copies, so a later session of the same host and SSRC that the kernel hashes to another
/// worker joins unnamed, as with one worker (README, Streams: a name is kept for a stream from
/// the same host and SSRC "unless a BYE came"). A review found the copies survived and the new
/// session joined under the ended session's name (review, session 34).
#[test]
fn a_name_handed_to_other_workers_does_not_outlive_the_bye_of_its_stream() {
    let one = second_session(false);
    assert!(
        one.iter().any(|m| m.contains("session.join"))
            && !one.iter().any(|m| m.contains("Old Session")),
        "premise: one worker joins the new session unnamed: {one:?}"
    );
    let two = second_session(true);
    assert!(two.iter().any(|m| m.contains("session.join")), "{two:?}");
    let stale: Vec<&String> = two.iter().filter(|m| m.contains("Old Session")).collect();
    assert!(
        stale.is_empty(),
        "with two workers the new session carries the ended session's name: {stale:?}"
    );
}

/// `--workers N`: a BYE that ends a stream on the worker that read it is handed on only for
/// the others to forget what they kept for it: a stream of the same host and SSRC from another
/// port on another worker (a second instance of a client with a configured SSRC) is not ended
/// nor renamed by it, as with one worker, where the BYE finds its own stream by its address
/// (README, RTCP).
#[test]
fn a_bye_handed_on_for_a_stream_ended_elsewhere_ends_nothing_of_the_other_worker() {
    let (h1, h2): (SocketAddr, SocketAddr) = (
        "192.0.2.7:5000".parse().unwrap(),
        "192.0.2.7:6000".parse().unwrap(),
    );
    let mut a = Gateway::new(Config::default());
    let mut b = Gateway::new(Config::default());
    a.share_rtcp();
    b.share_rtcp();
    let ssrc = 0x77;
    a.handle_datagram(at(0), h1, &t140(1, ssrc, "First. "));
    b.handle_datagram(at(0), h2, &t140(1, ssrc, "Second. "));
    a.handle_datagram(at(300), h1, &sdes(ssrc, "First Caller", true));
    assert_eq!(hand_on(&mut a, &mut b, at(300)), 1, "premise: handed on");
    b.handle_datagram(at(2_000), h2, &t140(2, ssrc, "Still here. "));
    b.handle_timeout(at(5_000));
    let out: Vec<String> = drain(&mut b)
        .iter()
        .map(|m| serde_json::to_string(m).unwrap())
        .collect();
    assert!(
        !out.iter()
            .any(|m| m.contains("session.leave") || m.contains("First Caller")),
        "the other worker's stream was ended or renamed by a BYE not its own: {out:?}"
    );
    assert!(out.iter().any(|m| m.contains("Still here.")), "{out:?}");
}

/// An SDES item ended with a C string's NUL, or begun with a BOM (neither is RFC 3550 6.5's
/// UTF-8 text, but senders do it): the display name dropped them, the `rtcp_name` rule's
/// match did not, so a rule for "Alice" refused "Alice\0" and all she said was lost.
#[test]
fn an_sdes_name_with_a_trailing_nul_or_a_bom_matches_its_rule() {
    for sent in [
        "Alice\u{0}",
        "Alice\u{0}\u{0}\u{0}",
        "\u{feff}Alice",
        " Alice ",
    ] {
        let mut gw = Gateway::new(Config {
            mapping: alice_rule(Unmatched::Refuse),
            ..Config::default()
        });
        let mut d = Vec::new();
        pvp_t140::rtcp::write_sdes(&mut d, 7, "alice@host", Some(sent));
        gw.handle_datagram(at(0), addr(4001), &d);
        gw.handle_datagram(at(1), addr(4000), &t140(1, 7, "Hello. "));
        gw.shutdown(at(5_000));
        let out = drain(&mut gw);
        assert_eq!(text_of(&out, "alice"), "Hello.", "{sent:?}: {out:#?}");
    }
}

/// A name over the 128 characters kept is cut between grapheme clusters: cut between a letter
/// and its combining accents, it showed a letter without them (an SDES item's 255 octets hold
/// more than 128 characters only of scripts like these).
#[test]
fn a_long_sdes_name_is_cut_between_grapheme_clusters() {
    for (unit, chars) in [("e\u{301}", 2), ("a\u{301}\u{302}", 3)] {
        let mut gw = Gateway::new(Config::default());
        let mut d = Vec::new();
        pvp_t140::rtcp::write_sdes(&mut d, 7, "x@host", Some(&unit.repeat(101)));
        gw.handle_datagram(at(0), addr(4001), &d);
        let name = join_name(&mut gw);
        let n = name.chars().count();
        assert!(n <= 128 && n > 128 - chars, "{n} characters");
        assert_eq!(name, unit.repeat(n / chars), "whole clusters only");
    }
}
