//! A stdout nobody reads (a stuck pipeline) must not keep the gateway from stopping: on SIGTERM
//! it waits the grace (5 s) for the writer, then exits and counts what it could not write as
//! dropped. Before, it hung until the reader went away, and counted those envelopes as neither.

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};

const WAIT: Duration = Duration::from_secs(30);

fn field(line: &str, name: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    v["fields"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {line}"))
}

#[test]
fn sigterm_with_an_unread_stdout_exits_after_the_grace_and_counts_the_unwritten() {
    let mut gw = Gateway::start_unread(&["--listen", "127.0.0.1:0", "--rtcp", "false"]);
    let mut a = Sender::new(gw.listen, 0x5eed_0001);
    // 400 chunks of about 500 bytes of JSON each: more than the pipe (64 KiB) and the writer's
    // buffer (64 KiB) hold together. Ten sentences a datagram, so that the burst fits even a
    // default-sized socket buffer (net.core.rmem_max 208 KiB).
    for i in 0..40 {
        let text: String = (0..10)
            .map(|j| {
                format!(
                    "Sentence number {} is here, and it is long enough to fill the pipe. ",
                    i * 10 + j
                )
            })
            .collect();
        a.send(&text);
    }
    // Datagrams are handled in arrival order: once a later sender's chunk makes it join, all
    // 400 chunks have been made.
    let mut b = Sender::new(gw.listen, 0x5eed_0002);
    b.send("The last one. ");
    gw.wait_stderr(WAIT, &b.participant());

    let status = gw.terminate(Duration::from_secs(60));
    assert!(status.success(), "{status:?}");
    let lines = gw.stderr_lines();
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("\"message\":\"{message}\"")))
            .unwrap_or_else(|| panic!("no {message:?} line in\n{}", lines.join("\n")))
            .clone()
    };
    let envelopes = field(&find("counters"), "envelopes");
    let stopped = find("stopped");
    let (sent, dropped) = (field(&stopped, "sent"), field(&stopped, "dropped"));
    assert!(envelopes > 400, "joins, 401 chunks, leaves: {envelopes}");
    assert!(dropped > 0, "the pipe cannot hold them all: {stopped}");
    assert_eq!(
        sent + dropped,
        envelopes,
        "every envelope accounted for: {stopped}"
    );
    assert!(
        lines.iter().any(|l| l.contains("did not finish within")),
        "the grace ran out, and the log says so"
    );
}

/// pvp-spec 19.4 (one envelope a line) and README ("`_stdout_failed` (1 once stdout's reader
/// has gone)"; /healthz is ready while "the sink is stdout that still takes lines"). A stdout
/// whose open file description is non-blocking (O_NONBLOCK set by the parent, or by another
/// process sharing the pipe or terminal; the flag belongs to the description, not the fd)
/// answers a full pipe with EAGAIN instead of blocking. The writer takes `WouldBlock` for a
/// reader that has gone: it stops writing for good ("writing to stdout failed ... envelopes
/// from now on are dropped"), sets `stdout_failed` (so /healthz says 503) and drops every
/// later envelope, though the reader is still there and was only slow for a moment. It should
/// get every envelope, each a whole line (a partial write before the EAGAIN must not leave a
/// line cut either).
#[test]
fn a_non_blocking_stdout_that_fills_up_for_a_moment_is_waited_for_not_given_up() {
    use std::io::{BufRead, BufReader, Read};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};

    let (mut reader, child_end) = UnixStream::pair().unwrap();
    child_end.set_nonblocking(true).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--rtcp", "false"])
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let lines = stderr.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        });
    }
    let wait_stderr = |needle: &str| -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if let Some(l) = stderr.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} on stderr"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let listen: std::net::SocketAddr =
        common::gateway_proc::log_field(&wait_stderr("pvp-t140 listening"), "listen")
            .parse()
            .unwrap();
    // 2,000 chunks of about 500 bytes of JSON: more than the socket buffer holds while unread.
    let mut a = Sender::new(listen, 0x5eed_0001);
    for i in 0..200 {
        let text: String = (0..10)
            .map(|j| {
                format!(
                    "Sentence number {} is here, and it is long enough to fill the pipe. ",
                    i * 10 + j
                )
            })
            .collect();
        a.send(&text);
    }
    let mut b = Sender::new(listen, 0x5eed_0002);
    b.send("The last one. ");
    wait_stderr(&b.participant());
    // The reader was away for a moment; now it reads everything.
    std::thread::sleep(Duration::from_millis(500));
    let all = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).unwrap();
        bytes
    });
    std::thread::sleep(Duration::from_millis(500));
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    assert!(child.wait().unwrap().success());
    let bytes = all.join().unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let failed: Vec<String> = stderr
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("writing to stdout failed"))
        .cloned()
        .collect();
    let cut: Vec<&str> = text
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
        .collect();
    let adds = text
        .lines()
        .filter(|l| l.contains("\"context.add\""))
        .count();
    assert!(
        failed.is_empty() && cut.is_empty() && adds == 2001,
        "{adds} of 2001 context.add lines; lines cut short: {cut:?}; stderr: {failed:?}"
    );
}
