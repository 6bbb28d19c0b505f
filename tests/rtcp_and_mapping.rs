//! RTCP (RFC 3550 section 6) and mapping rules through the sans-IO gateway: compound packets
//! of any size, names without control characters, IPv4-mapped networks in rules and allow
//! lists; and, ignored, what mixers' RTCP and shared participant ids still get wrong.

use std::net::SocketAddr;

use pvp_t140::mapping::{Mapping, Rule};
use pvp_t140::presence::Presence;
use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// An RTP packet with one CSRC (an RFC 9071 mixer's), T.140 payload type 98.
fn with_csrc(seq: u16, ts: u32, ssrc: u32, csrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0x81, 98 | if seq == 1 { 0x80 } else { 0 }, 0, 0];
    d[2..4].copy_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&ts.to_be_bytes());
    d.extend_from_slice(&ssrc.to_be_bytes());
    d.extend_from_slice(&csrc.to_be_bytes());
    d.extend_from_slice(payload);
    d
}

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
    assert_eq!(gw.live_streams(), 0, "the BYE for SSRC 9 was ignored");
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
    let mut gw = Gateway::new(Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_source: Some("127.0.0.0/8".parse().unwrap()),
                participant: Some("room".into()),
                ..Rule::default()
            }],
            ..Mapping::default()
        },
        ..Config::default()
    });
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
/// stream's SSRC only, so the speaker stayed until the whole mixer stream ended.)
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
    let mut bye = vec![0x80, 201, 0, 1, 0, 0, 0, 9];
    pvp_t140::rtcp::write_bye(&mut bye, 2);
    gw.handle_datagram(at(20), addr(5000), &bye);
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
