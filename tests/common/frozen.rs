//! The real binary under signals: started, frozen (SIGSTOP) while datagrams queue in its
//! sockets, stopped with SIGTERM; its stdout envelopes and stderr log read back. Linux only
//! (`/proc`, `kill`): for stop_drain.rs and receive_shell.rs.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Gw(
    Child,
    BufReader<ChildStderr>,
    Option<std::thread::JoinHandle<String>>,
);

pub fn addr(v: &Value, field: &str) -> Option<SocketAddr> {
    v["fields"][field].as_str()?.parse().ok()
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Gw {
    /// Starts the binary; returns it and its "pvp-t140 listening" log line.
    pub fn start(args: &[&str]) -> (Gw, Value) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(args)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        // Read as it comes: a full pipe would hold the gateway's writer.
        let mut stdout = child.stdout.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            stdout.read_to_string(&mut s).unwrap();
            s
        });
        let mut line = String::new();
        while !line.contains("pvp-t140 listening") {
            line.clear();
            assert!(err.read_line(&mut line).unwrap() > 0, "exited at start");
        }
        (
            Gw(child, err, Some(out)),
            serde_json::from_str(&line).unwrap(),
        )
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.0.id().to_string();
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success());
    }

    /// SIGSTOP, then waits until every thread of the process is stopped.
    pub fn freeze(&self) {
        self.signal("-STOP");
        let stopped = |t: std::fs::DirEntry| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim().chars().next());
            matches!(state, Some('T' | 't'))
        };
        let tasks = format!("/proc/{}/task", self.0.id());
        wait_until("never stopped", || {
            std::fs::read_dir(&tasks).unwrap().flatten().all(stopped)
        });
    }

    /// SIGTERM (while frozen, then SIGCONT); after a clean exit, the envelopes on stdout and
    /// the rest of stderr.
    pub fn stop(mut self, frozen: bool) -> (Vec<Value>, String) {
        self.signal("-TERM");
        if frozen {
            self.signal("-CONT");
        }
        let mut status = None;
        wait_until("no exit after SIGTERM", || {
            status = self.0.try_wait().unwrap();
            status.is_some()
        });
        let out = self.2.take().unwrap().join().unwrap();
        let mut err = String::new();
        self.1.read_to_string(&mut err).unwrap();
        assert!(status.unwrap().success(), "{status:?}\n{err}");
        let envelopes = out.lines().map(|l| serde_json::from_str(l).unwrap());
        (envelopes.collect(), err)
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary with `args` until it also reads its RTCP port (port + 1 may be taken: it
/// then reads rtcp-mux only, and another is started); it, its RTP and its RTCP address.
pub fn start_with_rtcp_port(args: &[&str]) -> (Gw, SocketAddr, SocketAddr) {
    loop {
        let (gw, l) = Gw::start(args);
        if let (Some(to), Some(rtcp)) = (addr(&l, "listen"), addr(&l, "rtcp")) {
            return (gw, to, rtcp);
        }
    }
}

/// A sender's RTP socket on 127.0.0.1 and its RTCP socket on the port after it (RFC 3550 11).
pub fn rtp_and_rtcp_sockets() -> (UdpSocket, UdpSocket) {
    loop {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let next = a.local_addr().unwrap().port().wrapping_add(1);
        if let Ok(b) = UdpSocket::bind(("127.0.0.1", next)) {
            return (a, b);
        }
    }
}

/// A T.140 packet of sequence number `seq` (the first, 1000, marked and with the BOM).
pub fn rtp(seq: u16, ssrc: u32, text: &str) -> Vec<u8> {
    let (mut d, bom) = (Vec::new(), if seq == 1000 { "\u{feff}" } else { "" });
    let payload = format!("{bom}{text}");
    let ts = u32::from(seq) * 300;
    pvp_t140::rtp::write_packet(&mut d, seq == 1000, 98, seq, ts, ssrc, payload.as_bytes());
    d
}
