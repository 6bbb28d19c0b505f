//! Review r: replay/live parity and the receive side of RTCP. One session (two SSRCs, RED, a
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

#[path = "common/frames.rs"]
mod frames;
use frames::udp_ipv4;

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
        (0, From::ARtp, To::Rtp, plain(true, 1000, 0, A, "\u{feff}Hello there. ")),
        (30, From::ARtcp, To::Rtcp, sr),
        (60, From::BRtp, To::Rtp, red(true, 1, 0, B, &[], "\u{feff}Good ")),
        (120, From::BRtp, To::Rtp, red(false, 2, 100, B, &[(100, "Good ")], "morning")),
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
        (300, From::ARtp, To::Rtp, plain(false, 1002, 600, A, "Lost one. ")),
        // An idle gap, then words with no sentence end: an idle flush.
        (1800, From::ARtp, To::Rtp, plain(false, 1003, 1800, A, "After the pause")),
        (1850, From::ARtp, To::Rtp, plain(false, 1004, 1850, A, " waits")),
        (1900, From::BRtp, To::Rtp, red(false, 6, 1900, B, &[(1500, " you. ")], "Bye now")),
        (3000, From::ARtcp, To::Rtcp, bye_with_reason(A, "done")),
        // B's BYE multiplexed on the RTP port (RFC 5761).
        (3100, From::BRtp, To::Rtp, b_bye),
        (3600, From::BRtp, To::Elsewhere, b"end".to_vec()),
    ]
}

fn pcap(frames: &[(u64, SocketAddr, SocketAddr, Vec<u8>)]) -> Vec<u8> {
    const T0: u64 = 1_700_000_000_000_000;
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&262_144u32.to_le_bytes());
    f.extend_from_slice(&0u32.to_le_bytes()); // LINKTYPE_NULL
    for (ms, from, to, payload) in frames {
        let mut data = 2u32.to_le_bytes().to_vec();
        data.extend(udp_ipv4(
            [127, 0, 0, 1],
            from.port(),
            [127, 0, 0, 1],
            to.port(),
            payload,
        ));
        let us = T0 + ms * 1000;
        f.extend_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
        f.extend_from_slice(&((us % 1_000_000) as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.extend_from_slice(&data);
    }
    f
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
    let mut args = vec!["--listen", "127.0.0.1:0"];
    args.extend(ARGS);
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
    for (ms, from, to, d) in session() {
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
        .args(ARGS)
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
    // And what both say is the session as sent.
    let adds: Vec<String> = (live.iter())
        .filter(|e| e["type"] == "context.add")
        .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
        .collect();
    eprintln!("{}", show(&live));
    assert!(adds.contains(&"Good morning all of you.".to_owned()), "{adds:?}");
}
