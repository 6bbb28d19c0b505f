//! The IO shell (main.rs, udp.rs, admission.rs, metrics.rs, sink/stdout.rs) against the real
//! binary and real sockets on 127.0.0.1: ports, the RTCP port with several workers, health,
//! rate limits, the configuration file's bounds and signals at start-up. Each test failed
//! before the fix it pins.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway_proc::{
    Gateway, Sender, http_get, log_field, log_number, run_briefly, run_briefly_status,
    run_briefly_with, sample,
};

const WAIT: Duration = Duration::from_secs(20);

/// With `--workers N` (N > 1) the sockets are bound with SO_REUSEPORT, which would let a second
/// gateway on the same port (a deploy that starts the new instance before the old one is gone,
/// a typo in a unit file) join the first's group, the kernel quietly splitting the senders
/// between the two. It is refused with "address in use", as with one worker.
#[test]
fn a_second_gateway_on_a_port_in_use_is_refused_even_with_workers() {
    let gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--rtcp",
        "false",
    ]);
    let listen = gw.listen.to_string();
    let second = run_briefly(
        &["--listen", &listen, "--workers", "2", "--rtcp", "false"],
        Duration::from_secs(5),
    );
    match second {
        Some((ok, err)) => {
            assert!(!ok, "the second gateway exited 0: {err}");
            assert!(err.contains("in use"), "{err}");
        }
        None => panic!(
            "a second gateway with --workers 2 started on {listen}, already taken by a running \
             gateway, and ran: the kernel now shares that port's senders between the two"
        ),
    }
}

/// A start-up error is said once on stderr: as the plain `pvp-t140: …` line in text mode (it was
/// also logged as an ERROR line just before, so a user saw it twice), and as one JSON line in
/// JSON mode, where every line a log collector reads must parse.
#[test]
fn a_start_up_error_is_said_once_in_either_log_format() {
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    for format in ["text", "json"] {
        let (ok, err) = run_briefly(
            &[
                "--listen",
                &listen,
                "--rtcp",
                "false",
                "--log-format",
                format,
            ],
            Duration::from_secs(10),
        )
        .expect("a gateway on a taken port exits");
        assert!(!ok, "{format}: exited 0 on a taken port: {err}");
        let saying: Vec<&str> = err.lines().filter(|l| l.contains("in use")).collect();
        assert_eq!(
            saying.len(),
            1,
            "{format}: the error said {} times:\n{err}",
            saying.len()
        );
        if format == "json" {
            for line in err.lines() {
                assert!(
                    serde_json::from_str::<serde_json::Value>(line).is_ok(),
                    "json: a line that is not JSON: {line:?}"
                );
            }
        } else {
            assert!(saying[0].starts_with("pvp-t140: "), "text: {err}");
        }
    }
}

/// README `--log-format`: "filter with `RUST_LOG`"; a start-up error is said once. What is
/// wrong: in JSON mode the error is now only a `tracing::error!` event, so a `RUST_LOG` that
/// leaves the binary's own target out (here one aimed at the sink module while debugging it,
/// or `off`) hides it: the gateway exits 1 on a taken port with nothing at all on stderr.
/// Before, the plain `pvp-t140: …` line was always written (main.rs's own comment says that
/// line is what "no RUST_LOG filter can hide"). What should happen: whatever the filter, the
/// error that stops the process is said, once (as a JSON line in JSON mode).
#[test]
fn a_start_up_error_in_json_mode_is_said_whatever_rust_log_filters() {
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    for filter in ["pvp_t140::sink=debug", "off"] {
        let args = [
            "--listen",
            &listen,
            "--rtcp",
            "false",
            "--log-format",
            "json",
        ];
        let (ok, err) = run_briefly_with(&args, &[("RUST_LOG", filter)], WAIT)
            .unwrap_or_else(|| panic!("RUST_LOG={filter}: a gateway on a taken port did not exit"));
        assert!(!ok, "RUST_LOG={filter}: exited 0 on a taken port");
        let saying = err.lines().filter(|l| l.contains("in use")).count();
        assert_eq!(
            saying, 1,
            "RUST_LOG={filter}: exit 1 on a taken port, the error said {saying} times; stderr: {err:?}"
        );
    }
}

/// main.rs: the error that stops the process is said "in JSON mode [as] a JSON line as the
/// log's, since a collector reads every line of stderr as JSON". What is wrong: an error in the
/// `--config` file (here `t140_pt = 200`, out of range) returns from `main` before the logs are
/// set up, through its own `eprintln!("pvp-t140: {e}")`, so with `--log-format json` the one
/// line a collector gets is not JSON (it drops it, or flags the stream as corrupt) and the
/// reason the gateway did not start is lost. What should happen: in JSON mode this start-up
/// error too is one JSON line, like the others.
#[test]
fn a_config_file_error_in_json_mode_is_a_json_line() {
    assert_config_error_is_one_json_line(
        "json-error",
        "t140_pt = 200\n",
        &["--log-format", "json"],
    );
}

/// The same when JSON mode comes from the `--config` file itself (README: the file "takes
/// every flag as a key"). `apply_file` set the file's `log_format` only after every other key
/// checked out, so an error in another key of that file was the plain `pvp-t140: ...` line.
#[test]
fn a_config_file_error_is_a_json_line_when_the_file_asks_for_json_logs() {
    let text = "log_format = \"json\"\nt140_pt = 200\n";
    assert_config_error_is_one_json_line("json-from-file", text, &[]);
}

/// Runs the gateway with a config file `text` refused for its `t140_pt = 200` and `args`:
/// it exits non-zero, says the error once, and every stderr line is JSON.
fn assert_config_error_is_one_json_line(name: &str, text: &str, args: &[&str]) {
    let cfg = config_file(name, text);
    let mut all = vec!["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run_briefly(&all, Duration::from_secs(10));
    std::fs::remove_file(&cfg).ok();
    let (ok, err) = out.expect("a gateway with a bad --config exits");
    assert!(!ok, "exited 0 with t140_pt = 200: {err}");
    let saying: Vec<&str> = err.lines().filter(|l| l.contains("t140_pt")).collect();
    assert_eq!(
        saying.len(),
        1,
        "the error said {} times:\n{err}",
        saying.len()
    );
    for line in err.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "{name}: a line that is not JSON: {line:?}"
        );
    }
}

/// The same promise for the errors `config_file::load` finds while reading the file (an empty
/// `roles`, newly refused; an `allow` that is no network; a `[[stream]]` rule): `apply_file`
/// now reads the file's `log_format` first, but only once `load` has returned, so these
/// errors are still the plain `pvp-t140: FILE:2: roles: ...` line though the file asks for
/// JSON logs. Every line should be JSON, as for the file's other keys.
#[test]
fn a_config_file_error_found_while_reading_it_is_a_json_line_when_the_file_asks_for_json() {
    let mut wrong = Vec::new();
    for (name, rest) in [
        ("json-roles", "roles = []\n"),
        ("json-allow", "allow = [\"nowhere\"]\n"),
        ("json-rule", "[[stream]]\nssrc = 7\nroles = [\"pilot\"]\n"),
    ] {
        let cfg = config_file(name, &format!("log_format = \"json\"\n{rest}"));
        let out = run_briefly(
            &["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()],
            Duration::from_secs(10),
        );
        std::fs::remove_file(&cfg).ok();
        let (ok, err) = out.expect("a gateway with a bad --config exits");
        assert!(!ok, "exited 0 with {rest:?}: {err}");
        for line in err.lines() {
            if serde_json::from_str::<serde_json::Value>(line).is_err() {
                wrong.push(format!("{rest:?}: a line that is not JSON: {line:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A command line clap refuses is, with `--log-format json` on it, one JSON line and exit
/// status 1, as the same mistake found by the core's own check (`--t140-pt 70`) or in a
/// `--config` file: a flag value out of its range (`--t140-pt 200`, `--workers 0`,
/// `--server-silence-s 0`, `--reorder-wait-ms 10001`, also as `--log-format=json`) and live
/// flags before a subcommand. In text mode it stays clap's own error, exit status 2. A review
/// found these were clap's plain multi-line usage error in JSON mode too, lines a collector
/// drops, and the reason the gateway did not start lost (review, session 35).
#[test]
fn a_flag_value_refused_by_its_range_is_a_json_line_in_json_mode() {
    let all_json = |err: &str| {
        err.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    };
    let mut wrong = Vec::new();
    for (format, bad) in [
        (&["--log-format", "json"][..], ["--t140-pt", "200"]),
        (&["--log-format", "json"], ["--workers", "0"]),
        (&["--log-format", "json"], ["--server-silence-s", "0"]),
        (&["--log-format=json"], ["--reorder-wait-ms", "10001"]),
    ] {
        let mut args = format.to_vec();
        args.extend_from_slice(&["--listen", "127.0.0.1:0"]);
        args.extend_from_slice(&bad);
        let (status, err) = run_briefly_status(&args, &[], Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{bad:?}: the gateway did not exit"));
        assert_eq!(status.code(), Some(1), "{bad:?}: {err}");
        assert!(
            err.contains(bad[1]),
            "{bad:?}: the error does not name the value: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{bad:?}: said once: {err}");
        if !all_json(&err) {
            wrong.push(format!("{bad:?}: a stderr line that is not JSON: {err:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The same kind of mistake that the core's own check finds is one JSON line.
    let (status, err) = run_briefly_status(
        &[
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
            "--t140-pt",
            "70",
        ],
        &[],
        Duration::from_secs(10),
    )
    .expect("exits");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(all_json(&err), "{err}");
    // Live flags before a subcommand: one JSON line naming them all.
    let capture = concat!(env!("CARGO_MANIFEST_DIR"), "/pcaps/backspace.pcap");
    let (status, err) = run_briefly_status(
        &[
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:9",
            "--workers",
            "2",
            "replay",
            capture,
        ],
        &[],
        Duration::from_secs(10),
    )
    .expect("exits");
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let message = log_field(&err, "message");
    assert!(
        message.contains("cannot be used with") && message.contains("--listen\n  --workers"),
        "{message}"
    );
    // Text mode: clap's own error and status.
    let (status, err) = run_briefly_status(
        &["--listen", "127.0.0.1:0", "--t140-pt", "200"],
        &[],
        Duration::from_secs(10),
    )
    .expect("exits");
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: invalid value '200'"), "{err}");
}

/// Waits for `child` at most `timeout`; kills it (and reaps it) past that.
#[cfg(target_os = "linux")]
fn wait_at_most(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pipe whose buffer is already full (a log collector that stopped reading, its pipe shared
/// with an earlier run of the process): a write to its write end blocks. The reader is
/// returned so that the pipe stays open, never read.
#[cfg(target_os = "linux")]
fn full_pipe() -> (std::io::PipeReader, std::io::PipeWriter) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::io::Write;
    use std::os::fd::AsFd;
    let (r, mut w) = std::io::pipe().unwrap();
    let flags = OFlag::from_bits_truncate(fcntl(w.as_fd(), FcntlArg::F_GETFL).unwrap());
    fcntl(w.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).unwrap();
    let chunk = [b'x'; 4096];
    let mut filled = 0usize;
    for size in [4096usize, 1] {
        loop {
            match w.write(&chunk[..size]) {
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the pipe: {e}"),
            }
        }
    }
    assert!(filled > 0);
    // Blocking again (the flag belongs to the open file description the child inherits).
    fcntl(w.as_fd(), FcntlArg::F_SETFL(flags)).unwrap();
    (r, w)
}

/// README, `--log-format` row: "a stderr nobody reads holds the exit at most 2 s". An error
/// said before the logs are set up (a flag value out of range or live flags before a
/// subcommand, in either log format; a config file's error, either format) ends the process
/// (status 1 or 2) with a stderr whose pipe is full, as one found once the logs are set up
/// does. A review found those errors written with a plain, blocking `eprintln!` or clap's own
/// `Error::exit`: the process never exited, holding its supervisor's restart for good
/// (review, session 35).
#[cfg(target_os = "linux")]
#[test]
fn a_start_up_error_said_before_the_logs_are_set_up_does_not_hang_on_a_full_stderr() {
    let bad_file = config_file("full-stderr-json", "log_format = \"json\"\nworkers = 0\n");
    let bad_text_file = config_file("full-stderr-text", "workers = 0\n");
    let bad = bad_file.display().to_string();
    let bad_text = bad_text_file.display().to_string();
    let cases: [(&str, &[&str]); 5] = [
        (
            "a flag value out of range, --log-format json",
            &[
                "--log-format",
                "json",
                "--listen",
                "127.0.0.1:0",
                "--t140-pt",
                "200",
            ],
        ),
        (
            "live flags before a subcommand, --log-format json",
            &[
                "--log-format",
                "json",
                "--listen",
                "127.0.0.1:9",
                "send",
                "--to",
                "127.0.0.1:9",
            ],
        ),
        (
            "a config file error, the file asking for JSON logs",
            &["--config", &bad, "--listen", "127.0.0.1:0"],
        ),
        (
            "a config file error, text logs",
            &["--config", &bad_text, "--listen", "127.0.0.1:0"],
        ),
        (
            "a flag value out of range, text logs",
            &["--listen", "127.0.0.1:0", "--t140-pt", "200"],
        ),
    ];
    let mut hung = Vec::new();
    for (what, args) in cases {
        let (_reader, writer) = full_pipe();
        let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(writer))
            .spawn()
            .unwrap();
        // The bound is 2 s; 10 s leaves room for a loaded machine.
        match wait_at_most(&mut child, Duration::from_secs(10)) {
            None => hung.push(format!("{what}: still running 10 s later ({args:?})")),
            Some(st) if st.code() != Some(1) && st.code() != Some(2) => {
                hung.push(format!("{what}: exit status {st:?}"))
            }
            Some(_) => {}
        }
    }
    std::fs::remove_file(&bad_file).ok();
    std::fs::remove_file(&bad_text_file).ok();
    assert!(
        hung.is_empty(),
        "a stderr nobody reads held the exit for good:\n{}",
        hung.join("\n")
    );
}

/// README, `--log-format` row: "in JSON mode an error that stops the start (...) is one JSON
/// line and exit status 1". It is status 1 too when stderr cannot be written (its reader, a
/// log collector, has gone: EPIPE), for a flag value out of range and for a config file's
/// error, as for an error found once the logs are set up. A review found the `eprintln!` of
/// those errors panicking ("failed printing to stderr"): exit status 101, a panic's (review,
/// session 35).
#[cfg(target_os = "linux")]
#[test]
fn a_json_start_up_error_exits_1_when_stderr_is_closed() {
    let bad_file = config_file("closed-stderr", "log_format = \"json\"\nworkers = 0\n");
    let bad = bad_file.display().to_string();
    let cases: [(&str, &[&str]); 2] = [
        (
            "a flag value out of range",
            &[
                "--log-format",
                "json",
                "--listen",
                "127.0.0.1:0",
                "--t140-pt",
                "200",
            ],
        ),
        (
            "a config file error, the file asking for JSON logs",
            &["--config", &bad, "--listen", "127.0.0.1:0"],
        ),
    ];
    let mut wrong = Vec::new();
    for (what, args) in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        // The reader has gone before the process starts: every write is EPIPE.
        drop(reader);
        let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(writer))
            .spawn()
            .unwrap();
        match wait_at_most(&mut child, WAIT) {
            None => wrong.push(format!("{what}: did not exit")),
            Some(st) if st.code() != Some(1) => {
                wrong.push(format!("{what}: exit status {st:?}, not 1"))
            }
            Some(_) => {}
        }
    }
    std::fs::remove_file(&bad_file).ok();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A gateway on an ephemeral port N with its RTCP port N + 1. That port may be taken (other
/// tests' sockets): the gateway then reads RTCP multiplexed only ("mux only"), and is started
/// again on another port.
fn start_with_rtcp_port(args: &[&str]) -> (Gateway, SocketAddr) {
    for _ in 0..20 {
        let mut gw = Gateway::start(args);
        let listening = gw.wait_stderr(WAIT, "pvp-t140 listening");
        if let Ok(rtcp) = log_field(&listening, "rtcp").parse() {
            return (gw, rtcp);
        }
        gw.kill();
    }
    panic!("no free RTCP port after 20 gateways");
}

/// RTCP read on the separate RTCP port (port + 1) is handed to every worker, each acting on it
/// for its own streams; one counts it. (Each counted it: with `--workers 4`, one RTCP datagram
/// showed as 4 on /metrics and in the final counters.)
#[test]
fn an_rtcp_datagram_on_the_rtcp_port_is_counted_once_with_workers() {
    let (mut gw, rtcp) = start_with_rtcp_port(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "4",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let m = gw.metrics_addr();
    let mut sdes = Vec::new();
    pvp_t140::rtcp::write_sdes(&mut sdes, 0xabcd, "alice@example.org", Some("Alice"));
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(&sdes, rtcp)
        .unwrap();
    // Workers publish once a second: wait until something shows, then two more seconds so
    // every worker has published.
    let deadline = Instant::now() + WAIT;
    while sample(&http_get(m, "/metrics").1, "pvp_t140_rtcp_packets_total").unwrap_or(0.0) == 0.0 {
        assert!(Instant::now() < deadline, "the RTCP datagram never counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let body = http_get(m, "/metrics").1;
    assert_eq!(
        (
            sample(&body, "pvp_t140_datagrams_total"),
            sample(&body, "pvp_t140_rtcp_packets_total"),
            sample(&body, "pvp_t140_bytes_total"),
        ),
        (Some(1.0), Some(1.0), Some(sdes.len() as f64)),
        "one datagram was sent\n{body}"
    );
    assert!(gw.terminate(WAIT).success());
}

/// Once stdout is gone (its reader exited: EPIPE), every envelope is dropped from then on, and
/// /healthz says so (503), where it kept answering 200 "ready: udp bound, sink stdout".
#[test]
fn healthz_is_not_ready_once_stdout_is_gone() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader of stdout goes away at once.
    drop(child.stdout.take());
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    let wait_for = |needle: &str| -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(l) = lines.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            assert!(Instant::now() < deadline, "no {needle:?} on stderr");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let listen: SocketAddr = log_field(&wait_for("pvp-t140 listening"), "listen")
        .parse()
        .unwrap();
    let m: SocketAddr = log_field(&wait_for("serving /metrics"), "metrics")
        .parse()
        .unwrap();
    Sender::new(listen, 0xe1).send("Hello. ");
    wait_for("writing to stdout failed");
    let (status, body) = http_get(m, "/healthz");
    let _ = child.kill();
    let _ = child.wait();
    assert_ne!(
        status, 200,
        "stdout is gone and every envelope is dropped, yet /healthz says: {body}"
    );
}

/// `--max-pps-per-source` above about 10,500 killed the receive worker at its first datagram:
/// a fresh rate bucket's `last` is the Unix epoch, and `elapsed_us * pps` overflowed u64 (a
/// panic in a debug build, which `cargo test` runs; a wrapped product in release).
#[test]
fn a_high_max_pps_per_source_does_not_kill_the_receive_worker() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--max-pps-per-source", "20000"]);
    Sender::new(gw.listen, 0x20000).send("Hello. ");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw
        .stdout_lines()
        .iter()
        .any(|l| l.contains("\"context.add\""))
    {
        assert!(
            Instant::now() < deadline,
            "no transcript; stderr:\n{}",
            gw.stderr_lines()
                .iter()
                .filter(|l| !l.starts_with("  "))
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gw.terminate(WAIT).success());
}

/// On a dual-stack listener an IPv4 sender arrives as `::ffff:a.b.c.d`, and the gateway knows
/// it by its IPv4 address. An `--allow` rule written in that mapped form (the form `ss` shows
/// for the listener's peers) is taken as the IPv4 address it maps; as written it matched
/// nothing, and refused the very sender it names.
#[test]
fn an_ipv4_mapped_allow_rule_admits_its_ipv4_sender_on_a_dual_stack_listener() {
    let mut gw = Gateway::start(&["--listen", "[::]:0", "--allow", "::ffff:127.0.0.1"]);
    let to = SocketAddr::from(([127, 0, 0, 1], gw.listen.port()));
    Sender::new(to, 0x4545).send("Mapped hello. ");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw
        .stdout_lines()
        .iter()
        .any(|l| l.contains("Mapped hello."))
    {
        if Instant::now() > deadline {
            let refused = gw.stderr_lines().iter().any(|l| l.contains("not_allowed"));
            panic!("--allow ::ffff:127.0.0.1 refused 127.0.0.1 (not_allowed logged: {refused})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gw.terminate(WAIT).success());
}

fn config_file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "pvp-t140-review-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&p, text).unwrap();
    p
}

/// `--config` values have the range checks of the flags they stand for. They skipped them:
/// `t140_pt = 200` was taken (an RTP payload type has 7 bits, so every datagram was dropped as
/// unknown_payload_type), `reorder_wait_ms = 600000` held text behind a gap for 10 minutes
/// (the flag's limit is 10,000; RFC 4103 5.4 asks at most 1 s), and the same for `red_pt`,
/// `max_chunk_chars` and `workers`. Payload types 64-95 are refused either way: on a port that
/// also takes RTCP they cannot be told from it (RFC 5761 section 4), and every marked packet
/// was dropped as malformed RTCP, its text lost.
#[test]
fn the_config_files_values_are_checked_as_the_flags_are() {
    for (key, text) in [
        ("t140_pt", "t140_pt = 200\n"),
        ("red_pt", "red_pt = 228\n"),
        ("t140_pt", "t140_pt = 80\n"),
        ("reorder_wait_ms", "reorder_wait_ms = 600000\n"),
        ("max_chunk_chars", "max_chunk_chars = 5000000\n"),
        ("workers", "workers = 1000\n"),
    ] {
        let cfg = config_file(key, text);
        let file = run_briefly(
            &["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()],
            Duration::from_secs(10),
        );
        std::fs::remove_file(&cfg).ok();
        let flag = format!("--{}", key.replace('_', "-"));
        assert!(
            matches!(&file, Some((false, err)) if err.contains(key) || err.contains(&flag)),
            "{text:?} in --config: {file:?}"
        );
    }
    for args in [
        ["--t140-pt", "200"],
        ["--t140-pt", "80"],
        ["--red-pt", "72"],
    ] {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend(args);
        let flag = run_briefly(&all, Duration::from_secs(10));
        assert!(
            matches!(&flag, Some((false, err)) if err.contains(args[0])),
            "{args:?}: {flag:?}"
        );
    }
}

/// A time far too large is refused (a day at most), on the command line and in the file: a
/// huge `--heartbeat-s` was accepted and then panicked each participant's connection task
/// (`Instant + Duration` overflow), so no transcript reached the server.
#[test]
fn a_huge_heartbeat_is_refused() {
    let huge = u64::MAX.to_string();
    let flag = run_briefly(
        &["--listen", "127.0.0.1:0", "--heartbeat-s", &huge],
        Duration::from_secs(5),
    );
    assert!(
        matches!(&flag, Some((false, err)) if err.contains("--heartbeat-s")),
        "{flag:?}"
    );
    let cfg = config_file("heartbeat", "heartbeat_s = 99999999\n");
    let file = run_briefly(
        &["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()],
        Duration::from_secs(5),
    );
    std::fs::remove_file(&cfg).ok();
    assert!(
        matches!(&file, Some((false, err)) if err.contains(":1: heartbeat_s: must be at most 86400")),
        "{file:?}"
    );
}

/// SIGINT and SIGTERM are caught from before the sockets are bound. They were caught only at
/// the end of start-up, after "pvp-t140 listening": a SIGTERM in between took the default
/// action (death by the signal, exit status 143, nothing flushed), which a supervisor that
/// stops the gateway as soon as it says it listens hit about 1 start in 10.
#[test]
fn sigterm_right_after_listening_still_shuts_down_gracefully() {
    let mut killed = 0;
    for _ in 0..30 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while err.read_line(&mut line).unwrap() > 0 {
            if line.contains("pvp-t140 listening") {
                break;
            }
            line.clear();
        }
        // As a supervisor would: SIGTERM as soon as the gateway says it listens.
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        let status = child.wait().unwrap();
        if !status.success() {
            killed += 1;
            assert!(!rest.contains("stopped"), "{rest}");
        }
    }
    assert_eq!(
        killed, 0,
        "{killed} of 30 gateways died by SIGTERM instead of shutting down (exit 0)"
    );
}

/// SIGHUP (the terminal closed, an ssh session lost, `kill -HUP`) stops the gateway as SIGTERM
/// does: the half sentence it holds is written, its speaker leaves, and it exits 0. A review
/// found SIGHUP took its default action, death (exit status 129) with the text lost (review,
/// session 35). Started with SIGHUP's default action, as from a terminal: a test run under
/// `nohup` would hand the gateway an ignored SIGHUP, which it keeps (the test below).
#[test]
fn sighup_flushes_what_is_held_and_exits_0() {
    let mut gw =
        Gateway::start_with_hangup(&["--listen", "127.0.0.1:0", "--idle-flush-ms", "600000"]);
    let mut sender = Sender::new(gw.listen, 0x4a5);
    sender.send("held until the stop");
    gw.wait_stderr(WAIT, "stream started");
    assert!(gw.stdout_lines().is_empty(), "flushed before the stop");
    let status = gw.stop_with("HUP", WAIT);
    assert!(status.success(), "SIGHUP: {status}");
    let out = gw.stdout_lines();
    let text = out
        .iter()
        .position(|l| l.contains("context.add") && l.contains("held until the stop"))
        .unwrap_or_else(|| panic!("the held text was lost: {out:?}"));
    assert!(
        out[text..].iter().any(|l| l.contains("session.leave")),
        "no leave after the text: {out:?}"
    );
}

/// A gateway started with SIGHUP ignored (`nohup pvp-t140 &`, `trap '' HUP`: POSIX nohup
/// runs a program so that a hangup does not end it) keeps it ignored: a hangup changes
/// nothing, and text sent after it is said by an idle flush, not by a stop. A review found the
/// handler installed for SIGHUP replacing the inherited SIG_IGN, so a lost ssh session ended a
/// `nohup`ed gateway (review, session 35).
#[test]
fn a_gateway_started_with_sighup_ignored_keeps_running_after_a_hangup() {
    let mut gw = Gateway::start_after(
        "trap '' HUP",
        &["--listen", "127.0.0.1:0", "--idle-flush-ms", "100"],
    );
    let kill = Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success(), "kill -HUP");
    let mut sender = Sender::new(gw.listen, 0xd0e);
    sender.send("said after the hangup");
    let line = gw.wait_stdout(WAIT, "said after the hangup");
    assert!(
        line.contains("flush:idle"),
        "said by a stop, not an idle flush: {line}"
    );
    gw.assert_stderr_lacks("shutting down");
    assert!(gw.terminate(WAIT).success());
}

/// A gateway started with SIGINT ignored keeps it ignored, as with SIGHUP: a shell without job
/// control starts a background job (`pvp-t140 &` in a script) with SIGINT ignored (POSIX XCU
/// 2.11), so that a Ctrl-C at the terminal for the foreground reaches no background job. A
/// review found the gateway's handler replacing the inherited SIG_IGN (review, session 36).
#[test]
fn a_gateway_started_with_sigint_ignored_keeps_running_after_an_interrupt() {
    let mut gw = Gateway::start_after(
        "trap '' INT",
        &["--listen", "127.0.0.1:0", "--idle-flush-ms", "100"],
    );
    let kill = Command::new("kill")
        .args(["-INT", &gw.pid().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success(), "kill -INT");
    let mut sender = Sender::new(gw.listen, 0xd0f);
    sender.send("said after the interrupt");
    let line = gw.wait_stdout(WAIT, "said after the interrupt");
    assert!(
        line.contains("flush:idle"),
        "said by a stop, not an idle flush: {line}"
    );
    gw.assert_stderr_lacks("shutting down");
    assert!(gw.terminate(WAIT).success());
}

/// The `token` of the `session.join` a gateway started with `args` and the environment `env`
/// (PVP_TOKEN is removed first, so the test's own environment does not leak in) writes for one
/// sender: `None` when the join has no token field.
fn join_token(args: &[&str], env: &[(&str, &str)]) -> Option<serde_json::Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--rtcp",
            "false",
            "--log-format",
            "json",
        ])
        .args(args)
        .env_remove("PVP_TOKEN")
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |r: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let err = lines(Box::new(child.stderr.take().unwrap()));
    let out = lines(Box::new(child.stdout.take().unwrap()));
    let find = |rx: &std::sync::mpsc::Receiver<String>, needle: &str| loop {
        match rx.recv_timeout(WAIT) {
            Ok(l) if l.contains(needle) => break Some(l),
            Ok(_) => {}
            Err(_) => break None,
        }
    };
    let Some(listening) = find(&err, "pvp-t140 listening") else {
        let _ = child.kill();
        let status = child.wait().unwrap();
        let rest: Vec<String> = err.try_iter().collect();
        panic!("{args:?} {env:?}: no listening line; exit {status}: {rest:?}");
    };
    let listen: SocketAddr = log_field(&listening, "listen").parse().unwrap();
    Sender::new(listen, 0x70c).send("Hello. ");
    let join = find(&out, "\"session.join\"");
    let _ = child.kill();
    let _ = child.wait();
    let join: serde_json::Value =
        serde_json::from_str(&join.unwrap_or_else(|| panic!("{args:?} {env:?}: no join"))).unwrap();
    join["payload"].get("token").cloned()
}

/// pvp-spec 6.3 makes session.join's `token` OPTIONAL (20.1: for transport-layer auth). An
/// empty one (`--token ""`, `PVP_TOKEN=` as an environment file writes an unset variable) was
/// sent as `"token":""`, an empty string presented as a credential; it means no token, and the
/// join goes without the field. A token that is there is sent as given.
#[test]
fn an_empty_token_on_the_command_line_or_in_the_environment_is_no_token() {
    use serde_json::json;
    for (args, env) in [
        (&["--token", ""][..], &[][..]),
        (&["--token", "  "][..], &[][..]),
        (&[][..], &[("PVP_TOKEN", "")][..]),
        (&[][..], &[]),
    ] {
        assert_eq!(join_token(args, env), None, "{args:?} {env:?}");
    }
    assert_eq!(join_token(&["--token", "tok"], &[]), Some(json!("tok")));
    assert_eq!(
        join_token(&[], &[("PVP_TOKEN", " tok ")]),
        Some(json!(" tok ")),
        "a token is sent as given, not trimmed"
    );
    // The environment overrides the configuration file, as a flag does: an empty PVP_TOKEN
    // says "no token" over the file's.
    let cfg = config_file("token", "token = \"from-file\"\n");
    let path = cfg.to_str().unwrap();
    assert_eq!(
        join_token(&["--config", path], &[]),
        Some(json!("from-file"))
    );
    assert_eq!(join_token(&["--config", path], &[("PVP_TOKEN", "")]), None);
    std::fs::remove_file(&cfg).ok();
}

/// Text received and not delivered shows where a user looks: on /metrics and in the totals of
/// the "stopped" line. The chunks of a speaker the stream mapping refused (`unmatched =
/// "refuse"`) were counted by the core (`Stats::refused_chunks`) and shown nowhere: neither on
/// /metrics nor in the final lines, which read as if nothing had been refused. Datagrams the
/// admission checks refuse (`--allow`) were shown already, as drops (`not_allowed`), and still
/// are.
#[test]
fn text_refused_by_the_mapping_or_admission_is_in_the_final_totals_and_on_metrics() {
    let cfg = config_file(
        "refused",
        "unmatched = \"refuse\"\n\n[[stream]]\nssrc = \"0x000a11ce\"\nparticipant = \"alice\"\n",
    );
    // Dual-stack, allowing ::1 and not 127.0.0.1: an IPv4 sender is refused by admission.
    let mut gw = Gateway::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        "[::]:0",
        "--allow",
        "::1/128",
        "--metrics",
        "127.0.0.1:0",
    ]);
    std::fs::remove_file(&cfg).ok();
    let m = gw.metrics_addr();
    let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, gw.listen.port()));
    let v4 = SocketAddr::from(([127, 0, 0, 1], gw.listen.port()));
    Sender::new(v4, 0xa11ce).send("Not from here. ");
    Sender::new(v6, 0x5).send("Nobody maps me. ");
    Sender::new(v6, 0xa11ce).send("Alice speaks. ");
    // One socket, one worker: the two before it were read before Alice's text came out.
    gw.wait_stdout(WAIT, "Alice speaks.");
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let body = http_get(m, "/metrics").1;
        if sample(&body, "pvp_t140_datagrams_total") == Some(3.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        sample(&body, "pvp_t140_mapping_refused_chunks_total"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "pvp_t140_drops_total{reason=\"not_allowed\"}"),
        Some(1.0),
        "{body}"
    );
    assert!(gw.terminate(WAIT).success());
    let lines = gw.stderr_lines();
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("\"message\":\"{message}\"")))
            .unwrap_or_else(|| panic!("no {message:?} line in\n{}", lines.join("\n")))
            .clone()
    };
    let stopped = find("stopped");
    assert_eq!(
        log_number(&stopped, "mapping_refused_chunks"),
        1,
        "{stopped}"
    );
    let counters = find("counters");
    assert!(
        log_field(&counters, "drops").contains("not_allowed=1"),
        "{counters}"
    );
}

/// README, flag table: "`--rtcp` | `true` | also read RTCP on the next port up" (main.rs:
/// "`--rtcp false` to leave that port alone"). What is wrong: with one worker (the default)
/// the RTCP port's datagrams go through the whole RTP path (`handle_rtcp_port` with `counts`
/// calls `handle_datagram`), so an RTP text packet sent to port + 1 (a sender given the wrong
/// port, another application's media) becomes a participant and a transcript in the session.
/// With `--workers 2` only worker 0 does this, the others keep to RTCP (`looks_like_rtcp`):
/// the same datagram is or is not a transcript depending on the worker count. The RTCP port
/// should carry RTCP only, as its flag says.
#[test]
fn rtp_text_sent_to_the_rtcp_port_is_not_a_transcript() {
    let (mut gw, rtcp_port) = start_with_rtcp_port(&["--listen", "127.0.0.1:0"]);
    // A real sender on the RTP port, on a socket of our own so its RTCP can come from it.
    let real = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rtp = Vec::new();
    pvp_t140::rtp::write_packet(
        &mut rtp,
        true,
        98,
        1,
        0,
        0x1111,
        "\u{feff}Sent to the RTP port. ".as_bytes(),
    );
    real.send_to(&rtp, gw.listen).unwrap();
    gw.wait_stdout(WAIT, "Sent to the RTP port.");
    let mut stray = Sender::new(rtcp_port, 0x5757);
    stray.send("Sent to the RTCP port. ");
    // Then the real sender's SDES NAME, to the RTCP port as well: the RTCP port's datagrams
    // reach the worker in order, so once this name is announced the stray packet before it
    // has been handled.
    let mut sdes = Vec::new();
    pvp_t140::rtcp::write_sdes(&mut sdes, 0x1111, "real@127.0.0.1", Some("Sentinel Name"));
    real.send_to(&sdes, rtcp_port).unwrap();
    gw.wait_stdout(WAIT, "Sentinel Name");
    assert!(gw.terminate(WAIT).success());
    let strays: Vec<String> = gw
        .stdout_lines()
        .into_iter()
        .filter(|l| l.contains(&stray.participant()))
        .collect();
    assert!(
        strays.is_empty(),
        "RTP on the RTCP port became a participant:\n{}",
        strays.join("\n")
    );
}

/// README, `--allow`: "only accept datagrams from these networks", and what is refused is
/// counted as `not_allowed` (`text_refused_by_the_mapping_or_admission_...` above). A datagram
/// on the RTCP port that is not RTCP is now counted `rtcp_malformed` by `handle_rtcp_port`
/// before admission is asked, so an RTP packet from a network `--allow` refuses never shows as
/// `not_allowed` (nor is it rate-limited by `--max-pps-per-source`), while an RTCP packet from
/// the same source on the same port does. Admission should come first, as for every other
/// datagram: one refused datagram, one `not_allowed`.
#[test]
fn a_non_rtcp_datagram_on_the_rtcp_port_from_a_refused_network_is_not_allowed() {
    let (mut gw, rtcp_port) = start_with_rtcp_port(&[
        "--listen",
        "127.0.0.1:0",
        "--allow",
        "10.0.0.0/8",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let m = gw.metrics_addr();
    Sender::new(rtcp_port, 0x5757).send("From a refused network. ");
    let deadline = Instant::now() + WAIT;
    let body = loop {
        let body = http_get(m, "/metrics").1;
        if sample(&body, "pvp_t140_datagrams_total") == Some(1.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(gw.terminate(WAIT).success());
    assert_eq!(
        (
            sample(&body, "pvp_t140_drops_total{reason=\"not_allowed\"}"),
            sample(&body, "pvp_t140_drops_total{reason=\"rtcp_malformed\"}"),
        ),
        (Some(1.0), Some(0.0)),
        "a datagram from outside --allow is counted as not allowed\n{body}"
    );
}

/// README, "Text decoding": "Every dropped datagram is counted by reason and logged at debug
/// level" (`handle_hinted`: "datagram dropped", with its source and reason). The new drop in
/// `handle_rtcp_port` of a datagram on the RTCP port that is not RTCP counts it
/// (`rtcp_malformed`) and returns without that line, so with `RUST_LOG=debug` an operator
/// looking for why a sender's text never arrived (it sends to port + 1) finds nothing. It
/// should be logged as every other drop is.
#[test]
fn a_non_rtcp_datagram_dropped_on_the_rtcp_port_is_logged_at_debug_level() {
    // Gateway::start logs at debug level.
    let (mut gw, rtcp_port) =
        start_with_rtcp_port(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let mut stray = Sender::new(rtcp_port, 0x5757);
    stray.send("Sent to the RTCP port. ");
    let deadline = Instant::now() + WAIT;
    loop {
        let body = http_get(m, "/metrics").1;
        if sample(&body, "pvp_t140_datagrams_total") == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gw.terminate(WAIT).success());
    let source = stray.local_addr().to_string();
    let lines = gw.stderr_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("datagram dropped") && l.contains(&source)),
        "no debug line for the datagram dropped from {source}:\n{}",
        lines.join("\n")
    );
}
