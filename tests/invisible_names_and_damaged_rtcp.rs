//! Speaker identity: names of invisible characters only (an SDES NAME, `send --name`, a rule's
//! `name` or `rtcp_name`) show nothing and are passed over or refused; a t140llm stream id's
//! bidirectional overrides are escaped in the participant id; damage inside one packet of an
//! RTCP compound no longer loses the BYE after it.
//!
//! Found by review av (session 46).

use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// An RR and an SDES with `cname` and `name` for `ssrc` (RFC 3550 6.1).
fn sdes(ssrc: u32, cname: &str, name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, ssrc);
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, cname, Some(name));
    d
}

/// The name the speaker of SSRC 7 joins with, after `rtcp` and a sentence.
fn joined_as(rtcp: &[u8]) -> String {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), rtcp);
    gw.handle_datagram(at(10), addr(4000), &t140(1, 7, "Hello. "));
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    join.payload["participant"]["name"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Found by review av (session 46). An SDES NAME of nothing but invisible characters (zero
/// width space U+200B, the Hangul filler U+3164, word joiner U+2060, LRM U+200E: Unicode's
/// default ignorable code points, which a name shows nothing of) was taken for a name, since
/// none is a control nor white space: the participant joined with a blank name, where the
/// README has a NAME that leaves no name passed over for the CNAME. Such names are the usual
/// way to pass for nobody (the Hangul filler most of all). They now leave no name; one with
/// a visible character keeps them (a zero width joiner inside an emoji).
#[test]
fn a_name_of_invisible_characters_is_passed_over_for_the_cname() {
    for blank in [
        "\u{200b}",
        "\u{3164}",
        "\u{200b}\u{3164} \u{2060}\u{200e}",
        "\u{ffa0}\u{115f}\u{1160}\u{feff}\u{ad}\u{180e}\u{fe0f}\u{e0041}",
    ] {
        assert_eq!(
            joined_as(&sdes(7, "alice@host", blank)),
            "alice@host",
            "{blank:?}"
        );
    }
    let coder = "\u{1f469}\u{200d}\u{1f4bb} Ada";
    assert_eq!(joined_as(&sdes(7, "alice@host", coder)), coder);
}

/// Found by review av (session 46). `pvp-t140 send --name` refuses a name without "at least
/// one visible character", but checked only for white space: a name of zero width spaces or
/// Hangul fillers was sent as the SDES NAME, which every receiver shows as a blank name (and
/// this gateway now passes over for the CNAME). It is refused as a blank one is.
#[test]
fn send_refuses_a_name_of_invisible_characters() {
    for name in [" ", "\u{200b}", "\u{3164}\u{3164}", "\u{2060} \u{200e}"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(["send", "--to", "127.0.0.1:9", "--name", name])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{name:?} was taken");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("at least one visible character"), "{err}");
    }
}

/// Found by review av (session 46). A rule's `rtcp_name` is matched against the SDES item a
/// speaker's name came from, and an item that shows no name (controls, or invisible
/// characters only) names no one: it is passed over. A rule for such a name was loaded, and
/// could match nothing, its speakers silently refused or joined by the automatic rule; one
/// of white space only was already refused at load for that reason. Now any is.
#[test]
fn a_rule_for_an_rtcp_name_that_shows_nothing_is_refused_at_load() {
    let path = std::path::Path::new("gw.toml");
    for name in ["\\u0007", "\\u200B", "\\u3164 \\u2060"] {
        let text = format!("[[stream]]\nrtcp_name = \"{name}\"\nparticipant = \"p\"\n");
        let e = pvp_t140::config_file::parse(path, &text)
            .err()
            .unwrap_or_else(|| panic!("{name} was taken"));
        assert!(
            e.starts_with("gw.toml:2: stream[0].rtcp_name: must not be empty"),
            "{e}"
        );
    }
    // A name that shows is taken as it is, invisible characters and all.
    let text = "[[stream]]\nrtcp_name = \"Ada\\u200B\"\nparticipant = \"p\"\n";
    let (_, m, _) = pvp_t140::config_file::parse(path, text).unwrap();
    assert_eq!(m.rules[0].match_rtcp_name.as_deref(), Some("Ada\u{200b}"));
}

/// Found by review av (session 46). A t140llm stream id (`<id>\x1E<text>`) becomes the end of
/// its speaker's participant id, which clients show and the gateway logs at the join. Ids with
/// control characters are taken for text, but one with a bidirectional override (U+202E) or
/// a line separator (U+2028) went into the participant id as it came: a Trojan Source id
/// (CVE-2021-42574) that turns around what is shown after it, as a display name is kept from
/// doing. Such characters are now percent-encoded in the participant id, as `/` and `%` are
/// (the name, cleaned, and `stream_id` keep the id).
#[test]
fn a_stream_ids_bidirectional_overrides_are_escaped_in_the_participant_id() {
    let mut gw = Gateway::new(Config {
        compat: pvp_t140::Compat::T140llm,
        t140_pt: 96,
        red_pt: 98,
        ..Config::default()
    });
    let mut d = Vec::new();
    let payload = "gpt\u{202e}txt.exe\u{2028}x\x1eHello. ";
    pvp_t140::rtp::write_packet(&mut d, false, 96, 0, 0, 0x1122_3344, payload.as_bytes());
    gw.handle_datagram(at(0), addr(4000), &d);
    gw.handle_timeout(at(60_000));
    let out = drain(&mut gw);
    let join = out
        .iter()
        .find(|e| e.kind == "session.join")
        .expect("a join");
    assert_eq!(
        join.sender, "t140:11223344@127.0.0.1:4000/gpt%E2%80%AEtxt.exe%E2%80%A8x",
        "{join:?}"
    );
    assert_eq!(join.payload["participant"]["name"], "gpttxt.exex");
    let add = out
        .iter()
        .find(|e| e.kind == "context.add")
        .expect("the text");
    assert_eq!(add.payload["content"], "Hello.");
}

/// Found by review av (session 46). A rule's `name` is the participant's display name, and one
/// of zero width spaces or Hangul fillers is blank on screen: it is refused at load as a blank
/// one is (it was loaded, and the participant joined nameless), and the error says why.
#[test]
fn a_rule_name_of_invisible_characters_is_refused_at_load() {
    let path = std::path::Path::new("gw.toml");
    let text = "[[stream]]\nssrc = 1\nname = \"\\u3164\\u200B\"\n";
    let e = pvp_t140::config_file::parse(path, text).unwrap_err();
    assert!(
        e.starts_with("gw.toml:3: stream[0].name: must not be empty") && e.contains("invisible"),
        "{e}"
    );
}

/// Found by review av (session 46). The length fields of a compound's packets frame them
/// (RFC 3550 A.2 checks that they add up to the datagram), so damage inside one packet leaves
/// the packets after it whole. The parser stopped at the damage: an SDES chunk a sender left
/// without its null terminator (or an RR whose count says more report blocks than it holds)
/// took the BYE after it with it, and the caller stayed in the session until the stream
/// timeout, its name lost with it. The damaged packet is counted (`rtcp_malformed`) and the
/// rest of the compound is read.
#[test]
fn damage_inside_one_packet_of_a_compound_does_not_lose_the_bye_after_it() {
    // An SDES chunk whose last item fills its words, with no null octet after it.
    let unterminated = [0x81, 202, 0, 2, 0, 0, 0, 7, 1, 2, b'c', b'7'];
    // An RR whose report count says 1 and holds no block.
    let miscounted = [0x81, 201, 0, 1, 0, 0, 0, 7];
    for damaged in [&unterminated[..], &miscounted[..]] {
        let mut gw = Gateway::new(Config::default());
        gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "Bye now"));
        let mut rtcp = damaged.to_vec();
        pvp_t140::rtcp::write_sdes(&mut rtcp, 7, "ada@host", Some("Ada"));
        pvp_t140::rtcp::write_bye(&mut rtcp, 7);
        gw.handle_datagram(at(100), addr(4000), &rtcp);
        gw.handle_timeout(at(1_100));
        let out = drain(&mut gw);
        let kinds: Vec<_> = out.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["session.join", "context.add", "session.leave"],
            "{damaged:?}"
        );
        assert_eq!(out[0].payload["participant"]["name"], "Ada");
        assert_eq!(out[1].payload["content"], "Bye now");
        assert_eq!(out[2].payload["reason"], "rtcp bye");
        assert_eq!(
            gw.stats().drops(pvp_t140::DropReason::RtcpMalformed),
            1,
            "the damage is counted"
        );
    }
}
