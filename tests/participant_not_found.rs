//! PARTICIPANT_NOT_FOUND (pvp-spec 17: "Participant not in session") from a PVP server that
//! has forgotten a participant (a session member it expired, a restart behind a proxy that
//! kept the connection): the connection joins again after a pause and sends the text the
//! server refused after the rejoin (README "Delivery to a PVP server"). Until session 38 the
//! error was only logged, and everything the participant said after it was refused, unread by
//! anyone, for as long as the connection lived. The real `WsSink` against a real WebSocket
//! server on 127.0.0.1. With gates asked again after the rejoin, and a join waiting to go again
//! stood for by it (a review of the fix, session 38).

#[path = "common/ws_rate.rs"]
mod ws_rate;
use ws_rate::*;

fn not_found(related: Option<&Value>) -> Value {
    let mut payload = json!({"code": "PARTICIPANT_NOT_FOUND", "message": "who?",
        "recoverable": true});
    if let Some(r) = related {
        payload["related_to"] = r.clone();
    }
    from_server("error", payload)
}

/// A server that forgets the participant after its join: it refuses every envelope until a
/// second join. The refused text goes again after the rejoin, once, in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_text_goes_again_after_a_rejoin() {
    let j = std::sync::atomic::AtomicU32::new(0);
    let (url, log) = server(Box::new(move |v| {
        use std::sync::atomic::Ordering::SeqCst;
        match v["type"].as_str().unwrap_or("") {
            "session.join" => {
                j.fetch_add(1, SeqCst);
                (true, vec![])
            }
            // Forgotten between the first join and the second.
            _ if j.load(SeqCst) == 1 => (false, vec![not_found(Some(&v["id"]))]),
            _ => (true, vec![]),
        }
    }))
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000f001@127.0.0.1:40401";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Hello."));
    wait_until("the text taken", &log, || {
        taken(&log, p).iter().any(|s| s == "Hello.")
    })
    .await;
    ws.send(talk.add(p, "Still here."));
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        taken(&log, p),
        ["join", "join", "Hello.", "Still here.", "leave"],
        "what the server took from {p}; {stats:?}"
    );
    // The rejoin carries the join's content under a fresh id, on the same connection.
    let joins = frames(&log, p, "session.join");
    assert_eq!(joins.len(), 2, "{joins:?}");
    assert_ne!(joins[0].0, joins[1].0);
    assert_eq!((joins[0].1, joins[1].1), (0, 0), "no reconnect: {joins:?}");
    assert_eq!(metrics.rejoined_not_found.get(), 1);
    // The rejoin is the connection's own, not counted; the text refused once is counted once.
    assert_eq!((stats.sent, stats.dropped), (4, 0));
}

/// The same error read again (a server replaying its history, pvp-spec 19.1) is acted on
/// once, and one that names no envelope still makes the connection join again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_naming_nothing_rejoins_once_however_often_it_is_read() {
    let j = std::sync::atomic::AtomicU32::new(0);
    let error = not_found(None);
    let (url, log) = server(Box::new(move |v| {
        use std::sync::atomic::Ordering::SeqCst;
        match v["type"].as_str().unwrap_or("") {
            // The server forgets the participant at once, and says so twice.
            "session.join" if j.fetch_add(1, SeqCst) == 0 => {
                (true, vec![error.clone(), error.clone()])
            }
            _ => (true, vec![]),
        }
    }))
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000f002@127.0.0.1:40402";
    ws.send(talk.join(p));
    wait_until("the rejoin", &log, || {
        frames(&log, p, "session.join").len() == 2
    })
    .await;
    ws.send(talk.add(p, "Hello."));
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        taken(&log, p),
        ["join", "join", "Hello.", "leave"],
        "what the server took from {p}; {stats:?}"
    );
    assert_eq!(metrics.rejoined_not_found.get(), 1);
    assert_eq!((stats.sent, stats.dropped), (3, 0));
}

/// A server that refuses the participant's join as PARTICIPANT_NOT_FOUND (and all after it):
/// the refused join is not sent again beside the rejoin (one join goes after the pause, not
/// two), and the text refused with it follows the rejoin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_join_is_stood_for_by_the_rejoin() {
    let j = std::sync::atomic::AtomicU32::new(0);
    let (url, log) = server(Box::new(move |v| {
        use std::sync::atomic::Ordering::SeqCst;
        match v["type"].as_str().unwrap_or("") {
            "session.join" if j.fetch_add(1, SeqCst) == 0 => {
                (false, vec![not_found(Some(&v["id"]))])
            }
            "session.join" => (true, vec![]),
            // Nor anything else until it is joined.
            _ if j.load(SeqCst) == 1 => (false, vec![not_found(Some(&v["id"]))]),
            _ => (true, vec![]),
        }
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000f003@127.0.0.1:40403";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    assert_eq!(
        taken(&log, p),
        ["join", "Hello.", "leave"],
        "what the server took from {p}; {stats:?}"
    );
    assert_eq!(frames(&log, p, "session.join").len(), 2);
}

fn approve(request: &Value) -> Value {
    json!({"v": 1, "id": fresh_id(), "ts": "2026-11-25T00:00:00.000Z", "session": "s",
        "sender": "approver-1", "type": "gate.approve", "ref": request["id"],
        "payload": {"gate": request["id"], "approver": "approver-1"}})
}

/// With `--gate-transcripts`, a server restarted behind a proxy that kept the connection (the
/// case the README gives for PARTICIPANT_NOT_FOUND) has lost the gates the participant asked
/// for before it forgot the participant: no decision can come for them. A reconnect asks
/// them again after its rejoin (README "Gated transcripts": "a server that restarted has lost
/// its gates"); the rejoin after PARTICIPANT_NOT_FOUND did not, and the chunk waited out
/// `--gate-timeout-s` + 5 s unasked, holding the chunks behind it, and was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_awaiting_approval_are_asked_again_after_a_rejoin() {
    use std::sync::atomic::Ordering::SeqCst;
    let joins = std::sync::atomic::AtomicU32::new(0);
    let requests = std::sync::atomic::AtomicU32::new(0);
    let (url, log) = server(Box::new(move |v| match v["type"].as_str().unwrap_or("") {
        "session.join" => {
            joins.fetch_add(1, SeqCst);
            (true, vec![])
        }
        // Taken before the restart, and lost with it: no decision.
        "gate.request" if requests.fetch_add(1, SeqCst) == 0 => (true, vec![]),
        // The restarted server does not know the participant until it joins again.
        _ if joins.load(SeqCst) == 1 => (false, vec![not_found(Some(&v["id"]))]),
        "gate.request" => (true, vec![approve(v)]),
        _ => (true, vec![]),
    }))
    .await;
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(2),
        }),
        ..config(url)
    };
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000e001@127.0.0.1:40501";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "One."));
    wait_until("the first request", &log, || {
        taken(&log, p).iter().any(|s| s == "gate.request")
    })
    .await;
    ws.send(talk.add(p, "Two."));
    // Either both chunks are added, or the first one's gate runs out (2 s + 5 s) and it is
    // dropped.
    wait_until("the chunks added or dropped", &log, || {
        taken(&log, p).iter().any(|s| s == "Two.") || metrics.gates_refused.get() > 0
    })
    .await;
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_secs(5)).await;
    let texts: Vec<String> = taken(&log, p)
        .into_iter()
        .filter(|s| s.ends_with('.'))
        .collect();
    assert_eq!(
        texts,
        ["One.", "Two."],
        "chunks dropped by the gate: {}; {:?}; {stats:?}",
        metrics.gates_refused.get(),
        taken(&log, p)
    );
    assert_eq!(metrics.gates_refused.get(), 0);
    assert_eq!(metrics.rejoined_not_found.get(), 1);
    assert_eq!(frames(&log, p, "session.join").len(), 2);
}

/// A join refused as RATE_LIMITED waits in the outbox to go again after the pause; a
/// PARTICIPANT_NOT_FOUND read during that pause makes the connection rejoin after it. The
/// rejoin stands for the refused join (as after a reconnect): the old join, written after the
/// rejoin as well, joined the participant twice on one connection, the second time under an
/// id the server had already refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_waiting_to_go_again_is_stood_for_by_the_rejoin() {
    use std::sync::atomic::Ordering::SeqCst;
    let joins = std::sync::atomic::AtomicU32::new(0);
    let (url, log) = server(Box::new(move |v| match v["type"].as_str().unwrap_or("") {
        "session.join" if joins.fetch_add(1, SeqCst) == 0 => {
            (false, vec![rate_limited(&v["id"]), not_found(None)])
        }
        // Nor anything else until it is joined.
        "session.join" => (true, vec![]),
        _ if joins.load(SeqCst) == 1 => (false, vec![not_found(Some(&v["id"]))]),
        _ => (true, vec![]),
    }))
    .await;
    let cfg = config(url);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000e002@127.0.0.1:40502";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    assert_eq!(
        taken(&log, p),
        ["join", "Hello.", "leave"],
        "what the server took from {p}; {stats:?}"
    );
    assert_eq!(frames(&log, p, "session.join").len(), 2);
    assert_eq!(metrics.rejoined_not_found.get(), 1);
    assert_eq!(stats.dropped, 0);
}
