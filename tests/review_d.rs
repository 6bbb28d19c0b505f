//! Review d: what the gateway accepted survives (the `--spool` journal).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway_proc::Gateway;
use common::pvp_server::TestPvpServer;

const WAIT: Duration = Duration::from_secs(20);

/// A second gateway started on the `--spool DIR` a running one uses (a restart while the old
/// process lingers, two instances from one config) read the first one's undelivered envelopes
/// and sent them too, then replaced the journal the first went on appending to: what the first
/// had not delivered was lost to a kill. The second stops at start, with an error saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_a_spool_in_use_stops_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-review-d-{}", std::process::id()));
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
