//! Configuration, found by review t (`--config`, `[[stream]]` mapping, presence, CLI flags).

use pvp_t140::mapping::{Mapping, Rule, Unmatched};
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::with_csrc;

#[path = "common/gateway_proc.rs"]
#[allow(dead_code)]
mod gateway_proc;

const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

fn sdes_name(ssrc: u32, cname: &str, name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, ssrc);
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, cname, Some(name));
    d
}

fn run_to(gw: &mut Gateway, ms: u64) {
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(ms)) {
        gw.handle_timeout(t);
    }
}

/// A rule matching by `rtcp_name` with `unmatched = "refuse"`: the sender's first RTCP report
/// (with its SDES NAME) comes 1-3 s after its first text (RFC 3550 6.3.1, as `pvp-t140 send`
/// does), and a first sentence is cut at once. The speaker is decided at that first chunk,
/// before its name came, and refused for good: none of its text, even what it says after the
/// name arrived, reaches the session.
#[test]
fn a_speaker_refused_before_its_sdes_name_came_is_taken_once_a_rule_matches_it() {
    let mut gw = Gateway::new(Config {
        mapping: alice_rule(Unmatched::Refuse),
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(5000), &t140(1, 7, "Hello there. "));
    run_to(&mut gw, 1000);
    gw.handle_datagram(
        at(1500),
        addr(5000),
        &sdes_name(7, "pvp-t140-7@127.0.0.1", "Alice"),
    );
    gw.handle_datagram(at(2000), addr(5000), &t140(2, 7, "How are you? "));
    run_to(&mut gw, 5000);
    let out = drain(&mut gw);
    let adds: Vec<_> = out
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| {
            (
                e.sender.to_string(),
                e.payload["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        adds.contains(&("alice".into(), "How are you?".into())),
        "{adds:?}"
    );
}

/// A `[[stream]]` rule's `ssrc` is "an integer or a hex string like \"0x1a2b3c4d\"". A string
/// without `0x` was read as hex all the same: `ssrc = "4660"`, the spelling `send --ssrc 4660`
/// takes as decimal, made a rule for SSRC 0x4660 that never matched the sender (and with
/// `unmatched = "refuse"` dropped all its text) without a word; `"0x0x12"` and `"+12"` were
/// taken too. An SSRC string that is not `0x` and hex digits is refused, naming the line.
#[test]
fn an_ssrc_string_is_hex_only_with_0x_and_anything_else_is_refused() {
    use std::path::Path;
    let parse = |v: &str| {
        pvp_t140::config_file::parse(
            Path::new("gw.toml"),
            &format!("[[stream]]\nssrc = {v}\nparticipant = \"a\"\n"),
        )
    };
    for bad in [
        "\"4660\"",
        "\"0x0x12\"",
        "\"+12\"",
        "\"0x+12\"",
        "\"1a2b\"",
        "\"0x\"",
    ] {
        match parse(bad) {
            Err(e) => assert!(e.starts_with("gw.toml:2: stream[0].ssrc:"), "{bad}: {e}"),
            Ok((_, m, _)) => panic!("{bad} taken as {:#x?}", m.rules[0].match_ssrc),
        }
    }
    for (good, want) in [
        ("\"0x1234\"", 0x1234),
        ("\"0X00001234\"", 0x1234),
        ("4660", 4660),
        ("0x1234", 0x1234),
    ] {
        let (_, m, _) = parse(good).unwrap();
        assert_eq!(m.rules[0].match_ssrc, Some(want), "{good}");
    }
}

/// As above with `unmatched = "auto"`: the speaker joined by the automatic rule at its first
/// sentence, before its SDES NAME came, and all it says stays under `t140:<ssrc>@<addr>`, the
/// rule naming it never applied. This is what `pvp-t140 send --name Alice` meets: its first
/// RTCP report goes 1-3 s after its first text.
#[test]
#[ignore = "known gap: the mapping is decided at the first chunk; a speaker that joined by the automatic rule before its SDES name came is not moved to the rule's participant (that needs a leave and a join under a new id mid-stream, or holding the first chunks until the first RTCP report)"]
fn a_speaker_auto_joined_before_its_sdes_name_came_is_named_by_the_rule_afterwards() {
    let mut gw = Gateway::new(Config {
        mapping: alice_rule(Unmatched::Auto),
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(5000), &t140(1, 7, "Hello there. "));
    run_to(&mut gw, 1000);
    gw.handle_datagram(
        at(1500),
        addr(5000),
        &sdes_name(7, "pvp-t140-7@127.0.0.1", "Alice"),
    );
    gw.handle_datagram(at(2000), addr(5000), &t140(2, 7, "How are you? "));
    run_to(&mut gw, 5000);
    let out = drain(&mut gw);
    let adds: Vec<_> = out
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| e.sender.to_string())
        .collect();
    assert_eq!(adds.last().map(String::as_str), Some("alice"), "{adds:?}");
}

/// README: "after `--server-silence-s` (90 s) with nothing at all from the server it is left".
/// The silence is counted in whole heartbeat intervals, at least two (`sink::ws::Liveness`):
/// `--server-silence-s 10` with the default 30 s heartbeat leaves a vanished server after 60 s,
/// six times what was asked, and nothing said so. The time it is taken as is said at start.
#[test]
fn a_server_silence_taken_longer_than_given_is_said_at_start() {
    let mut gw = gateway_proc::Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--server",
        "ws://127.0.0.1:9",
        "--server-silence-s",
        "10",
    ]);
    let line = gw.wait_stderr(WAIT, "--server-silence-s 10");
    assert!(line.contains("\"WARN\"") && line.contains("60 s"), "{line}");
    assert!(gw.terminate(WAIT).success());

    // A whole number of heartbeats, at least two: nothing to say.
    let mut gw = gateway_proc::Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--server",
        "ws://127.0.0.1:9",
        "--server-silence-s",
        "60",
    ]);
    assert!(gw.terminate(WAIT).success());
    gw.assert_stderr_lacks("--server-silence-s");
}

/// `unmatched = "refuse"` with no `[[stream]]` rule refuses every speaker: the gateway sends
/// nothing, and nothing said why (a rule lost in an edit). It is said at start; with a rule,
/// nothing is.
#[test]
fn refusing_the_unmatched_with_no_rule_is_said_at_start() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-refuse-all-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (none, one) = (dir.join("none.toml"), dir.join("one.toml"));
    std::fs::write(&none, "unmatched = \"refuse\"\n").unwrap();
    std::fs::write(
        &one,
        "unmatched = \"refuse\"\n[[stream]]\nssrc = 7\nparticipant = \"seven\"\n",
    )
    .unwrap();
    let start = |file: &std::path::Path| {
        gateway_proc::Gateway::start(&[
            "--listen",
            "127.0.0.1:0",
            "--config",
            file.to_str().unwrap(),
        ])
    };
    let mut gw = start(&none);
    let line = gw.wait_stderr(WAIT, "every speaker is refused");
    assert!(line.contains("\"WARN\""), "{line}");
    assert!(gw.terminate(WAIT).success());
    let mut gw = start(&one);
    assert!(gw.terminate(WAIT).success());
    gw.assert_stderr_lacks("every speaker is refused");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An `rtcp_name` is compared with an SDES item, which holds at most 255 octets (RFC 3550
/// 6.5): a longer one could match nothing, as an empty one (refused at load) could not, and
/// a rule that can never apply was taken without a word (with `unmatched = "refuse"`, the
/// speaker it was meant for refused).
#[test]
fn an_rtcp_name_longer_than_an_sdes_item_is_refused_at_load() {
    let parse = |name: &str| {
        pvp_t140::config_file::parse(
            std::path::Path::new("gw.toml"),
            &format!("unmatched = \"refuse\"\n[[stream]]\nrtcp_name = \"{name}\"\n"),
        )
    };
    let e = parse(&"a".repeat(256)).unwrap_err();
    assert!(e.starts_with("gw.toml:3: stream[0].rtcp_name:"), "{e}");
    assert!(e.contains("255"), "{e}");
    let (_, m, _) = parse(&format!(" {} ", "é".repeat(127))).unwrap();
    assert_eq!(
        m.rules[0].match_rtcp_name.as_ref().map(String::len),
        Some(254)
    );
}

/// README: "filter with `RUST_LOG` (default `info`)". A `RUST_LOG` that does not parse
/// (`pvp_t140=warning`: the level is `warn`) was dropped without a word, and the gateway
/// logged at info, where the operator asked for less: a typo in the environment taken
/// silently. It is said, naming the variable, and the default applies.
#[test]
fn a_rust_log_that_does_not_parse_is_said() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--session", " "])
        .env("RUST_LOG", "pvp_t140=warning")
        .output()
        .unwrap();
    // The blank session stops the start at once, after the logs are set up.
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains("RUST_LOG") && l.contains("pvp_t140=warning")),
        "{err}"
    );
}

/// README: "Flags given on the command line (or by environment variable) override the file".
/// `gate_transcripts = true` in the file could not be: `--gate-transcripts` took no value, so
/// no flag said "off", and a shared file that gates could not be run ungated. (`--rtcp false`
/// takes a value for the same reason.)
#[test]
fn gate_transcripts_in_the_file_can_be_turned_off_on_the_command_line() {
    let cfg = std::env::temp_dir().join(format!("pvp-t140-rvt-{}-gate.toml", std::process::id()));
    std::fs::write(&cfg, "gate_transcripts = true\n").unwrap();
    // The file's gate without a server is refused...
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("gate_transcripts needs --server"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ... and turned off on the command line, the gateway runs.
    let mut gw = gateway_proc::Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--config",
        cfg.to_str().unwrap(),
        "--gate-transcripts",
        "false",
    ]);
    std::fs::remove_file(&cfg).ok();
    assert!(gw.terminate(WAIT).success());
}

/// README "Configuration file": a mixer's speaker is matched by its CSRC as `ssrc`; a rule for
/// the mixer's own SSRC matches only what the mixer sends without a CSRC (the README said
/// "SSRC" alone, and a rule for a mixer's SSRC with `unmatched = "refuse"` refused every
/// speaker behind it).
#[test]
fn a_mixers_speakers_are_matched_by_their_csrc_not_the_mixers_ssrc() {
    let rule = |ssrc: u32, who: &str| Rule {
        match_ssrc: Some(ssrc),
        participant: Some(who.into()),
        ..Rule::default()
    };
    let mut gw = Gateway::new(Config {
        mapping: Mapping {
            rules: vec![rule(9, "mixer"), rule(1, "one")],
            unmatched: Unmatched::Refuse,
        },
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(5000), &with_csrc(1, 1000, 9, 1, b"From one. "));
    gw.handle_datagram(
        at(100),
        addr(5000),
        &with_csrc(2, 1100, 9, 2, b"From two. "),
    );
    gw.handle_datagram(at(200), addr(5000), &t140(3, 9, "From the mixer. "));
    run_to(&mut gw, 10_000);
    let adds: Vec<_> = drain(&mut gw)
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| {
            (
                e.sender.to_string(),
                e.payload["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        adds,
        [
            ("one".to_owned(), "From one.".to_owned()),
            ("mixer".to_owned(), "From the mixer.".to_owned())
        ]
    );
    assert_eq!(gw.stats().refused_chunks, 1);
}
