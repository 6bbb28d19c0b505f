//! PARTICIPANT_NOT_FOUND (pvp-spec 17: "Participant not in session") from a PVP server that
//! has forgotten a participant (a session member it expired, a restart behind a proxy that
//! kept the connection): the connection joins again after a pause and sends the text the
//! server refused after the rejoin (README "Delivery to a PVP server"). Until session 38 the
//! error was only logged, and everything the participant said after it was refused, unread by
//! anyone, for as long as the connection lived. The real `WsSink` against a real WebSocket
//! server on 127.0.0.1.

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
