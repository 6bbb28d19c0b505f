//! The README's first screen, followed as written: its run command starts the gateway on the
//! stdout default, the README's sender lines send text, and `context.add` lines appear.

mod common;

use std::process::Command;
use std::time::Duration;

use common::gateway_proc::Gateway;

const WAIT: Duration = Duration::from_secs(20);

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// The arguments of the README's `cargo run --release -- ...` line (its first code block).
fn run_args() -> Vec<String> {
    let readme = readme();
    let first_block = readme.split("```").nth(1).expect("a code block");
    let line = first_block
        .lines()
        .find(|l| l.trim_start().starts_with("cargo run"))
        .expect("a cargo run line in the README's first code block");
    let args = line.split_once(" -- ").expect("cargo run ... -- ARGS").1;
    args.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn the_readme_run_command_prints_a_context_add_on_stdout() {
    let args = run_args();
    assert!(
        args.windows(2).any(|w| w[0] == "--listen"),
        "README names the listen address"
    );
    assert!(
        !args.iter().any(|a| a == "--server"),
        "the first command runs on stdout"
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut gw = Gateway::start(&argv);

    // The README's own sender line: `echo "TEXT" | cargo run --release -- send ARGS`.
    let readme = readme();
    let send = readme
        .lines()
        .find(|l| l.contains("-- send"))
        .expect("a send line in the README");
    let text = send.split('"').nth(1).expect("echo \"TEXT\"");
    let send_args: Vec<&str> = send
        .split_once("-- send")
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("send")
        .args(&send_args)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        format!("{text}\n").as_bytes(),
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    let line = gw.wait_stdout(WAIT, "\"context.add\"");
    let env: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(env["payload"]["content"], "Hello from T.140.");
    assert_eq!(env["payload"]["content_type"], "audio_transcript");
    gw.wait_stdout(WAIT, "\"session.leave\"");
    // The Python one-liner, when python3 is there, is a second participant.
    if let (Some(cmd), Ok(o)) = (
        readme.lines().find(|l| l.starts_with("python3 -c")),
        Command::new("python3").arg("--version").output(),
    ) && o.status.success()
    {
        assert!(
            Command::new("sh")
                .args(["-c", cmd])
                .status()
                .unwrap()
                .success()
        );
        gw.wait_stdout(WAIT, "t140:00001234@127.0.0.1:");
    }
    let status = gw.terminate(WAIT);
    assert!(status.success());
    let out = gw.stdout_lines();
    let types: Vec<String> = out
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    // The sender names itself by its SDES CNAME (RFC 3550 6.1): in its first report, about
    // 1-3 s in (RFC 3550 6.2, randomized), or else in the compound with its BYE. Either way
    // one `participant.announce` renames the participant before it leaves; where it falls
    // among the text depends on that random time.
    let first: Vec<&str> = types[..5].iter().map(String::as_str).collect();
    let mut text_and_leave = first.clone();
    text_and_leave.retain(|t| *t != "participant.announce");
    assert_eq!(
        text_and_leave,
        [
            "session.join",
            "context.add",
            "context.add",
            "session.leave"
        ],
        "{first:?}"
    );
    let at = first
        .iter()
        .position(|t| *t == "participant.announce")
        .expect("one announce among the first five");
    assert!(0 < at && at < 4, "{first:?}");
    let announce: serde_json::Value = serde_json::from_str(&out[at]).unwrap();
    // Named `pvp-t140-<ssrc>@<host>`, the SSRC the join named it by: unique in the session
    // (RFC 3550 6.5.1), so two senders on one host are two names.
    let joined = out[0].split("t140:").nth(1).expect("joined as t140:<ssrc>");
    assert_eq!(
        announce["payload"]["name"],
        format!("pvp-t140-{}@127.0.0.1", &joined[..8])
    );
    assert_eq!(types.last().map(String::as_str), Some("session.leave"));
    // Logs never mix into the NDJSON on stdout.
    assert!(
        gw.stderr_lines()
            .iter()
            .any(|l| l.contains("pvp-t140 listening"))
    );
}
