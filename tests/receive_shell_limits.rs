//! Found by review u: the UDP receive shell (udp.rs, recv.rs, handoff.rs, admission.rs, budget.rs)
//! against real sockets on 127.0.0.1 and the real binary. Linux only (`/proc`, `kill`).
#![cfg(target_os = "linux")]

use std::net::UdpSocket;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::frozen::{Gw, addr, rtp};

#[path = "common/core.rs"]
mod core_helpers;

/// The final counters' line (`counters`), as JSON.
fn counters(stderr: &str) -> Value {
    let line = (stderr.lines())
        .find(|l| l.contains("\"counters\""))
        .unwrap_or_else(|| panic!("no counters line\n{stderr}"));
    serde_json::from_str(line).unwrap()
}

/// Datagrams of 0, 1 and 11 bytes are too short for RTP and each counted as such; one of
/// exactly 12 (an RTP header, no payload: T.140's keep-alive) is taken as a packet of its
/// stream, and the text that follows it on that stream comes out.
#[test]
fn datagrams_shorter_than_a_header_are_counted_and_a_bare_header_is_a_packet() {
    let (gw, listening) = Gw::start(&["--listen", "127.0.0.1:0", "--idle-flush-ms", "60000"]);
    let to = addr(&listening, "listen").unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    for len in [0usize, 1, 11] {
        s.send_to(&vec![0x80; len], to).unwrap();
    }
    let first = rtp(1000, 0x51, "");
    assert_eq!(first.len(), 12 + 3);
    s.send_to(&first, to).unwrap();
    let mut bare = rtp(1001, 0x51, "");
    bare[1] &= 0x7f;
    assert_eq!(bare.len(), 12);
    s.send_to(&bare, to).unwrap();
    s.send_to(&rtp(1002, 0x51, "Still here."), to).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (envelopes, stderr) = gw.stop(false);
    let c = counters(&stderr);
    assert_eq!(c["fields"]["datagrams"], 6, "{c}");
    let line = c.to_string();
    assert!(line.contains("rtp_too_short=3"), "{line}");
    let text: String = (envelopes.iter())
        .filter(|e| e["type"] == "context.add")
        .map(|e| e["payload"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Still here.");
}

/// README "Speakers": "a known SSRC arriving from another address is refused
/// (`ssrc_conflict`)". With `--workers 2` the kernel hashes each source address:port to one
/// worker, and each worker kept its own SSRC owners: the same SSRC from 16 ports of the host
/// was one stream with one worker and two with two (2 joins, 14 `ssrc_conflict`): the workers
/// now share who holds each SSRC ([`pvp_t140::budget`]).
#[test]
fn one_ssrc_from_many_ports_is_one_stream_whatever_the_workers() {
    for workers in ["1", "2"] {
        let (gw, listening) = Gw::start(&[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            workers,
            "--idle-flush-ms",
            "60000",
        ]);
        let to = addr(&listening, "listen").unwrap();
        let senders: Vec<UdpSocket> = (0..16)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for (i, s) in senders.iter().enumerate() {
            s.send_to(&rtp(1000, 0xabc, &format!("From port {i}. ")), to)
                .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
        let (envelopes, stderr) = gw.stop(false);
        let joins = (envelopes.iter())
            .filter(|e| e["type"] == "session.join")
            .count();
        let c = counters(&stderr).to_string();
        assert_eq!(joins, 1, "--workers {workers}: {c}");
        assert!(c.contains("ssrc_conflict=15"), "--workers {workers}: {c}");
    }
}

/// The refusals of the receive path move their counters on `/metrics` as they happen, by
/// reason: a source over `--max-pps-per-source` (`rate_limited`), a new stream past
/// `--max-streams` when every stream carried text (`stream_limit`), a known SSRC from
/// another port (`ssrc_conflict`); and `_streams_live`, `_streams_total`,
/// `_receive_workers_running` say what is.
#[test]
fn refusals_of_the_receive_path_move_their_counters_on_the_endpoint() {
    use common::gateway_proc::{Gateway, http_get, sample};
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
        "--max-pps-per-source",
        "10",
        "--max-streams",
        "2",
        "--idle-flush-ms",
        "60000",
    ]);
    let m = gw.metrics_addr();
    let to = gw.listen;
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    // 30 at once: a second's burst of 10 admitted, 20 refused.
    for i in 0..30u16 {
        a.send_to(&rtp(1000 + i, 0xa, "a"), to).unwrap();
    }
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    b.send_to(&rtp(1000, 0xb, "b"), to).unwrap();
    // Both streams carried text: a third is refused.
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.send_to(&rtp(1000, 0xc, "c"), to).unwrap();
    // 0xb from another port.
    let d = UdpSocket::bind("127.0.0.1:0").unwrap();
    d.send_to(&rtp(1000, 0xb, "d"), to).unwrap();
    let want = 33.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (_, body) = http_get(m, "/metrics");
        if sample(&body, "pvp_t140_datagrams_total") == Some(want) {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let drops = |reason: &str| {
        sample(
            &body,
            &format!("pvp_t140_drops_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(drops("rate_limited"), Some(20.0), "{body}");
    assert_eq!(drops("stream_limit"), Some(1.0), "{body}");
    assert_eq!(drops("ssrc_conflict"), Some(1.0), "{body}");
    assert_eq!(sample(&body, "pvp_t140_streams_live"), Some(2.0), "{body}");
    assert_eq!(sample(&body, "pvp_t140_streams_total"), Some(2.0), "{body}");
    assert_eq!(
        sample(&body, "pvp_t140_receive_workers_running"),
        Some(1.0),
        "{body}"
    );
    assert!(gw.terminate(Duration::from_secs(20)).success());
}

/// An RTP packet of mixer `ssrc` carrying source `csrc`'s text (RFC 9071: the single CSRC
/// names the speaker), T.140 payload type 98, marked when it is the first (1).
fn mixed(seq: u16, ssrc: u32, csrc: u32, text: &str) -> Vec<u8> {
    let mut d = vec![0x81, 98 | if seq == 1 { 0x80 } else { 0 }, 0, 0];
    d[2..4].copy_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&(u32::from(seq) * 300).to_be_bytes());
    d.extend_from_slice(&ssrc.to_be_bytes());
    d.extend_from_slice(&csrc.to_be_bytes());
    d.extend_from_slice(text.as_bytes());
    d
}

/// README (Delivery): "the gateway raises its soft open-file limit at start as far as
/// `--max-streams` needs", one descriptor a participant. A stream is up to 33 participants
/// (an RFC 9071 mixer's 32 sources, README "Speakers", and its own voice; review aw), so a
/// limit raised for one a stream runs
/// out: two mixers of 32 sources each under `--max-streams 2` and a soft limit of 64 (raised to
/// 71, about 50 of them free for connections) left some sources never connected, their
/// transcripts retried and dropped. The limit is raised for every participant the streams can
/// have, as far as the hard limit allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_participant_of_mixer_streams_connects_under_a_low_soft_limit() {
    use common::gateway_proc::Gateway;
    use common::pvp_server::TestPvpServer;
    const SOURCES: u32 = 32;
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    if hard < 1024 {
        eprintln!("SKIPPED: hard open-file limit {hard} is too low for this test");
        return;
    }
    let server = TestPvpServer::start().await;
    let url = server.url();
    let mut gw = Gateway::start_with_fd_limit(
        64,
        &[
            "--listen",
            "127.0.0.1:0",
            "--server",
            &url,
            "--max-streams",
            "2",
            "--max-pps-per-source",
            "0",
        ],
    );
    let mixers: Vec<UdpSocket> = (0..2)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    for (m, s) in mixers.iter().enumerate() {
        for i in 0..SOURCES {
            let seq = i as u16 + 1;
            let d = mixed(
                seq,
                0x900 + m as u32,
                0x100 + i,
                &format!("Source {i} here. "),
            );
            s.send_to(&d, gw.listen).unwrap();
        }
    }
    let want = 2 * SOURCES as usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let senders = || {
        (server.received_of_type("context.add").iter())
            .map(|e| e["sender"].as_str().unwrap_or_default().to_owned())
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    while senders() < want && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = senders();
    let stderr = gw.stderr_lines();
    let raised = stderr.iter().find(|l| l.contains("open-file limit"));
    gw.terminate(Duration::from_secs(30));
    assert_eq!(got, want, "participants heard; {raised:?}");
    server.assert_no_violations();
}

/// Udp RcvbufErrors from /proc/net/snmp (all sockets of this network namespace).
fn udp_rcvbuf_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    (names.split_whitespace().zip(values.split_whitespace()))
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// One source flooding text packets of one stream far over `--max-pps-per-source` beside a
/// quiet speaker: the quiet one is heard whole, and the flood's excess is counted as
/// `rate_limited`, its admitted part no more than its burst and rate allow.
#[test]
fn a_flooding_source_is_limited_and_a_quiet_one_beside_it_is_heard() {
    let (gw, listening) = Gw::start(&["--listen", "127.0.0.1:0", "--idle-flush-ms", "60000"]);
    let to = addr(&listening, "listen").unwrap();
    let kernel_drops = udp_rcvbuf_errors();
    let flood = UdpSocket::bind("127.0.0.1:0").unwrap();
    let quiet = UdpSocket::bind("127.0.0.1:0").unwrap();
    let words = ["Quiet ", "words ", "are ", "still ", "heard."];
    let started = std::time::Instant::now();
    let (mut sent, mut next) = (0u32, 0);
    for i in 0..20_000u32 {
        let seq = 1000u16.wrapping_add(i as u16);
        let _ = flood.send_to(&rtp(seq, 0xf100d, "x"), to);
        sent += 1;
        if i % 4000 == 0 {
            quiet
                .send_to(&rtp(1000 + next as u16, 0x9, words[next]), to)
                .unwrap();
            next += 1;
        }
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let (envelopes, stderr) = gw.stop(false);
    let dropped_by_kernel = udp_rcvbuf_errors() - kernel_drops;
    let c = counters(&stderr);
    let line = c.to_string();
    let quiet_text: String = (envelopes.iter())
        .filter(|e| e["type"] == "context.add")
        .filter(|e| e["sender"].as_str().unwrap().starts_with("t140:00000009@"))
        .map(|e| e["payload"]["content"].as_str().unwrap())
        .collect();
    if dropped_by_kernel == 0 {
        assert_eq!(quiet_text, words.concat(), "{line}");
        assert_eq!(c["fields"]["datagrams"], u64::from(sent) + 5, "{line}");
    }
    let limited: u64 = (line.split(['"', ',']))
        .find_map(|p| p.strip_prefix("rate_limited="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rate_limited in {line}"));
    let admitted = u64::from(sent) - dropped_by_kernel - limited;
    assert!(
        admitted <= 1000 + (1000.0 * (secs + 0.5)) as u64,
        "{admitted} admitted of {sent} in {secs:.2} s: {line}"
    );
}

/// SIGTERM while the hand-off queue to a stuck stdout is full: every envelope the workers
/// made is either written or counted as refused (`sink_queue_full`), and the stop's final
/// flush (a speaker whose words waited for their idle flush, and whose join found no room)
/// is written whole, join first, once stdout is read again (README: "At shutdown the final
/// flushes and leaves are queued whatever the bound, so SIGTERM loses no text").
#[test]
fn sigterm_with_the_hand_off_queue_full_writes_the_final_flush_and_counts_the_rest() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--max-pps-per-source", "0"])
        .args(["--idle-flush-ms", "60000", "--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("pvp-t140 listening") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "exited at start");
    }
    let to = addr(&serde_json::from_str(&line).unwrap(), "listen").unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let kernel_drops = udp_rcvbuf_errors();
    // 70,000 sentences, one a packet: more than the pipe and the 65,536 of the queue hold.
    let loud = UdpSocket::bind("127.0.0.1:0").unwrap();
    let n = 70_000u32;
    for i in 0..n {
        let d = rtp(1000u16.wrapping_add(i as u16), 0x1, &format!("n{i}. "));
        loud.send_to(&d, to).unwrap();
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let quiet = UdpSocket::bind("127.0.0.1:0").unwrap();
    quiet
        .send_to(&rtp(1000, 0x2, "Words that wait for their flush"), to)
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
    let envelopes: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let quiet_id = format!("t140:00000002@{}", quiet.local_addr().unwrap());
    let quiet_kinds: Vec<String> = (envelopes.iter())
        .filter(|e| e["sender"] == quiet_id.as_str())
        .map(|e| format!("{} {}", e["type"], e["payload"]["content"]))
        .collect();
    assert_eq!(
        quiet_kinds,
        [
            "\"session.join\" null",
            "\"context.add\" \"Words that wait for their flush\"",
            "\"session.leave\" null",
        ],
        "{}",
        stderr.lines().rev().take(3).collect::<Vec<_>>().join("\n")
    );
    if udp_rcvbuf_errors() == kernel_drops {
        let stopped = (stderr.lines())
            .find(|l| l.contains("\"stopped\""))
            .unwrap_or_else(|| panic!("{stderr}"));
        let v: Value = serde_json::from_str(stopped).unwrap();
        let refused = v["fields"]["sink_queue_full"].as_u64().unwrap();
        let loud_adds = (envelopes.iter())
            .filter(|e| e["type"] == "context.add")
            .filter(|e| e["sender"] != quiet_id.as_str())
            .count() as u64;
        assert_eq!(loud_adds + refused, u64::from(n), "{stopped}");
        assert!(refused > 0, "the queue never filled: {stopped}");
    }
}

/// Cores sharing a budget (`--workers N`) share who holds each SSRC: a known SSRC from
/// another source on another core is refused as `ssrc_conflict`, and is free again once the
/// stream holding it ends, once a stream refused at the limit is not opened after all, and
/// once the core holding it goes away (a worker that failed: its sources go to the others).
#[test]
fn cores_sharing_a_budget_refuse_an_ssrc_another_core_holds_until_it_is_free() {
    use core_helpers::{addr as from, at, t140};
    use pvp_t140::budget::StreamBudget;
    use pvp_t140::{Config, DropReason, Gateway};
    let conflicts = |gw: &Gateway| gw.stats().drops(DropReason::SsrcConflict);
    let limited = |gw: &Gateway| gw.stats().drops(DropReason::StreamLimit);
    // A reserve of 1 each and a pool of 1.
    let budget = StreamBudget::new(3, 2);
    let core = || Gateway::with_budget(Config::default(), budget.clone());
    let (mut a, mut b) = (core(), core());
    a.handle_datagram(at(0), from(4000), &t140(1, 7, "From a. "));
    b.handle_datagram(at(0), from(4001), &t140(1, 7, "From b. "));
    assert_eq!(
        (a.live_streams(), b.live_streams(), conflicts(&b)),
        (1, 0, 1)
    );
    // a's stream ends: the SSRC is b's source's to take.
    a.shutdown(at(10));
    b.handle_datagram(at(20), from(4001), &t140(1, 7, "Now b. "));
    assert_eq!((b.live_streams(), conflicts(&b)), (1, 1));
    // b holds its reserve and the pool with streams that spoke: its next is refused at the
    // limit, and the SSRC it would have taken stays free.
    b.handle_datagram(at(30), from(4002), &t140(1, 8, "Pool. "));
    b.handle_datagram(at(40), from(4003), &t140(1, 9, "Refused. "));
    assert_eq!((b.live_streams(), limited(&b)), (2, 1));
    a.handle_datagram(at(50), from(4004), &t140(1, 9, "Taken by a. "));
    assert_eq!((a.live_streams(), conflicts(&a)), (1, 0));
    // b goes away holding SSRC 7: a third core may take it from another source.
    drop(b);
    let mut c = core();
    c.handle_datagram(at(60), from(4005), &t140(1, 7, "Taken by c. "));
    assert_eq!((c.live_streams(), conflicts(&c)), (1, 0));
}

/// `--max-pps-per-source`: "packets per second one source address:port may send". The
/// buckets are a fixed table of 4,096 indexed by a hash of the source, so a flood from many
/// ports drains the buckets of the quiet sources that share theirs: with 64 ports flooding
/// (3,000 packets a second each), about 1 in 64 callers, sending one packet, is refused
/// outright though it never sent more than its rate (seen: 144 of 8,000). Two buckets a
/// source, refused only when both are empty, would leave about 1 in 1,000 (a flooder sharing
/// both then gets up to twice its rate), a larger table fewer still, at a cache line a packet.
#[test]
#[ignore = "known gap: a quiet source whose rate bucket a flooder shares is refused (fixed table of 4,096 buckets, one a source)"]
fn a_flood_from_many_ports_does_not_refuse_quiet_callers_under_their_rate() {
    use pvp_t140::Time;
    use pvp_t140::admission::Admission;
    let mut a = Admission::new(Vec::new(), 1000);
    let t0 = Time::from_millis(1_700_000_000_000);
    let flooders: Vec<std::net::SocketAddr> = (0..64u16)
        .map(|p| std::net::SocketAddr::from(([10, 0, 0, 1], 20_000 + p)))
        .collect();
    // Each flooder sends three times its rate for two seconds, a millisecond at a time.
    let mut now = t0;
    for ms in 0..2_000u64 {
        now = Time(t0.0 + ms * 1000);
        for f in &flooders {
            for _ in 0..3 {
                let _ = a.admit(now, *f);
            }
        }
    }
    // Amid the flood: the same millisecond as its last packets, one packet a caller.
    let callers = 8_000u32;
    let refused = (0..callers)
        .filter(|i| {
            let ip = std::net::Ipv4Addr::from(0xc000_0200 + (i >> 8));
            let caller = std::net::SocketAddr::from((ip, 5000 + (i & 0xff) as u16));
            a.admit(now, caller).is_err()
        })
        .count();
    assert!(
        refused <= 30,
        "{refused} of {callers} quiet callers refused"
    );
}

/// Each receive worker holds descriptors of its own (its socket and its runtime's, some 5:
/// `fdlimit::PER_WORKER`), whatever the sink. The soft open-file limit was raised only with
/// `--server`: on stdout, `--workers 64` under a soft limit of 200 said "listening" with 64
/// workers, and 30-odd of them failed to start ("Too many open files"), logged only at the
/// stop; /healthz said 503 for good. The limit is raised for the workers on stdout too.
#[test]
fn every_receive_worker_starts_under_a_low_soft_limit_on_stdout() {
    use common::gateway_proc::{Gateway, http_get, sample};
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    if hard < 1024 {
        eprintln!("SKIPPED: hard open-file limit {hard} is too low for this test");
        return;
    }
    let mut gw = Gateway::start_with_fd_limit(
        200,
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
    let (mut status, mut running) = (0, None);
    while std::time::Instant::now() < deadline {
        status = http_get(m, "/healthz").0;
        running = sample(
            &http_get(m, "/metrics").1,
            "pvp_t140_receive_workers_running",
        );
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let failed = (gw.stderr_lines().iter())
        .filter(|l| l.contains("failed to start"))
        .count();
    gw.terminate(Duration::from_secs(30));
    let failed = failed.max(
        (gw.stderr_lines().iter())
            .filter(|l| l.contains("failed to start"))
            .count(),
    );
    assert_eq!((status, running, failed), (200, Some(64.0), 0));
}
