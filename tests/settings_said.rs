//! What the gateway says at start about the settings it was given: a buffer the kernel capped,
//! settings that do nothing, errors naming the file and line; and the file read once. Run as
//! the real binary (review c, session 39).

mod common;
#[path = "common/core.rs"]
mod core_helpers;
#[path = "common/frames.rs"]
mod frames;

use std::time::Duration;

use common::gateway_proc::Gateway;

const WAIT: Duration = Duration::from_secs(20);

/// `net.core.rmem_max`, the most SO_RCVBUF a process without CAP_NET_ADMIN gets.
fn rmem_max() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// README: "`--recv-buffer` ... SO_RCVBUF requested per RTP socket, in bytes; bursts wait there
/// instead of being dropped (the kernel caps it at `net.core.rmem_max`)". A request the kernel
/// capped was said nowhere: an operator who asked for 2 GiB of burst room got what rmem_max
/// allows (208 KiB on a stock kernel) and no word of it, and the bursts beyond it were dropped
/// by the kernel, where the gateway counts nothing. A flag value not honoured must be said.
#[test]
fn a_receive_buffer_the_kernel_capped_is_said_at_start() {
    let Some(max) = rmem_max() else {
        eprintln!("SKIPPED: no /proc/sys/net/core/rmem_max");
        return;
    };
    let asked = i32::MAX as u64;
    if max >= asked {
        eprintln!("SKIPPED: net.core.rmem_max {max} allows any request");
        return;
    }
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--recv-buffer",
        &asked.to_string(),
    ]);
    let line = gw.wait_stderr(WAIT, "net.core.rmem_max");
    assert!(line.contains("\"WARN\""), "{line}");
    assert!(line.contains("--recv-buffer"), "{line}");
    assert!(line.contains(&asked.to_string()), "{line}");
    assert!(gw.terminate(WAIT).success());
}

/// A request the kernel honours is not warned about.
#[test]
fn a_receive_buffer_the_kernel_honoured_is_not_warned_about() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--recv-buffer", "65536"]);
    assert!(gw.terminate(WAIT).success());
    gw.assert_stderr_lacks("net.core.rmem_max");
}

/// The receive buffer (`ss -m`'s `rb`) of the UDP socket bound on `port`, if `ss` reads it.
fn receive_buffer(port: u16) -> Option<u64> {
    let out = std::process::Command::new("ss")
        .args(["-ulnmH", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rb = text
        .split(['(', ',', ')'])
        .find_map(|f| f.strip_prefix("rb"))?;
    rb.parse().ok()
}

/// `--recv-buffer` is asked for the RTCP port's socket too: it was bound with the default
/// 8 MiB whatever the flag said, so an operator bounding the gateway's kernel memory with a
/// small buffer still had the default's on the RTCP port.
#[test]
fn the_rtcp_port_gets_the_receive_buffer_asked_for() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--recv-buffer", "65536"]);
    gw.wait_stderr(WAIT, "listening");
    let port = gw.listen.port();
    let (Some(rtp), Some(rtcp)) = (receive_buffer(port), receive_buffer(port + 1)) else {
        eprintln!("SKIPPED: `ss` does not read the sockets' buffers here");
        assert!(gw.terminate(WAIT).success());
        return;
    };
    assert!(gw.terminate(WAIT).success());
    assert_eq!(rtcp, rtp, "the RTCP port's buffer is the RTP socket's");
    assert!(
        rtp <= 2 * 65536,
        "{rtp}: what was asked for, doubled by the kernel"
    );
}

/// The settings of the PVP server's connections (`--ca-file`, `--heartbeat-s`,
/// `--connect-timeout-s`, `--write-timeout-s`, `--server-silence-s`) do nothing without
/// `--server`, and `--gate-quorum`/`--gate-timeout-s` nothing without `--gate-transcripts`;
/// given so, they were taken without a word (`--ca-file /nonexistent` was not even read), while
/// `--ca-file` with a `ws://` server says it is not used, and `--spool`/`--gate-transcripts`
/// without `--server` are refused. A gateway started with `--gate-quorum 2` and no
/// `--gate-transcripts` adds every chunk ungated: an operator who meant gating is not told.
#[test]
fn settings_that_do_nothing_without_their_mode_are_said_unused() {
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--ca-file",
        "/nonexistent/ca.pem",
        "--heartbeat-s",
        "5",
    ]);
    let line = gw.wait_stderr(WAIT, "not used");
    assert!(line.contains("\"WARN\""), "{line}");
    assert!(
        line.contains("--ca-file") && line.contains("--heartbeat-s"),
        "{line}"
    );
    assert!(line.contains("--server"), "{line}");
    assert!(gw.terminate(WAIT).success());

    // From the file too, named by its keys; the gate's settings without the gate.
    let cfg = std::env::temp_dir().join(format!("pvp-t140-{}-unused.toml", std::process::id()));
    std::fs::write(&cfg, "gate_quorum = 2\nconnect_timeout_s = 3\n").unwrap();
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()]);
    let line = gw.wait_stderr(WAIT, "not used");
    std::fs::remove_file(&cfg).ok();
    assert!(
        line.contains("--gate-quorum") && line.contains("--connect-timeout-s"),
        "{line}"
    );
    assert!(gw.terminate(WAIT).success());

    // Defaults are no one's choice: nothing is said of them.
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0"]);
    assert!(gw.terminate(WAIT).success());
    gw.assert_stderr_lacks("not used");
}

/// README, "Replaying captures": "`--port N` keeps the datagrams to port N and to N+1, the
/// RTCP port a live gateway listening on N reads by default (`--rtcp`), so both give the same
/// envelopes", and "`--config FILE` takes the file the live gateway ran with". A gateway whose
/// file says `rtcp = false` leaves port N+1 alone (another service's RTCP may be there), but
/// its replay fed that port's RTCP to the core all the same: here a BYE on 5005, which the
/// live gateway never read, ended the stream in the replay ("rtcp bye", at once) where live
/// it ended by timing out. Replay must read what the live gateway read.
#[test]
fn replay_with_a_file_that_says_rtcp_false_leaves_the_rtcp_port_alone() {
    const T0: u64 = 1_700_000_000_000_000;
    let mut rtp = vec![0x80, 0x80 | 98, 0, 1, 0, 0, 0, 0];
    rtp.extend_from_slice(&0x7777u32.to_be_bytes());
    rtp.extend_from_slice(b"Hello there. ");
    let mut bye = vec![0x81, 203, 0, 1];
    bye.extend_from_slice(&0x7777u32.to_be_bytes());
    let capture = frames::pcap_to(&[(T0, 5004, rtp), (T0 + 300_000, 5005, bye)]);
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let (cap, cfg) = (
        dir.join(format!("pvp-t140-rvc-{pid}.pcap")),
        dir.join(format!("pvp-t140-rvc-{pid}-rtcp.toml")),
    );
    std::fs::write(&cap, capture).unwrap();
    let leave_reason = |config: &str| {
        std::fs::write(&cfg, config).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .arg("replay")
            .arg(&cap)
            .args(["--port", "5004", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|e| e["type"] == "session.leave")
            .map(|e| e["payload"]["reason"].as_str().unwrap().to_owned())
    };
    let with_rtcp = leave_reason("rtcp = true\n");
    let without = leave_reason("rtcp = false\n");
    std::fs::remove_file(&cap).ok();
    std::fs::remove_file(&cfg).ok();
    assert_eq!(with_rtcp.as_deref(), Some("rtcp bye"));
    assert_ne!(
        without.as_deref(),
        Some("rtcp bye"),
        "the live gateway never read the BYE on the RTCP port"
    );
}

/// README, "Configuration file": "an error names the file, line and field". The file's
/// `spool` and `ca_file` were checked only when used, and their errors spoke of flags the user
/// never typed (`--spool needs --server`, `--ca-file ca.pem: I/O error: No such file or
/// directory`), naming neither the file nor the line: with a relative `ca_file`, read from the
/// working directory (`/` under systemd), nothing said where the name came from.
#[test]
fn errors_of_the_files_spool_and_ca_file_name_the_file_line_and_key() {
    let pid = std::process::id();
    for (name, text, expect) in [
        (
            "spool",
            "session = \"s\"\nspool = \"/tmp/pvp-t140-rvc-spool\"\n",
            ":2: spool needs --server",
        ),
        (
            "gate",
            "gate_transcripts = true\n",
            ":1: gate_transcripts needs --server",
        ),
        (
            "ca",
            "server = \"wss://127.0.0.1:9\"\nca_file = \"pvp-t140-rvc-no-such-ca.pem\"\n",
            ":2: ca_file pvp-t140-rvc-no-such-ca.pem: ",
        ),
        (
            "spooldir",
            "server = \"ws://127.0.0.1:9\"\n\nspool = \"/proc/pvp-t140-rvc/x\"\n",
            ":3: spool /proc/pvp-t140-rvc/x: ",
        ),
    ] {
        let cfg = std::env::temp_dir().join(format!("pvp-t140-rvc-{pid}-{name}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        std::fs::remove_file(&cfg).ok();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with(&format!("pvp-t140: {}{expect}", cfg.display())),
            "{name}: {last}"
        );
    }
    // On the command line, the flags are named as before.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--spool", "/tmp/x"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pvp-t140: --spool needs --server"), "{err}");
}

/// A `[[stream]]` rule's `rtcp_name` is "RTCP SDES NAME (or CNAME) to match"
/// (src/config_file.rs). The CNAME is the item every RTCP sender sends, and the one that
/// stays the same (RFC 3550 6.5.1), so it is what a rule would name; but the rule is matched
/// against the best item the speaker has (its NAME once one came), so a sender that sends a
/// NAME beside its CNAME, as SIP endpoints do, is never matched by its CNAME, and with
/// `unmatched = "refuse"` all its text is dropped.
#[test]
#[ignore = "known gap: a speaker keeps only its best SDES item (NAME over CNAME), so an rtcp_name rule naming the CNAME misses a sender that also sent a NAME; keeping both costs every speaker a second name (README says which item is compared)"]
fn a_rule_naming_the_cname_matches_a_sender_that_also_sends_a_name() {
    use core_helpers::{addr, at, drain, t140};
    use pvp_t140::mapping::{Mapping, Rule, Unmatched};
    let mut gw = pvp_t140::Gateway::new(pvp_t140::Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_rtcp_name: Some("alice@192.0.2.7".into()),
                participant: Some("alice".into()),
                ..Rule::default()
            }],
            unmatched: Unmatched::Refuse,
        },
        ..pvp_t140::Config::default()
    });
    let mut rtcp = Vec::new();
    pvp_t140::rtcp::write_rr(&mut rtcp, 7);
    pvp_t140::rtcp::write_sdes(&mut rtcp, 7, "alice@192.0.2.7", Some("Alice"));
    gw.handle_datagram(at(0), addr(5000), &rtcp);
    gw.handle_datagram(at(10), addr(5000), &t140(1, 7, "Hello there. "));
    while let Some(t) = gw.poll_timeout().filter(|&t| t <= at(5000)) {
        gw.handle_timeout(t);
    }
    let out = drain(&mut gw);
    let said: Vec<_> = out
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .filter(|e| e["type"] == "context.add")
        .map(|e| (e["sender"].clone(), e["payload"]["content"].clone()))
        .collect();
    assert_eq!(
        said,
        [(
            serde_json::json!("alice"),
            serde_json::json!("Hello there.")
        )]
    );
}

/// `--config` read from a pipe (a named FIFO a secrets tool or a template writes,
/// `--config <(envsubst < gw.toml)`) is read once. A file refused for a value was opened a
/// second time to find the `log_format` its error should be written in: a FIFO's second open
/// waits for a writer that never comes, and the gateway hung without a word instead of
/// exiting with the error (a process substitution's pipe, read again, is empty: the error
/// came in text, not in the JSON the file asked for).
#[test]
fn a_config_file_from_a_fifo_that_is_refused_says_why_and_exits() {
    let fifo = std::env::temp_dir().join(format!("pvp-t140-rvc-{}.fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let path = fifo.clone();
    let writer = std::thread::spawn(move || {
        // Opening for writing waits for the gateway to open it for reading.
        std::fs::write(&path, "log_format = \"json\"\nidle_flush_ms = 0\n").unwrap();
    });
    let run = common::gateway_proc::run_briefly(
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            fifo.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    );
    writer.join().unwrap();
    std::fs::remove_file(&fifo).ok();
    let (ok, err) = run.expect("the gateway hung on a refused config file from a FIFO");
    assert!(!ok, "{err}");
    let line: serde_json::Value = serde_json::from_str(err.trim()).expect("one JSON line");
    assert!(
        line["fields"]["message"]
            .as_str()
            .unwrap()
            .contains(":2: idle_flush_ms: must be at least 1"),
        "{line}"
    );
}

/// `--config /dev/zero` (or a pipe that never ends) is refused once past 1 MiB, naming the
/// file: it was read without bound, the gateway's memory growing until the kernel killed it.
#[test]
fn an_endless_config_file_is_refused_past_a_bound() {
    let run = common::gateway_proc::run_briefly(
        &["--listen", "127.0.0.1:0", "--config", "/dev/zero"],
        Duration::from_secs(20),
    );
    let (ok, err) = run.expect("the gateway read /dev/zero without end");
    assert!(!ok, "{err}");
    assert!(err.contains("/dev/zero: larger than 1024 KiB"), "{err}");
}
