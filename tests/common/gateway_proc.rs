//! Runs the real `pvp-t140` binary for end-to-end tests: finds its bound address from its JSON
//! log, collects stdout and stderr lines, sends real UDP datagrams, stops it with SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Gateway {
    child: Child,
    pub listen: SocketAddr,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// [`Gateway::start_unread`]: the pipe, held open and never read.
    _unread: Option<std::process::ChildStdout>,
}

fn collect(r: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            match line {
                Ok(l) => sink.lock().unwrap().push(l),
                Err(_) => break,
            }
        }
    });
    lines
}

impl Gateway {
    /// Starts the binary with `args` plus `--log-format json`, and waits for it to listen.
    pub fn start(args: &[&str]) -> Gateway {
        Self::start_logging(args, "debug,tungstenite=info,tokio_tungstenite=info")
    }

    /// [`Gateway::start`] on an ephemeral local port, sending to the PVP server at `url`.
    pub fn start_for_server(url: &str, args: &[&str]) -> Gateway {
        let mut all = vec!["--listen", "127.0.0.1:0", "--server", url];
        all.extend_from_slice(args);
        Self::start(&all)
    }

    /// As [`Gateway::start`], with this `RUST_LOG`.
    pub fn start_logging(args: &[&str], rust_log: &str) -> Gateway {
        Self::spawn(args, rust_log, true)
    }

    /// As [`Gateway::start`], with a stdout nobody reads: once the pipe is full, the
    /// gateway's writes to it block.
    #[allow(dead_code)]
    pub fn start_unread(args: &[&str]) -> Gateway {
        Self::spawn(args, "info", false)
    }

    /// As [`Gateway::start`], started with a soft open-file limit of `soft` (the shell's
    /// `ulimit -Sn`, then `exec`, so the process is the gateway itself).
    #[allow(dead_code)]
    pub fn start_with_fd_limit(soft: u64, args: &[&str]) -> Gateway {
        Self::start_after(&format!("ulimit -Sn {soft}"), args)
    }

    /// As [`Gateway::start`], with SIGHUP's default action whatever this process inherited
    /// (`env --default-signal=HUP`, GNU coreutils): a test run under `nohup` would otherwise
    /// start the gateway with SIGHUP ignored, which it keeps ignored.
    #[allow(dead_code)]
    pub fn start_with_hangup(args: &[&str]) -> Gateway {
        let mut cmd = Command::new("env");
        cmd.args(["--default-signal=HUP", env!("CARGO_BIN_EXE_pvp-t140")]);
        Self::spawn_command(
            cmd,
            args,
            "debug,tungstenite=info,tokio_tungstenite=info",
            true,
        )
    }

    /// As [`Gateway::start`], through `sh -c "PRELUDE && exec BIN ARGS"`: the process is the
    /// gateway itself, started with what `prelude` set (a limit, a signal ignored).
    #[allow(dead_code)]
    pub fn start_after(prelude: &str, args: &[&str]) -> Gateway {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("{prelude} && exec \"$0\" \"$@\"")])
            .arg(env!("CARGO_BIN_EXE_pvp-t140"));
        Self::spawn_command(cmd, args, "info", true)
    }

    fn spawn(args: &[&str], rust_log: &str, read_stdout: bool) -> Gateway {
        let cmd = Command::new(env!("CARGO_BIN_EXE_pvp-t140"));
        Self::spawn_command(cmd, args, rust_log, read_stdout)
    }

    fn spawn_command(
        mut cmd: Command,
        args: &[&str],
        rust_log: &str,
        read_stdout: bool,
    ) -> Gateway {
        let mut child = cmd
            .args(args)
            .args(["--log-format", "json"])
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pvp-t140");
        let out = child.stdout.take().unwrap();
        let (stdout, unread) = if read_stdout {
            (collect(out), None)
        } else {
            (Arc::default(), Some(out))
        };
        let stderr = collect(child.stderr.take().unwrap());
        let mut gw = Gateway {
            child,
            listen: "0.0.0.0:0".parse().unwrap(),
            stdout,
            stderr,
            _unread: unread,
        };
        let line = gw.wait_stderr(Duration::from_secs(20), "pvp-t140 listening");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON log line");
        gw.listen = v["fields"]["listen"].as_str().unwrap().parse().unwrap();
        gw
    }

    /// The process's peak resident memory (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Descriptors the process holds open (`/proc/PID/fd`).
    #[allow(dead_code)]
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The process's soft open-file limit (`/proc/PID/limits`).
    #[allow(dead_code)]
    pub fn soft_nofile(&self) -> u64 {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .to_owned();
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    }

    /// The names of the process's threads (`/proc/PID/task/*/comm`), sorted.
    pub fn thread_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", self.child.id()))
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .map(|n| n.trim().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The process id (a signal's target).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Fails, showing stderr, if a stderr line so far contains `needle`.
    #[allow(dead_code)]
    pub fn assert_stderr_lacks(&self, needle: &str) {
        let lines = self.stderr_lines();
        assert!(
            !lines.iter().any(|l| l.contains(needle)),
            "a stderr line contains {needle:?}: {lines:?}"
        );
    }

    fn wait_lines(
        &mut self,
        which: &Arc<Mutex<Vec<String>>>,
        timeout: Duration,
        needle: &str,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = which.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "no line containing {needle:?} within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout_lines().join("\n"),
                    self.stderr_lines().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (polling, with a deadline) for a stderr line containing `needle`.
    pub fn wait_stderr(&mut self, timeout: Duration, needle: &str) -> String {
        let lines = self.stderr.clone();
        self.wait_lines(&lines, timeout, needle)
    }

    /// Waits for a stdout line containing `needle`.
    pub fn wait_stdout(&mut self, timeout: Duration, needle: &str) -> String {
        let lines = self.stdout.clone();
        self.wait_lines(&lines, timeout, needle)
    }

    /// SIGKILL: no flush, no leave, nothing the process could still do.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit status (killing it after `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.stop_with("TERM", timeout)
    }

    /// The signal `name` (`kill -NAME`), then waits for the exit status (killing it after
    /// `timeout`).
    pub fn stop_with(&mut self, name: &str, timeout: Duration) -> ExitStatus {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Let the reader threads collect the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "pvp-t140 did not exit within {timeout:?} of SIG{name}\nstderr:\n{}",
                    self.stderr_lines().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A T.140 sender on a UDP socket: RTP version 2, PT 98, BOM first, marker on the first packet.
pub struct Sender {
    socket: UdpSocket,
    to: SocketAddr,
    seq: u16,
    ssrc: u32,
}

impl Sender {
    pub fn new(to: SocketAddr, ssrc: u32) -> Sender {
        let bind: SocketAddr = if to.is_ipv6() {
            "[::1]:0"
        } else {
            "127.0.0.1:0"
        }
        .parse()
        .unwrap();
        Sender {
            socket: UdpSocket::bind(bind).unwrap(),
            to,
            seq: 1000,
            ssrc,
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr().unwrap()
    }

    pub fn participant(&self) -> String {
        format!("t140:{:08x}@{}", self.ssrc, self.local_addr())
    }

    pub fn send(&mut self, text: &str) {
        let mut payload = Vec::new();
        if self.seq == 1000 {
            payload.extend_from_slice("\u{feff}".as_bytes());
        }
        payload.extend_from_slice(text.as_bytes());
        let mut d = Vec::new();
        pvp_t140::rtp::write_packet(
            &mut d,
            self.seq == 1000,
            98,
            self.seq,
            u32::from(self.seq) * 300,
            self.ssrc,
            &payload,
        );
        self.seq = self.seq.wrapping_add(1);
        self.socket.send_to(&d, self.to).unwrap();
    }
}

/// `GET path` over a fresh connection to the gateway's metrics endpoint: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// A field of a JSON log line (`--log-format json`).
pub fn log_field(line: &str, name: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    v["fields"][name].as_str().unwrap().to_owned()
}

/// The value of the first Prometheus sample line starting with `prefix`.
pub fn sample(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

impl Gateway {
    /// Where it serves /metrics, from its log line (started with `--metrics 127.0.0.1:0`).
    pub fn metrics_addr(&mut self) -> SocketAddr {
        log_field(
            &self.wait_stderr(Duration::from_secs(20), "serving /metrics"),
            "metrics",
        )
        .parse()
        .unwrap()
    }
}

/// Runs the binary with `args` and waits at most `timeout` for it to exit; `None` (and the
/// process killed) if it was still running, else its exit success and stderr.
pub fn run_briefly(args: &[&str], timeout: Duration) -> Option<(bool, String)> {
    run_briefly_with(args, &[], timeout)
}

/// [`run_briefly`] with environment variables set.
pub fn run_briefly_with(
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Option<(bool, String)> {
    run_briefly_status(args, env, timeout).map(|(st, err)| (st.success(), err))
}

/// [`run_briefly_with`], giving the exit status itself.
pub fn run_briefly_status(
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Option<(ExitStatus, String)> {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return Some((st, err));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A number field of a JSON log line.
pub fn log_number(line: &str, name: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    v["fields"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {name} in {line}"))
}
