//! A stdout nobody reads (a stuck pipeline) must not keep the gateway from stopping: on SIGTERM
//! it waits the grace (5 s) for the writer, then exits and counts what it could not write as
//! dropped. Before, it hung until the reader went away, and counted those envelopes as neither.
//! A stderr nobody reads (a stuck log collector) must not either, nor put anything but
//! envelopes on stdout.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender, http_get, log_number, sample};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn sigterm_with_an_unread_stdout_exits_after_the_grace_and_counts_the_unwritten() {
    let mut gw = Gateway::start_unread(&["--listen", "127.0.0.1:0", "--rtcp", "false"]);
    let mut a = Sender::new(gw.listen, 0x5eed_0001);
    // 400 chunks of about 500 bytes of JSON each: more than the pipe (64 KiB) and the writer's
    // buffer (64 KiB) hold together. Ten sentences a datagram, so that the burst fits even a
    // default-sized socket buffer (net.core.rmem_max 208 KiB).
    for i in 0..40 {
        let text: String = (0..10)
            .map(|j| {
                format!(
                    "Sentence number {} is here, and it is long enough to fill the pipe. ",
                    i * 10 + j
                )
            })
            .collect();
        a.send(&text);
    }
    // Datagrams are handled in arrival order: once a later sender's chunk makes it join, all
    // 400 chunks have been made.
    let mut b = Sender::new(gw.listen, 0x5eed_0002);
    b.send("The last one. ");
    gw.wait_stderr(WAIT, &b.participant());

    let status = gw.terminate(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let lines = gw.stderr_lines();
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("\"message\":\"{message}\"")))
            .unwrap_or_else(|| panic!("no {message:?} line in\n{}", lines.join("\n")))
            .clone()
    };
    let envelopes = log_number(&find("counters"), "envelopes");
    let stopped = find("stopped");
    let (sent, dropped) = (
        log_number(&stopped, "sent"),
        log_number(&stopped, "dropped"),
    );
    assert!(envelopes > 400, "joins, 401 chunks, leaves: {envelopes}");
    assert!(dropped > 0, "the pipe cannot hold them all: {stopped}");
    assert_eq!(
        sent + dropped,
        envelopes,
        "every envelope accounted for: {stopped}"
    );
    assert!(
        lines.iter().any(|l| l.contains("did not finish within")),
        "the grace ran out, and the log says so"
    );
}

/// pvp-spec 19.4 (one envelope a line) and README ("`_stdout_failed` (1 once stdout's reader
/// has gone)"; /healthz is ready while "the sink is stdout that still takes lines"). A stdout
/// whose open file description is non-blocking (O_NONBLOCK set by the parent, or by another
/// process sharing the pipe or terminal; the flag belongs to the description, not the fd)
/// answers a full pipe with EAGAIN instead of blocking. The writer takes `WouldBlock` for a
/// reader that has gone: it stops writing for good ("writing to stdout failed ... envelopes
/// from now on are dropped"), sets `stdout_failed` (so /healthz says 503) and drops every
/// later envelope, though the reader is still there and was only slow for a moment. It should
/// get every envelope, each a whole line (a partial write before the EAGAIN must not leave a
/// line cut either).
#[test]
fn a_non_blocking_stdout_that_fills_up_for_a_moment_is_waited_for_not_given_up() {
    use std::io::{BufRead, BufReader, Read};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};

    let (mut reader, child_end) = UnixStream::pair().unwrap();
    child_end.set_nonblocking(true).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--rtcp", "false"])
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let lines = stderr.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        });
    }
    let wait_stderr = |needle: &str| -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if let Some(l) = stderr.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} on stderr"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let listen: std::net::SocketAddr =
        common::gateway_proc::log_field(&wait_stderr("pvp-t140 listening"), "listen")
            .parse()
            .unwrap();
    // 2,000 chunks of about 500 bytes of JSON: more than the socket buffer holds while unread.
    let mut a = Sender::new(listen, 0x5eed_0001);
    for i in 0..200 {
        let text: String = (0..10)
            .map(|j| {
                format!(
                    "Sentence number {} is here, and it is long enough to fill the pipe. ",
                    i * 10 + j
                )
            })
            .collect();
        a.send(&text);
    }
    let mut b = Sender::new(listen, 0x5eed_0002);
    b.send("The last one. ");
    wait_stderr(&b.participant());
    // The reader was away for a moment; now it reads everything.
    std::thread::sleep(Duration::from_millis(500));
    let all = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).unwrap();
        bytes
    });
    std::thread::sleep(Duration::from_millis(500));
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    assert!(child.wait().unwrap().success());
    let bytes = all.join().unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let failed: Vec<String> = stderr
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("writing to stdout failed"))
        .cloned()
        .collect();
    let cut: Vec<&str> = text
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
        .collect();
    let adds = text
        .lines()
        .filter(|l| l.contains("\"context.add\""))
        .count();
    assert!(
        failed.is_empty() && cut.is_empty() && adds == 2001,
        "{adds} of 2001 context.add lines; lines cut short: {cut:?}; stderr: {failed:?}"
    );
}

/// README: "logs go to stderr through a writer thread that never blocks the receive loop
/// (lines it has no room for are counted and reported at exit)"; SIGTERM "exits 0"; stdout is
/// NDJSON envelopes, one a line (pvp-spec 19.4). What is wrong: when stderr is not read (a
/// stuck log collector) and the log writer's queue has overflowed (here: debug logging of a
/// flood of malformed datagrams), the stop hangs for good: the report of the dropped lines is
/// an `eprintln!` to that same blocked stderr (whose lock the blocked log writer thread
/// holds), and before it the log guard's drop prints "Failed to send shutdown signal to
/// logging worker" with `println!` onto stdout, in the middle of the NDJSON stream. What
/// should happen: as with a blocked stdout, the process exits once the grace has passed,
/// counting what it could not write, and stdout carries nothing but envelopes.
#[test]
fn sigterm_with_an_unread_stderr_and_dropped_log_lines_exits_and_keeps_stdout_ndjson() {
    let free_udp = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let free_tcp = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let listen = free_udp();
    let metrics = free_tcp();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            &listen.to_string(),
            "--rtcp",
            "false",
            "--metrics",
            &metrics.to_string(),
            "--max-pps-per-source",
            "0",
            "--log-format",
            "json",
        ])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // stderr: held open, never read.
    let _stderr = child.stderr.take().unwrap();
    let stdout: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let out = child.stdout.take().unwrap();
        let lines = stdout.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                match l {
                    Ok(l) => lines.lock().unwrap().push(l),
                    Err(_) => break,
                }
            }
        });
    }
    let deadline = Instant::now() + WAIT;
    let scrape = |path: &str| {
        std::net::TcpStream::connect(metrics)
            .ok()
            .map(|_| http_get(metrics, path))
    };
    while scrape("/healthz").is_none_or(|(status, _)| status != 200) {
        assert!(Instant::now() < deadline, "the gateway never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A sentence, then a flood of one-byte datagrams: each is dropped and logged at debug
    // level, far more than the log writer's queue (128,000 lines) and stderr's pipe hold.
    let mut a = Sender::new(listen, 0x0057_de44);
    a.send("Hello before the flood. ");
    let flood = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = 300_000.0;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for _ in 0..20_000 {
            let _ = flood.send_to(&[0u8], listen);
        }
        std::thread::sleep(Duration::from_millis(20));
        let handled = scrape("/metrics")
            .and_then(|(_, body)| sample(&body, "pvp_t140_datagrams_total"))
            .unwrap_or(0.0);
        if handled >= target {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {handled} datagrams handled"
        );
    }
    let deadline = Instant::now() + WAIT;
    while !stdout
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("Hello before the flood."))
    {
        assert!(Instant::now() < deadline, "the sentence never came out");
        std::thread::sleep(Duration::from_millis(20));
    }

    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(100));
    let not_json: Vec<String> = stdout
        .lock()
        .unwrap()
        .iter()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
        .cloned()
        .collect();
    let mut problems = Vec::new();
    match status {
        None => problems.push(format!(
            "still running {WAIT:?} after SIGTERM (hung on its unread stderr)"
        )),
        Some(st) if !st.success() => problems.push(format!("exited with {st:?}")),
        Some(_) => {}
    }
    if !not_json.is_empty() {
        problems.push(format!("stdout lines that are no envelope: {not_json:?}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
