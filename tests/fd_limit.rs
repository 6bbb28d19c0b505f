//! The open-file limit: every PVP participant holds a WebSocket of its own, so a gateway started
//! under a low soft limit (systemd's and most shells' 1,024) must raise it before its
//! participants run out of descriptors (src/fdlimit.rs).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use common::pvp_server::TestPvpServer;

/// More participants than the soft limit the gateway starts with has descriptors for.
const PARTICIPANTS: u32 = 300;
const SOFT: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participants_beyond_a_low_soft_limit_all_connect() {
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    if hard < u64::from(PARTICIPANTS) + pvp_t140::fdlimit::RESERVED {
        // Nothing to raise to: the gateway warns instead (checked below on its own).
        eprintln!("SKIPPED: hard open-file limit {hard} is below what this test needs");
        return;
    }
    let server = TestPvpServer::start().await;
    let url = server.url();
    let mut gw = Gateway::start_with_fd_limit(
        SOFT,
        &[
            "--listen",
            "127.0.0.1:0",
            "--server",
            &url,
            "--max-streams",
            "1000",
            "--max-pps-per-source",
            "0",
        ],
    );
    let raised = gw.wait_stderr(Duration::from_secs(5), "open-file limit raised");
    assert!(raised.contains("\"from\":200"), "{raised}");
    let mut senders: Vec<Sender> = (0..PARTICIPANTS)
        .map(|i| Sender::new(gw.listen, 0x1000 + i))
        .collect();
    for (i, s) in senders.iter_mut().enumerate() {
        s.send(&format!("Speaker {i} here. "));
    }
    server
        .wait_until(
            Duration::from_secs(60),
            "a context.add from every participant",
            |s| {
                let senders: HashSet<String> = s
                    .received_of_type("context.add")
                    .iter()
                    .map(|e| e["sender"].as_str().unwrap_or_default().to_owned())
                    .collect();
                senders.len() == PARTICIPANTS as usize
            },
        )
        .await;
    assert!(server.connections_opened() >= PARTICIPANTS as usize);
    server.assert_no_violations();
    gw.terminate(Duration::from_secs(30));
}

#[test]
fn a_hard_limit_too_low_for_max_streams_is_said_at_start() {
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    if hard >= 1_000_000 + pvp_t140::fdlimit::RESERVED {
        eprintln!("SKIPPED: hard open-file limit {hard} allows a million participants");
        return;
    }
    let mut gw = Gateway::start_with_fd_limit(
        100,
        &[
            "--listen",
            "127.0.0.1:0",
            "--server",
            "ws://127.0.0.1:9",
            "--max-streams",
            "1000000",
        ],
    );
    let line = gw.wait_stderr(Duration::from_secs(5), "fewer than --max-streams");
    assert!(line.contains("WARN"), "{line}");
    gw.terminate(Duration::from_secs(30));
}
