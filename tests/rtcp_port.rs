//! RTCP on the port after RTP's (RFC 3550 11): which stream a report from another port is for,
//! and the workers' feed of it (`--workers N`): each worker acts on it alike, and what a
//! lagging worker's feed loses is counted.

use pvp_t140::Time;

const T0: u64 = 1_700_000_000_000; // ms

fn at(ms: u64) -> Time {
    Time::from_millis(T0 + ms)
}

// RTCP on the separate port with --workers: the counting worker's admission vs the others'.

use pvp_t140::{Config, DropReason, Gateway};
use std::net::SocketAddr;

/// A marked T.140 packet with the BOM: a stream's first.
fn rtp_text(seq: u16, ssrc: u32, text: &str) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(
        &mut d,
        true,
        98,
        seq,
        0,
        ssrc,
        format!("\u{feff}{text}").as_bytes(),
    );
    d
}

/// RTCP compound RR + SDES CNAME (+ BYE).
fn rtcp(ssrc: u32, bye: bool) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, ssrc);
    pvp_t140::rtcp::write_sdes(&mut d, ssrc, "ada@192.0.2.7", None);
    if bye {
        pvp_t140::rtcp::write_bye(&mut d, ssrc);
    }
    d
}

fn kinds(gw: &mut Gateway) -> Vec<String> {
    std::iter::from_fn(|| gw.poll_output().map(|e| e.to_message().kind)).collect()
}

/// `--max-pps-per-source`: "the excess is dropped and counted". With `--workers 2` (worker 0
/// counts the RTCP port's datagrams, the others act on them for their own streams) an RTCP
/// datagram over its source's rate was counted by worker 0 as a `rate_limited` drop, yet the
/// worker holding the stream acted on it (it asked only the allow list): a BYE counted as
/// dropped ended the stream, and with one worker it did not. Each worker now applies the rate.
#[test]
fn an_rtcp_datagram_counted_rate_limited_is_not_acted_on_by_another_worker() {
    let cfg = Config {
        max_pps_per_source: 1,
        ..Config::default()
    };
    let rtp_src: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let rtcp_src: SocketAddr = "192.0.2.7:40001".parse().unwrap();
    let ssrc = 0x1234;
    let report = rtcp(ssrc, false);
    let bye = rtcp(ssrc, true);

    // One worker: it gets the RTP and counts the RTCP port's datagrams.
    let mut one = Gateway::new(cfg.clone());
    one.handle_datagram(at(0), rtp_src, &rtp_text(1, ssrc, "Hello there. "));
    one.handle_rtcp_port(at(100), rtcp_src, &report, true);
    one.handle_rtcp_port(at(200), rtcp_src, &bye, true); // over 1 pps: dropped
    one.handle_timeout(at(5_000));
    let one_kinds = kinds(&mut one);
    assert_eq!(one.stats().drops(DropReason::RateLimited), 1);

    // Two workers: the kernel hashed the RTP to worker 1; worker 0 counts the RTCP port.
    let mut w0 = Gateway::new(cfg.clone());
    let mut w1 = Gateway::new(cfg);
    w1.handle_datagram(at(0), rtp_src, &rtp_text(1, ssrc, "Hello there. "));
    for (t, d) in [(100, &report), (200, &bye)] {
        w0.handle_rtcp_port(at(t), rtcp_src, d, true);
        w1.handle_rtcp_port(at(t), rtcp_src, d, false);
    }
    w0.handle_timeout(at(5_000));
    w1.handle_timeout(at(5_000));
    let mut two_kinds = kinds(&mut w0);
    two_kinds.extend(kinds(&mut w1));
    let dropped =
        w0.stats().drops(DropReason::RateLimited) + w1.stats().drops(DropReason::RateLimited);
    assert_eq!(dropped, 1, "the BYE is counted as a rate_limited drop");
    assert_eq!(
        two_kinds, one_kinds,
        "with two workers the BYE counted as dropped still ended the stream"
    );
}

/// RFC 3550 8.2 tracks the source transport addresses of a participant's RTP and RTCP apart:
/// an RTP stack with a socket for each sends from two unrelated ports (a NAT may map them
/// apart too). The gateway looked a report's stream up only at the same port (rtcp-mux) or the
/// port below, so a sender whose RTP came from 40000 and its RTCP from 50000 was never named
/// and its BYE ignored: it stayed until `--stream-timeout-s`. The same host's SSRC is its.
#[test]
fn rtcp_from_an_unrelated_source_port_of_the_same_host_names_and_ends_the_stream() {
    let mut gw = Gateway::new(Config::default());
    let rtp_src: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let rtcp_src: SocketAddr = "192.0.2.7:50000".parse().unwrap();
    let ssrc = 0x1234;
    gw.handle_datagram(at(0), rtp_src, &rtp_text(1, ssrc, "Hello there. "));
    gw.handle_rtcp_port(at(500), rtcp_src, &rtcp(ssrc, true), true);
    gw.handle_timeout(at(5_000));
    let out: Vec<_> = std::iter::from_fn(|| gw.poll_output().map(|e| e.to_message())).collect();
    let kinds: Vec<&str> = out.iter().map(|m| m.kind.as_str()).collect();
    assert!(
        kinds.contains(&"session.leave"),
        "the BYE did not end the stream within 5 s: {kinds:?}"
    );
    assert!(
        out.iter()
            .any(|m| m.payload.to_string().contains("ada@192.0.2.7")),
        "the CNAME never named the participant: {kinds:?}"
    );
}

/// README: "Every dropped datagram is counted by reason". The RTCP port's reader hands its
/// datagrams to the workers through a broadcast channel of 1,024 (`run_live`); a worker that
/// falls behind it loses the oldest, which were only logged ("RTCP feed lagged"), in no
/// counter. Here 1,100 wait in a feed of 1,024 when the counting worker stops: the 76 lost
/// are counted as `rtcp_feed_lagged` drops.
#[test]
fn rtcp_datagrams_lost_to_a_lagged_feed_are_counted() {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let (feed_tx, feed) = tokio::sync::broadcast::channel(1024); // as run_live
    let from: SocketAddr = "127.0.0.1:40001".parse().unwrap();
    for i in 0..1100u32 {
        feed_tx
            .send(std::sync::Arc::new((from, rtcp(1000 + i, false))))
            .unwrap();
    }
    let (out, _rx) = pvp_t140::handoff::queue(1024);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    stop.send(true).unwrap();
    let links = pvp_t140::udp::WorkerLinks {
        rtcp: Some(feed),
        counts_rtcp: true,
        out,
        shutdown,
        publish: None,
        running: prometheus_client::metrics::gauge::Gauge::default(),
    };
    let worker = pvp_t140::udp::spawn_worker(
        0,
        socket,
        Gateway::new(Config {
            max_pps_per_source: 0,
            ..Config::default()
        }),
        links,
    )
    .unwrap();
    let report = worker.join().unwrap().unwrap();
    let s = report.stats;
    assert_eq!(
        s.datagrams,
        1100,
        "datagrams counted {} (rtcp {}, drops {}) of 1100 handed to the worker",
        s.datagrams,
        s.rtcp,
        s.drops_total()
    );
    assert_eq!(s.drops(pvp_t140::DropReason::RtcpFeedLagged), 76);
}
