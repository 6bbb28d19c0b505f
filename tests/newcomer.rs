//! The README's first screen, followed as written: its run command starts the gateway on the
//! stdout default, the README's one-line sender sends a datagram, and a `context.add` appears.

mod common;

use std::process::Command;
use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};

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

    // The README's own one-line sender, when python3 is there; the same packet otherwise.
    let readme = readme();
    let py = readme.lines().find(|l| l.starts_with("python3 -c"));
    let sent_by_readme = match (py, Command::new("python3").arg("--version").output()) {
        (Some(cmd), Ok(o)) if o.status.success() => {
            let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
            assert!(st.success(), "README sender failed");
            true
        }
        _ => {
            eprintln!("python3 not found: sending the README's packet from Rust instead");
            Sender::new(gw.listen, 0x1234).send("Hello from T.140. ");
            false
        }
    };
    let line = gw.wait_stdout(WAIT, "\"context.add\"");
    let env: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(env["payload"]["content"], "Hello from T.140.");
    assert_eq!(env["payload"]["content_type"], "audio_transcript");
    if sent_by_readme {
        assert!(
            env["sender"]
                .as_str()
                .unwrap()
                .starts_with("t140:00001234@127.0.0.1:")
        );
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
    assert_eq!(types, ["session.join", "context.add", "session.leave"]);
    // Logs never mix into the NDJSON on stdout.
    assert!(
        gw.stderr_lines()
            .iter()
            .any(|l| l.contains("pvp-t140 listening"))
    );
}
