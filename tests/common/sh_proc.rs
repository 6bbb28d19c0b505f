//! The gateway run under `sh -c "PRELUDE && exec BIN ARGS"` (a `ulimit` before it), its
//! stdout where a test puts it and its JSON logs read here: for the stdout sink's failures.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// A fresh scratch directory, `tag` naming the test file.
pub fn scratch(tag: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pvp-t140-{tag}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The gateway started by `sh -c "PRELUDE && exec BIN ARGS"` with stdout to `out`, JSON logs
/// on a stderr read here.
pub struct Proc {
    pub child: Child,
    pub listen: std::net::SocketAddr,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn start(prelude: &str, out: Stdio, args: &[&str]) -> Proc {
        let mut child = Command::new("sh")
            .args(["-c", &format!("{prelude} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(args)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
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

    pub fn to_file(prelude: &str, out: &Path, args: &[&str]) -> Proc {
        Self::start(prelude, std::fs::File::create(out).unwrap().into(), args)
    }

    pub fn has(&self, needle: &str) -> bool {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    pub fn wait_stderr(&mut self, needle: &str) -> String {
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

    pub fn terminate(&mut self) -> ExitStatus {
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

    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    pub fn stopped(&self) -> String {
        let lines = self.stderr();
        lines
            .iter()
            .find(|l| l.contains("\"message\":\"stopped\""))
            .unwrap_or_else(|| panic!("no stopped line:\n{}", lines.join("\n")))
            .clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
