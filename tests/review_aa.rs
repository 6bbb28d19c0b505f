//! Review aa: PVP envelopes and the WebSocket participant lifecycle, over real sockets on
//! 127.0.0.1 (the sink API against a recording server).

mod common;

use std::time::Duration;

use pvp_t140::sink::ws::WsSink;
use serde_json::{Value, json};

#[path = "common/ws_recorder.rs"]
mod ws_recorder;
use common::talk::Talk;
use ws_recorder::{Log, config, server};

const WAIT: Duration = Duration::from_secs(20);

const ME: &str = "t140:0000a11e@127.0.0.1:40001";

/// A frame from the server in session "s".
fn frame(kind: &str, id: &str, sender: &str, payload: Value) -> String {
    json!({"v": 1, "id": id, "ts": "2026-11-28T00:00:00.000Z", "session": "s",
        "sender": sender, "type": kind, "payload": payload})
    .to_string()
}

async fn wait_for(log: &Log, what: &str, pred: impl Fn(&[(usize, Value)]) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !pred(&log.lock().unwrap()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn contents(log: &[(usize, Value)]) -> Vec<String> {
    log.iter()
        .filter(|(_, v)| v["type"] == "context.add")
        .map(|(_, v)| v["payload"]["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// A server relaying session traffic (README: the reference one broadcasts what it has no
/// handler for, `error` included) hands the connection an agent's `RATE_LIMITED` about the
/// chunk it was processing (its own model provider throttled it): the agent's word, not the
/// server's, which took the chunk. README: text errors count "sent by the server (sender
/// `system` or `server`, or the participant's own id; not another member's ...)". The chunk
/// was sent a second time (the server holds it twice, a duplicate key) after a pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_rate_limited_about_a_chunk_does_not_send_it_twice() {
    let (url, log) = server(|_, v| {
        if v["type"] != "context.add" || v["payload"]["content"] != "Once." {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAK1",
                "claude-agent-1",
                json!({"code": "RATE_LIMITED", "message": "provider throttled me",
                    "recoverable": true, "related_to": id}),
            ),
            frame(
                "heartbeat.ping",
                "01JQAAAAAAAAAAAAAAAAAAAAK2",
                "system",
                json!({}),
            ),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Once."));
    wait_for(&log, "the pong after the agent's error", |l| {
        l.iter().any(|(_, v)| v["type"] == "heartbeat.pong")
    })
    .await;
    ws.send(talk.add(ME, "Then this."));
    ws.send(talk.leave(ME));
    wait_for(&log, "the leave", |l| {
        l.iter().any(|(_, v)| v["type"] == "session.leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(contents(&log.lock().unwrap()), ["Once.", "Then this."]);
    assert_eq!((stats.sent, stats.dropped), (4, 0));
    assert_eq!(metrics.rate_limited_resent.get(), 0);
}

/// The same for an agent's `UNAUTHORIZED` naming one of the participant's chunks (the agent
/// may not act on it): the server took the chunk and the participant. It stopped the
/// participant ("PVP server refused this participant"), and what its speaker said next was
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_unauthorized_about_a_chunk_does_not_stop_the_participant() {
    let (url, log) = server(|_, v| {
        if v["type"] != "context.add" || v["payload"]["content"] != "First." {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAM1",
                "claude-agent-1",
                json!({"code": "UNAUTHORIZED", "message": "agent may not read this",
                    "recoverable": false, "related_to": id}),
            ),
            frame(
                "heartbeat.ping",
                "01JQAAAAAAAAAAAAAAAAAAAAM2",
                "system",
                json!({}),
            ),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "First."));
    // The ping behind the error is answered, or the connection has stopped reading.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline
        && !log
            .lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v["type"] == "heartbeat.pong")
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ws.send(talk.add(ME, "Second."));
    ws.send(talk.leave(ME));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(metrics.refused.get(), 0, "participant refused");
    assert_eq!(contents(&log.lock().unwrap()), ["First.", "Second."]);
    assert_eq!((stats.sent, stats.dropped), (4, 0));
}
