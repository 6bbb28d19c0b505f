//! While a receive worker runs, RTCP from the RTCP port's feed is acted on after the RTP its
//! socket already holds (a BYE follows its sender's last packets), and reading past tokio's
//! readiness to find that RTP leaves no stall. Linux: the read past readiness is recvmmsg's.
#![cfg(target_os = "linux")]

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use pvp_t140::pvp::{Envelope, Kind};
use pvp_t140::{Config, Gateway, rtp, udp};

/// `kind`'s `field`s among `got`.
fn field(got: &[Envelope], kind: Kind, field: &str) -> Vec<String> {
    (got.iter().filter(|e| e.kind() == kind))
        .map(|e| e.to_message().payload[field].as_str().unwrap().to_owned())
        .collect()
}

/// Envelopes until `done`, 20 s at most (polls for the event; no sleep stands in for one).
fn until(
    rx: &mut pvp_t140::handoff::Receiver,
    got: &mut Vec<Envelope>,
    done: impl Fn(&[Envelope]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(got) {
        let adds = field(got, Kind::ContextAdd, "content");
        assert!(
            Instant::now() < deadline,
            "not come in 20 s; text so far {adds:?}"
        );
        match rx.try_recv(64) {
            Some(batch) => got.extend(batch),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// RTP and a BYE are queued before the worker's first poll: tokio has not learnt the socket's
/// readiness, the feed is ready, so the RTCP branch runs first, and only the read past
/// readiness finds the RTP: the stream leaves for its BYE (RFC 3550 6.3.7) with its text
/// whole. Then one datagram from another sender and nothing after: the worker wakes for it,
/// not at a next datagram. (From a review of b3425fc; without the RTP read in the RTCP branch
/// the BYE found no stream.)
#[test]
fn a_bye_woken_for_first_follows_its_rtp_and_leaves_no_stall() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let to = socket.local_addr().unwrap();
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    for (i, w) in ["Said ", "and ", "done."].iter().enumerate() {
        let (mut d, seq) = (Vec::new(), 100 + i as u16);
        rtp::write_packet(
            &mut d,
            i == 0,
            98,
            seq,
            u32::from(seq) * 300,
            7,
            w.as_bytes(),
        );
        peer.send_to(&d, to).unwrap();
    }
    let mut bye = Vec::new();
    pvp_t140::rtcp::write_rr(&mut bye, 7);
    pvp_t140::rtcp::write_bye(&mut bye, 7);
    let mut rtcp_from = peer.local_addr().unwrap();
    rtcp_from.set_port(rtcp_from.port() + 1);
    let (feed_tx, feed) = tokio::sync::broadcast::channel(16);
    feed_tx
        .send(udp::RtcpDatagram::admitted(rtcp_from, bye))
        .unwrap();
    let (out, mut rx) = pvp_t140::handoff::queue(1024);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let links = udp::WorkerLinks {
        rtcp: Some(feed),
        counts_rtcp: true,
        rtcp_refused: None,
        out,
        shutdown,
        publish: None,
        running: prometheus_client::metrics::gauge::Gauge::default(),
        share: None,
    };
    let cfg = Config {
        idle_flush: Duration::from_millis(100),
        ..Config::default()
    };
    let worker = udp::spawn_worker(0, socket, Gateway::new(cfg), links).unwrap();
    let mut got = Vec::new();
    until(&mut rx, &mut got, |g| {
        g.iter().any(|e| e.kind() == Kind::SessionLeave)
    });
    let text = field(&got, Kind::ContextAdd, "content").concat();
    let reasons = field(&got, Kind::SessionLeave, "reason");
    assert_eq!(
        (text.as_str(), reasons),
        ("Said and done.", vec!["rtcp bye".to_owned()])
    );
    let (other, mut d) = (UdpSocket::bind("127.0.0.1:0").unwrap(), Vec::new());
    rtp::write_packet(&mut d, true, 98, 500, 150_000, 9, b"Later.");
    other.send_to(&d, to).unwrap();
    until(&mut rx, &mut got, |g| {
        field(g, Kind::ContextAdd, "content")
            .concat()
            .ends_with("Later.")
    });
    stop.send(true).unwrap();
    worker.join().unwrap().unwrap();
}
