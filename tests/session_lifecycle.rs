//! The session's lifecycle as the server tells it: `session.end` (pvp-spec 6.5), a session the
//! server lost, a join refused as full. Over real sockets on 127.0.0.1 (review j, session 39).

#![allow(dead_code)]

use std::time::Duration;

use pvp_t140::sink::ws::WsSink;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

#[path = "common/ws_recorder.rs"]
mod ws_recorder;
use ws_recorder::{Log, config, server};

#[path = "common/talk.rs"]
mod talk;
use talk::Talk;

fn frame(session: &str, kind: &str, sender: &str, payload: Value) -> String {
    json!({"v": 1, "id": format!("01JQEND{:019}", rand_id()), "ts": "2026-11-28T00:00:00.000Z",
        "session": session, "sender": sender, "type": kind, "payload": payload})
    .to_string()
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

const ME: &str = "t140:0000a11e@127.0.0.1:40001";
const YOU: &str = "t140:0000b0b0@127.0.0.1:40002";

async fn wait_until(what: &str, pred: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !pred() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn adds(log: &Log) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| v["type"] == "context.add")
        .count()
}

/// pvp-spec 6.5: "The server MUST NOT accept further messages after a session ends". The
/// server broadcasts the admin's `session.end` to every member: both participants' connections
/// read it. It is acted on once for the session (one count, one warning), neither connection
/// reconnects, and text said after it is dropped under its own count, never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_end_stops_the_sessions_text_once_without_reconnecting() {
    let (url, log) = server(|_, v| {
        if v["type"] != "session.join" {
            return vec![];
        }
        vec![
            frame(
                "s",
                "participant.announce",
                "admin-1",
                json!({"id": "admin-1", "name": "Chair", "type": "human", "roles": ["admin"]}),
            ),
            frame(
                "s",
                "session.end",
                "admin-1",
                json!({"reason": "meeting over", "final_state": "completed"}),
            ),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.join(YOU));
    wait_until("the session ended", || metrics.sessions_ended.get() == 1).await;
    // Both connections read it and end (their tasks finish): none reconnects.
    let l = log.clone();
    wait_until("both joined", || {
        l.lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v["type"] == "session.join")
            .count()
            == 2
    })
    .await;
    for i in 0..3 {
        ws.send(talk.add(ME, &format!("after the end {i}")));
        ws.send(talk.add(YOU, &format!("you too {i}")));
    }
    let stats = ws.close(Duration::from_secs(2)).await;
    assert_eq!(adds(&log), 0, "no text written into the ended session");
    assert_eq!(
        metrics.sessions_ended.get(),
        1,
        "one session, acted on once"
    );
    assert_eq!(metrics.session_ended_items.get(), 6);
    assert_eq!(stats.dropped, 6);
    assert!(
        log.lock().unwrap().iter().all(|(c, _)| *c < 2),
        "no reconnect: {:?}",
        log.lock().unwrap()
    );
}

/// A `session.end` for another session, from a member not announced as an admin (the
/// reference server relays any member's unchecked), or one whose payload is not pvp-spec 6.5's (a
/// `final_state` outside its enum), is not acted on: the participant's text still goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_end_for_another_session_or_malformed_is_not_acted_on() {
    let (url, log) = server(|_, v| {
        if v["type"] != "session.join" {
            return vec![];
        }
        vec![
            frame(
                "s",
                "participant.announce",
                "admin-1",
                json!({"id": "admin-1", "name": "Chair", "type": "human", "roles": ["admin"]}),
            ),
            frame(
                "s",
                "participant.announce",
                "bob",
                json!({"id": "bob", "name": "Bob", "type": "human", "roles": ["navigator"]}),
            ),
            frame(
                "s",
                "session.end",
                "bob",
                json!({"reason": "prank", "final_state": "aborted"}),
            ),
            frame(
                "other",
                "session.end",
                "admin-1",
                json!({"reason": "theirs", "final_state": "completed"}),
            ),
            frame(
                "s",
                "session.end",
                "admin-1",
                json!({"reason": "bad", "final_state": "exploded"}),
            ),
            frame(
                "s",
                "session.end",
                "admin-1",
                json!({"final_state": "aborted"}),
            ),
        ]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    let l = log.clone();
    wait_until("joined", || !l.lock().unwrap().is_empty()).await;
    ws.send(talk.add(ME, "still here"));
    let l = log.clone();
    wait_until("the text written", || adds(&l) == 1).await;
    let stats = ws.close(Duration::from_secs(2)).await;
    assert_eq!(metrics.sessions_ended.get(), 0);
    assert_eq!(stats.dropped, 0);
}

/// pvp-spec 17 `SESSION_NOT_FOUND` for a chunk after the server took the participant's join:
/// the server lost the session (a restart whose connection a proxy kept, an expiry). The
/// reference server makes the session a `session.join` names, so a rejoin brings it back; the
/// participant was stopped for good instead, all it said afterwards lost. It now rejoins
/// after a pause, as for PARTICIPANT_NOT_FOUND, and its text goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lost_after_the_join_is_joined_again() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static ONCE: AtomicBool = AtomicBool::new(false);
    let (url, log) = server(|_, v| {
        if v["type"] != "context.add" || ONCE.swap(true, Ordering::SeqCst) {
            return vec![];
        }
        vec![frame(
            "s",
            "error",
            "system",
            json!({"code": "SESSION_NOT_FOUND", "message": "Session s not found",
                "recoverable": false, "related_to": v["id"]}),
        )]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "lost with the session"));
    let l = log.clone();
    wait_until("a second join", || {
        l.lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v["type"] == "session.join")
            .count()
            == 2
    })
    .await;
    ws.send(talk.add(ME, "after the rejoin"));
    let l = log.clone();
    wait_until("the text after the rejoin", || {
        l.lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v["payload"]["content"] == "after the rejoin")
    })
    .await;
    ws.close(Duration::from_secs(2)).await;
    assert_eq!(metrics.refused.get(), 0, "the participant was not stopped");
    assert_eq!(metrics.rejoined_not_found.get(), 1);
}

/// A join the server refuses with a code that does not stop the participant (a full session:
/// INVALID_STATE here), then its text as PARTICIPANT_NOT_FOUND, as a strict server would: the
/// participant rejoins, but after pauses that double (500 ms, 1 s, 2 s, ... to 30 s), counted
/// in `rejoined_not_found`, not at wire speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_refused_as_full_is_retried_with_growing_pauses() {
    let (url, log) = server(|_, v| {
        let code = match v["type"].as_str() {
            Some("session.join") => "INVALID_STATE",
            Some("context.add") => "PARTICIPANT_NOT_FOUND",
            _ => return vec![],
        };
        vec![frame(
            "s",
            "error",
            "system",
            json!({"code": code, "message": "session full",
                "recoverable": true, "related_to": v["id"]}),
        )]
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let start = std::time::Instant::now();
    ws.send(talk.join(ME));
    ws.send(talk.add(ME, "hello"));
    let l = log.clone();
    let joins = move || {
        l.lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v["type"] == "session.join")
            .count()
    };
    let j = joins.clone();
    wait_until("three joins", move || j() >= 3).await;
    let took = start.elapsed();
    // Two pauses went by: at least 500 ms and 1 s.
    assert!(
        took >= Duration::from_millis(1400),
        "rejoined too fast: {took:?}"
    );
    assert!(joins() <= 4, "{} joins in {took:?}", joins());
    assert!(metrics.rejoined_not_found.get() >= 2);
    assert_eq!(metrics.refused.get(), 0);
    ws.close(Duration::from_millis(200)).await;
}

/// The admins a connection remembers are bounded: members announcing themselves admins without
/// end grew every participant's connection's list, scanned at each announce. The newest 64 are
/// kept: a `session.end` from the first of 65 is not acted on (text still goes), one from the
/// last is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admins_remembered_are_the_newest_64() {
    let (url, log) = server(|_, v| match v["type"].as_str() {
        Some("session.join") => {
            let mut out: Vec<String> = (0..65)
                .map(|i| {
                    let id = format!("admin-{i}");
                    frame(
                        "s",
                        "participant.announce",
                        &id,
                        json!({"id": id, "name": "Chair", "type": "human", "roles": ["admin"]}),
                    )
                })
                .collect();
            out.push(frame(
                "s",
                "session.end",
                "admin-0",
                json!({"reason": "forgotten", "final_state": "completed"}),
            ));
            // Its pong says the end before it was read.
            out.push(frame("s", "heartbeat.ping", "server", json!({})));
            out
        }
        Some("context.add") => vec![frame(
            "s",
            "session.end",
            "admin-64",
            json!({"reason": "meeting over", "final_state": "completed"}),
        )],
        _ => vec![],
    })
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    ws.send(talk.join(ME));
    let l = log.clone();
    wait_until("the pong after the first admin's end", || {
        l.lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v["type"] == "heartbeat.pong")
    })
    .await;
    assert_eq!(
        metrics.sessions_ended.get(),
        0,
        "the first admin is forgotten"
    );
    ws.send(talk.add(ME, "still heard"));
    let l = log.clone();
    wait_until("the text written", || adds(&l) == 1).await;
    wait_until("the session ended", || metrics.sessions_ended.get() == 1).await;
    ws.close(Duration::from_secs(2)).await;
}
