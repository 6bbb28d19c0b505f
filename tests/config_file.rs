//! `--config FILE`: settings and `[[stream]]` mapping from TOML, flags overriding the file, and
//! errors that name the line and the field.

mod common;

use std::process::Command;
use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("pvp-t140-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn mapping_rules_name_participants_route_sessions_and_refuse_the_rest() {
    let cfg = write(
        "map",
        r#"
# An address no machine here has: the command line's --listen must win over it.
listen = "192.0.2.1:5004"
session = "from-file"
roles = ["observer"]
unmatched = "refuse"

[[stream]]
ssrc = "0x000a11ce"
participant = "alice"
name = "Alice"
roles = ["driver"]
session = "captions"

[[stream]]
rtcp_name = "Bob"
participant = "bob"
"#,
    );
    let mut gw = Gateway::start(&["--config", cfg.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    let mut alice = Sender::new(gw.listen, 0xa11ce);
    let mut stranger = Sender::new(gw.listen, 0x5);
    alice.send("Alice speaks. ");
    stranger.send("Nobody maps me. ");
    gw.wait_stdout(WAIT, "Alice speaks.");
    assert!(gw.terminate(WAIT).success());
    std::fs::remove_file(&cfg).ok();
    let out: Vec<Value> = gw
        .stdout_lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        out.iter().all(|e| e["sender"] == "alice"),
        "only the mapped speaker: {out:?}"
    );
    let join = &out[0];
    assert_eq!(join["type"], "session.join");
    assert_eq!(join["session"], "captions");
    assert_eq!(join["payload"]["participant"]["name"], "Alice");
    assert_eq!(join["payload"]["participant"]["roles"], json!(["driver"]));
    assert!(out.iter().all(|e| e["session"] == "captions"));
    assert_eq!(out.last().unwrap()["type"], "session.leave");
}

#[test]
fn settings_come_from_the_file_unless_a_flag_says_otherwise() {
    let cfg = write(
        "settings",
        "session = \"from-file\"\nroles = [\"approver\"]\n",
    );
    let mut gw = Gateway::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--role",
        "admin",
    ]);
    Sender::new(gw.listen, 9).send("Hi. ");
    let line = gw.wait_stdout(WAIT, "session.join");
    assert!(gw.terminate(WAIT).success());
    std::fs::remove_file(&cfg).ok();
    let join: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(join["session"], "from-file");
    assert_eq!(join["payload"]["participant"]["roles"], json!(["admin"]));
}

#[test]
fn a_bad_file_is_refused_with_its_line_and_field() {
    let cfg = write("bad", "session = \"x\"\n\n[[stream]]\nssrc = \"not hex\"\n");
    let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    std::fs::remove_file(&cfg).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":4: stream[0].ssrc:"), "{err}");
}

#[test]
fn a_receive_buffer_out_of_range_is_refused() {
    for (name, value, expect) in [
        ("rcvbuf0", "0", "recv_buffer must be at least 1"),
        (
            "rcvbufbig",
            "3000000000",
            "recv_buffer must be at most 2147483647 bytes",
        ),
    ] {
        let cfg = write(name, &format!("recv_buffer = {value}\n"));
        let out = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        std::fs::remove_file(&cfg).ok();
        assert!(!out.status.success(), "{value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{value}: {err}");
    }
}
