//! Interop with a real sender written by others: the npm package `t140llm` (0.0.19), driven by
//! `interop/t140llm/send.mjs` through its own public API, sends to the real gateway binary over
//! loopback UDP with `--compat t140llm`. The transcript must equal the text sent.
//!
//! These need node and `npm install` in interop/t140llm, so they are `#[ignore]`d in a plain
//! `cargo test`; `.ci/run` installs both and runs them with `--ignored`, where a missing
//! prerequisite fails loudly.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::gateway_proc::Gateway;
use serde_json::Value;

const TEXT: &str = "Grüße, 世界! Real-time text over RTP. Does it arrive intact?";
const WAIT: Duration = Duration::from_secs(60);

fn interop_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop/t140llm")
}

fn prerequisites() {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "node is not installed: the t140llm interop tests need it (.ci/run installs it)"
    );
    assert!(
        interop_dir()
            .join("node_modules/t140llm/package.json")
            .exists(),
        "t140llm is not installed: run `npm install` in interop/t140llm (.ci/run does)"
    );
}

/// Runs t140llm against a fresh gateway and returns each participant's transcript (its
/// context.add contents joined by single spaces) and the envelopes.
fn run(send_args: &[&str]) -> (BTreeMap<String, String>, Vec<Value>) {
    run_text(TEXT, send_args)
}

/// [`run`] sending `text`.
fn run_text(text: &str, send_args: &[&str]) -> (BTreeMap<String, String>, Vec<Value>) {
    prerequisites();
    let mut gw = Gateway::start(&[
        "--listen",
        "127.0.0.1:0",
        "--compat",
        "t140llm",
        "--session",
        "interop",
    ]);
    let port = gw.listen.port().to_string();
    let status = Command::new("node")
        .current_dir(interop_dir())
        .args([
            "send.mjs",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--text",
            text,
        ])
        .args(send_args)
        .status()
        .expect("run node send.mjs");
    assert!(
        status.success(),
        "send.mjs {send_args:?} failed: {status:?}"
    );
    assert!(gw.terminate(WAIT).success());
    let envelopes: Vec<Value> = gw
        .stdout_lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("NDJSON"))
        .collect();
    let mut transcripts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in envelopes.iter().filter(|e| e["type"] == "context.add") {
        transcripts
            .entry(e["sender"].as_str().unwrap().to_owned())
            .or_default()
            .push(e["payload"]["content"].as_str().unwrap().to_owned());
    }
    let joined = transcripts
        .into_iter()
        .map(|(k, v)| (k, v.join(" ")))
        .collect();
    (joined, envelopes)
}

fn suffixes(t: &BTreeMap<String, String>) -> Vec<String> {
    t.keys()
        .map(|k| k.rsplit_once('/').map_or("", |(_, s)| s).to_owned())
        .collect()
}

#[test]
#[ignore = "needs node and `npm install` in interop/t140llm; .ci/run runs it"]
fn t140llm_plain_text_arrives_exactly() {
    let (t, _) = run(&["--mode", "plain"]);
    assert_eq!(t.values().collect::<Vec<_>>(), [TEXT], "{t:?}");
}

#[test]
#[ignore = "needs node and `npm install` in interop/t140llm; .ci/run runs it"]
fn t140llm_red_arrives_exactly() {
    let (t, env) = run(&["--mode", "red", "--red-generations", "2"]);
    assert_eq!(t.values().collect::<Vec<_>>(), [TEXT], "{t:?}");
    assert!(!env.iter().any(|e| e.to_string().contains('\u{fffd}')));
}

#[test]
#[ignore = "needs node and `npm install` in interop/t140llm; .ci/run runs it"]
fn t140llm_multiplexed_prefix_streams_are_separate_participants() {
    let (t, _) = run(&["--mode", "multiplex", "--stream-id", "alpha,beta"]);
    assert_eq!(suffixes(&t), ["alpha", "beta"], "{t:?}");
    assert!(t.values().all(|v| v == TEXT), "{t:?}");
}

#[test]
#[ignore = "needs node and `npm install` in interop/t140llm; .ci/run runs it"]
fn t140llm_multiplexed_csrc_streams_are_separate_participants() {
    let (t, _) = run(&["--mode", "multiplex", "--stream-id", "a,b", "--csrc"]);
    assert_eq!(suffixes(&t), ["csrc:00000001", "csrc:00000002"], "{t:?}");
    assert!(t.values().all(|v| v == TEXT), "{t:?}");
}

#[test]
#[ignore = "needs node and `npm install` in interop/t140llm; .ci/run runs it"]
fn t140llm_metadata_packets_stay_out_of_the_transcript() {
    let (t, _) = run(&["--mode", "direct", "--metadata", r#"{"tool":"search"}"#]);
    assert_eq!(t.values().collect::<Vec<_>>(), [TEXT], "{t:?}");
}

/// t140llm clamps a redundant block's length at 255 but appends the whole block
/// (docs/t140llm.md section 5): its first packet here holds the whole burst of 30 ZWJ emoji
/// (330 bytes, fed at once), and the two RED packets after it repeat that block with length
/// 255. The gateway reads them by the first packet's length (`crate::clamped`), so their new
/// text arrives; it dropped both as `red_ambiguous_length`, losing " ok.".
#[test]
#[ignore = "needs node and `npm install` in interop/t140llm; .ci/run runs it"]
fn t140llm_red_after_a_burst_over_255_bytes_arrives_exactly() {
    let text = format!("{} ok.", "\u{1f469}\u{200d}\u{1f4bb}".repeat(30));
    let (t, _) = run_text(&text, &["--mode", "red", "--chunk", "0"]);
    assert_eq!(t.values().collect::<Vec<_>>(), [&text], "{t:?}");
}
