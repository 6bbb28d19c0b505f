//! RTCP on the port after RTP's (RFC 3550 11): which stream a report from another port is for,
//! and the workers' feed of it (`--workers N`): each worker acts on it alike, and what a
//! lagging worker's feed loses is counted.

use pvp_t140::Time;

const T0: u64 = 1_700_000_000_000; // ms

fn at(ms: u64) -> Time {
    Time::from_millis(T0 + ms)
}

// RTCP on the separate port with --workers: the counting worker's admission vs the others'.

use pvp_t140::admission::{Admission, Refusal};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::{drain, t140};

#[path = "common/mixer.rs"]
mod mixer_helpers;
use mixer_helpers::with_csrc;
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
/// dropped ended the stream, and with one worker it did not. Giving each worker the rate
/// check (review) made them disagree whenever their buckets did (RTP from the same address
/// fills only its own worker's). The port's reader decides once, with the port's own
/// admission, and every worker follows it.
#[test]
fn every_worker_follows_the_rtcp_port_readers_admission() {
    let cfg = Config {
        max_pps_per_source: 1,
        ..Config::default()
    };
    let rtp_src: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    let ssrc = 0x1234;
    let report = rtcp(ssrc, false);
    let bye = rtcp(ssrc, true);
    // RTCP from the RTP port's own address (one socket for both) or from the port after it.
    for rtcp_src in ["192.0.2.7:40000", "192.0.2.7:40001"] {
        let rtcp_src: SocketAddr = rtcp_src.parse().unwrap();
        let mut reader = Admission::new(Vec::new(), 1);
        let decided: Vec<_> = [(100, &report), (200, &bye)]
            .into_iter()
            .map(|(t, d)| (t, d, reader.admit(at(t), rtcp_src).err()))
            .collect();
        assert_eq!(decided[1].2, Some(Refusal::RateLimited), "over 1 a second");

        // One worker: it gets the RTP and counts the RTCP port's datagrams.
        let mut one = Gateway::new(cfg.clone());
        one.handle_datagram(at(0), rtp_src, &rtp_text(1, ssrc, "Hello there. "));
        for &(t, d, refused) in &decided {
            one.handle_rtcp_port(at(t), rtcp_src, d, refused, true);
        }
        one.handle_timeout(at(5_000));
        let one_kinds = kinds(&mut one);
        assert_eq!(one.stats().drops(DropReason::RateLimited), 1);
        assert!(
            !one_kinds.contains(&"session.leave".to_owned()),
            "{one_kinds:?}"
        );

        // Two workers: the kernel hashed the RTP to worker 1; worker 0 counts the RTCP port.
        let mut w0 = Gateway::new(cfg.clone());
        let mut w1 = Gateway::new(cfg.clone());
        w1.handle_datagram(at(0), rtp_src, &rtp_text(1, ssrc, "Hello there. "));
        for &(t, d, refused) in &decided {
            w0.handle_rtcp_port(at(t), rtcp_src, d, refused, true);
            w1.handle_rtcp_port(at(t), rtcp_src, d, refused, false);
        }
        w0.handle_timeout(at(5_000));
        w1.handle_timeout(at(5_000));
        let mut two_kinds = kinds(&mut w0);
        two_kinds.extend(kinds(&mut w1));
        let dropped =
            w0.stats().drops(DropReason::RateLimited) + w1.stats().drops(DropReason::RateLimited);
        assert_eq!(dropped, 1, "the BYE is counted once as a rate_limited drop");
        assert_eq!(two_kinds, one_kinds, "from {rtcp_src}");
    }
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
    gw.handle_rtcp_port(at(500), rtcp_src, &rtcp(ssrc, true), None, true);
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
/// counter. Here 1,100 wait in a feed of 1,024 when a worker stops: every worker counts the
/// 76 its streams missed (`rtcp_feed_missed`; review: a worker that does not count the port,
/// the one busy with its streams' RTP, counted nothing), and the counting one counts them as
/// received and dropped (`rtcp_feed_lagged`), as no one else does.
#[test]
fn rtcp_datagrams_lost_to_a_lagged_feed_are_counted() {
    for counts in [true, false] {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        let (feed_tx, feed) = tokio::sync::broadcast::channel(1024); // as run_live
        let from: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        for i in 0..1100u32 {
            let d = pvp_t140::udp::RtcpDatagram::admitted(from, rtcp(1000 + i, false));
            feed_tx.send(d).unwrap();
        }
        let (out, _rx) = pvp_t140::handoff::queue(1024);
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        stop.send(true).unwrap();
        let links = pvp_t140::udp::WorkerLinks {
            rtcp: Some(feed),
            counts_rtcp: counts,
            rtcp_refused: None,
            out,
            shutdown,
            publish: None,
            running: prometheus_client::metrics::gauge::Gauge::default(),
            share: None,
        };
        let gw = Gateway::new(Config::default());
        let worker = pvp_t140::udp::spawn_worker(0, socket, gw, links).unwrap();
        let s = worker.join().unwrap().unwrap().stats;
        assert_eq!(s.rtcp_feed_missed, 76, "counts {counts}");
        let (datagrams, lagged) = if counts { (1100, 76) } else { (0, 0) };
        assert_eq!(s.datagrams, datagrams, "counts {counts}: {s:?}");
        assert_eq!(
            s.drops(DropReason::RtcpFeedLagged),
            lagged,
            "counts {counts}"
        );
    }
}

/// README (RTCP): "In a mixer's compound (known by its SR/RR or SDES), SDES and BYE for its
/// sources' CSRCs (RFC 3550 6.5, 6.6) name or end those speakers". The host's fallback (the
/// SSRC's stream from another port of the same host) was first tried before the mixer's own
/// speakers: with a stream of the mixer's host whose SSRC is one of the mixer's CSRCs (the
/// source also sending there directly, or all on one host or behind one NAT), the mixer's
/// forwarded BYE for its source ended that other stream, and the source never left.
#[test]
fn a_mixer_forwarded_bye_for_its_source_ends_that_source_not_another_port_stream() {
    let mut gw = Gateway::new(Config::default());
    let mixer: SocketAddr = "192.0.2.7:5000".parse().unwrap();
    let mixer_rtcp: SocketAddr = "192.0.2.7:5001".parse().unwrap();
    let other: SocketAddr = "192.0.2.7:6000".parse().unwrap();
    // A sender on the mixer's host, SSRC 0x77, says something.
    gw.handle_datagram(core_helpers::at(0), other, &t140(1, 0x77, "Direct here. "));
    // The mixer (SSRC 9) forwards its source CSRC 0x77.
    gw.handle_datagram(
        core_helpers::at(100),
        mixer,
        &with_csrc(1, 100, 9, 0x77, b"Via mixer. "),
    );
    gw.handle_datagram(
        core_helpers::at(200),
        mixer,
        &with_csrc(2, 200, 9, 0x88, b"Other source. "),
    );
    // The mixer's compound: its own RR and SDES, then its source 0x77's forwarded SDES and BYE
    // (RFC 3550 6.5, 6.6).
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, 9);
    pvp_t140::rtcp::write_sdes(&mut d, 9, "mixer@192.0.2.7", None);
    pvp_t140::rtcp::write_sdes(&mut d, 0x77, "alice@192.0.2.7", Some("Alice"));
    pvp_t140::rtcp::write_bye(&mut d, 0x77);
    gw.handle_rtcp_port(core_helpers::at(1_000), mixer_rtcp, &d, None, true);
    gw.handle_timeout(core_helpers::at(5_000));
    let out = drain(&mut gw);
    let source = "t140:00000009@192.0.2.7:5000/csrc:00000077";
    let direct = "t140:00000077@192.0.2.7:6000";
    let left = |who: &str| {
        out.iter()
            .any(|e| e.kind == "session.leave" && e.sender == who)
    };
    let summary: Vec<String> = out
        .iter()
        .map(|e| format!("{} {}", e.kind, e.sender))
        .collect();
    assert!(left(source), "the mixer's source never left: {summary:#?}");
    assert!(
        !left(direct),
        "the other port's stream was ended by the mixer's BYE: {summary:#?}"
    );
}

/// The same case as `rtcp_port.rs`'s `a_mixer_forwarded_bye_for_its_source_ends_that_source_
/// not_another_port_stream`, with `--workers 2` (README "Scaling out": RTCP on the separate
/// port is handed to every worker, each acting on it for its own streams): the kernel hashed
/// the mixer's RTP (port 5000) to worker 0 and the direct sender's (port 6000) to worker 1.
/// Worker 1 holds no mixer, so for it the compound's home was the direct stream found by the
/// host fallback for the CSRC, and the mixer's forwarded BYE for its source ended that stream
/// (its forwarded SDES renamed it); with one worker neither happens. The fallback is now for
/// the compound's sender only.
#[test]
fn a_mixer_forwarded_bye_for_its_source_does_not_end_another_workers_stream_of_the_host() {
    use pvp_t140::pvp::Message;
    let mixer: std::net::SocketAddr = "192.0.2.7:5000".parse().unwrap();
    let mixer_rtcp: std::net::SocketAddr = "192.0.2.7:5001".parse().unwrap();
    let other: std::net::SocketAddr = "192.0.2.7:6000".parse().unwrap();
    let mut d = Vec::new();
    pvp_t140::rtcp::write_rr(&mut d, 9);
    pvp_t140::rtcp::write_sdes(&mut d, 9, "mixer@192.0.2.7", None);
    pvp_t140::rtcp::write_sdes(&mut d, 0x77, "alice@192.0.2.7", Some("Alice"));
    pvp_t140::rtcp::write_bye(&mut d, 0x77);
    let direct_rtp = core_helpers::t140(1, 0x77, "Direct here. ");
    let via1 = with_csrc(1, 100, 9, 0x77, b"Via mixer. ");
    let via2 = with_csrc(2, 200, 9, 0x88, b"Other source. ");
    let summary = |out: &[Message]| -> Vec<String> {
        out.iter()
            .filter(|e| e.sender == "t140:00000077@192.0.2.7:6000")
            .map(|e| e.kind.clone())
            .collect()
    };

    // One worker.
    let mut one = Gateway::new(Config::default());
    one.handle_datagram(at(0), other, &direct_rtp);
    one.handle_datagram(at(100), mixer, &via1);
    one.handle_datagram(at(200), mixer, &via2);
    one.handle_rtcp_port(at(1_000), mixer_rtcp, &d, None, true);
    one.handle_timeout(at(5_000));
    let one_direct = summary(&drain(&mut one));

    // Two workers: the mixer's RTP on worker 0 (which counts the RTCP port), the direct
    // sender's on worker 1.
    let mut w0 = Gateway::new(Config::default());
    let mut w1 = Gateway::new(Config::default());
    w1.handle_datagram(at(0), other, &direct_rtp);
    w0.handle_datagram(at(100), mixer, &via1);
    w0.handle_datagram(at(200), mixer, &via2);
    w0.handle_rtcp_port(at(1_000), mixer_rtcp, &d, None, true);
    w1.handle_rtcp_port(at(1_000), mixer_rtcp, &d, None, false);
    w0.handle_timeout(at(5_000));
    w1.handle_timeout(at(5_000));
    let mut out = drain(&mut w0);
    out.extend(drain(&mut w1));
    let two_direct = summary(&out);
    assert_eq!(
        two_direct, one_direct,
        "the direct stream on another worker was renamed/ended by the mixer's compound"
    );
}

/// The RTCP port's reader and receive errors (review, session 36).
mod rtcp_reader_errors {
    use std::time::Duration;

    /// A `tracing` writer into a shared buffer: the log lines a test's code wrote.
    #[derive(Clone, Default)]
    struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
        type Writer = Logs;
        fn make_writer(&'a self) -> Logs {
            self.clone()
        }
    }

    /// The RTCP port's reader reads past a one-off error and pauses "the same way" as a worker
    /// only when errors persist (review, session 36; before, it paused at once) (README, metrics:
    /// `_socket_errors_total`: an error "read past; one that persists ... pauses that socket's
    /// reads"; `ErrorPause`: "Pauses a socket's reads while it keeps failing", whose `after` takes
    /// "the error it kept returning, if it did"). A worker reads past a one-off error
    /// (`drain_by` pauses only after `ERRORS_IN_A_ROW`, 8, in a row), but `run_rtcp_reader`
    /// (src/udp.rs, its `select!`) hands every single `recv_from` error to `ErrorPause::after`: one
    /// pending error (here an ICMP port unreachable's ECONNREFUSED, ahead of a good datagram)
    /// pauses the reads and logs at warn level "receive socket keeps failing: its reads pause"
    /// (failures=1), and it takes the 10 s log slot that a real persistent failure would need.
    #[tokio::test(flavor = "current_thread")]
    async fn the_rtcp_reader_reads_past_a_one_off_error_as_a_worker_does() {
        use tracing_subscriber::util::SubscriberInitExt;
        let logs = Logs::default();
        let _guard = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish()
            .set_default();

        // A port nobody listens on, for the ICMP port unreachable, then the peer sending from it.
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer_addr = closed.local_addr().unwrap();
        drop(closed);
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.connect(peer_addr).await.unwrap();
        socket.send(b"x").await.unwrap();
        // The error is pending (EPOLLERR), not consumed.
        tokio::time::timeout(
            Duration::from_secs(5),
            socket.ready(tokio::io::Interest::ERROR),
        )
        .await
        .expect("an ICMP port unreachable")
        .unwrap();
        let peer = std::net::UdpSocket::bind(peer_addr).unwrap();
        peer.send_to(
            b"\x81\xcb\x00\x01\x00\x00\x00\x07",
            socket.local_addr().unwrap(),
        )
        .unwrap();

        let (tx, mut rx) = tokio::sync::broadcast::channel(16);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let reader = tokio::spawn(pvp_t140::udp::run_rtcp_reader(
            socket,
            tx,
            stop_rx,
            pvp_t140::admission::Admission::new(Vec::new(), 0),
            Default::default(),
        ));
        let d = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the datagram behind the error")
            .unwrap();
        assert_eq!(d.from, peer_addr);
        stop_tx.send(true).unwrap();
        reader.await.unwrap();
        let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
        assert!(
            !text.contains("keeps failing"),
            "a one-off error paused the RTCP reader and was logged as one that persists:\n{text}"
        );
    }
}
