//! Participant ids a `[[stream]]` mapping rule gives several speakers (README "Configuration
//! file": every stream from a network is one participant): what the session is told of that
//! participant once the envelopes have passed the sinks' one `Presence`.
//!
//! Found by review ao (session 45).

use std::net::SocketAddr;

use pvp_t140::mapping::{Mapping, Rule};
use pvp_t140::presence::Presence;
use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// One RTCP SDES packet (RFC 3550 6.5) for `ssrc`: its CNAME and its NAME.
fn sdes(ssrc: u32, cname: &str, name: &str) -> Vec<u8> {
    let mut d = vec![0x81, 202, 0, 0];
    d.extend_from_slice(&ssrc.to_be_bytes());
    for (kind, text) in [(1u8, cname), (2, name)] {
        d.push(kind);
        d.push(text.len() as u8);
        d.extend_from_slice(text.as_bytes());
    }
    d.push(0);
    while d.len() % 4 != 0 {
        d.push(0);
    }
    let words = (d.len() / 4 - 1) as u16;
    d[2..4].copy_from_slice(&words.to_be_bytes());
    d
}

/// Every source on 127.0.0.0/8 is the participant `room` (no `name` in the rule).
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

/// What leaves the sinks: the core's envelopes through one `Presence`.
fn admitted(gw: &mut Gateway, presence: &mut Presence) -> Vec<Envelope> {
    std::iter::from_fn(|| gw.poll_output())
        .filter(|e| presence.admit(e))
        .map(|e| e.to_message())
        .collect()
}

fn from(port: u16) -> SocketAddr {
    addr(port)
}

/// Two senders on the rule's network are one participant, `room`, which joined as the first
/// of them. Each sender's RTCP names it (RFC 3550 6.1: every compound carries the CNAME; a
/// sender's first report comes 1-3 s in, after its first sentence made it join): the second
/// one's name, and the metadata of its own SSRC, went out as a `participant.announce` of
/// `room` all the same (pvp-spec 7.1), so the one participant was renamed after whichever
/// sender's report came last, and said it was that sender's SSRC, while its join (the first
/// sender's) was the one the session had been shown. Now only the speaker whose join the
/// session saw names the participant: another speaker's name is its own, not the
/// participant's.
#[test]
fn a_shared_participant_is_not_renamed_after_each_of_its_speakers() {
    let mut gw = one_room();
    let mut presence = Presence::default();
    gw.handle_datagram(at(0), from(5000), &t140(1, 7, "Alpha speaking. "));
    gw.handle_datagram(at(100), from(5002), &t140(1, 8, "Bravo speaking. "));
    gw.handle_datagram(at(1500), from(5000), &sdes(7, "alpha@host", "Alpha"));
    gw.handle_datagram(at(1600), from(5002), &sdes(8, "bravo@host", "Bravo"));
    gw.handle_datagram(at(2000), from(5000), &t140(2, 7, "Alpha again. "));
    let out = admitted(&mut gw, &mut presence);
    let joins: Vec<&Envelope> = out.iter().filter(|e| e.kind == "session.join").collect();
    assert_eq!(joins.len(), 1, "one participant joins once");
    let joined_ssrc = joins[0].payload["participant"]["metadata"]["ssrc"].clone();
    assert_eq!(joined_ssrc, "00000007", "{}", joins[0].payload);
    let announced: Vec<(String, String)> = out
        .iter()
        .filter(|e| e.kind == "participant.announce")
        .map(|e| {
            (
                e.payload["name"].as_str().unwrap_or_default().to_owned(),
                e.payload["metadata"]["ssrc"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        announced,
        [("Alpha".to_owned(), "00000007".to_owned())],
        "only the speaker the session saw join names the participant"
    );
    // The text of both goes out, under the one participant.
    let adds = out.iter().filter(|e| e.kind == "context.add").count();
    assert_eq!(adds, 3);
    assert!(out.iter().all(|e| e.sender == "room"));
}
