//! The receive shell (udp.rs, recv.rs, handoff.rs, main.rs's start and stop) against
//! real sockets and the real binary. Linux only (`/proc`, `kill`).
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;
use common::frozen::{Gw, addr, rtp, rtp_and_rtcp_sockets, start_with_rtcp_port};

/// Every sender's text, by participant id, in order.
fn texts(envelopes: &[Value]) -> std::collections::BTreeMap<String, String> {
    let mut by_sender = std::collections::BTreeMap::<String, String>::new();
    for e in envelopes.iter().filter(|e| e["type"] == "context.add") {
        let sender = e["sender"].as_str().unwrap().to_owned();
        by_sender
            .entry(sender)
            .or_default()
            .push_str(e["payload"]["content"].as_str().unwrap());
    }
    by_sender
}

/// The final counters' `name` (the "counters" log line).
fn counter(stderr: &str, name: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.contains("\"counters\""))?;
    let v: Value = serde_json::from_str(line).ok()?;
    v["fields"][name].as_u64()
}

fn ipv6_loopback() -> bool {
    UdpSocket::bind("[::1]:0").is_ok()
}

/// A dual-stack listener with two workers (`--listen [::]:0 --workers 2`): IPv4 and IPv6
/// senders' words queued while the gateway is frozen all come out whole at SIGTERM, each
/// IPv4 sender known by its IPv4 address.
#[test]
fn dual_stack_workers_deliver_ipv4_and_ipv6_senders_queued_before_sigterm() {
    if !ipv6_loopback() {
        eprintln!("no IPv6 loopback: skipped");
        return;
    }
    let args = [
        "--listen",
        "[::]:0",
        "--workers",
        "2",
        "--idle-flush-ms",
        "60000",
    ];
    let (gw, listening) = Gw::start(&args);
    let port = addr(&listening, "listen").unwrap().port();
    let v4: SocketAddr = ([127, 0, 0, 1], port).into();
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let senders: Vec<(UdpSocket, SocketAddr)> = (0..12)
        .map(|i| {
            if i % 2 == 0 {
                (UdpSocket::bind("127.0.0.1:0").unwrap(), v4)
            } else {
                (UdpSocket::bind("[::1]:0").unwrap(), v6)
            }
        })
        .collect();
    gw.freeze();
    let words = ["Both ", "families ", "arrive."];
    for (w, word) in words.iter().enumerate() {
        for (i, (s, to)) in senders.iter().enumerate() {
            s.send_to(&rtp(1000 + w as u16, 0x6000 + i as u32, word), to)
                .unwrap();
        }
    }
    let (envelopes, stderr) = gw.stop(true);
    let by_sender = texts(&envelopes);
    let want: std::collections::BTreeMap<String, String> = (senders.iter().enumerate())
        .map(|(i, (s, _))| {
            let id = format!("t140:{:08x}@{}", 0x6000 + i as u32, s.local_addr().unwrap());
            (id, words.concat())
        })
        .collect();
    assert_eq!(by_sender, want, "{stderr}");
    assert_eq!(
        counter(&stderr, "datagrams"),
        Some((senders.len() * words.len()) as u64)
    );
    // Said at exit even without --metrics: a run that lost reads would show it.
    assert_eq!(counter(&stderr, "socket_errors"), Some(0), "{stderr}");
    assert_eq!(counter(&stderr, "rtcp_feed_missed"), Some(0), "{stderr}");
}

/// The largest datagrams UDP carries (65,507 bytes over IPv4, 65,527 over IPv6) arrive whole:
/// their text, at the very end of the payload, comes out.
#[test]
fn the_largest_udp_datagrams_are_read_whole() {
    let (gw, listening) = Gw::start(&["--listen", "[::]:0", "--idle-flush-ms", "60000"]);
    let port = addr(&listening, "listen").unwrap().port();
    let mut cases = vec![(
        "127.0.0.1:0",
        SocketAddr::from(([127, 0, 0, 1], port)),
        65_507,
    )];
    if ipv6_loopback() {
        cases.push(("[::1]:0", format!("[::1]:{port}").parse().unwrap(), 65_527));
    }
    let mut want = std::collections::BTreeMap::new();
    let mut sockets = Vec::new();
    for (i, (bind, to, size)) in cases.into_iter().enumerate() {
        let s = UdpSocket::bind(bind).unwrap();
        let ssrc = 0x7000 + i as u32;
        // 12 bytes of RTP header, 3 of BOM: the rest text, ending in a sentence.
        let tail = "The end.";
        let fill = "a ".repeat((size - 12 - 3 - tail.len()) / 2);
        let mut text = format!("{fill}{tail}");
        while 12 + 3 + text.len() < size {
            text.insert(0, 'b');
        }
        let d = rtp(1000, ssrc, &text);
        assert_eq!(d.len(), size);
        s.send_to(&d, to).unwrap();
        want.insert(format!("t140:{ssrc:08x}@{}", s.local_addr().unwrap()), text);
        sockets.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));
    let (envelopes, stderr) = gw.stop(false);
    let got = texts(&envelopes);
    assert_eq!(got.len(), want.len(), "{stderr}");
    for (k, v) in &want {
        let g = got.get(k).map(|s| s.replace(char::is_whitespace, ""));
        assert_eq!(g, Some(v.replace(char::is_whitespace, "")), "{k}");
    }
}

/// Text held back for a gap (a packet after a missing one, waiting for it or its redundancy)
/// when SIGTERM comes is delivered at the stop, not lost with the gap.
#[test]
fn text_held_behind_a_gap_is_delivered_at_sigterm() {
    let (gw, listening) = Gw::start(&["--listen", "127.0.0.1:0", "--idle-flush-ms", "60000"]);
    let to = addr(&listening, "listen").unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    gw.freeze();
    s.send_to(&rtp(1000, 0x42, "Before "), to).unwrap();
    // 1001 never comes.
    s.send_to(&rtp(1002, 0x42, "after the gap."), to).unwrap();
    let (envelopes, stderr) = gw.stop(true);
    let text: String = texts(&envelopes).into_values().collect();
    assert!(text.contains("after the gap."), "{text:?}\n{stderr}");
}

/// On a dual-stack listener with two workers, an IPv4 sender's BYE on the RTCP port (port +
/// 1, from its RTCP port, RTP + 1) ends its stream: the leave says so.
#[test]
fn an_ipv4_senders_bye_on_a_dual_stack_rtcp_port_ends_its_stream() {
    let (gw, to, rtcp) = start_with_rtcp_port(&["--listen", "[::]:0", "--workers", "2"]);
    let v4 = |a: SocketAddr| SocketAddr::from(([127, 0, 0, 1], a.port()));
    let (rtp_s, rtcp_s) = rtp_and_rtcp_sockets();
    gw.freeze();
    for (w, word) in ["Said ", "and ", "done."].iter().enumerate() {
        rtp_s
            .send_to(&rtp(1000 + w as u16, 0x78, word), v4(to))
            .unwrap();
    }
    let mut bye = Vec::new();
    pvp_t140::rtcp::write_rr(&mut bye, 0x78);
    pvp_t140::rtcp::write_bye(&mut bye, 0x78);
    rtcp_s.send_to(&bye, v4(rtcp)).unwrap();
    // An empty datagram and a one-byte one on the RTP port: dropped, counted, nothing else.
    rtp_s.send_to(&[], v4(to)).unwrap();
    rtp_s.send_to(&[0x80], v4(to)).unwrap();
    let (envelopes, stderr) = gw.stop(true);
    let text: String = texts(&envelopes).into_values().collect();
    assert_eq!(text, "Said and done.", "{stderr}");
    let reasons: Vec<_> = (envelopes.iter())
        .filter(|e| e["type"] == "session.leave")
        .map(|e| e["payload"]["reason"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasons, ["rtcp bye"], "{stderr}");
    assert_eq!(counter(&stderr, "datagrams"), Some(5 + 1), "{stderr}");
}

/// SIGTERM while eight senders keep sending to four workers: the gateway exits 0 within a few
/// seconds, and each sender's words come out in order, none missing before the last.
#[test]
fn sigterm_under_steady_traffic_with_workers_keeps_each_streams_order() {
    let (gw, listening) = Gw::start(&["--listen", "127.0.0.1:0", "--workers", "4"]);
    let to = addr(&listening, "listen").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let senders: Vec<_> = (0..8u32)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                let mut n = 0u16;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 2000 {
                    s.send_to(&rtp(1000 + n, 0x9000 + i, &format!("w{n} ")), to)
                        .unwrap();
                    n += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                (s.local_addr().unwrap(), n)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    let (envelopes, stderr) = gw.stop(false);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent: Vec<_> = senders.into_iter().map(|h| h.join().unwrap()).collect();
    let mut by_sender = std::collections::BTreeMap::<String, Vec<String>>::new();
    for e in envelopes.iter().filter(|e| e["type"] == "context.add") {
        let content = e["payload"]["content"].as_str().unwrap();
        (by_sender
            .entry(e["sender"].as_str().unwrap().to_owned())
            .or_default())
        .extend(content.split_whitespace().map(str::to_owned));
    }
    assert_eq!(by_sender.len(), sent.len(), "{stderr}");
    for (who, words) in &by_sender {
        let want: Vec<String> = (0..words.len()).map(|n| format!("w{n}")).collect();
        assert_eq!(*words, want, "{who}");
    }
}

/// A start-up error found once the RTP port is bound (here the `--metrics` address is taken)
/// comes before the gateway says it listens and before any worker reads a datagram: it used
/// to log "pvp-t140 listening", start its receive workers (which took what senders sent), and
/// then exit 1 on the metrics bind, dropping what they had read unflushed.
#[test]
fn a_metrics_address_in_use_fails_the_start_before_the_gateway_listens() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--metrics", &metrics])
        .args(["--workers", "2", "--log-format", "json"])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("Address already in use"), "{stderr}");
    assert!(
        !stderr.contains("pvp-t140 listening"),
        "said it listens, then failed to start:\n{stderr}"
    );
}

/// On a dual-stack listener with four workers, IPv4 senders' BYEs sent rtcp-mux to the RTP
/// port, half from the RTP port itself and half from another port of the host (RFC 3550 8.2,
/// hashed to any worker), end their streams: each leaves for its BYE.
#[test]
fn ipv4_rtcp_mux_byes_on_a_dual_stack_listener_with_workers_end_their_streams() {
    let (gw, listening) = Gw::start(&["--listen", "[::]:0", "--workers", "4", "--rtcp", "false"]);
    let port = addr(&listening, "listen").unwrap().port();
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let n = 8u32;
    let senders: Vec<(UdpSocket, UdpSocket)> = (0..n)
        .map(|_| {
            (
                UdpSocket::bind("127.0.0.1:0").unwrap(),
                UdpSocket::bind("127.0.0.1:0").unwrap(),
            )
        })
        .collect();
    for (i, (s, _)) in senders.iter().enumerate() {
        s.send_to(&rtp(1000, 0xa000 + i as u32, "Said."), to)
            .unwrap();
    }
    // Read before the BYEs: the BYE's stream exists.
    std::thread::sleep(Duration::from_millis(300));
    gw.freeze();
    for (i, (s, other)) in senders.iter().enumerate() {
        let ssrc = 0xa000 + i as u32;
        let mut bye = Vec::new();
        pvp_t140::rtcp::write_rr(&mut bye, ssrc);
        pvp_t140::rtcp::write_bye(&mut bye, ssrc);
        let from = if i % 2 == 0 { s } else { other };
        from.send_to(&bye, to).unwrap();
    }
    let (envelopes, stderr) = gw.stop(true);
    let mut reasons: Vec<(String, String)> = (envelopes.iter())
        .filter(|e| e["type"] == "session.leave")
        .map(|e| {
            let who = e["sender"].as_str().unwrap().to_owned();
            (who, e["payload"]["reason"].as_str().unwrap().to_owned())
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), n as usize, "{stderr}");
    for (who, why) in &reasons {
        assert_eq!(why, "rtcp bye", "{who}\n{stderr}");
    }
}
