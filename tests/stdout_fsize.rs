//! The stdout sink under failure (review m): stdout written to a file that cannot grow past
//! a size limit (`ulimit -f`, systemd `LimitFSIZE=`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::gateway_proc::{Sender, log_number};

const WAIT: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pvp-t140-review-m-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The gateway started by `sh -c "PRELUDE && exec BIN ARGS"` with stdout to `out` (a file),
/// JSON logs on a stderr read here.
struct Proc {
    child: Child,
    listen: std::net::SocketAddr,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn start(prelude: &str, out: &Path, args: &[&str]) -> Proc {
        let mut child = Command::new("sh")
            .args(["-c", &format!("{prelude} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(args)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        let mut p = Proc {
            child,
            listen: "0.0.0.0:0".parse().unwrap(),
            stderr: lines,
        };
        let line = p.wait_stderr("pvp-t140 listening");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        p.listen = v["fields"]["listen"].as_str().unwrap().parse().unwrap();
        p
    }

    fn wait_stderr(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(l) = self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "exited ({st:?}) before {needle:?}; stderr:\n{}",
                    self.stderr.lock().unwrap().join("\n")
                );
            }
            assert!(Instant::now() < deadline, "no {needle:?} on stderr");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn terminate(&mut self) -> ExitStatus {
        if self.child.try_wait().unwrap().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                return st;
            }
            assert!(Instant::now() < deadline, "did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut gw = Proc::start(
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
