//! Metrics and observability (review k), checked against the README over real sockets: the
//! names the README lists, OpenMetrics format, counters moved by real datagrams, bad HTTP clients.

mod common;

use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, http_get};

const WAIT: Duration = Duration::from_secs(20);

/// The metric names the README's "Metrics and health" section lists (`_name` is
/// `pvp_t140_name`).
fn readme_metric_names() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find("## Metrics and health").unwrap();
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").unwrap() + 3];
    let mut names = Vec::new();
    for piece in section.split('`').skip(1).step_by(2) {
        let name = piece.split('{').next().unwrap();
        let full = if let Some(rest) = name.strip_prefix('_') {
            format!("pvp_t140_{rest}")
        } else if name.starts_with("pvp_t140_") {
            name.to_owned()
        } else {
            continue;
        };
        if full
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        {
            names.push(full);
        }
    }
    names
}

#[test]
fn every_metric_the_readme_names_is_served_and_the_exposition_is_valid() {
    let names = readme_metric_names();
    assert!(names.len() > 40, "{names:?}");
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (status, body) = http_get(m, "/metrics");
        assert_eq!(status, 200);
        if body.contains("pvp_t140_datagrams_total") {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let samples: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split([' ', '{']).next().unwrap())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| {
            !samples.iter().any(|s| {
                *s == n.as_str()
                    || s.strip_prefix(n.as_str())
                        .is_some_and(|r| ["_bucket", "_sum", "_count"].contains(&r))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "README names, /metrics lacks: {missing:?}\n{body}"
    );
    // OpenMetrics: every family has HELP and TYPE, counters' samples end in _total, and the
    // exposition ends with # EOF.
    assert_eq!(body.trim_end().lines().last(), Some("# EOF"), "{body}");
    for l in body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut w = l.split(' ').skip(2);
        let (fam, ty) = (w.next().unwrap(), w.next().unwrap());
        assert!(body.contains(&format!("# HELP {fam} ")), "{fam}");
        if ty == "counter" {
            assert!(body.contains(&format!("\n{fam}_total")), "{fam}");
        }
    }
    assert!(gw.terminate(WAIT).success());
}

fn rtp(first: u8, pt: u8, ssrc: u32, rest: &[u8]) -> Vec<u8> {
    let mut p = vec![first, pt, 0, 1, 0, 0, 0, 1];
    p.extend_from_slice(&ssrc.to_be_bytes());
    p.extend_from_slice(rest);
    p
}

/// Malformed datagrams sent to the gateway's real UDP socket move `_drops_total` by their
/// reason, `_datagrams_total` and `_bytes_total` by what came, and the `counters` log line at
/// the stop says the same.
#[test]
fn malformed_rtp_moves_each_drop_reason_on_the_endpoint_and_in_the_stop_line() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("rtp_too_short", vec![0x80, 98, 0, 1, 0]),
        ("rtp_bad_version", rtp(0x40, 98, 1, b"x")),
        ("rtp_csrc_overrun", rtp(0x8F, 98, 2, b"x")),
        (
            "rtp_extension_overrun",
            rtp(0x90, 98, 3, &[0xBE, 0xDE, 0, 100]),
        ),
        ("rtp_bad_padding", rtp(0xA0, 98, 4, &[b'x', 200])),
        ("unknown_payload_type", rtp(0x80, 0, 5, b"x")),
        ("red_truncated_header", rtp(0x80, 100, 6, &[0x80 | 98, 0])),
    ];
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut bytes = 0;
    for (_, p) in &cases {
        s.send_to(p, gw.listen).unwrap();
        bytes += p.len();
    }
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let (_, body) = http_get(m, "/metrics");
        if common::gateway_proc::sample(&body, "pvp_t140_datagrams_total")
            == Some(cases.len() as f64)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        common::gateway_proc::sample(&body, "pvp_t140_bytes_total"),
        Some(bytes as f64)
    );
    for (reason, _) in &cases {
        assert_eq!(
            common::gateway_proc::sample(
                &body,
                &format!("pvp_t140_drops_total{{reason=\"{reason}\"}}")
            ),
            Some(1.0),
            "{reason}\n{body}"
        );
    }
    assert_eq!(
        common::gateway_proc::sample(&body, "pvp_t140_streams_total"),
        Some(0.0)
    );
    assert!(gw.terminate(WAIT).success());
    let stderr = gw.stderr_lines().join("\n");
    let counters = stderr
        .lines()
        .find(|l| l.contains("counters"))
        .unwrap_or_else(|| panic!("{stderr}"));
    for (reason, _) in &cases {
        assert!(counters.contains(&format!("{reason}=1")), "{counters}");
    }
    assert!(
        counters.contains(&format!("\"datagrams\":{}", cases.len())),
        "{counters}"
    );
}

fn raw(addr: std::net::SocketAddr, req: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let _ = s.write_all(req);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Bad clients of the metrics endpoint (other methods, unknown paths, a huge header, 16
/// connections that never send a request) get an error or a close, and neither the endpoint
/// nor the packet path stops working.
#[test]
fn bad_metrics_clients_are_answered_and_text_still_flows() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let post = raw(
        m,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let unknown = raw(
        m,
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
    let mut huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 2 << 20));
    huge.extend_from_slice(b"\r\n\r\n");
    let answer = raw(m, &huge);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    // 16 idle connections hold every room of the endpoint; text still flows meanwhile.
    let idle: Vec<std::net::TcpStream> = (0..16)
        .map(|_| std::net::TcpStream::connect(m).unwrap())
        .collect();
    let mut s = common::gateway_proc::Sender::new(gw.listen, 9);
    s.send("Still here.");
    gw.wait_stdout(WAIT, "Still here.");
    drop(idle);
    let (status, _) = http_get(m, "/healthz");
    assert_eq!(status, 200);
    assert!(gw.terminate(WAIT).success());
}

/// The decoder's anomalies in one real datagram (a BOM, a control, an escape sequence,
/// invalid UTF-8) each move their counter on /metrics while the stream lives.
#[test]
fn decoder_anomalies_move_their_counters_on_the_endpoint() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let mut payload = "\u{FEFF}Hi\x07 there\x1b[31m red".as_bytes().to_vec();
    payload.extend_from_slice(b"\xff ok. ");
    // Marker bit: the stream's first packet.
    let p = rtp(0x80, 0x80 | 98, 0x5151, &payload);
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(&p, gw.listen).unwrap();
    gw.wait_stdout(WAIT, "red");
    let names = [
        "pvp_t140_boms_total",
        "pvp_t140_controls_dropped_total",
        "pvp_t140_escape_sequences_skipped_total",
        "pvp_t140_invalid_utf8_total",
    ];
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = http_get(m, "/metrics");
        let got: Vec<Option<f64>> = names
            .iter()
            .map(|n| common::gateway_proc::sample(&body, &format!("{n} ")))
            .collect();
        if got.iter().all(|v| *v == Some(1.0)) {
            break;
        }
        assert!(Instant::now() < deadline, "{names:?} {got:?}\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gw.terminate(WAIT).success());
}

fn rtp_seq(seq: u16, marker: bool, ssrc: u32, text: &str) -> Vec<u8> {
    let mut p = rtp(
        0x80,
        if marker { 0x80 | 98 } else { 98 },
        ssrc,
        text.as_bytes(),
    );
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[4..8].copy_from_slice(&(u32::from(seq) * 300).to_be_bytes());
    p
}

/// A duplicate and a packet ahead of a gap, sent to the real socket, move
/// `_drops_total{reason="stale_or_duplicate"}` and `_reordered_packets_total`.
#[test]
fn a_duplicate_and_a_reordered_packet_move_their_counters() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for p in [
        rtp_seq(10, true, 0x77, "One "),
        rtp_seq(10, true, 0x77, "One "),
        rtp_seq(12, false, 0x77, "three."),
        rtp_seq(11, false, 0x77, "two "),
    ] {
        s.send_to(&p, gw.listen).unwrap();
    }
    gw.wait_stdout(WAIT, "One two three.");
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = http_get(m, "/metrics");
        let got = (
            common::gateway_proc::sample(
                &body,
                "pvp_t140_drops_total{reason=\"stale_or_duplicate\"}",
            ),
            common::gateway_proc::sample(&body, "pvp_t140_reordered_packets_total "),
            common::gateway_proc::sample(&body, "pvp_t140_lost_packets_total "),
        );
        if got == (Some(1.0), Some(1.0), Some(0.0)) {
            break;
        }
        assert!(Instant::now() < deadline, "{got:?}\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gw.terminate(WAIT).success());
}

/// RTCP on the RTP port (RFC 5761): a receiver report moves `_rtcp_packets_total`, a
/// malformed compound `_drops_total{reason="rtcp_malformed"}` as well.
#[test]
fn rtcp_on_the_rtp_port_moves_its_counters() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // RR with no report blocks: 8 bytes, length 1.
    s.send_to(&[0x80, 201, 0, 1, 0, 0, 0, 9], gw.listen)
        .unwrap();
    // An RR whose length says 100 words.
    s.send_to(&[0x80, 201, 0, 100, 0, 0, 0, 9], gw.listen)
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, body) = http_get(m, "/metrics");
        let got = (
            common::gateway_proc::sample(&body, "pvp_t140_rtcp_packets_total "),
            common::gateway_proc::sample(&body, "pvp_t140_drops_total{reason=\"rtcp_malformed\"}"),
        );
        if got == (Some(2.0), Some(1.0)) {
            break;
        }
        assert!(Instant::now() < deadline, "{got:?}\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gw.terminate(WAIT).success());
}
