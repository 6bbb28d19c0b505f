//! Found by review ab (session 43): a mixer's sources and their names. A source recycled at the
//! speaker bound keeps its SDES name for its return; each source's text, split characters,
//! backspaces and lost sentence ends stay its own across the mixer's switches; BYEs and SDES
//! naming several sources. Driven through the core with time as a value.

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway, rtcp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::*;

/// What a default gateway gives for the mixer's `packets` (at their ms) by `until`.
fn through_the_mixer(packets: &[(u64, Vec<u8>)], until: u64) -> Vec<Envelope> {
    let mut gw = Gateway::new(Config::default());
    for (t, d) in packets {
        gw.handle_datagram(at(*t), addr(5000), d);
    }
    run_timers(&mut gw, until);
    drain(&mut gw)
}

fn joins(out: &[Envelope]) -> Vec<(String, String)> {
    out.iter()
        .filter(|e| e.kind == "session.join" || e.kind == "participant.announce")
        .map(|e| {
            let p = if e.kind == "session.join" {
                &e.payload["participant"]
            } else {
                &e.payload
            };
            (
                e.sender.clone(),
                p["name"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

/// A mixer switches sources mid-sentence: A's half sentence is A's, finished by A's next packet.
#[test]
fn a_mixers_half_sentence_stays_with_its_source_across_a_switch() {
    let out = through_the_mixer(
        &[
            (0, with_csrc(1, 1000, MIXER, 1, b"Hello wor")),
            (100, with_csrc(2, 1100, MIXER, 2, b"Hi there. ")),
            (200, with_csrc(3, 1200, MIXER, 1, b"ld. ")),
        ],
        10_000,
    );
    assert_eq!(
        text_of(&out, "csrc:00000001"),
        "Hello world.",
        "{:#?}",
        timeline(&out)
    );
    assert_eq!(text_of(&out, "csrc:00000002"), "Hi there.");
}

/// One BYE naming two plain streams of one endpoint (rtcp-mux, same address).
#[test]
fn one_bye_naming_two_streams_of_an_endpoint_ends_both() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Seven "));
    gw.handle_datagram(at(0), addr(4000), &t140(1, 8, "Eight "));
    let mut d = Vec::new();
    rtcp::write_rr(&mut d, 7);
    d.extend_from_slice(&[0x82, 203, 0, 2, 0, 0, 0, 7, 0, 0, 0, 8]);
    gw.handle_datagram(at(100), addr(4000), &d);
    run_timers(&mut gw, 5_000);
    let out = drain(&mut gw);
    let leaves: Vec<_> = out
        .iter()
        .filter(|e| e.kind == "session.leave")
        .map(|e| e.sender.clone())
        .collect();
    assert_eq!(leaves.len(), 2, "{:#?}", timeline(&out));
    assert!(leaves.iter().all(|l| l.ends_with("@127.0.0.1:4000")));
    let t = shown(&out);
    assert_eq!(t, vec!["Seven", "Eight"]);
}

/// A reduced-size SDES (RFC 5506, no RR) whose first chunk is a mixer's source, then the mixer.
#[test]
fn a_reduced_size_sdes_with_the_sources_chunk_first_names_it() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Hello"));
    let mut d = Vec::new();
    rtcp::write_sdes(&mut d, 1, "a@x", Some("Alice"));
    rtcp::write_sdes(&mut d, MIXER, "mixer@x", None);
    gw.handle_datagram(at(10), addr(5000), &d);
    gw.handle_datagram(at(20), addr(5000), &with_csrc(2, 1020, MIXER, 1, b". "));
    run_timers(&mut gw, 10_000);
    let out = drain(&mut gw);
    let j = joins(&out);
    assert!(
        j.iter()
            .any(|(s, n)| s.ends_with("csrc:00000001") && n == "Alice"),
        "{j:?}"
    );
}

/// SDES before any RTP, from the RTCP port (port+1): the join carries the name.
#[test]
fn an_sdes_before_the_first_packet_names_the_join_and_a_new_name_is_announced() {
    let mut gw = Gateway::new(Config::default());
    let mut d = Vec::new();
    rtcp::write_rr(&mut d, 7);
    rtcp::write_sdes(&mut d, 7, "u@h", Some("Ada"));
    gw.handle_rtcp_port(at(0), addr(4001), &d, None, true);
    gw.handle_datagram(at(10), addr(4000), &t140(1, 7, "Hi. "));
    run_timers(&mut gw, 100);
    let out = drain(&mut gw);
    assert_eq!(joins(&out)[0].1, "Ada");
    // A new NAME after the join: announced.
    let mut d = Vec::new();
    rtcp::write_rr(&mut d, 7);
    rtcp::write_sdes(&mut d, 7, "u@h", Some("Ada L."));
    gw.handle_datagram(at(200), addr(4001), &d);
    let out = drain(&mut gw);
    assert_eq!(
        joins(&out),
        vec![("t140:00000007@127.0.0.1:4000".into(), "Ada L.".into())]
    );
}

/// CSRC lists of 2: the own voice, in auto.
#[test]
fn a_packet_of_two_csrcs_is_the_mixers_own_voice() {
    let mut gw = Gateway::new(Config::default());
    let mut d = vec![
        0x82,
        0x80 | 98,
        0,
        1,
        0,
        0,
        3,
        0xe8,
        0,
        0,
        0,
        9,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        2,
    ];
    d.extend_from_slice(b"Both. ");
    gw.handle_datagram(at(0), addr(5000), &d);
    run_timers(&mut gw, 100);
    let out = drain(&mut gw);
    assert_eq!(text_of_exactly(&out, OWN), "Both.");
}

/// A mixer's SDES for one source, in the mixer's compound (RR first).
fn source_sdes(csrc: u32, name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    rtcp::write_rr(&mut d, MIXER);
    rtcp::write_sdes(&mut d, MIXER, "mixer@host", None);
    rtcp::write_sdes(&mut d, csrc, &format!("{csrc}@host"), Some(name));
    d
}

/// Source 1 of a mixer, named by the mixer's SDES before it spoke, says "Hi.", then 39 other
/// sources speak: past the bound of 32 speakers a new one takes the place of the longest
/// silent, source 1. Source 1 then speaks again: it is the same person, and the mixer sent its
/// name once (RFC 3550 6.5 lets a mixer spread its sources' SDES over its reports).
fn recycled_source_comes_back(cfg: Config) -> Vec<Envelope> {
    let mut gw = Gateway::new(cfg);
    let mut seq = 1u16;
    let mut ts = 1000u32;
    let mut send = |gw: &mut Gateway, t: u64, csrc: u32, text: &[u8]| {
        gw.handle_datagram(at(t), addr(5000), &with_csrc(seq, ts, MIXER, csrc, text));
        seq += 1;
        ts += 10;
    };
    send(&mut gw, 0, 2, b"");
    gw.handle_datagram(at(5), addr(5000), &source_sdes(1, "Alice"));
    send(&mut gw, 10, 1, b"Hi. ");
    let mut t = 20;
    for c in 3..=41u32 {
        send(&mut gw, t, c, b"x. ");
        t += 10;
    }
    run_timers(&mut gw, t + 3000);
    t += 3000;
    send(&mut gw, t, 1, b"Back. ");
    run_timers(&mut gw, t + 3000);
    drain(&mut gw)
}

/// Review ab: the source that left to make room kept no name: back, it joined as "T.140
/// 00000001 via ...", though the gateway had been told its name.
#[test]
fn a_source_recycled_at_the_speaker_bound_comes_back_with_its_sdes_name() {
    let out = recycled_source_comes_back(Config::default());
    let alice: Vec<_> = joins(&out)
        .into_iter()
        .filter(|(s, _)| s.ends_with("csrc:00000001"))
        .map(|(_, n)| n)
        .collect();
    assert_eq!(alice, ["Alice", "Alice"], "{:#?}", timeline(&out));
}

/// The same with `unmatched = "refuse"` and a rule taking `rtcp_name = "Alice"`: back, the
/// source was refused (no name to match) and its words were dropped.
#[test]
fn a_source_recycled_at_the_speaker_bound_is_still_matched_by_its_rtcp_name() {
    use pvp_t140::mapping::Unmatched;
    let cfg = Config {
        mapping: alice_rule(Unmatched::Refuse),
        ..Config::default()
    };
    let out = recycled_source_comes_back(cfg);
    assert_eq!(
        text_of_exactly(&out, "alice"),
        "Hi. Back.",
        "{:#?}",
        timeline(&out)
    );
}

/// A rule giving every source of a network one participant id (README: they are one
/// participant) without a `name`: the participant joins named after the first source's SDES
/// NAME ("Alice"), and the second source's NAME renames it ("Bob", a `participant.announce`),
/// so Alice's next words show under "Bob". One source's SDES names the shared participant
/// whichever source speaks. What a shared participant should be called (the rule's id, the
/// stream's name, the first name only) is a decision, and the core cannot tell a rule that
/// matches one speaker from one that matches several (Presence, in the sinks, sees that).
#[test]
#[ignore = "known gap: one source's SDES NAME renames a participant id a rule gives several speakers"]
fn a_participant_shared_by_sources_is_not_renamed_by_one_sources_sdes() {
    use pvp_t140::mapping::{Mapping, Rule};
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
    gw.handle_datagram(at(0), addr(5000), &source_sdes(1, "Alice"));
    gw.handle_datagram(
        at(0),
        addr(5000),
        &with_csrc(1, 1000, MIXER, 1, b"I am Alice. "),
    );
    gw.handle_datagram(
        at(100),
        addr(5000),
        &with_csrc(2, 1100, MIXER, 2, b"I am Bob. "),
    );
    gw.handle_datagram(at(200), addr(5000), &source_sdes(2, "Bob"));
    gw.handle_datagram(
        at(300),
        addr(5000),
        &with_csrc(3, 1300, MIXER, 1, b"Alice again. "),
    );
    gw.shutdown(at(400));
    let mut presence = pvp_t140::presence::Presence::default();
    let out: Vec<Envelope> = std::iter::from_fn(|| gw.poll_output())
        .filter(|e| presence.admit(e))
        .map(|e| e.to_message())
        .collect();
    let names: Vec<String> = joins(&out).into_iter().map(|(_, n)| n).collect();
    assert!(
        names.windows(2).all(|w| w[0] == w[1]),
        "the shared participant was renamed: {names:?}"
    );
}

/// The name a recycled source keeps is the mixer's session's: the mixer's BYE forgets it, so
/// a later stream of the host whose SSRC is that CSRC does not join under it.
#[test]
fn a_recycled_sources_kept_name_goes_with_the_mixers_bye() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(5000), &source_sdes(1, "Alice"));
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, MIXER, 1, b"Hi. "));
    for c in 2..=34u32 {
        let seq = c as u16;
        let ts = 1000 + 10 * c;
        gw.handle_datagram(
            at(u64::from(c) * 10),
            addr(5000),
            &with_csrc(seq, ts, MIXER, c, b"x. "),
        );
    }
    let mut bye = Vec::new();
    rtcp::write_rr(&mut bye, MIXER);
    rtcp::write_bye(&mut bye, MIXER);
    gw.handle_datagram(at(500), addr(5000), &bye);
    run_timers(&mut gw, 5_000);
    drain(&mut gw);
    gw.handle_datagram(at(6_000), addr(6000), &t140(1, 1, "New. "));
    run_timers(&mut gw, 6_100);
    let out = drain(&mut gw);
    let j = joins(&out);
    assert_eq!(j.len(), 1, "{j:?}");
    assert_ne!(j[0].1, "Alice");
}

/// Per speaker state across a switch: a character split between A's packets, with B's packet
/// (and its backspace) between them, is A's, whole, and B's backspace erases B's text only.
#[test]
fn a_split_character_and_a_backspace_stay_with_their_source_across_a_switch() {
    let out = through_the_mixer(
        &[
            (0, with_csrc(1, 1000, MIXER, 1, b"Caf\xc3")),
            (10, with_csrc(2, 1010, MIXER, 2, b"Noo\x08. ")),
            (20, with_csrc(3, 1020, MIXER, 1, b"\xa9. ")),
        ],
        5_000,
    );
    assert_eq!(
        text_of(&out, "csrc:00000001"),
        "Café.",
        "{:#?}",
        timeline(&out)
    );
    assert_eq!(text_of(&out, "csrc:00000002"), "No.");
}

/// A's packet finishing its sentence is lost while the mixer switches to B; A's next packet
/// (its idle tail, empty primary) carries it as redundancy: the half sentence is finished as
/// A's, and nothing is marked lost.
#[test]
fn a_sources_lost_sentence_end_across_a_switch_is_recovered_as_its_own() {
    let out = through_the_mixer(
        &[
            (0, red_csrc(1, 1000, 1, &[], b"Hello wor")),
            // seq 2, A, ts 1300: [(300, "Hello wor")] "ld. " lost.
            (350, red_csrc(3, 1350, 2, &[], b"Hi. ")),
            (
                600,
                red_csrc(4, 1600, 1, &[(600, b"Hello wor"), (300, b"ld. ")], b""),
            ),
        ],
        5_000,
    );
    assert_eq!(
        text_of(&out, "csrc:00000001"),
        "Hello world.",
        "{:#?}",
        timeline(&out)
    );
    assert_eq!(text_of(&out, "csrc:00000002"), "Hi.");
    assert!(!any_mark(&out));
}
