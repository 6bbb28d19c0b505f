//! RATE_LIMITED for a participant's control envelopes (README "Delivery to a PVP server"): a
//! `session.join`, a rejoin after a reconnect, or a `gate.request` the server refused is sent
//! again after the pause, before the text (review, session 37: none was, and the participant
//! spoke without being in the session, or a gated chunk timed out unasked); and with a reconnect,
//! a replayed refusal or a stop during the pause, each once and the join first (a review of
//! that fix, session 37). The real `WsSink` against a real WebSocket server on 127.0.0.1.

#[path = "common/ws_rate.rs"]
mod ws_rate;
use ws_rate::*;

/// With `--gate-transcripts`, a server that refuses a chunk's `gate.request` as RATE_LIMITED
/// (pvp-spec 17: "Servers MUST send `error` messages for all rejected operations": the gate
/// was not created) never gets it again: the connection only pauses, and asks again only after
/// a reconnect, which a healthy connection never makes. No approver ever sees the chunk, it
/// waits out `--gate-timeout-s` + 5 s, holding everything behind it, and is then dropped as
/// "timed out" (README "Gated transcripts"; "RATE_LIMITED pauses it ... to send what the
/// participant still holds"). A user expects the request to be made again after the pause,
/// as refused text is (README "Delivery to a PVP server"), and the approved chunk delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_request_refused_as_rate_limited_is_asked_again_after_the_pause() {
    let refused_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = refused_once.clone();
    let (url, log) = server(Box::new(move |v| {
        if v["type"] != "gate.request" {
            return (true, vec![]);
        }
        if !r.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return (false, vec![rate_limited(&v["id"])]);
        }
        let approve = json!({"v": 1, "id": fresh_id(),
            "ts": "2026-11-25T00:00:00.000Z", "session": "s", "sender": "approver-1",
            "type": "gate.approve", "ref": v["id"],
            "payload": {"gate": v["id"], "approver": "approver-1"}});
        (true, vec![approve])
    }))
    .await;
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(3),
        }),
        ..config(url)
    };
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000b001@127.0.0.1:40101";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Please approve me."));
    // Either the chunk is added, or its gate runs out (3 s + 5 s) and it is dropped.
    wait_until("the chunk added or dropped", &log, || {
        taken(&log, p).iter().any(|s| s == "Please approve me.") || metrics.gates_refused.get() > 0
    })
    .await;
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        taken(&log, p),
        ["join", "gate.request", "Please approve me.", "leave"],
        "refused gate.request never asked again; chunks dropped by the gate: {}; {stats:?}",
        metrics.gates_refused.get()
    );
    // Sent: the join, the chunk and the leave; the request is the connection's own frame, not
    // an envelope of the queue (review z: the `stopped` line's `sent` counted each gated
    // chunk twice).
    assert_eq!((stats.sent, stats.dropped), (3, 0));
    assert_eq!(metrics.gates_refused.get(), 0);
}

/// A server that rate-limits a participant's first frames refuses its `session.join` as
/// RATE_LIMITED (`related_to` = the join): the participant is not in the session. The
/// connection pauses, then sends its text (which it resends if refused) but never the join
/// again, nor does it reconnect, so the server holds text from a participant that never
/// joined (pvp-spec 6.3: a connection's first frame must be the join; README "A join is never
/// refused (its participant's later envelopes would be without one, which a server
/// refuses)"). A user expects the join to go again after the pause, before the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_refused_as_rate_limited_is_sent_again_before_the_text() {
    let joined = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let j = joined.clone();
    let t = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (url, log) = server(Box::new(move |v| {
        use std::sync::atomic::Ordering::SeqCst;
        match v["type"].as_str().unwrap_or("") {
            // The first join is refused for the rate; any later one taken.
            "session.join" => {
                if j.fetch_add(1, SeqCst) == 0 {
                    (false, vec![rate_limited(&v["id"])])
                } else {
                    (true, vec![])
                }
            }
            // The burst's first text is refused for the rate as well; any later taken.
            "context.add" if !t.swap(true, SeqCst) => (false, vec![rate_limited(&v["id"])]),
            _ => (true, vec![]),
        }
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000b002@127.0.0.1:40102";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Hello."));
    // The text is refused, then sent again after the pause and taken (with or without a
    // join before it).
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    assert_eq!(
        taken(&log, p),
        ["join", "Hello.", "leave"],
        "what the server took from {p}; {stats:?}"
    );
    assert_eq!((stats.sent, stats.dropped), (3, 0));
}

/// The same refusal after a reconnect: a server back from a restart, with every participant
/// rejoining at once, refuses this participant's rejoin as RATE_LIMITED. The rejoin (a fresh
/// id, not among the envelopes the connection remembers) is not sent again either, so all
/// the participant says on the new connection comes from a sender that is not in the
/// session (README: "joins again after a reconnect"; pvp-spec 6.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_refused_as_rate_limited_is_sent_again_before_the_text() {
    let joins = Arc::new(Mutex::new(std::collections::HashMap::<usize, u32>::new()));
    let j = joins.clone();
    let (url, log) = server_on(Box::new(move |conn, v| {
        let kind = v["type"].as_str().unwrap_or("");
        let mut joins = j.lock().unwrap();
        if kind == "session.join" {
            let n = joins.entry(conn).or_default();
            *n += 1;
            // After the restart, the first join is refused for the rate.
            if conn == 1 && *n == 1 {
                return (false, vec![rate_limited(&v["id"])], false);
            }
        } else if conn == 1 && joins.get(&conn).is_none_or(|&n| n < 2) {
            // The participant is rate-limited as a whole until its rejoin is taken: text the
            // connection wrote before it read the refusal is refused too (and sent again).
            return (false, vec![rate_limited(&v["id"])], false);
        }
        // The server goes down (restarts) once it has "Before.".
        let close = conn == 0 && v["payload"]["content"] == "Before.";
        (true, vec![], close)
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000b003@127.0.0.1:40103";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Before."));
    wait_until("the first connection's text", &log, || {
        taken(&log, p).iter().any(|s| s == "Before.")
    })
    .await;
    wait_until("the rejoin refused", &log, || {
        log.lock()
            .unwrap()
            .iter()
            .any(|(v, ok)| !ok && v["type"] == "session.join")
    })
    .await;
    ws.send(talk.add(p, "After."));
    wait_until("the text after the restart", &log, || {
        taken(&log, p).iter().any(|s| s == "After.")
    })
    .await;
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_secs(5)).await;
    let on_second: Vec<String> = {
        let l = log.lock().unwrap();
        l.iter()
            .filter(|(v, ok)| *ok && v["conn"] == 1)
            .filter_map(|(v, _)| match v["type"].as_str().unwrap() {
                "session.join" => Some("join".to_owned()),
                "session.leave" => Some("leave".to_owned()),
                "context.add" => Some(v["payload"]["content"].as_str().unwrap().to_owned()),
                _ => None,
            })
            .collect()
    };
    // "Before." goes again too: the first connection closed right after reading it, before
    // the ping behind it, so no pong showed it read (README "Delivery to a PVP server": at
    // least once; its id and key are the same, which a server keeping context by key takes as
    // one item).
    assert_eq!(
        on_second,
        ["join", "Before.", "After.", "leave"],
        "what the restarted server took; {stats:?}"
    );
}

/// A join refused as RATE_LIMITED is put in the outbox, to go again after the pause (same id).
/// If the connection drops during that pause (the server closes it right after the error: a
/// restarting or overloaded server), the reconnect rejoins at once (fresh id), and then the
/// refused join still in the outbox is written as well: the participant joins twice on the
/// new connection, the second time with an id the server already saw on the old one.
/// README: "joins again after a reconnect" (one join a connection; pvp-spec 6.3: the join is
/// the connection's first frame, and ids are unique, pvp-spec 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_refused_then_a_reconnect_during_the_pause_joins_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let joined = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let j = joined.clone();
    let (url, log) = server_on(Box::new(move |_conn, v| {
        if v["type"] == "session.join" && j.fetch_add(1, SeqCst) == 0 {
            // Refused for the rate, and the server goes away.
            return (false, vec![rate_limited(&v["id"])], true);
        }
        (true, vec![], false)
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000d001@127.0.0.1:40201";
    ws.send(talk.join(p));
    wait_until("the join refused", &log, || {
        log.lock()
            .unwrap()
            .iter()
            .any(|(v, ok)| !ok && v["type"] == "session.join")
    })
    .await;
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    let joins = frames(&log, p, "session.join");
    assert_eq!(
        taken(&log, p),
        ["join", "Hello.", "leave"],
        "joins read by the server (id, connection, taken): {joins:?}; {stats:?}"
    );
}

/// A gate.request refused as RATE_LIMITED is put in the outbox, to be asked again after the
/// pause. If the connection drops during the pause, the reconnect asks every undecided gate
/// again at once (leaving out only one still in `pending`, not one in the outbox), and then
/// the outbox asks it once more: the server gets the same request (same id) twice on the new
/// connection, and approvers are asked twice about one chunk (README "Gated transcripts":
/// "Chunks held for approval are asked about again" after a reconnect, once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_request_refused_then_a_reconnect_during_the_pause_is_asked_once() {
    let refused_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = refused_once.clone();
    let (url, log) = server_on(Box::new(move |_conn, v| {
        if v["type"] != "gate.request" {
            return (true, vec![], false);
        }
        if !r.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // Refused for the rate, and the server goes away.
            return (false, vec![rate_limited(&v["id"])], true);
        }
        (true, vec![], false)
    }))
    .await;
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(30),
        }),
        ..config(url)
    };
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000d002@127.0.0.1:40202";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Please approve me."));
    wait_until("the first request refused", &log, || {
        frames(&log, p, "gate.request").iter().any(|(_, _, ok)| !ok)
    })
    .await;
    let first = frames(&log, p, "gate.request")[0].0.clone();
    // The first request asked on the second connection.
    wait_until("the request asked again", &log, || {
        frames(&log, p, "gate.request")
            .iter()
            .any(|(_, c, ok)| *ok && *c == 1)
    })
    .await;
    // A second chunk: taken from the queue only once the pause is over and the outbox is
    // empty, so its request comes after anything the outbox still held.
    ws.send(talk.add(p, "Second."));
    wait_until("the second chunk's request", &log, || {
        frames(&log, p, "gate.request")
            .iter()
            .any(|(id, _, _)| *id != first)
    })
    .await;
    let requests = frames(&log, p, "gate.request");
    let _ = ws.close(Duration::from_secs(1)).await;
    let again: Vec<_> = requests
        .iter()
        .filter(|(id, c, _)| *c == 1 && *id == first)
        .collect();
    assert_eq!(
        again.len(),
        1,
        "gate.request frames read by the server (id, connection, taken): {requests:?}"
    );
}

/// With `--gate-transcripts`, a participant that has left (its leave held behind a chunk
/// awaiting approval) loses its connection; the server, back, refuses the rejoin as
/// RATE_LIMITED, and an approver approves the chunk. The gateway stops during
/// the pause: the stop path waits the pause out and writes the approved chunk and the leave,
/// but never the rejoin that was to be made again after the pause, so the server gets text
/// from a participant not in the session (README "One naming the participant's `session.join`
/// (or its rejoin after a reconnect) ... goes again after the pause, ahead of what waits";
/// "a stop waits out a pause ... to send what the participant still holds"; pvp-spec 6.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_refused_then_a_stop_during_the_pause_still_rejoins_first() {
    let asked: Arc<Mutex<Value>> = Arc::default();
    let a = asked.clone();
    let refused = std::sync::atomic::AtomicBool::new(false);
    let (url, log) = server_on(Box::new(move |conn, v| {
        let kind = v["type"].as_str().unwrap_or("");
        match (conn, kind) {
            // The server restarts once asked about the chunk.
            (0, "gate.request") => {
                *a.lock().unwrap() = v["id"].clone();
                (true, vec![], true)
            }
            // Back, it refuses the first rejoin for the rate, and an approver (who saw the request
            // before the restart) approves the chunk.
            (1, "session.join") if !refused.swap(true, std::sync::atomic::Ordering::SeqCst) => {
                let gate = a.lock().unwrap().clone();
                let approve = json!({"v": 1, "id": fresh_id(),
                    "ts": "2026-11-25T00:00:00.000Z", "session": "s", "sender": "approver-1",
                    "type": "gate.approve", "ref": gate,
                    "payload": {"gate": gate, "approver": "approver-1"}});
                (false, vec![rate_limited(&v["id"]), approve], false)
            }
            _ => (true, vec![], false),
        }
    }))
    .await;
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(30),
        }),
        ..config(url)
    };
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000d003@127.0.0.1:40203";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Please approve me."));
    ws.send(talk.leave(p));
    wait_until(
        "the request asked again on the second connection",
        &log,
        || {
            frames(&log, p, "gate.request")
                .iter()
                .any(|(_, c, _)| *c == 1)
        },
    )
    .await;
    // The gateway stops (within the 500 ms pause).
    let stats = ws.close(Duration::from_secs(5)).await;
    let on_second: Vec<String> = {
        let l = log.lock().unwrap();
        l.iter()
            .filter(|(v, ok)| *ok && v["conn"] == 1 && v["sender"] == p)
            .filter_map(|(v, _)| match v["type"].as_str().unwrap() {
                "session.join" => Some("join".to_owned()),
                "session.leave" => Some("leave".to_owned()),
                "context.add" => Some(v["payload"]["content"].as_str().unwrap().to_owned()),
                _ => None,
            })
            .collect()
    };
    // The chunk is there if its approval was read before the stop (else it was dropped as
    // undecided): either way the join comes first.
    let without_chunk: Vec<&str> = on_second
        .iter()
        .map(String::as_str)
        .filter(|s| *s != "Please approve me.")
        .collect();
    assert_eq!(
        (on_second.first().map(String::as_str), without_chunk),
        (Some("join"), vec!["join", "leave"]),
        "what the restarted server took; {stats:?}; all: {:?}",
        log.lock().unwrap()
    );
}

/// pvp-spec 19.1: "The server SHOULD replay missed messages on reconnection". A server that
/// refused the join as RATE_LIMITED just as the connection dropped replays that refusal on the
/// new connection, after the participant's rejoin (a fresh id) was taken. The refusal names the
/// old connection's join, which the rejoin already stands for, yet the connection puts that
/// old join in its outbox and sends it again after the pause: the participant joins twice on
/// the new connection, the second time under an id the server saw before (README "joins again
/// after a reconnect"; "The same error envelope read again ... is acted on once").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_refusal_of_the_old_connections_join_does_not_join_again() {
    let first: Arc<Mutex<Value>> = Arc::default();
    let f = first.clone();
    let replayed = std::sync::atomic::AtomicBool::new(false);
    let (url, log) = server_on(Box::new(move |conn, v| {
        match (conn, v["type"].as_str().unwrap_or("")) {
            // Refused for the rate, and the connection drops before the error is written.
            (0, "session.join") => {
                *f.lock().unwrap() = v["id"].clone();
                (false, vec![], true)
            }
            // The rejoin taken; the missed error replayed.
            (1, "session.join") if !replayed.swap(true, std::sync::atomic::Ordering::SeqCst) => {
                let old = f.lock().unwrap().clone();
                (true, vec![rate_limited(&old)], false)
            }
            _ => (true, vec![], false),
        }
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000d004@127.0.0.1:40204";
    ws.send(talk.join(p));
    wait_until("the rejoin", &log, || {
        frames(&log, p, "session.join")
            .iter()
            .any(|(_, c, _)| *c == 1)
    })
    .await;
    // Taken from the queue only after the pause (if any) and whatever the outbox held.
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    let joins = frames(&log, p, "session.join");
    assert_eq!(
        taken(&log, p),
        ["join", "Hello.", "leave"],
        "joins read by the server (id, connection, taken): {joins:?}; {stats:?}"
    );
}
