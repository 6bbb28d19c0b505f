//! The receive shell against the real binary: what the kernel dropped for the gateway's
//! sockets (a receive buffer overrun while the gateway was busy or frozen), the RTP sockets'
//! and the RTCP port's, is counted (`kernel_drops` in the exit `counters` line, the RTP
//! sockets' on `/metrics` too), so that the datagrams read and dropped add up to what was sent;
//! and `--workers N` starts under a soft open-file limit below its sockets (the limit is raised
//! before they are bound). Linux only (`/proc`, `kill`). Found by review al (session 45).
#![cfg(target_os = "linux")]

use std::net::UdpSocket;

use serde_json::Value;

mod common;
use common::frozen::{Gw, addr, rtp};

/// The exit `counters` line's fields.
fn counters(stderr: &str) -> Value {
    let line = (stderr.lines())
        .find(|l| l.contains("\"counters\""))
        .unwrap_or_else(|| panic!("no counters line:\n{stderr}"));
    serde_json::from_str::<Value>(line).unwrap()["fields"].clone()
}

/// A frozen gateway with the smallest receive buffer the kernel gives (`--recv-buffer 1`)
/// takes a few datagrams of a burst and the kernel drops the rest. Before, those drops were
/// counted nowhere: the `counters` line said `datagrams` of the few, and nothing told the
/// operator that the rest of the burst (text) was lost below the gateway. Now every datagram
/// sent is either read or counted in `kernel_drops`, with one worker and with three.
#[test]
fn datagrams_the_kernel_dropped_for_a_full_receive_buffer_are_counted_at_the_stop() {
    for workers in ["1", "3"] {
        let args = [
            "--listen",
            "127.0.0.1:0",
            "--recv-buffer",
            "1",
            "--workers",
            workers,
            "--idle-flush-ms",
            "60000",
        ];
        let (gw, listening) = Gw::start(&args);
        let to = addr(&listening, "listen").unwrap();
        let senders: Vec<_> = (0..6)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        gw.freeze();
        let per_sender = 100u16;
        for seq in 0..per_sender {
            for (i, s) in senders.iter().enumerate() {
                s.send_to(&rtp(1000 + seq, 0x7100 + i as u32, "a"), to)
                    .unwrap();
            }
        }
        let sent = u64::from(per_sender) * senders.len() as u64;
        let (_, stderr) = gw.stop(true);
        let c = counters(&stderr);
        let read = c["datagrams"].as_u64().unwrap();
        let dropped = c["kernel_drops"].as_u64();
        assert!(
            read < sent,
            "workers {workers}: the buffer held the burst: {c}"
        );
        assert_eq!(
            dropped.map(|d| d + read),
            Some(sent),
            "workers {workers}: {c}"
        );
    }
}

/// The same drops on `/metrics` while the gateway runs (`pvp_t140_kernel_drops_total`,
/// published with the worker's other counters once a second): with `_datagrams_total`, every
/// datagram sent to the frozen gateway.
#[test]
fn datagrams_the_kernel_dropped_show_on_metrics_while_running() {
    use common::gateway_proc::{Gateway, http_get, sample};
    use std::time::{Duration, Instant};
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--recv-buffer",
        "1",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let m = gw.metrics_addr();
    let pid = gw.pid().to_string();
    let kill = |sig: &str| {
        let s = std::process::Command::new("kill")
            .args([sig, &pid])
            .status();
        assert!(s.unwrap().success());
    };
    kill("-STOP");
    common::frozen::wait_until("never stopped", || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let state = stat.rsplit_once(')').map(|(_, r)| r.trim().chars().next());
                matches!(state, Some(Some('T' | 't')))
            })
    });
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sent = 400u16;
    for seq in 0..sent {
        s.send_to(&rtp(1000 + seq, 0x7200, "b"), gw.listen).unwrap();
    }
    kill("-CONT");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http_get(m, "/metrics");
        assert_eq!(status, 200);
        let read = sample(&body, "pvp_t140_datagrams_total");
        let dropped = sample(&body, "pvp_t140_kernel_drops_total");
        if let (Some(r), Some(d)) = (read, dropped)
            && r + d == f64::from(sent)
        {
            assert!(d > 0.0, "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "read {read:?} dropped {dropped:?} of {sent}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    gw.terminate(Duration::from_secs(20));
}

/// `--workers 64` under a soft open-file limit of 64 (the hard limit allowing more): the
/// gateway raises the soft limit for its workers, and it did, but only after it had bound the
/// workers' 64 sockets, so the start failed at the bind ("bind ... (worker): Too many open
/// files") with the raise a few lines away. Now the limit is raised before the sockets are
/// bound, and the gateway starts, every worker running, and stops cleanly.
#[test]
fn many_workers_start_under_a_soft_open_file_limit_below_their_sockets() {
    use common::gateway_proc::{Gateway, http_get, sample};
    use std::time::Duration;
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    if hard < 1024 {
        eprintln!("SKIPPED: hard open-file limit {hard} is too low for this test");
        return;
    }
    let mut gw = Gateway::start_with_fd_limit(
        64,
        &[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "64",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let m = gw.metrics_addr();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut running = None;
    while std::time::Instant::now() < deadline {
        running = sample(
            &http_get(m, "/metrics").1,
            "pvp_t140_receive_workers_running",
        );
        if running == Some(64.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(running, Some(64.0));
    assert!(gw.soft_nofile() >= 64 + 64 * 5, "{}", gw.soft_nofile());
    let status = gw.terminate(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
}

/// The RTCP port's socket (`--listen`'s port + 1, read apart by the RTCP reader) is not an RTP
/// socket of a worker: what the kernel dropped for it was counted nowhere, and a burst of RTCP
/// to a frozen gateway with the smallest receive buffer came out short in `datagrams` with no
/// `kernel_drops` for the rest. Now the reader reads its socket's count at its end and the
/// exit line adds it.
#[test]
fn datagrams_the_kernel_dropped_for_the_rtcp_port_are_counted_at_the_stop() {
    use common::frozen::{rtp_and_rtcp_sockets, start_with_rtcp_port};
    let (gw, _, rtcp) = start_with_rtcp_port(&["--listen", "127.0.0.1:0", "--recv-buffer", "1"]);
    let (_, rtcp_s) = rtp_and_rtcp_sockets();
    gw.freeze();
    let sent = 300u64;
    for i in 0..sent {
        let mut rr = Vec::new();
        pvp_t140::rtcp::write_rr(&mut rr, 0x7300 + i as u32);
        rtcp_s.send_to(&rr, rtcp).unwrap();
    }
    let (_, stderr) = gw.stop(true);
    let c = counters(&stderr);
    let read = c["datagrams"].as_u64().unwrap();
    assert!(read < sent, "the buffer held the burst: {c}");
    assert_eq!(
        c["kernel_drops"].as_u64().map(|d| d + read),
        Some(sent),
        "{c}"
    );
}
