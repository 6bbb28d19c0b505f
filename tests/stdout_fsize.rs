//! The stdout sink under failure (review m): stdout written to a file that cannot grow past
//! a size limit (`ulimit -f`, systemd `LimitFSIZE=`).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::gateway_proc::{Sender, log_number};
use common::sh_proc::Proc;

const WAIT: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    common::sh_proc::scratch("stdout-fsize", name)
}

/// README ("Metrics and health", `_stdout_failed`): once stdout cannot take a line, the lines
/// not known to have reached it and every later one are counted as dropped; a stop counts them
/// (`stopped ... dropped=N`). A stdout redirected to a file that may not grow past a limit
/// (`ulimit -f`, systemd `LimitFSIZE=`) got SIGXFSZ at the write that crossed it, whose default
/// action kills the process: the gateway died with half a line in the file, no `stopped` line
/// and every envelope it held lost, uncounted. It should take the write's EFBIG as a stdout
/// that failed, count, and keep running until it is stopped.
#[test]
fn stdout_to_a_file_at_its_size_limit_is_a_failure_counted_not_a_death() {
    let dir = scratch("fsize");
    let out = dir.join("out.ndjson");
    // 2 KiB (ulimit -f counts 512-byte blocks in dash, 1 KiB blocks in bash).
    let mut gw = Proc::to_file(
        "ulimit -f 4",
        &out,
        &["--listen", "127.0.0.1:0", "--rtcp", "false"],
    );
    let mut a = Sender::new(gw.listen, 0x5eed_00f5);
    let mut i = 0;
    let deadline = Instant::now() + WAIT;
    // Until the file stops growing: the gateway died or says its write failed.
    while gw.child.try_wait().unwrap().is_none()
        && !gw
            .stderr()
            .iter()
            .any(|l| l.contains("writing to stdout failed"))
    {
        assert!(Instant::now() < deadline, "the file never filled");
        a.send(&format!("Sentence {i} fills the file a little more. "));
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past the limit: more text, then a stop.
    for j in 0..5 {
        a.send(&format!("Sentence {j} after the limit. "));
    }
    let mut b = Sender::new(gw.listen, 0x5eed_00f6);
    b.send("Last. ");
    // Datagrams are handled in order: once the later sender joins, the rest was handled.
    gw.wait_stderr(&b.participant());
    let status = gw.terminate();
    let lines = gw.stderr();
    // Stopped, not killed: exit status 1, as a stop after stdout failed ends (review v).
    assert_eq!(
        status.code(),
        Some(1),
        "the gateway died ({status:?}); stderr:\n{}",
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|l| l.contains("writing to stdout failed")),
        "{}",
        lines.join("\n")
    );
    let stopped = lines
        .iter()
        .find(|l| l.contains("\"message\":\"stopped\""))
        .expect("a stopped line");
    assert!(log_number(stopped, "dropped") > 0, "{stopped}");
    let _ = std::fs::remove_dir_all(&dir);
}
