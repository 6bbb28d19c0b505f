//! What the gateway does with what a PVP server sends back (pvp-spec sections 7, 9, 17, 19, and
//! the reference server agrathwohl/pvp): capabilities it checks, pings it sends, errors it
//! answers a write or a gate request with, and errors that are not its own. Over real sockets
//! on 127.0.0.1 (reviews a and f, session 39).

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, Sender};
use common::pvp_server::{ServerOptions, TestPvpServer};
use pvp_t140::pvp::Kind;
use pvp_t140::sink::ws::WsSink;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

#[path = "common/ws_recorder.rs"]
mod ws_recorder;
use common::talk::Talk;
use ws_recorder::{config, frame, ping, ponged, server, wait_for};

const ME: &str = "t140:0000a11e@127.0.0.1:40001";

fn pongs(log: &[(usize, Value)]) -> Vec<String> {
    log.iter()
        .filter(|(_, v)| v["type"] == "heartbeat.pong")
        .map(|(_, v)| v["ref"].as_str().unwrap_or("").to_owned())
        .collect()
}

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

/// pvp-spec 8.1: the server pings and participants answer. A server that relays session traffic
/// (the reference logs every routed message, `heartbeat.ping` included, and replays that whole
/// history to each joiner) hands a connection other members' pings and its own earlier ones:
/// each was answered with a pong, which the reference broadcasts to every member again. A join
/// into an hour-old session of 100 participants wrote 12,000 pongs and read 1.2 million.
/// Only the server's pings are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_servers_pings_are_answered() {
    let (url, log) = server(|_, v| {
        if v["type"] != "session.join" {
            return vec![];
        }
        vec![
            // History: another member's ping, and one of this participant's own.
            frame(
                "heartbeat.ping",
                "01JQAAAAAAAAAAAAAAAAAAAAA1",
                "t140:0000b0b0@127.0.0.1:40002",
                json!({}),
            ),
            frame(
                "heartbeat.ping",
                "01JQAAAAAAAAAAAAAAAAAAAAA2",
                ME,
                json!({}),
            ),
            // The server's own.
            ping("01JQAAAAAAAAAAAAAAAAAAAAA3"),
        ]
    })
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    wait_for(&log, "the pong to the server's ping", |l| {
        pongs(l).contains(&"01JQAAAAAAAAAAAAAAAAAAAAA3".to_owned())
    })
    .await;
    // Frames are read and answered in order: any pong to the earlier pings is written by now.
    let got = pongs(&log.lock().unwrap());
    ws.close(Duration::from_secs(1)).await;
    assert_eq!(got, ["01JQAAAAAAAAAAAAAAAAAAAAA3"]);
}

/// pvp-spec 17: "Servers MUST send error messages for all rejected operations". An `error`
/// whose `related_to` names a `context.add` the connection wrote (CONTEXT_TOO_LARGE,
/// INVALID_MESSAGE, INVALID_STATE, or the reference's catch-all INTERNAL_ERROR) says the chunk
/// was not taken: it was logged, but counted as sent, and the exit line said nothing was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_the_server_refused_counts_as_dropped_not_sent() {
    let (url, log) = server(|_, v| {
        if v["type"] != "context.add" {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAE1",
                "system",
                json!({"code": "CONTEXT_TOO_LARGE", "message": "too large",
                    "recoverable": true, "related_to": id}),
            ),
            // The same error read again (a server replaying its history) counts once.
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAE1",
                "system",
                json!({"code": "CONTEXT_TOO_LARGE", "message": "too large",
                    "recoverable": true, "related_to": id}),
            ),
            ping("01JQAAAAAAAAAAAAAAAAAAAAP1"),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Far too long a sentence."));
    wait_for(&log, "the pong after the error", |l| !pongs(l).is_empty()).await;
    let stats = ws.close(Duration::from_secs(2)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (1, 1),
        "the join sent, the chunk dropped"
    );
    assert_eq!(metrics.server_refused_items.get(), 1);
}

/// A server may send messages larger than the 1 MiB a connection reads (another member's
/// inline `file` or `image` context, pvp-spec 9.1). tungstenite failed the connection on it, and
/// a server that replays its history to each joiner (the reference does; pvp-spec 19.1:
/// "SHOULD replay missed messages on reconnection") sent it again on every rejoin: the
/// participant reconnected for ever, the server's pings after it unanswered. It is skipped now
/// (sink::oversize) and counted as a rejected frame, on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_message_in_the_servers_history_does_not_wedge_the_participant() {
    let (url, log) = server(|_, v| {
        if v["type"] != "session.join" {
            return vec![];
        }
        let big = "x".repeat(2 << 20);
        vec![
            frame(
                "context.add",
                "01JQAAAAAAAAAAAAAAAAAAAAB1",
                "human-1",
                json!({"key": "screenshot", "content_type": "image", "content": big}),
            ),
            ping("01JQAAAAAAAAAAAAAAAAAAAAP2"),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    wait_for(&log, "a pong after the large message", |l| {
        !pongs(l).is_empty()
    })
    .await;
    ws.close(Duration::from_secs(1)).await;
    assert_eq!(metrics.server_frames_rejected.get(), 1, "the large message");
    assert_eq!(metrics.reconnects.get(), 0, "on the first connection");
}

/// README: frames from the server that do not parse are not acted on and are counted in
/// `pvp_t140_server_frames_rejected_total`. An `error` envelope whose payload is not pvp-spec
/// 17's (no `code` string, no `message`) was logged and neither acted on nor counted: a server
/// refusing the participant in a shape the gateway cannot read went unseen on /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_envelope_with_a_malformed_payload_is_counted_as_rejected() {
    let (url, log) = server(|_, v| {
        if v["type"] != "session.join" {
            return vec![];
        }
        vec![
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAM1",
                "system",
                json!({"code": 401, "recoverable": false}),
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
    wait_for(&log, "the pong after the error", |l| !pongs(l).is_empty()).await;
    ws.close(Duration::from_secs(1)).await;
    assert_eq!(metrics.server_frames_rejected.get(), 1);
}

// Review f (session 39), of review a's fixes.

/// pvp-spec 17: a server refusing a participant's `context.add` with UNAUTHORIZED (the
/// validating server in tests/common and a spec-following server do; the reference turns it
/// into INTERNAL_ERROR) names the chunk in `related_to`: it was not taken. The participant
/// stops, and what it still held is counted as dropped, but the refused chunk itself stayed in
/// the sink's sent count: the `stopped` line said it was delivered, and
/// `pvp_t140_server_refused_items_total` (which counts it under any other code) did not count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_refused_as_unauthorized_counts_as_dropped_not_sent() {
    let (url, _log) = server(|_, v| {
        if v["type"] != "context.add" {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![frame(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAF1",
            "system",
            json!({"code": "UNAUTHORIZED", "message": "may not add context",
                "recoverable": false, "related_to": id}),
        )]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Not allowed."));
    let deadline = tokio::time::Instant::now() + WAIT;
    while metrics.refused.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = ws.close(Duration::from_secs(2)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (1, 1),
        "the join sent, the refused chunk dropped"
    );
    assert_eq!(metrics.server_refused_items.get(), 1);
}

/// pvp-spec 17: an error for every rejected operation. With `--gate-transcripts` a chunk is
/// held behind its `gate.request`; a server that will not make the gate (INVALID_STATE here: a
/// strict server's answer to an `action_ref` naming a message it never saw, the held chunk;
/// INVALID_MESSAGE, INTERNAL_ERROR alike) says so at once, naming the request. The error was
/// only logged: no decision could ever come, yet the chunk waited out its whole timeout (60 s
/// by default, up to a day) plus 5 s, everything the participant said after it and its leave
/// waiting behind it, and was then dropped as "timed out". It is refused at once now, as a
/// gate.reject would refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_request_the_server_refuses_drops_its_chunk_at_once() {
    let (url, log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![frame(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAG1",
            "system",
            json!({"code": "INVALID_STATE", "message": "action_ref names no message",
                "recoverable": false, "related_to": id}),
        )]
    })
    .await;
    let mut cfg = config(url);
    // A decision that never comes would hold the chunk for an hour.
    cfg.gate = Some(pvp_t140::sink::gate::GateConfig {
        quorum: 1,
        timeout: Duration::from_secs(3600),
    });
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Held for approval."));
    let leave = talk.env(ME, Kind::SessionLeave, json!({"reason": "stream ended"}));
    ws.send(leave);
    wait_for(&log, "the leave behind the refused chunk", |l| {
        l.iter().any(|(_, v)| v["type"] == "session.leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(2)).await;
    let l = log.lock().unwrap();
    assert!(
        !l.iter().any(|(_, v)| v["type"] == "context.add"),
        "the chunk was never approved: {l:?}"
    );
    assert_eq!(metrics.gates_refused.get(), 1);
    // The request is the connection's own frame, not an envelope sent (review z).
    assert_eq!((stats.sent, stats.dropped), (2, 0), "join, leave");
}

/// pvp-spec 17 lists AGENT_ERROR, "agent-side processing error": an agent member of the
/// session may answer a message it could not process with an `error` naming it (the reference
/// agent does, under its own id), and a server relaying session traffic hands it to every
/// member. An agent failing on this participant's chunk is no refusal by the server, which took
/// the chunk: it was counted as dropped and in `pvp_t140_server_refused_items_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_error_about_a_chunk_is_no_refusal_by_the_server() {
    let (url, log) = server(|_, v| {
        if v["type"] != "context.add" {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAH1",
                "claude-agent-1",
                json!({"code": "AGENT_ERROR", "message": "could not summarise it",
                    "recoverable": true, "related_to": id}),
            ),
            ping("01JQAAAAAAAAAAAAAAAAAAAAH2"),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Taken by the server."));
    wait_for(&log, "the pong after the agent's error", ponged).await;
    let stats = ws.close(Duration::from_secs(2)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (2, 0),
        "the join and the chunk sent (a pong is not counted)"
    );
    assert_eq!(metrics.server_refused_items.get(), 0);
}

/// The same for a gated chunk: an agent's error naming its `gate.request` (which the server
/// relayed to every member, the agent included) says nothing of the gate, which an approver
/// then approves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_error_about_a_gate_request_does_not_refuse_the_chunk() {
    let (url, log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return vec![];
        }
        let id = v["id"].as_str().unwrap();
        vec![
            frame(
                "error",
                "01JQAAAAAAAAAAAAAAAAAAAAJ1",
                "claude-agent-1",
                json!({"code": "AGENT_ERROR", "message": "cannot judge transcripts",
                    "recoverable": true, "related_to": id}),
            ),
            json!({"v": 1, "id": "01JQAAAAAAAAAAAAAAAAAAAAJ2", "ts": "2026-11-28T00:00:00.000Z",
                "session": "s", "sender": "approver-1", "type": "gate.approve", "ref": id,
                "payload": {"gate": id, "approver": "approver-1"}})
            .to_string(),
        ]
    })
    .await;
    let mut cfg = config(url);
    cfg.gate = Some(pvp_t140::sink::gate::GateConfig {
        quorum: 1,
        timeout: Duration::from_secs(3600),
    });
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "Approved in the end."));
    wait_for(&log, "the approved chunk", |l| {
        l.iter().any(|(_, v)| v["type"] == "context.add")
    })
    .await;
    ws.close(Duration::from_secs(2)).await;
    assert_eq!(metrics.gates_refused.get(), 0);
}
