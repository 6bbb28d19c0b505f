//! Found by review aa (session 43): whose server `error` a participant acts on. Another
//! member's error, even one naming this participant's chunk, is no refusal; a refused heartbeat
//! or pong does not stop the participant. Over real sockets on 127.0.0.1 (the sink API against
//! a recording server).

mod common;

use std::time::Duration;

use pvp_t140::sink::ws::WsSink;
use serde_json::{Value, json};

#[path = "common/ws_recorder.rs"]
mod ws_recorder;
use common::talk::Talk;
use ws_recorder::{config, frame, ping, ponged, server, wait_for};

const ME: &str = "t140:0000a11e@127.0.0.1:40001";

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
            ping("01JQAAAAAAAAAAAAAAAAAAAAK2"),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Once."));
    wait_for(&log, "the pong after the agent's error", ponged).await;
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
            ping("01JQAAAAAAAAAAAAAAAAAAAAM2"),
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
    while tokio::time::Instant::now() < deadline && !ponged(&log.lock().unwrap()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ws.send(talk.add(ME, "Second."));
    ws.send(talk.leave(ME));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(metrics.refused.get(), 0, "participant refused");
    assert_eq!(contents(&log.lock().unwrap()), ["First.", "Second."]);
    assert_eq!((stats.sent, stats.dropped), (4, 0));
}

/// README "Delivery to a PVP server": "A refused heartbeat or pong is logged at info level and
/// not sent again." A server that refuses a pong (a strict one refusing a frame of a sender it
/// does not count in the session yet, or one that takes no pongs) with `UNAUTHORIZED` naming
/// it stopped the participant for good ("PVP server refused this participant"): the
/// connection's own frames are not among the writes an error is matched against, so the
/// refusal read as one of the participant, and everything its speaker said was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pong_does_not_stop_the_participant() {
    let (url, log) = server(|_, v| match v["type"].as_str() {
        Some("session.join") => vec![ping("01JQAAAAAAAAAAAAAAAAAAAAN1")],
        Some("heartbeat.pong") => vec![frame(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAN2",
            "system",
            json!({"code": "UNAUTHORIZED", "message": "pongs are not taken here",
                "recoverable": true, "related_to": v["id"]}),
        )],
        _ => vec![],
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    wait_for(&log, "the pong", ponged).await;
    // The refusal is on its way back; give the connection a moment to read it, so that what
    // follows comes after it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    ws.send(talk.add(ME, "Said after the pong."));
    ws.send(talk.leave(ME));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(metrics.refused.get(), 0, "participant refused");
    assert_eq!(contents(&log.lock().unwrap()), ["Said after the pong."]);
    assert_eq!((stats.sent, stats.dropped), (3, 0));
}

/// README: "a `SESSION_NOT_FOUND` from the server naming a message other than the
/// participant's join: the server lost the session after taking the join ..., and the
/// participant joins again". Naming the connection's pong (the first frame a restarted server
/// behind a proxy that kept the connection reads, answering its own ping), it stopped the
/// participant instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lost_before_a_pong_is_joined_again() {
    static PINGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let (url, log) = server(|_, v| match v["type"].as_str() {
        Some("session.join") if !PINGED.swap(true, std::sync::atomic::Ordering::Relaxed) => {
            vec![ping("01JQAAAAAAAAAAAAAAAAAAAAP1")]
        }
        Some("heartbeat.pong") => vec![frame(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAP2",
            "system",
            json!({"code": "SESSION_NOT_FOUND", "message": "no such session",
                "recoverable": false, "related_to": v["id"]}),
        )],
        _ => vec![],
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    wait_for(&log, "the pong", ponged).await;
    ws.send(talk.add(ME, "After the lost session."));
    wait_for(&log, "the rejoin and the text", |l| {
        l.iter()
            .filter(|(_, v)| v["type"] == "session.join")
            .count()
            == 2
            && !contents(l).is_empty()
    })
    .await;
    ws.send(talk.leave(ME));
    ws.close(Duration::from_secs(5)).await;
    assert_eq!(metrics.refused.get(), 0, "participant refused");
    let kinds: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(_, v)| v["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "session.join",
            "heartbeat.pong",
            "session.join",
            "context.add",
            "session.leave"
        ]
    );
}
