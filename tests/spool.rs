//! `--spool DIR`: a gateway killed with SIGKILL while its PVP server is unreachable resends,
//! after a restart, what it had not delivered — and nothing it had; a second gateway on a
//! directory in use is refused at start.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender};
use common::pvp_server::TestPvpServer;

const WAIT: Duration = Duration::from_secs(20);

fn contents(s: &TestPvpServer) -> Vec<String> {
    s.received_of_type("context.add")
        .iter()
        .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_nothing_flushed_and_resends_nothing_delivered() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-spool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spool = dir.to_str().unwrap().to_owned();

    let first = TestPvpServer::start().await;
    let url = first.url();
    let mut gw = Gateway::start_for_server(&url, &["--spool", &spool]);
    let mut a = Sender::new(gw.listen, 0x5a);
    a.send("Delivered before the crash. ");
    first
        .wait_until(WAIT, "first sentence", |s| {
            contents(s) == ["Delivered before the crash."]
        })
        .await;

    // The server goes away; once the gateway has noticed (a frame written into a dying
    // connection cannot be known lost), the next sentences can only be journaled.
    first.stop().await;
    gw.wait_stderr(WAIT, "PVP connect failed");
    a.send("Said while the server was down. And more");
    a.send(". ");
    let journal = dir.join("journal.ndjson");
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&journal)
        .unwrap_or_default()
        .contains("And more.")
    {
        assert!(Instant::now() < deadline, "never journaled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.kill();

    // A new gateway on the same spool, and a server to talk to.
    let second = TestPvpServer::start().await;
    let url = second.url();
    let mut gw = Gateway::start_for_server(&url, &["--spool", &spool]);
    second
        .wait_until(WAIT, "the undelivered sentences, then a leave", |s| {
            !s.received_of_type("session.leave").is_empty()
        })
        .await;
    assert_eq!(
        contents(&second),
        ["Said while the server was down.", "And more."]
    );
    let types: Vec<String> = second
        .received()
        .iter()
        .map(|r| r.envelope["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        types.first().map(String::as_str),
        Some("session.join"),
        "{types:?}"
    );
    second.assert_no_violations();
    assert!(gw.terminate(WAIT).success());

    // A third start has nothing left to send.
    let third = TestPvpServer::start().await;
    let url = third.url();
    let mut gw = Gateway::start_for_server(&url, &["--spool", &spool]);
    let line = gw.wait_stderr(WAIT, "spool open");
    assert!(line.contains("\"resend\":0"), "{line}");
    assert!(gw.terminate(WAIT).success());
    assert!(third.received().is_empty());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_unwritable_spool_is_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--server",
            "ws://127.0.0.1:9",
            "--spool",
            "/proc/no-such-dir",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--spool"));
}

/// A second gateway started on the `--spool DIR` a running one uses (a restart while the old
/// process lingers, two instances from one config) read the first one's undelivered envelopes
/// and sent them too, then replaced the journal the first went on appending to: what the first
/// had not delivered was lost to a kill. The second stops at start, with an error saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_a_spool_in_use_stops_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-spool-in-use-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spool = dir.to_str().unwrap().to_owned();
    let server = TestPvpServer::start().await;
    let url = server.url();
    let mut first = Gateway::start_for_server(&url, &["--spool", &spool]);
    let mut second = Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--server",
            &url,
            "--spool",
            &spool,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(first.terminate(WAIT).success());
    std::fs::remove_dir_all(&dir).ok();
    let status = status.expect("the second gateway ran on the spool the first one uses");
    assert!(!status.success());
    assert!(
        stderr.contains("in use by another running gateway"),
        "{stderr}"
    );
}
