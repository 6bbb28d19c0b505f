//! The stdout sink and PVP's stdio binding (pvp-spec 19.4: newline-delimited JSON, one envelope
//! a line), against the real binary: a pipe its reader stopped reading, `replay` to a full
//! non-blocking stdout or a file at its size limit, hostile text.
//!
//! Found by review ak (session 44).

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
#[path = "common/frames.rs"]
mod frames;

/// One RTP packet (PT 98, text/t140).
fn rtp(marker: bool, seq: u16, ssrc: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, (u8::from(marker) << 7) | 98];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&(u32::from(seq) * 300).to_be_bytes());
    p.extend_from_slice(&ssrc.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pvp-t140-review-ak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// README ("Replaying captures"): `replay` "prints the envelopes as NDJSON", the stdio binding
/// the live gateway's stdout writes too. The live writer waits out a stdout whose open file
/// description is non-blocking (a parent such as node.js that set O_NONBLOCK on the pipe or
/// terminal it hands down: the flag belongs to the description, shared by every process that
/// holds it) when it is full for a moment: EAGAIN is a slow reader, not a gone one
/// (`stdout_blocked.rs`). The replay took the first EAGAIN for a failed stdout: it stopped
/// with `writing envelopes to stdout: Resource temporarily unavailable` and exit status 1, and
/// the envelopes after the pipe's buffer were lost, though the reader was there and read all.
#[test]
fn replay_waits_out_a_non_blocking_stdout_that_is_full_for_a_moment() {
    // 2,000 sentences of about 70 characters: some 600 KB of NDJSON, more than a socket's
    // buffer holds unread.
    let mut packets = Vec::new();
    for i in 0..2000u16 {
        let mut text = String::new();
        if i == 0 {
            text.push('\u{feff}');
        }
        text.push_str(&format!(
            "Sentence number {i} is here, and it is long enough to fill the pipe. "
        ));
        packets.push((
            1_000_000 + u64::from(i) * 20_000,
            5004,
            rtp(i == 0, 1000 + i, 0x5eed_0a4b, text.as_bytes()),
        ));
    }
    let capture = scratch("nonblocking.pcap");
    std::fs::write(&capture, frames::pcap_to(&packets)).unwrap();
    let (mut reader, child_end) = UnixStream::pair().unwrap();
    child_end.set_nonblocking(true).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("replay")
        .arg(&capture)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is away for a moment, then reads everything.
    std::thread::sleep(Duration::from_millis(500));
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let adds = text
        .lines()
        .filter(|l| l.contains("\"context.add\""))
        .count();
    assert!(
        status.success() && adds == 2000,
        "{status:?}, {adds} of 2000 context.add lines; stderr: {stderr}"
    );
}

/// README ("Replaying captures", as the live gateway's "Metrics and health"): a write error of
/// the replay's stdout ends it with its error and exit status 1. stdout redirected to a file
/// that may not grow past a limit (`ulimit -f`, systemd `LimitFSIZE=`): the live gateway
/// catches SIGXFSZ, so the write fails with EFBIG; the replay did not, and the signal's default
/// action killed it at the limit (a core dump, status 128 + 25, and no word of why).
#[test]
fn replay_to_a_file_at_its_size_limit_ends_with_an_error_not_a_signal() {
    let out = scratch("fsize.ndjson");
    let capture = concat!(env!("CARGO_MANIFEST_DIR"), "/pcaps/loss_red.pcap");
    // 512 bytes (dash's `ulimit -f` counts 512-byte blocks): less than the replay prints.
    let done = Command::new("sh")
        .args(["-c", "ulimit -f 1 && exec \"$0\" replay \"$1\" > \"$2\""])
        .arg(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg(capture)
        .arg(&out)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(
        done.status.code(),
        Some(1),
        "{:?}; stderr: {stderr}",
        done.status
    );
    assert!(
        stderr.contains("writing envelopes to stdout"),
        "stderr: {stderr}"
    );
}

/// pvp-spec 19.4 (one `MessageEnvelope` a line of newline-delimited JSON) and 4.1 (its required
/// fields), README ("`sent` counts envelopes written"): text with every C0 control, DEL, NEL,
/// U+2028 and U+2029, invalid UTF-8 (a CESU-8 surrogate pair), quotes and backslashes gives
/// one parsable envelope a line, the join first and the leave last, and the `stopped` line's
/// `sent` is the number of lines. (Checked, found right.)
#[test]
fn hostile_text_gives_one_valid_envelope_a_line_counted_as_sent() {
    use common::gateway_proc::{Gateway, log_number};
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--rtcp", "false"]);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let controls: Vec<u8> = (0u8..0x20).filter(|&b| b != 0x08).chain([0x7f]).collect();
    let payloads: Vec<Vec<u8>> = vec![
        [&b"\xef\xbb\xbfA"[..], &controls, b"B. "].concat(),
        "line\u{2028}sep\u{2029}para\u{85}nel. ".as_bytes().to_vec(),
        b"surrogates \xed\xa0\x80\xed\xb0\x80 end. ".to_vec(),
        b"quote \" back \\ slash. ".to_vec(),
    ];
    for (i, p) in payloads.iter().enumerate() {
        let mut d = Vec::new();
        pvp_t140::rtp::write_packet(
            &mut d,
            i == 0,
            98,
            7 + i as u16,
            300 * i as u32,
            0x5eed_0a4c,
            p,
        );
        sock.send_to(&d, gw.listen).unwrap();
    }
    gw.wait_stdout(Duration::from_secs(30), "quote");
    assert!(gw.terminate(Duration::from_secs(30)).success());
    let lines = gw.stdout_lines();
    let stopped = gw.wait_stderr(Duration::from_secs(5), "\"message\":\"stopped\"");
    assert_eq!(
        log_number(&stopped, "sent"),
        lines.len() as u64,
        "{lines:#?}"
    );
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
            for field in ["id", "ts", "session", "sender", "type"] {
                assert!(v[field].is_string(), "{field} in {l}");
            }
            assert!(v["v"] == 1 && v["payload"].is_object(), "{l}");
            if let Some(c) = v["payload"]["content"].as_str() {
                assert!(
                    !c.chars().any(|c| c.is_control() && c != '\n'),
                    "a control in {c:?}"
                );
            }
            v["type"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("session.join"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("session.leave"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "context.add").count(),
        4,
        "{kinds:?}"
    );
}

/// README ("Delivery to a PVP server": `sent` "counts envelopes written"; at the stop "what was
/// not written is logged and counted as dropped") and `stdout_counts.rs`: a stdout pipe nobody
/// reads until the gateway has exited holds as many whole lines as the `stopped` line counts
/// sent. Under load the writer writes its 64 KiB buffer at once; such a write to a pipe (more
/// than PIPE_BUF bytes, so not atomic) that finds the pipe part full is taken in part by the
/// kernel and blocks for the rest. The lines it put in the pipe are there for the reader, but
/// the write never returned, so they were counted as dropped: `sent` said 2 with a hundred
/// lines in the pipe.
#[test]
fn lines_a_blocked_write_put_in_an_unread_pipe_count_as_sent() {
    let (bytes, stopped) = an_unread_pipe_after_a_burst();
    let whole = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    let sent = common::gateway_proc::log_number(&stopped, "sent");
    assert!(
        common::gateway_proc::log_number(&stopped, "dropped") > 0,
        "{stopped}"
    );
    assert_eq!(sent, whole, "{whole} whole lines in the pipe; {stopped}");
}

/// pvp-spec 19.4: one envelope a line. A reader that comes back to an unread pipe after the
/// gateway's exit (the stop's grace ran out) found its last line cut short, a broken envelope:
/// the writes ended wherever the buffer did. Each write to a pipe now ends at a line's end (a
/// line longer than a write aside), so the pipe holds whole lines only.
#[test]
fn an_unread_pipe_read_after_the_exit_ends_with_a_whole_line() {
    let (bytes, stopped) = an_unread_pipe_after_a_burst();
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.ends_with('\n'),
        "{stopped}; the pipe ends in {:?}",
        &text[text.len().saturating_sub(80)..]
    );
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
}

/// A gateway whose stdout pipe is read only after its exit, given a sentence and then a burst
/// of a hundred in one datagram, stopped with SIGTERM: what the pipe held, and the `stopped`
/// line.
fn an_unread_pipe_after_a_burst() -> (Vec<u8>, String) {
    use common::gateway_proc::Sender;
    use common::sh_proc::Proc;
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut gw = Proc::start(
        "true",
        writer.into(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--rtcp",
            "false",
            "--max-pps-per-source",
            "0",
        ],
    );
    // A first sentence, written at once (the join and its add: a small write), then a hundred
    // sentences in one datagram: their envelopes, some 90 KB of JSON, come to the writer at
    // once, and it writes its whole buffer into the pipe that has some 63 KB of room left.
    let mut a = Sender::new(gw.listen, 0x5eed_0a4d);
    a.send("First. ");
    gw.wait_stderr(&a.participant());
    std::thread::sleep(Duration::from_millis(200));
    let pad = "x".repeat(500);
    let burst: String = (0..100).map(|i| format!("Sentence {i} {pad}. ")).collect();
    a.send(&burst);
    let mut b = Sender::new(gw.listen, 0x5eed_0a4e);
    b.send("The last one. ");
    gw.wait_stderr(&b.participant());
    let status = gw.terminate();
    assert!(status.success(), "{status:?}");
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).unwrap();
    (bytes, gw.stopped())
}
