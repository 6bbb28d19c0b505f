//! Shutdown (SIGTERM) around a PVP server that was away and has just come back, and around a
//! stderr nobody reads: nothing accepted is lost while the server is there to take it, and the
//! process neither hangs nor writes anything but envelopes to stdout.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender, http_get, sample};
use common::pvp_server::{ServerOptions, TestPvpServer};

const WAIT: Duration = Duration::from_secs(30);

fn adds_of(server: &TestPvpServer, sender: &str) -> Vec<String> {
    server
        .received_of_type("context.add")
        .iter()
        .filter(|e| e["sender"] == sender)
        .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
        .collect()
}

/// The reconnect wait a "PVP connect failed ...; retrying in WAIT" log line names.
fn retry_wait(line: &str) -> Option<Duration> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let msg = v["fields"]["message"].as_str()?;
    let rest = msg.split("retrying in ").nth(1)?;
    let d: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',')
        .collect();
    if let Some(ms) = d.strip_suffix("ms") {
        ms.parse::<f64>()
            .ok()
            .map(|v| Duration::from_secs_f64(v / 1e3))
    } else if let Some(us) = d.strip_suffix("µs") {
        us.parse::<f64>()
            .ok()
            .map(|v| Duration::from_secs_f64(v / 1e6))
    } else if let Some(ns) = d.strip_suffix("ns") {
        ns.parse::<f64>()
            .ok()
            .map(|v| Duration::from_secs_f64(v / 1e9))
    } else {
        d.strip_suffix('s')?
            .parse::<f64>()
            .ok()
            .map(Duration::from_secs_f64)
    }
}

/// README: "Ctrl-C (or SIGTERM) on the gateway flushes every stream"; the project's rule:
/// nothing already accepted is lost. What is wrong: a participant's connection that is
/// waiting out its reconnect backoff (which grows to 5-10 s after a few seconds of outage)
/// does not notice the stop. The PVP server comes back and the gateway is stopped at once
/// (a rolling restart of both): the connection keeps sleeping through the whole shutdown
/// grace (5 s), never connects to the server that is now there, and the sentence said during
/// the outage is given up ("envelopes still waiting for their PVP connection when the
/// shutdown's grace ended") and lost, without `--spool` for good. What should happen: a stop
/// ends the backoff wait, the connection tries at once, and the waiting sentence (then the
/// leave) reaches the server within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_right_after_the_server_comes_back_delivers_what_waited_for_it() {
    let server = TestPvpServer::start().await;
    let url = server.url();
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let mut gw = Gateway::start_for_server(&url, &["--session", "backoff"]);
    let mut a = Sender::new(gw.listen, 0xbac0ff);
    let p = a.participant();
    a.send("Before the outage. ");
    server
        .wait_until(WAIT, "the first sentence", |s| {
            adds_of(s, &p) == ["Before the outage."]
        })
        .await;
    server.stop().await;

    // The outage lasts until the connection's reconnect wait has grown past the shutdown's
    // grace (5 s) with room to spare: the latest failure names a wait of at least 6 s.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the reconnect wait never reached 6 s"
        );
        let failures: Vec<String> = gw
            .stderr_lines()
            .into_iter()
            .filter(|l| l.contains("PVP connect failed"))
            .collect();
        if failures.len() > seen {
            seen = failures.len();
            if retry_wait(failures.last().unwrap()).is_some_and(|w| w >= Duration::from_secs(6)) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    // Said during the outage; then the server is back, and the gateway is stopped.
    a.send("Said during the outage. ");
    let server = TestPvpServer::start_with(ServerOptions {
        port,
        ..ServerOptions::default()
    })
    .await;
    assert!(gw.terminate(WAIT).success());
    let stopped = gw
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("\"message\":\"stopped\""))
        .unwrap_or_default();
    assert_eq!(
        adds_of(&server, &p),
        ["Said during the outage."],
        "the server was back before the stop, yet the sentence never reached it; {stopped}"
    );
    server.stop().await;
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
