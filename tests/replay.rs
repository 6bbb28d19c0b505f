//! `pvp-t140 replay` on captures written byte by byte: the replay clock, and `--compat t140llm`
//! multiplexing cases the real captures in `pcaps/` do not hold.

use std::process::Command;

use serde_json::Value;

#[path = "common/frames.rs"]
mod frames;
use frames::{pcap_to, udp_ipv4};

/// One RTP packet.
fn rtp(pt: u8, marker: bool, seq: u16, ts: u32, ssrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, (u8::from(marker) << 7) | pt];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&ts.to_be_bytes());
    p.extend_from_slice(&ssrc.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// A classic microsecond pcap of (time in µs, UDP payload).
fn pcap(packets: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let to: Vec<(u64, u16, Vec<u8>)> = packets.iter().map(|(t, p)| (*t, 5004, p.clone())).collect();
    pcap_to(&to)
}

fn replay(name: &str, packets: &[(u64, Vec<u8>)], args: &[&str]) -> Vec<Value> {
    replay_capture(name, &pcap(packets), args)
}

fn replay_capture(name: &str, capture: &[u8], args: &[&str]) -> Vec<Value> {
    let (ok, envelopes, stderr) = replay_status(name, capture, args);
    assert!(ok, "{stderr}");
    envelopes
}

/// Runs `pvp-t140 replay` on `capture`: exit success, stdout envelopes, stderr.
fn replay_status(name: &str, capture: &[u8], args: &[&str]) -> (bool, Vec<Value>, String) {
    let (code, out, err) = frames::replay(name, capture, args);
    let envelopes = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (code == Some(0), envelopes, err)
}

/// (sender, content) of every context.add.
fn adds(envelopes: &[Value]) -> Vec<(String, String)> {
    envelopes
        .iter()
        .filter(|e| e["type"] == "context.add")
        .map(|e| {
            (
                e["sender"].as_str().unwrap().to_owned(),
                e["payload"]["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const T0: u64 = 1_700_000_000_000_000;

/// A capture whose clock steps back (an NTP correction while tcpdump runs, or two captures
/// concatenated with `mergecap -a`): after the step the capture still shows 10 s between
/// words, and those pauses must still be idle flushes. Pinning every later packet to the time
/// before the step would let no time pass for as long as the step (here an hour): one merged
/// chunk, all with one timestamp.
#[test]
fn after_the_capture_clock_steps_back_later_pauses_still_count() {
    let ssrc = 0x5eed_0001;
    let back = T0 - 3_600_000_000;
    let packets = vec![
        (T0, rtp(98, true, 1, 0, ssrc, b"Hi.")),
        (back, rtp(98, false, 2, 1000, ssrc, b" one")),
        (back + 10_000_000, rtp(98, false, 3, 2000, ssrc, b" two")),
        (back + 20_000_000, rtp(98, false, 4, 3000, ssrc, b" three")),
    ];
    let envelopes = replay("clockstep", &packets, &[]);
    let texts: Vec<String> = adds(&envelopes).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        texts,
        ["Hi.", "one", "two", "three"],
        "10 s pauses after the step are idle flushes"
    );
}

const RS: u8 = 0x1e;

fn named(id: &str, text: &str) -> Vec<u8> {
    let mut p = id.as_bytes().to_vec();
    p.push(RS);
    p.extend_from_slice(text.as_bytes());
    p
}

/// t140llm multiplexing (docs/t140llm.md section 6) takes any string as a stream id, and a
/// model name is the natural one: `openai/gpt-4o`. Each id must be its own participant, its
/// `/` percent-encoded in the participant id (where `/` separates the parts), and no id may
/// show in the text. Refusing the id would read the whole payload as text: both streams
/// merged into the SSRC's participant, the ids spliced into the transcript.
#[test]
fn t140llm_stream_ids_with_a_slash_are_still_separate_participants() {
    let ssrc = 0x1122_3344;
    let packets = vec![
        (
            T0,
            rtp(96, false, 0, 0, ssrc, &named("openai/gpt-4o", "Hi ")),
        ),
        (
            T0 + 1000,
            rtp(96, false, 1, 160, ssrc, &named("anthropic/claude", "Yo ")),
        ),
        (
            T0 + 100_000,
            rtp(96, false, 2, 320, ssrc, &named("openai/gpt-4o", "A.")),
        ),
        (
            T0 + 101_000,
            rtp(96, false, 3, 480, ssrc, &named("anthropic/claude", "B.")),
        ),
    ];
    let envelopes = replay("slash", &packets, &["--compat", "t140llm"]);
    let got = adds(&envelopes);
    for (_, text) in &got {
        assert!(
            !text.contains("openai") && !text.contains("anthropic"),
            "ids in the text: {got:?}"
        );
    }
    let senders: std::collections::BTreeSet<&str> = got.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        senders,
        [
            "t140:11223344@127.0.0.1:40000/anthropic%2Fclaude",
            "t140:11223344@127.0.0.1:40000/openai%2Fgpt-4o"
        ]
        .into(),
        "two streams, two participants: {got:?}"
    );
    let names: Vec<&str> = envelopes
        .iter()
        .filter(|e| e["type"] == "session.join")
        .map(|e| {
            e["payload"]["participant"]["metadata"]["stream_id"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(
        names,
        ["openai/gpt-4o", "anthropic/claude"],
        "the id as sent"
    );
}

/// In t140llm's multiplex mode all streams share one SSRC and one sequence. A lost packet's
/// mark must not go to the stream's SSRC speaker, a participant that does not exist (it would
/// join the session only to say U+FFFD, and leave). Which named stream lost the packet is not
/// known, so no one's text is marked (the loss is counted: `lost_unattributed`).
#[test]
fn t140llm_multiplex_loss_does_not_invent_a_participant() {
    let ssrc = 0x1122_3344;
    let packets = vec![
        (T0, rtp(96, false, 0, 0, ssrc, &named("alpha", "Hi "))),
        (
            T0 + 1000,
            rtp(96, false, 1, 160, ssrc, &named("beta", "Hi ")),
        ),
        // seq 2 (alpha "A.") lost
        (
            T0 + 101_000,
            rtp(96, false, 3, 480, ssrc, &named("beta", "B.")),
        ),
        (
            T0 + 200_000,
            rtp(96, false, 4, 640, ssrc, &named("alpha", "C.")),
        ),
    ];
    let envelopes = replay("muxloss", &packets, &["--compat", "t140llm"]);
    let joined: Vec<&str> = envelopes
        .iter()
        .filter(|e| e["type"] == "session.join")
        .map(|e| e["sender"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined,
        [
            "t140:11223344@127.0.0.1:40000/alpha",
            "t140:11223344@127.0.0.1:40000/beta"
        ],
        "{:?}",
        adds(&envelopes)
    );
    let got = adds(&envelopes);
    assert!(got.iter().all(|(_, t)| !t.contains('\u{FFFD}')), "{got:?}");
}

/// A capture that ends in the middle of a record: what `tcpdump -w` leaves when it is killed
/// (or the disk fills, or the file is copied while still being written). Wireshark and tshark
/// read every whole packet of it and warn that it was cut short. Replay stops with an error
/// before its end-of-capture flush: the text still held (no sentence end, no idle flush yet) is
/// never sent and the participant that joined never leaves; here nothing at all comes out. The
/// whole packets must give the envelopes they give without the cut tail.
#[test]
fn a_capture_cut_short_in_its_last_record_still_flushes_and_leaves() {
    let ssrc = 0x5eed_0002;
    let mut file = pcap(&[(T0, rtp(98, true, 1, 0, ssrc, b"Hello there"))]);
    // The next record: its header and part of its frame, as a killed tcpdump left it.
    let whole = pcap(&[(T0 + 300_000, rtp(98, false, 2, 300, ssrc, b" again"))]);
    file.extend_from_slice(&whole[24..24 + 16 + 10]);
    let path =
        std::env::temp_dir().join(format!("pvp-t140-replay-cut-{}.pcap", std::process::id()));
    std::fs::write(&path, &file).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .output()
        .expect("run pvp-t140 replay");
    std::fs::remove_file(&path).ok();
    let envelopes: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = envelopes
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        (kinds, adds(&envelopes)),
        (
            vec!["session.join", "context.add", "session.leave"],
            vec![(
                "t140:5eed0002@127.0.0.1:40000".to_owned(),
                "Hello there".to_owned()
            )]
        ),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// src/replay.rs: with `--port N`, replay takes "only datagrams to that port and to the RTCP
/// port after it: what a live gateway on that port reads by default, so both give the same
/// envelopes". The live gateway now drops a datagram on the RTCP port that is not RTCP
/// (`Gateway::handle_rtcp_port`: `rtcp_malformed`; README `--rtcp`: "anything else arriving
/// there, RTP included, is dropped"; tests/shell.rs
/// `rtp_text_sent_to_the_rtcp_port_is_not_a_transcript`), but replay still hands the RTCP
/// port's datagrams to `handle_datagram`, the RTP path: an RTP text packet to port 5005 in a
/// capture becomes a participant and a transcript in `replay --port 5004`, and nothing on the
/// live gateway that captured it. Replay should drop it as the live gateway does.
#[test]
fn rtp_to_the_rtcp_port_is_no_transcript_in_replay_as_it_is_none_live() {
    let capture = pcap_to(&[
        (T0, 5004, rtp(98, true, 1, 0, 0x1111, b"To the RTP port. ")),
        (
            T0 + 100_000,
            5005,
            rtp(98, true, 1, 0, 0x5757, b"To the RTCP port. "),
        ),
    ]);
    let envelopes = replay_capture("rtponrtcpport", &capture, &["--port", "5004"]);
    assert_eq!(
        adds(&envelopes)
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>(),
        ["To the RTP port."],
        "RTP on the RTCP port, dropped live, is a transcript in replay"
    );
}

/// An RTCP BYE (on the RTCP port, as SIP endpoints send it, RFC 3550 11) captured 10 ms before
/// the source's last RTP packet: it overtook it (RFC 3550 6.3.7), on another path or because
/// the two ports are read apart. The whole binary, from the capture: one participant, its last
/// words delivered after the BYE, no loss mark, one leave. (The leave came at the BYE and the
/// late packet opened a second participant: another join, "\u{fffd} World.", another leave.)
#[test]
fn a_bye_that_overtook_the_last_packet_leaves_one_participant_with_all_its_words() {
    let mut bye = vec![0x80, 201, 0, 1];
    bye.extend_from_slice(&0x7777u32.to_be_bytes());
    bye.extend_from_slice(&[0x81, 203, 0, 1]);
    bye.extend_from_slice(&0x7777u32.to_be_bytes());
    let capture = pcap_to(&[
        (T0, 5004, rtp(98, true, 1, 0, 0x7777, b"Hello there. ")),
        (T0 + 300_000, 5005, bye),
        (
            T0 + 310_000,
            5004,
            rtp(98, false, 2, 300, 0x7777, b"World. "),
        ),
        (
            T0 + 5_000_000,
            5004,
            rtp(98, true, 1, 0, 0x8888, b"Later. "),
        ),
    ]);
    let envelopes = replay_capture("byeovertakes", &capture, &["--port", "5004"]);
    let kinds = |kind: &str, who: &str| {
        envelopes
            .iter()
            .filter(|e| e["type"] == kind && e["sender"].as_str().unwrap().contains(who))
            .count()
    };
    assert_eq!(kinds("session.join", "00007777"), 1, "{envelopes:?}");
    assert_eq!(kinds("session.leave", "00007777"), 1, "{envelopes:?}");
    let said: Vec<String> = adds(&envelopes).into_iter().map(|(_, t)| t).collect();
    assert_eq!(said, ["Hello there.", "World.", "Later."]);
    let leave = envelopes
        .iter()
        .find(|e| e["type"] == "session.leave")
        .unwrap();
    assert_eq!(leave["payload"]["reason"], "rtcp bye");
}

/// A mixer's packet (SSRC 0x9999) for its source `csrc` (RFC 9071: one CSRC names who speaks).
fn mixed(marker: bool, seq: u16, ts: u32, csrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = rtp(98, marker, seq, ts, 0x9999, &[]);
    p[0] |= 1;
    p.extend_from_slice(&csrc.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// The mixer's RTCP, on the RTCP port, forwarding its source 2's BYE (RFC 3550 6.6), captured
/// 5 ms before source 2's last packet: it overtook it, with nothing held to show a packet was
/// missing. The whole binary, from the capture: source 2 says all its words and leaves once,
/// and the mixer and source 1 go on. (Source 2 left at the BYE, and its late packet made it
/// join again: a second participation, never left.)
#[test]
fn a_mixer_sources_bye_that_overtook_its_last_packet_leaves_it_once_with_all_its_words() {
    let mut bye = vec![0x80, 201, 0, 1];
    bye.extend_from_slice(&0x9999u32.to_be_bytes());
    bye.extend_from_slice(&[0x81, 203, 0, 1]);
    bye.extend_from_slice(&2u32.to_be_bytes());
    let capture = pcap_to(&[
        (T0, 5004, mixed(true, 1, 0, 1, b"Alpha. ")),
        (T0 + 10_000, 5004, mixed(false, 2, 10, 2, b"Bravo ")),
        (T0 + 300_000, 5005, bye),
        (T0 + 305_000, 5004, mixed(false, 3, 298, 2, b"ends. ")),
        (T0 + 5_000_000, 5004, mixed(false, 4, 5000, 1, b"More. ")),
    ]);
    let envelopes = replay_capture("mixerbyeovertakes", &capture, &["--port", "5004"]);
    let of = |kind: &str, who: &str| {
        envelopes
            .iter()
            .filter(|e| e["type"] == kind && e["sender"].as_str().unwrap().ends_with(who))
            .count()
    };
    assert_eq!(of("session.join", "csrc:00000002"), 1, "{envelopes:?}");
    assert_eq!(of("session.leave", "csrc:00000002"), 1, "{envelopes:?}");
    let said: Vec<String> = adds(&envelopes).into_iter().map(|(_, t)| t).collect();
    assert_eq!(said, ["Alpha.", "Bravo ends.", "More."]);
}

/// A capture stamped from the epoch (relative times, or shifted to 0 to anonymise it): the
/// rate limit's new buckets were refilled from the epoch and had nothing, so the first
/// packet of every source was refused as `rate_limited`.
#[test]
fn a_capture_stamped_at_the_epoch_is_not_rate_limited_on_its_first_packet() {
    let envelopes = replay(
        "epoch0",
        &[(0, rtp(98, true, 1, 0, 0x1234, b"Hello there. "))],
        &[],
    );
    let said: Vec<String> = adds(&envelopes).into_iter().map(|(_, t)| t).collect();
    assert_eq!(said, ["Hello there."]);
}

/// A SIP call captured whole: the text on port 5004 ("Hello there", no sentence end), and 70 s
/// later the call's SIP BYE on port 5060, which `replay --port 5004` leaves out. The capture's
/// timestamps are the clock, so the time it covers after the last datagram fed still passes:
/// a live gateway on 5004 flushed the text on idle 2 s after it (`flush:idle`, stamped T0+2 s)
/// and let the stream go at its timeout, both before the capture's end. Replay ended at the
/// last datagram it fed instead, and gave the text as `flush:end` stamped T0.
#[test]
fn time_the_capture_covers_after_the_last_fed_datagram_still_passes() {
    let capture = pcap_to(&[
        (T0, 5004, rtp(98, true, 1, 0, 0x1234, b"Hello there")),
        (
            T0 + 70_000_000,
            5060,
            b"BYE sip:bob@example.com SIP/2.0\r\n\r\n".to_vec(),
        ),
    ]);
    let envelopes = replay_capture("capturegoeson", &capture, &["--port", "5004"]);
    let add = envelopes
        .iter()
        .find(|e| e["type"] == "context.add")
        .expect("the text is said");
    assert_eq!(add["payload"]["content"], "Hello there");
    assert_eq!(
        (add["payload"]["tags"][2].as_str(), add["ts"].as_str()),
        (Some("flush:idle"), Some("2023-11-14T22:13:22.000Z")),
        "{add}"
    );
}

/// (content, flush cause, ts) of every context.add.
fn adds_flushed(envelopes: &[Value]) -> Vec<(String, String, String)> {
    envelopes
        .iter()
        .filter(|e| e["type"] == "context.add")
        .map(|e| {
            (
                e["payload"]["content"].as_str().unwrap().to_owned(),
                e["payload"]["tags"][2].as_str().unwrap().to_owned(),
                e["ts"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// With `--port`, the time the capture's tail covers after a step back of its clock still
/// passes (review, session 32): "Hello" goes to 5004, then SIP to 5060 for 15 s, the clock set
/// back an hour after its first second. Every datagram fed, the replay runs to T0+11 s and
/// "Hello" is an idle flush at T0+2 s, as live; with `--port 5004` the frames after the step
/// counted as earlier (the tail was measured by a clock that never steps), the replay ended at
/// T0+1 s and "Hello" came out as `flush:end` then: the filter changed the envelopes.
#[test]
fn with_port_the_time_after_a_clock_step_in_the_captures_tail_still_passes() {
    let back = T0 - 3_600_000_000;
    let capture = pcap_to(&[
        (T0, 5004, rtp(98, true, 1, 0, 0x1234, b"Hello")),
        (
            T0 + 1_000_000,
            5060,
            b"INFO sip:bob SIP/2.0\r\n\r\n".to_vec(),
        ),
        (
            back + 5_000_000,
            5060,
            b"INFO sip:bob SIP/2.0\r\n\r\n".to_vec(),
        ),
        (
            back + 15_000_000,
            5060,
            b"BYE sip:bob SIP/2.0\r\n\r\n".to_vec(),
        ),
    ]);
    let idle = vec![(
        "Hello".to_owned(),
        "flush:idle".to_owned(),
        "2023-11-14T22:13:22.000Z".to_owned(),
    )];
    let all = replay_capture("tailstep", &capture, &[]);
    assert_eq!(adds_flushed(&all), idle, "every datagram fed");
    let filtered = replay_capture("tailstep", &capture, &["--port", "5004"]);
    assert_eq!(adds_flushed(&filtered), idle, "--port 5004");
}

/// The same between two datagrams fed: with `--port`, frames not fed that pass time and then
/// step the clock back are the time between the datagrams, as without it. "Hello" to 5004,
/// SIP to 5060 5 s on, the clock set back an hour, " world. " to 5004 half a second after the
/// SIP: every datagram fed, "Hello" is an idle flush at T0+2 s and " world." comes at the
/// step, T0+5 s; with `--port 5004` the time the SIP covered was lost across the step (the
/// next datagram was placed at the last one fed), and "Hello world." came out as one sentence.
#[test]
fn with_port_the_time_before_a_clock_step_between_datagrams_still_passes() {
    let back = T0 - 3_600_000_000;
    let capture = pcap_to(&[
        (T0, 5004, rtp(98, true, 1, 0, 0x1234, b"Hello")),
        (
            T0 + 5_000_000,
            5060,
            b"INFO sip:bob SIP/2.0\r\n\r\n".to_vec(),
        ),
        (
            back + 5_500_000,
            5004,
            rtp(98, false, 2, 5500, 0x1234, b" world. "),
        ),
    ]);
    let said = vec![
        (
            "Hello".to_owned(),
            "flush:idle".to_owned(),
            "2023-11-14T22:13:22.000Z".to_owned(),
        ),
        (
            "world.".to_owned(),
            "flush:sentence".to_owned(),
            "2023-11-14T22:13:25.000Z".to_owned(),
        ),
    ];
    let all = replay_capture("midstep", &capture, &[]);
    assert_eq!(adds_flushed(&all), said, "every datagram fed");
    let filtered = replay_capture("midstep", &capture, &["--port", "5004"]);
    assert_eq!(adds_flushed(&filtered), said, "--port 5004");
}

/// A gateway run with `--config` mapping rules gives its participants their mapped ids; its
/// capture replayed with the same file must too, or replay does not show what the gateway
/// sent. `[[stream]]` rules come only from a file: `replay` refused `--config` (exit 2), so
/// the mapped "alice" came out as `t140:<ssrc>@<addr>`.
#[test]
fn replay_takes_the_configuration_file_the_live_gateway_ran_with() {
    let cfg = std::env::temp_dir().join(format!("pvp-t140-replay-cfg-{}.toml", std::process::id()));
    std::fs::write(
        &cfg,
        "[[stream]]\nssrc = \"0x00001234\"\nparticipant = \"alice\"\n",
    )
    .unwrap();
    let envelopes = replay(
        "replaycfg",
        &[(T0, rtp(98, true, 1, 0, 0x1234, b"Hello there. "))],
        &["--port", "5004", "--config", cfg.to_str().unwrap()],
    );
    std::fs::remove_file(&cfg).ok();
    assert!(!envelopes.is_empty());
    assert!(
        envelopes.iter().all(|e| e["sender"] == "alice"),
        "{envelopes:?}"
    );
}

/// The live gateway's file also says where it listened, which server it sent to and where its
/// metrics were: replay reads a capture and prints to stdout, so those keys are ignored (the
/// file need not be edited), while its core settings apply, and a flag overrides the file as
/// live.
#[test]
fn replay_ignores_the_live_io_keys_of_the_configuration_file() {
    let cfg = std::env::temp_dir().join(format!(
        "pvp-t140-replay-live-keys-{}.toml",
        std::process::id()
    ));
    std::fs::write(
        &cfg,
        "listen = \"0.0.0.0:5004\"\nserver = \"ws://192.0.2.1:9\"\nmetrics = \"127.0.0.1:9\"\n\
         workers = 4\nsession = \"from-file\"\nidle_flush_ms = 500\n",
    )
    .unwrap();
    // A second speaker a second later, so the capture covers the first one's idle flush.
    let packets = [
        (T0, rtp(98, true, 1, 0, 0x1234, b"Hello")),
        (T0 + 1_000_000, rtp(98, true, 1, 0, 0x5678, b"Hi")),
    ];
    let args = ["--config", cfg.to_str().unwrap()];
    let from_file = replay("livekeys", &packets, &args);
    let flag = replay(
        "livekeysflag",
        &packets,
        &[&args[..], &["--session", "s2"]].concat(),
    );
    std::fs::remove_file(&cfg).ok();
    let add = |envelopes: &[Value]| {
        let e = envelopes
            .iter()
            .find(|e| e["type"] == "context.add" && e["payload"]["content"] == "Hello")
            .cloned()
            .expect("the text is said");
        (e["session"].clone(), e["ts"].clone())
    };
    // The idle flush of the file's 500 ms, in its session; the flag's session over the file's.
    assert_eq!(
        add(&from_file),
        (
            Value::from("from-file"),
            Value::from("2023-11-14T22:13:20.500Z")
        )
    );
    assert_eq!(add(&flag).0, "s2");
}

/// A loopback (LINKTYPE_NULL) IPv4 packet from 127.0.0.1 to 127.0.0.1: UDP 40000 -> `port`
/// with `payload`, or (`port` None) an ICMP echo request.
fn loopback(port: Option<u16>, payload: &[u8]) -> Vec<u8> {
    let (proto, l4): (u8, Vec<u8>) = match port {
        Some(port) => {
            let mut u = 40000u16.to_be_bytes().to_vec();
            u.extend_from_slice(&port.to_be_bytes());
            u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            u.extend_from_slice(&[0, 0]);
            u.extend_from_slice(payload);
            (17, u)
        }
        None => (1, vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0]),
    };
    let total = 20 + l4.len();
    let mut f = 2u32.to_le_bytes().to_vec();
    f.extend_from_slice(&[
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        1,
        0x40,
        0,
        64,
        proto,
        0,
        0,
    ]);
    f.extend_from_slice(&[127, 0, 0, 1, 127, 0, 0, 1]);
    f.extend(l4);
    f
}

/// A little-endian pcapng: one section, `interfaces` LINKTYPE_NULL interfaces (microseconds),
/// and (interface, time in µs, frame) as Enhanced Packet Blocks.
fn pcapng(interfaces: u32, frames: &[(u32, u64, Vec<u8>)]) -> Vec<u8> {
    let block = |out: &mut Vec<u8>, kind: u32, body: &[u8]| {
        let mut body = body.to_vec();
        while !body.len().is_multiple_of(4) {
            body.push(0);
        }
        let len = (12 + body.len()) as u32;
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&len.to_le_bytes());
    };
    let mut f = Vec::new();
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut f, 0x0a0d_0d0a, &shb);
    for _ in 0..interfaces {
        let mut idb = 0u16.to_le_bytes().to_vec(); // LINKTYPE_NULL
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&262_144u32.to_le_bytes());
        block(&mut f, 1, &idb);
    }
    for (iface, us, data) in frames {
        let mut epb = iface.to_le_bytes().to_vec();
        epb.extend_from_slice(&((us >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(*us as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(data);
        block(&mut f, 6, &epb);
    }
    f
}

/// README (Replaying captures): "after a step back in the capture's clock of a second or more
/// (an NTP step, `mergecap -a`), later packets keep their spacing". A pcapng on two
/// interfaces whose clocks disagree by a minute (an unsynchronised NIC stamping in hardware):
/// the RTP is all on interface 0, half a second apart; interface 1 carries only other traffic
/// (ICMP). Those frames must not be the replay's clock: one stamped a minute behind was taken
/// for a step back and added a minute to every later frame (the 0.5 s between "Hello" and
/// " there." became over 60 s, the stream timed out in between, and its participant left and
/// joined again, the sentence cut in two); one a minute ahead would time the stream out.
#[test]
fn frames_of_an_interface_stamping_a_minute_off_do_not_stretch_the_rtp_between_them() {
    for other in [T0 - 61_000_000 + 200_000, T0 + 61_000_000 + 200_000] {
        let ssrc = 0x5eed_00d1;
        let frames = vec![
            (
                0,
                T0,
                loopback(Some(5004), &rtp(98, true, 1, 0, ssrc, b"Hello")),
            ),
            (1, other, loopback(None, b"")),
            (
                0,
                T0 + 500_000,
                loopback(Some(5004), &rtp(98, false, 2, 500, ssrc, b" there. ")),
            ),
        ];
        let envelopes = replay_capture("skew", &pcapng(2, &frames), &[]);
        let kinds: Vec<&str> = envelopes
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        let said: Vec<&str> = envelopes
            .iter()
            .filter(|e| e["type"] == "context.add")
            .map(|e| e["payload"]["content"].as_str().unwrap())
            .collect();
        assert_eq!(said, ["Hello there."], "{kinds:?}");
        assert_eq!(
            kinds.iter().filter(|k| **k == "session.join").count(),
            1,
            "{kinds:?}"
        );
    }
}

/// A failed write of the envelopes to stdout (a full disk, a closed pipe) is reported as an
/// error of the output, not of the capture (review, session 32): it was prefixed with the
/// capture's path, `pvp-t140: CAPTURE.pcap: No space left on device (os error 28)`, and the
/// user looked for it in a file that is fine.
#[test]
fn a_failed_write_to_stdout_is_not_reported_as_an_error_of_the_capture_file() {
    let path = std::env::temp_dir().join(format!(
        "pvp-t140-replay-devfull-{}.pcap",
        std::process::id()
    ));
    std::fs::write(
        &path,
        pcap(&[(T0, rtp(98, true, 1, 0, 0x1234, b"Hello there. "))]),
    )
    .unwrap();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&path)
        .stdout(full)
        .output()
        .expect("run pvp-t140 replay");
    std::fs::remove_file(&path).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("writing envelopes to stdout")
            && last.contains("os error 28")
            && !last.contains(&path.display().to_string()),
        "{last}"
    );
}

/// The first failed write of the envelopes ends the replay there (review, session 32): the
/// rest of the capture was still read, for nothing, and a fault further on in it (here a
/// pcapng block shorter than its own header) was then reported instead of the write's error.
#[test]
fn a_failed_write_of_the_envelopes_ends_the_replay_there() {
    struct Full(usize);
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            self.0 += 1;
            Err(std::io::ErrorKind::StorageFull.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let said = rtp(98, true, 1, 0, 0x1234, b"Hello there. ");
    let mut capture = pcapng(1, &[(0, T0, loopback(Some(5004), &said))]);
    capture.extend_from_slice(&6u32.to_le_bytes());
    capture.extend_from_slice(&8u32.to_le_bytes());
    let path = std::env::temp_dir().join(format!(
        "pvp-t140-replay-writefails-{}.pcapng",
        std::process::id()
    ));
    std::fs::write(&path, capture).unwrap();
    let mut out = Full(0);
    let err = pvp_t140::replay::run(&path, pvp_t140::Config::default(), None, &mut out)
        .expect_err("the write failed");
    std::fs::remove_file(&path).ok();
    assert!(
        matches!(err, pvp_t140::replay::ReplayError::Output(_)),
        "{err}"
    );
    assert_eq!(out.0, 1, "one write tried");
}

/// `--log-format` is global: given before `replay` it is replay's, while the live gateway's own
/// flags there are still refused. A review found clap refused the global flag with the others,
/// "the subcommand 'replay' cannot be used with '--log-format'" (review, session 33).
#[test]
fn log_format_before_replay_is_replays_and_a_live_flag_there_is_refused() {
    let capture = concat!(env!("CARGO_MANIFEST_DIR"), "/pcaps/backspace.pcap");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(args)
            .output()
            .expect("run pvp-t140")
    };
    let out = run(&["--log-format", "json", "replay", capture]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!out.stdout.is_empty(), "no envelopes");
    assert!(
        stderr
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "{stderr}"
    );
    let out = run(&["--listen", "127.0.0.1:9", "replay", capture]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the subcommand 'replay' cannot be used with '--listen'"),
        "{stderr}"
    );
}

/// Every live flag given before a subcommand is named in its refusal, as clap's
/// `args_conflicts_with_subcommands` named them ("cannot be used with:" and one line a flag).
/// A review found only the first named (`--listen X --workers 2 replay F` said `--listen`, and
/// the user who removed it was refused again for `--workers`) (review, session 33).
#[test]
fn every_live_flag_before_a_subcommand_is_named_in_its_refusal() {
    let capture = concat!(env!("CARGO_MANIFEST_DIR"), "/pcaps/backspace.pcap");
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            "127.0.0.1:9",
            "--workers",
            "2",
            "replay",
            capture,
        ])
        .output()
        .expect("run pvp-t140");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the subcommand 'replay' cannot be used with:")
            && stderr.contains("\n  --listen\n  --workers\n"),
        "{stderr}"
    );
}

/// A little-endian pcapng block.
fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut body = body.to_vec();
    while !body.len().is_multiple_of(4) {
        body.push(0);
    }
    let len = (12 + body.len()) as u32;
    let mut b = kind.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&body);
    b.extend_from_slice(&len.to_le_bytes());
    b
}

/// A little-endian pcapng, one raw-IP interface (microseconds), holding the Enhanced Packet
/// Blocks of (time in µs, UDP payload to 127.0.0.1:5004).
fn pcapng_blocks(packets: &[(u64, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    let mut idb = 101u16.to_le_bytes().to_vec(); // LINKTYPE_RAW
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&262_144u32.to_le_bytes());
    let mut blocks = vec![block(0x0a0d_0d0a, &shb), block(1, &idb)];
    for (us, payload) in packets {
        let ip = udp_ipv4([127, 0, 0, 1], 40000, [127, 0, 0, 1], 5004, payload);
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((us >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(*us as u32).to_le_bytes());
        epb.extend_from_slice(&(ip.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(ip.len() as u32).to_le_bytes());
        epb.extend_from_slice(&ip);
        blocks.push(block(6, &epb));
    }
    blocks
}

fn of_type<'a>(envelopes: &'a [Value], kind: &str) -> Vec<&'a Value> {
    envelopes.iter().filter(|e| e["type"] == kind).collect()
}

/// A pcapng whose blocks are all whole but one in the middle is corrupt (its trailing Block
/// Total Length disagrees with its leading one: a bit flip, a bad copy) is refused as a
/// whole: "not a readable pcap/pcapng capture: NomError([], Verify)" (as if it were no
/// capture at all), exit 1. By then the
/// records before it have been fed to the core and their participant has joined on stdout,
/// but the replay never shuts the core down: the text it holds (here the unfinished sentence
/// "Hello there", waiting for its idle flush) is never written, and the participant never
/// leaves, so the NDJSON stream has a `session.join` (and "Hi.") without its `session.leave`.
///
/// README, Replaying captures: every timestamped frame moves the clock "and the replay ends at
/// the capture's last frame: the idle flushes and stream timeouts due in the time the capture
/// covers happen as they did live"; a capture that ends inside a record (`cut_short`) is
/// replayed "up to it", flushed and left "as Wireshark reads such a file" (capture.rs), and
/// Wireshark likewise shows every record before a corrupt one. The records before the
/// corrupt one must give their text and the leave, whatever the exit status says about the
/// file (it stays a failure, naming the file).
#[test]
fn a_corrupt_block_mid_capture_still_flushes_and_leaves_what_came_before() {
    let hello = rtp(98, true, 1, 0, 0x1234, b"Hi. Hello there");
    let later = rtp(98, false, 2, 3000, 0x1234, b" and more");
    let mut blocks = pcapng_blocks(&[
        (1_000_000, hello),
        (4_000_000, later.clone()),
        (4_500_000, later),
    ]);
    // The second packet's block: its trailing length no longer matches.
    let bad = blocks.len() - 2;
    let n = blocks[bad].len();
    let wrong = (n as u32 + 4).to_le_bytes();
    blocks[bad][n - 4..].copy_from_slice(&wrong);
    let (ok, envelopes, stderr) = replay_status("corrupt-mid", &blocks.concat(), &[]);
    assert!(
        !ok && stderr.contains("corrupt-mid"),
        "the error is still reported: {stderr}"
    );
    // And said as what it is: a corrupt record after whole ones, not a file that is no capture.
    assert!(
        stderr.contains("a corrupt record after the first 1 packet records")
            && !stderr.contains("not a readable"),
        "{stderr}"
    );
    let adds: Vec<&str> = of_type(&envelopes, "context.add")
        .iter()
        .map(|e| e["payload"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        adds,
        ["Hi.", "Hello there"],
        "the text before the corrupt block is lost; stderr: {stderr}"
    );
    assert_eq!(of_type(&envelopes, "session.join").len(), 1, "{stderr}");
    assert_eq!(
        of_type(&envelopes, "session.leave").len(),
        1,
        "a join without its leave; stderr: {stderr}"
    );
}

/// `replay --port 0` kept nothing (no datagram goes to port 0) and said nothing: an operator
/// who meant "any port" saw an empty replay, exit 0. Refused as a bad value, as the live
/// gateway's flags are.
#[test]
fn a_replay_filtered_to_port_0_is_refused() {
    let capture = pcap(&[(0, rtp(98, true, 1, 0, 7, b"hello."))]);
    let (ok, envelopes, stderr) = replay_status("port0", &capture, &["--port", "0"]);
    assert!(!ok, "{stderr}");
    assert!(envelopes.is_empty());
    assert!(stderr.contains("--port"), "{stderr}");
}
