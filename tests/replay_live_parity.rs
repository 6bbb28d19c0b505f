//! Replay/live parity and the receive side of RTCP. One session (two SSRCs, RED, a
//! loss recovered and one not, reordering, SR+SDES, BYE with and without a reason, idle gaps)
//! sent live to the real binary and written to a pcap replayed by the real binary: the same
//! envelopes but for ids, wall-clock stamps and the key's stream-start time.
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::frozen::{rtp_and_rtcp_sockets, start_with_rtcp_port};

#[path = "common/core.rs"]
mod core;

#[path = "common/frames.rs"]
mod frames;

use pvp_t140::rtcp;
use pvp_t140::rtp::write_packet;

const A: u32 = 0xA1A1_A1A1;
const B: u32 = 0xB2B2_B2B2;

fn plain(marker: bool, seq: u16, ts: u32, ssrc: u32, text: &str) -> Vec<u8> {
    let mut d = Vec::new();
    write_packet(&mut d, marker, 98, seq, ts, ssrc, text.as_bytes());
    d
}

fn red(marker: bool, seq: u16, ts: u32, ssrc: u32, gens: &[(u16, &str)], text: &str) -> Vec<u8> {
    let gens: Vec<(u16, &[u8])> = gens.iter().map(|(o, t)| (*o, t.as_bytes())).collect();
    let mut payload = Vec::new();
    pvp_t140::red::write_payload(&mut payload, 98, &gens, text.as_bytes());
    let mut d = Vec::new();
    write_packet(&mut d, marker, 100, seq, ts, ssrc, &payload);
    d
}

fn bye_with_reason(ssrc: u32, reason: &str) -> Vec<u8> {
    let mut d = Vec::new();
    rtcp::write_rr(&mut d, ssrc);
    let start = d.len();
    d.extend_from_slice(&[0x81, 203, 0, 0]);
    d.extend_from_slice(&ssrc.to_be_bytes());
    d.push(reason.len() as u8);
    d.extend_from_slice(reason.as_bytes());
    while !(d.len() - start).is_multiple_of(4) {
        d.push(0);
    }
    let words = ((d.len() - start) / 4 - 1) as u16;
    d[start + 2..start + 4].copy_from_slice(&words.to_be_bytes());
    d
}

/// Which socket a datagram goes from, and to which gateway port.
#[derive(Clone, Copy)]
enum From {
    ARtp,
    ARtcp,
    BRtp,
}
#[derive(Clone, Copy)]
enum To {
    Rtp,
    Rtcp,
    Elsewhere,
}

/// The session: (ms from start, from, to, datagram).
fn session() -> Vec<(u64, From, To, Vec<u8>)> {
    let mut sr = Vec::new();
    rtcp::write_sr(&mut sr, A, 0, 30, 1, 16);
    rtcp::write_sdes(&mut sr, A, "alice@host", Some("Alice"));
    let mut b_bye = Vec::new();
    rtcp::write_rr(&mut b_bye, B);
    rtcp::write_bye(&mut b_bye, B);
    vec![
        (
            0,
            From::ARtp,
            To::Rtp,
            plain(true, 1000, 0, A, "\u{feff}Hello there. "),
        ),
        (30, From::ARtcp, To::Rtcp, sr),
        (
            60,
            From::BRtp,
            To::Rtp,
            red(true, 1, 0, B, &[], "\u{feff}Good "),
        ),
        (
            120,
            From::BRtp,
            To::Rtp,
            red(false, 2, 100, B, &[(100, "Good ")], "morning"),
        ),
        // seq 3 (" all") lost; 5 overtakes 4 and carries both in its redundancy.
        (
            240,
            From::BRtp,
            To::Rtp,
            red(false, 5, 400, B, &[(200, " all"), (100, " of")], " you. "),
        ),
        (
            250,
            From::BRtp,
            To::Rtp,
            red(false, 4, 300, B, &[(200, "morning"), (100, " all")], " of"),
        ),
        // A's 1001 lost for good: no redundancy.
        (
            300,
            From::ARtp,
            To::Rtp,
            plain(false, 1002, 600, A, "Lost one. "),
        ),
        // An idle gap, then words with no sentence end: an idle flush.
        (
            1800,
            From::ARtp,
            To::Rtp,
            plain(false, 1003, 1800, A, "After the pause"),
        ),
        (
            1850,
            From::ARtp,
            To::Rtp,
            plain(false, 1004, 1850, A, " waits"),
        ),
        (
            1900,
            From::BRtp,
            To::Rtp,
            red(false, 6, 1900, B, &[(1500, " you. ")], "Bye now"),
        ),
        (3000, From::ARtcp, To::Rtcp, bye_with_reason(A, "done")),
        // B's BYE multiplexed on the RTP port (RFC 5761).
        (3100, From::BRtp, To::Rtp, b_bye),
        (3600, From::BRtp, To::Elsewhere, b"end".to_vec()),
    ]
}

fn pcap(frames: &[(u64, SocketAddr, SocketAddr, Vec<u8>)]) -> Vec<u8> {
    const T0: u64 = 1_700_000_000_000_000;
    let records = frames
        .iter()
        .map(|(ms, from, to, payload)| (T0 + ms * 1000, from.port(), to.port(), &payload[..]));
    frames::pcap_loopback(records)
}

/// An envelope without what may differ: its id, its wall-clock ts, the key's start time.
fn normalised(e: &Value) -> Value {
    let mut e = e.clone();
    let o = e.as_object_mut().unwrap();
    o.remove("id");
    o.remove("ts");
    if let Some(key) = e["payload"]["key"].as_str() {
        let parts: Vec<&str> = key.split('/').collect();
        let key = format!("{}/*/{}", parts[0], parts[parts.len() - 1]);
        e["payload"]["key"] = Value::String(key);
    }
    e
}

const ARGS: [&str; 4] = ["--idle-flush-ms", "500", "--reorder-wait-ms", "200"];

#[test]
fn a_session_gives_the_same_envelopes_live_and_replayed() {
    let live = parity(session(), &ARGS);
    let adds: Vec<String> = (live.iter())
        .filter(|e| e["type"] == "context.add")
        .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        adds,
        [
            "Hello there.",
            "Good morning all of you.",
            "\u{fffd}Lost one.",
            "After the pause waits",
            "Bye now"
        ]
    );
}

/// Runs `session` live and replayed with `extra` flags; asserts the normalised envelopes are
/// the same; returns them.
fn parity(session: Vec<(u64, From, To, Vec<u8>)>, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["--listen", "127.0.0.1:0"];
    args.extend(extra);
    let (gw, to_rtp, to_rtcp) = start_with_rtcp_port(&args);
    let (a_rtp, a_rtcp) = rtp_and_rtcp_sockets();
    let b_rtp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let elsewhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let socket = |f: From| match f {
        From::ARtp => &a_rtp,
        From::ARtcp => &a_rtcp,
        From::BRtp => &b_rtp,
    };
    let dest = |t: To| match t {
        To::Rtp => to_rtp,
        To::Rtcp => to_rtcp,
        To::Elsewhere => elsewhere,
    };
    let start = Instant::now();
    let mut frames = Vec::new();
    for (ms, from, to, d) in session {
        // Pacing only: the gaps are 4x the waits they cross.
        let due = start + Duration::from_millis(ms);
        if let Some(w) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(w);
        }
        if !matches!(to, To::Elsewhere) {
            socket(from).send_to(&d, dest(to)).unwrap();
        }
        frames.push((ms, socket(from).local_addr().unwrap(), dest(to), d));
    }
    let (live, stderr) = gw.stop(false);

    let path = std::env::temp_dir().join(format!("pvp-t140-review-r-{}.pcap", std::process::id()));
    std::fs::write(&path, pcap(&frames)).unwrap();
    let port = to_rtp.port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .args(["--port", &port])
        .args(extra)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    assert!(out.status.success());
    let replayed: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let live: Vec<Value> = live.iter().map(normalised).collect();
    let replayed: Vec<Value> = replayed.iter().map(normalised).collect();
    let show = |v: &[Value]| {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        show(&live),
        show(&replayed),
        "live:\n{}\nreplayed:\n{}\n{stderr}",
        show(&live),
        show(&replayed)
    );
    eprintln!("{}", show(&live));
    live
}

mod core_rtcp {
    use pvp_t140::pvp::Message;
    use pvp_t140::{Gateway, gateway::Config};

    use super::core::{addr, at, drain, t140, t140m};

    use super::{bye_with_reason, rtcp};

    fn gw() -> Gateway {
        Gateway::new(Config::default())
    }

    fn until(gw: &mut Gateway, ms: u64) -> Vec<Message> {
        while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(ms)) {
            gw.handle_timeout(t);
        }
        drain(gw)
    }

    fn kinds(out: &[Message]) -> Vec<String> {
        out.iter().map(|m| m.kind.clone()).collect()
    }

    /// RFC 3550 6.6 then 8.2: a BYE ends the SSRC's session; the same SSRC from the same
    /// address after the linger is a new session: it joins again and its words are said.
    #[test]
    fn the_same_ssrc_after_its_bye_joins_again_with_its_words() {
        let mut g = gw();
        g.handle_datagram(at(0), addr(4000), &t140(1, 7, "First. "));
        g.handle_datagram(at(100), addr(4001), &bye_with_reason(7, "bye"));
        let mut out = until(&mut g, 3000);
        g.handle_datagram(at(3000), addr(4000), &t140m(1, 7, true, "Again. "));
        out.extend(until(&mut g, 10_000));
        g.shutdown(at(10_000));
        out.extend(drain(&mut g));
        assert_eq!(
            kinds(&out),
            [
                "session.join",
                "context.add",
                "session.leave",
                "session.join",
                "context.add",
                "session.leave"
            ],
            "{out:?}"
        );
    }

    /// Within the linger after a BYE: a marked packet far past the old numbering is a new
    /// session (the old leaves at once, the new joins); a marked one close on is the old
    /// session's last words after a pause (RFC 4103 5.2), said before its one leave.
    #[test]
    fn packets_in_the_linger_after_a_bye_are_told_apart() {
        let mut g = gw();
        g.handle_datagram(at(0), addr(4000), &t140(1, 7, "First. "));
        g.handle_datagram(at(100), addr(4001), &bye_with_reason(7, "bye"));
        g.handle_datagram(at(300), addr(4000), &t140m(50, 7, true, "New. "));
        let mut out = until(&mut g, 10_000);
        g.shutdown(at(10_000));
        out.extend(drain(&mut g));
        let k = kinds(&out);
        assert_eq!(
            k,
            [
                "session.join",
                "context.add",
                "session.leave",
                "session.join",
                "context.add",
                "session.leave"
            ],
            "{out:?}"
        );

        let mut g = gw();
        g.handle_datagram(at(0), addr(4000), &t140(1, 7, "First. "));
        g.handle_datagram(at(100), addr(4001), &bye_with_reason(7, "bye"));
        g.handle_datagram(at(300), addr(4000), &t140m(3, 7, true, "Last. "));
        let mut out = until(&mut g, 10_000);
        g.shutdown(at(10_000));
        out.extend(drain(&mut g));
        assert_eq!(
            kinds(&out),
            [
                "session.join",
                "context.add",
                "context.add",
                "session.leave"
            ],
            "{out:?}"
        );
        assert_eq!(
            out[2].payload["content"], "\u{fffd}Last.",
            "seq 2 lost: marked"
        );
    }

    /// A BYE for an SSRC never seen ends nothing and keeps no one from joining after.
    #[test]
    fn a_bye_for_an_unseen_ssrc_then_its_packets_join() {
        let mut g = gw();
        let mut bye = Vec::new();
        rtcp::write_rr(&mut bye, 9);
        rtcp::write_bye(&mut bye, 9);
        g.handle_datagram(at(0), addr(4001), &bye);
        g.handle_datagram(at(50), addr(4000), &t140(1, 9, "Hi. "));
        let mut out = until(&mut g, 5000);
        g.shutdown(at(5000));
        out.extend(drain(&mut g));
        assert_eq!(
            kinds(&out),
            ["session.join", "context.add", "session.leave"],
            "{out:?}"
        );
    }

    /// SDES NAME with an escape sequence, a new line and 300 characters: the join's name
    /// has no controls and is bounded.
    #[test]
    fn an_sdes_name_is_cleaned_and_bounded_in_the_join() {
        let mut g = gw();
        let long = format!("\u{1b}[31mEve\nil\u{2028}{}", "x".repeat(240));
        let mut d = Vec::new();
        rtcp::write_rr(&mut d, 5);
        rtcp::write_sdes(&mut d, 5, "eve@host", Some(&long));
        g.handle_datagram(at(0), addr(4001), &d);
        g.handle_datagram(at(10), addr(4000), &t140(1, 5, "Hi. "));
        let out = until(&mut g, 100);
        let join = out.iter().find(|m| m.kind == "session.join").unwrap();
        let name = join.payload["participant"]["name"].as_str().unwrap();
        assert!(
            !name.chars().any(|c| c.is_control() || c == '\u{2028}'),
            "{name:?}"
        );
        assert!(name.chars().count() <= 128, "{}", name.len());
    }

    /// RFC 5761: RTCP (PT 200-204) on the RTP port is not RTP: a BYE-only datagram with a
    /// padding bit is no stream and no text.
    #[test]
    fn rtcp_on_the_rtp_port_opens_no_stream() {
        let mut g = gw();
        for pt in 200u8..=204 {
            let d = [0x80, pt, 0, 1, 0, 0, 0, 0x33];
            g.handle_datagram(at(0), addr(4000), &d);
        }
        let out = until(&mut g, 100_000);
        assert!(out.is_empty(), "{out:?}");
    }
}

/// An SDES before the stream's first packet, a BYE for an SSRC never seen, a BYE then the
/// same SSRC again (a new session, RFC 3550 6.6), stream timeouts: the same both ways.
#[test]
fn byes_early_names_and_timeouts_are_the_same_live_and_replayed() {
    let mut early = Vec::new();
    rtcp::write_rr(&mut early, A);
    rtcp::write_sdes(&mut early, A, "alice@host", Some("Alice"));
    let mut unseen = Vec::new();
    rtcp::write_rr(&mut unseen, B);
    rtcp::write_bye(&mut unseen, 0xC3C3_C3C3);
    let mut a_bye = Vec::new();
    rtcp::write_rr(&mut a_bye, A);
    rtcp::write_bye(&mut a_bye, A);
    let session = vec![
        (0, From::ARtcp, To::Rtcp, early),
        (
            100,
            From::ARtp,
            To::Rtp,
            plain(true, 1, 0, A, "\u{feff}Hi. "),
        ),
        (150, From::BRtp, To::Rtp, unseen),
        (
            400,
            From::BRtp,
            To::Rtp,
            plain(true, 10, 0, B, "Timeout soon. "),
        ),
        (300, From::ARtcp, To::Rtcp, a_bye),
        (1500, From::ARtp, To::Rtp, plain(true, 1, 0, A, "Back. ")),
        (1600, From::ARtp, To::Rtp, plain(false, 2, 100, A, "Still ")),
        (1650, From::ARtp, To::Rtp, plain(false, 3, 150, A, "here")),
        (3300, From::BRtp, To::Elsewhere, b"end".to_vec()),
    ];
    let mut session = session;
    session.sort_by_key(|s| s.0);
    let mut args = ARGS.to_vec();
    args.extend(["--stream-timeout-s", "1"]);
    let live = parity(session, &args);
    let said: Vec<(String, String)> = (live.iter())
        .map(|e| {
            let what = match e["type"].as_str().unwrap() {
                "session.join" => e["payload"]["participant"]["name"].to_string(),
                "context.add" => e["payload"]["content"].to_string(),
                "session.leave" => e["payload"]["reason"].to_string(),
                k => k.to_owned(),
            };
            (e["type"].as_str().unwrap().to_owned(), what)
        })
        .collect();
    let kinds: Vec<&str> = said
        .iter()
        .map(|(k, w)| {
            if k == "context.add" {
                w.as_str()
            } else {
                k.as_str()
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "session.join",
            "\"Hi.\"",
            "session.join",
            "\"Timeout soon.\"",
            "session.leave",
            "session.leave",
            "session.join",
            "\"Back.\"",
            "\"Still here\"",
            "session.leave"
        ],
        "{said:?}"
    );
    assert_eq!(said[0].1, "\"Alice\"", "the early SDES names the join");
}

fn mixed(marker: bool, seq: u16, ts: u32, csrc: u32, text: &str) -> Vec<u8> {
    let mut d = plain(marker, seq, ts, A, text);
    d[0] |= 1;
    let payload = d.split_off(12);
    d.extend_from_slice(&csrc.to_be_bytes());
    d.extend_from_slice(&payload);
    d
}

/// A mixer (RFC 9071) whose RTCP, on the RTCP port, names its sources and says BYE for one,
/// which speaks again later, then the mixer's own BYE: the same both ways.
#[test]
fn a_mixers_sources_are_the_same_live_and_replayed() {
    let mut names = Vec::new();
    rtcp::write_sr(&mut names, A, 0, 0, 0, 0);
    rtcp::write_sdes(&mut names, A, "mixer@host", None);
    rtcp::write_sdes(&mut names, 0x11, "one@host", Some("One"));
    rtcp::write_sdes(&mut names, 0x22, "two@host", Some("Two"));
    let mut one_bye = Vec::new();
    rtcp::write_rr(&mut one_bye, A);
    rtcp::write_bye(&mut one_bye, 0x11);
    let mut own_bye = Vec::new();
    rtcp::write_rr(&mut own_bye, A);
    rtcp::write_bye(&mut own_bye, A);
    let session = vec![
        (0, From::ARtcp, To::Rtcp, names),
        (
            100,
            From::ARtp,
            To::Rtp,
            mixed(true, 1, 100, 0x11, "\u{feff}One speaks. "),
        ),
        (
            200,
            From::ARtp,
            To::Rtp,
            mixed(false, 2, 200, 0x22, "Two speaks. "),
        ),
        (
            300,
            From::ARtp,
            To::Rtp,
            mixed(false, 3, 300, 0x11, "One again"),
        ),
        (400, From::ARtcp, To::Rtcp, one_bye),
        (
            500,
            From::ARtp,
            To::Rtp,
            mixed(false, 4, 500, 0x22, "Two goes on. "),
        ),
        (
            1500,
            From::ARtp,
            To::Rtp,
            mixed(true, 5, 1500, 0x11, "One is back. "),
        ),
        (2000, From::ARtcp, To::Rtcp, own_bye),
        (2600, From::BRtp, To::Elsewhere, b"end".to_vec()),
    ];
    let live = parity(session, &ARGS);
    let said: Vec<String> = (live.iter())
        .map(|e| {
            let who = e["sender"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_owned();
            match e["type"].as_str().unwrap() {
                "session.join" => format!("{who} joins as {}", e["payload"]["participant"]["name"]),
                "context.add" => format!("{who}: {}", e["payload"]["content"]),
                "session.leave" => format!("{who} leaves: {}", e["payload"]["reason"]),
                k => format!("{who} {k}"),
            }
        })
        .collect();
    assert_eq!(
        said,
        [
            "csrc:00000011 joins as \"One\"",
            "csrc:00000011: \"One speaks.\"",
            "csrc:00000022 joins as \"Two\"",
            "csrc:00000022: \"Two speaks.\"",
            "csrc:00000022: \"Two goes on.\"",
            "csrc:00000011: \"One again\"",
            "csrc:00000011 leaves: \"rtcp bye\"",
            "csrc:00000011 joins as \"One\"",
            "csrc:00000011: \"One is back.\"",
            "csrc:00000011 leaves: \"rtcp bye\"",
            "csrc:00000022 leaves: \"rtcp bye\"",
        ]
    );
}

/// A live gateway run with `--rtcp false` (its --help's way to leave the RTCP port alone)
/// never read port N+1: replaying its capture with `--port N` must not either, and the flag
/// that said so live says so to replay. Only a config file's `rtcp = false` did: `replay
/// --rtcp false` was refused ("unexpected argument"), and without it a BYE sent to N+1 (to
/// another program there) ended the stream in replay, never live.
#[test]
fn replay_takes_the_live_gateways_rtcp_flag() {
    let rtp_from: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let rtcp_from: SocketAddr = "127.0.0.1:40001".parse().unwrap();
    let to_rtp: SocketAddr = "127.0.0.1:5004".parse().unwrap();
    let to_rtcp: SocketAddr = "127.0.0.1:5005".parse().unwrap();
    let mut bye = Vec::new();
    rtcp::write_rr(&mut bye, A);
    rtcp::write_bye(&mut bye, A);
    let frames = [
        (0, rtp_from, to_rtp, plain(true, 1, 0, A, "One. ")),
        (100, rtcp_from, to_rtcp, bye),
        (200, rtp_from, to_rtp, plain(false, 2, 200, A, "Two. ")),
    ];
    let path = std::env::temp_dir().join(format!(
        "pvp-t140-review-r-rtcp-{}.pcap",
        std::process::id()
    ));
    std::fs::write(&path, pcap(&frames)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .args(["--port", "5004", "--rtcp", "false"])
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let envelopes: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let reasons: Vec<&str> = (envelopes.iter())
        .filter(|e| e["type"] == "session.leave")
        .map(|e| e["payload"]["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["gateway shutdown"], "{envelopes:?}");
    let joins = envelopes.iter().filter(|e| e["type"] == "session.join");
    assert_eq!(joins.count(), 1, "{envelopes:?}");
}

/// A sender's first compound (RR + SDES NAME) to the RTCP port, then at once its first RTP
/// packet, as endpoints start (RFC 3550 6.2: the first compound goes out at once); and its
/// BYE at once after its last packet. Replayed, the join says "Alice". Live it said "T.140
/// a1a1a1a1 (127.0.0.1:P)" and a `participant.announce` renamed it (4 runs in 5): udp.rs
/// drains the RTP already queued before each RTCP datagram of the feed (so that a BYE follows
/// the last packets), which puts an SDES sent first after the packet that opens the stream,
/// and the RTCP reader's hop through the feed lets the RTP be read first anyway (tried: no
/// drain before a compound without BYE still failed 5 runs in 6, so the hop decides).
/// Timing-bound, so not run by default.
#[test]
#[ignore = "known gap: live, an SDES sent to the RTCP port just before the first RTP packet is \
            read after it (the worker drains queued RTP before each RTCP datagram, and the RTCP \
            reader is a hop behind): the join goes out unnamed and an announce follows, where \
            replay joins named; a fix needs a new stream's join held for the RTCP feed (skipping \
            the drain for SDES-only compounds alone did not help)"]
fn an_sdes_sent_just_before_the_first_packet_names_the_join_live_as_replayed() {
    let mut early = Vec::new();
    rtcp::write_rr(&mut early, A);
    rtcp::write_sdes(&mut early, A, "alice@host", Some("Alice"));
    let mut a_bye = Vec::new();
    rtcp::write_rr(&mut a_bye, A);
    rtcp::write_bye(&mut a_bye, A);
    let session = vec![
        (0, From::ARtcp, To::Rtcp, early),
        (0, From::ARtp, To::Rtp, plain(true, 1, 0, A, "\u{feff}Hi. ")),
        (
            100,
            From::ARtp,
            To::Rtp,
            plain(false, 2, 100, A, "Last words"),
        ),
        (100, From::ARtcp, To::Rtcp, a_bye),
        (1000, From::BRtp, To::Elsewhere, b"end".to_vec()),
    ];
    parity(session, &ARGS);
}
