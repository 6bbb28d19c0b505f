//! Review c: the command line and the configuration file, run as the real binary.

mod common;

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
