//! Review ak: the stdout sink and PVP's stdio binding (pvp-spec 19.4: newline-delimited JSON,
//! one envelope a line), against the real binary.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

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
