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
