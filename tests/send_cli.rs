//! `pvp-t140 send` → the gateway, both real processes over loopback UDP: what is typed on the
//! sender's stdin arrives as context.add, and its RTCP BYE ends the stream at once.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::gateway_proc::Gateway;
use serde_json::Value;

fn send(to: &str, input: &str, args: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["send", "--to", to])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn typed_text_arrives_and_bye_ends_the_stream() {
    for args in [&["--red", "2"][..], &["--red", "0", "--cps", "200"][..]] {
        let mut gw = Gateway::start(&["--listen", "127.0.0.1:0"]);
        let to = gw.listen.to_string();
        send(&to, "Hello from send. Café, 日本語 😀!\nLast line", args);
        // The BYE, not a timeout, ends it: the leave arrives while the gateway runs.
        let leave = gw.wait_stdout(Duration::from_secs(20), "\"session.leave\"");
        assert!(leave.contains("rtcp bye"), "{leave}");
        assert!(gw.terminate(Duration::from_secs(20)).success());
        let adds: Vec<String> = gw
            .stdout_lines()
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["type"] == "context.add")
            .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            adds,
            ["Hello from send.", "Café, 日本語 😀!", "Last line"],
            "{args:?}"
        );
    }
}

#[test]
fn bad_flags_are_clear_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["send", "--t140-pt", "100", "--red-pt", "100"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("both 100"));
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["send", "--red", "99"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Port 0 was taken: the first sends failed with EINVAL (review au, session 46).
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["send", "--to", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--to") && err.contains("port 0"), "{err}");
}

/// RFC 3550 6.3.7: "In either case, a participant which never sent an RTP or RTCP packet MUST
/// NOT send a BYE packet when they leave the group." With nothing on stdin (`< /dev/null`, an
/// STT pipeline that recognised nothing) the sender ends before its first RTCP report is due
/// (1-3 s in) and before any RTP, yet it still sends a compound with a BYE: it must send
/// nothing at all.
#[test]
fn empty_input_sends_no_bye() {
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = rx.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["send", "--to", &to])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The sender has exited: whatever it sent over loopback is already queued here. The
    // deadline only bounds the wait for a datagram that should not exist.
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 2048];
    if let Ok(n) = rx.recv(&mut buf) {
        let types: Vec<u8> = {
            let mut v = Vec::new();
            let mut rest = &buf[..n];
            while rest.len() >= 4 {
                v.push(rest[1]);
                let len = (usize::from(u16::from_be_bytes([rest[2], rest[3]])) + 1) * 4;
                rest = &rest[len.min(rest.len())..];
            }
            v
        };
        panic!("a sender that never sent RTP or RTCP sent {n} bytes, RTCP types {types:?}");
    }
}

/// The gateway writes SSRCs in hex (participant ids, logs, `ssrc = "0x1a2b3c4d"` in its
/// config file): `send --ssrc` takes the same spelling, and decimal as before. It refused
/// `0x1234` as an invalid digit.
#[test]
fn send_takes_an_ssrc_in_hex_or_decimal() {
    for ssrc in ["0x1234", "4660"] {
        let mut gw = Gateway::start(&["--listen", "127.0.0.1:0"]);
        let to = gw.listen.to_string();
        send(&to, "Hi. ", &["--ssrc", ssrc]);
        let join = gw.wait_stdout(Duration::from_secs(20), "\"session.join\"");
        assert!(join.contains("t140:00001234@"), "{ssrc}: {join}");
        assert!(gw.terminate(Duration::from_secs(20)).success());
    }
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["send", "--ssrc", "0xnope"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("decimal or hex"), "{err}");
}
