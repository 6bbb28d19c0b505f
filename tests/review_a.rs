//! Review a: the PVP envelopes and the WebSocket session against pvp-spec sections 4-9, 17, 19
//! and the reference server's behaviour, over real sockets on 127.0.0.1.

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use common::pvp_server::{ServerOptions, TestPvpServer};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// pvp-spec 7.3 lists `add_context` as the capability that lets a participant add context
/// items, and the implementation guide's router rules say "`context.add`: requires
/// `add_context` capability"; the reference server takes it, or the driver or navigator role
/// (`ParticipantManager.canAddContext`). The gateway's participants exist to add context, but
/// their announcement carried no `capabilities`: with `--role observer` (accepted, and the
/// natural choice for a caption source that must not prompt or approve) every chunk was
/// refused as UNAUTHORIZED and the participant stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_participant_may_still_add_its_transcript() {
    let server = TestPvpServer::start_with(ServerOptions::default()).await;
    let mut gw =
        Gateway::start_for_server(&server.url(), &["--session", "cap", "--role", "observer"]);
    let mut a = Sender::new(gw.listen, 0x0c0c0c0c);
    a.send("Captions only. ");
    let pa = a.participant();
    server
        .wait_until(WAIT, "the join", |s| {
            !s.received_of_type("session.join").is_empty()
        })
        .await;
    let join = &server.received_of_type("session.join")[0];
    assert_eq!(
        join["payload"]["participant"]["capabilities"],
        json!(["add_context"]),
        "{join}"
    );
    let status = gw.terminate(WAIT);
    assert!(status.success(), "exit status {status:?}");
    server
        .wait_until(WAIT, "the leave", |s| {
            !s.received_of_type("session.leave").is_empty()
        })
        .await;
    let adds: Vec<Value> = server
        .received_of_type("context.add")
        .into_iter()
        .filter(|e| e["sender"] == pa.as_str())
        .collect();
    assert_eq!(adds.len(), 1);
    server.assert_no_violations();
    server.stop().await;
}
