//! RATE_LIMITED for a participant's `participant.announce` (its new name: sent again after the
//! pause, in its place, unless a later announce or a rejoin carries the name), and what a
//! refused heartbeat, pong or older rejoin is logged as (nothing lost; review e, session 37).
//! The real `WsSink` against a real WebSocket server on 127.0.0.1.

#[path = "common/ws_rate.rs"]
mod ws_rate;
use ws_rate::*;
fn announce(talk: &mut Talk, who: &str, name: &str) -> Envelope {
    talk.env(
        who,
        Kind::ParticipantAnnounce,
        json!({"id": who, "name": name, "type": "human", "roles": ["navigator"],
            "transport": "t140"}),
    )
}

/// README "Delivery to a PVP server": a participant "joins again after a reconnect (under the
/// name its last `participant.announce` gave, say an RTCP NAME learnt after the first join)";
/// "One naming the participant's `session.join` ... was not taken either: it goes again after
/// the pause, ahead of what waits". A `participant.announce` (the name learnt from RTCP) that
/// the server refuses as RATE_LIMITED was not taken (pvp-spec 17: an error for a rejected
/// operation), but it is never sent again: the server keeps the old name for as long as the
/// connection lives. It should go again after the pause, in its place (before the text that
/// followed it, which the rate-limited server refused too), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announce_refused_as_rate_limited_is_sent_again_before_the_text_after_it() {
    use std::sync::atomic::Ordering::SeqCst;
    // 0: nothing refused yet; 1: the first announce refused, and the participant rate-limited
    // until it announces again; 2: taken again.
    let state = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let s = state.clone();
    let (url, log) = server(Box::new(move |v| {
        let kind = v["type"].as_str().unwrap_or("");
        match (s.load(SeqCst), kind) {
            (0, "participant.announce") => {
                s.store(1, SeqCst);
                (false, vec![rate_limited(&v["id"])])
            }
            (1, "participant.announce") => {
                s.store(2, SeqCst);
                (true, vec![])
            }
            (1, "heartbeat.ping" | "heartbeat.pong") => (true, vec![]),
            (1, _) => (false, vec![rate_limited(&v["id"])]),
            _ => (true, vec![]),
        }
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000e001@127.0.0.1:40301";
    ws.send(talk.join(p));
    ws.send(announce(&mut talk, p, "Alice"));
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    let announces = frames(&log, p, "participant.announce");
    assert_eq!(
        taken(&log, p),
        ["join", "announce:Alice", "Hello.", "leave"],
        "announces read by the server (id, connection, taken): {announces:?}; {stats:?}"
    );
    // The same announce (one id), read twice: refused, then taken.
    assert_eq!(announces.len(), 2, "{announces:?}");
    assert_eq!(announces[0].0, announces[1].0, "{announces:?}");
    assert_eq!((stats.sent, stats.dropped), (4, 0));
}

/// The refused announce is not sent again once a later one has been written (it carries the
/// newer name: sending the older one again would set the participant's name back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announce_refused_after_a_later_one_was_written_is_not_sent_again() {
    let first: Arc<Mutex<Value>> = Arc::default();
    let f = first.clone();
    let (url, log) = server(Box::new(move |v| {
        if v["type"] != "participant.announce" {
            return (true, vec![]);
        }
        let mut f = f.lock().unwrap();
        if f.is_null() {
            // Refused, the error sent only once the next announce is read.
            *f = v["id"].clone();
            return (false, vec![]);
        }
        (true, vec![rate_limited(&f)])
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000e002@127.0.0.1:40302";
    ws.send(talk.join(p));
    ws.send(announce(&mut talk, p, "Alice"));
    ws.send(announce(&mut talk, p, "Alice Smith"));
    wait_until("the second announce", &log, || {
        frames(&log, p, "participant.announce").len() >= 2
    })
    .await;
    // Taken from the queue after the pause and whatever the outbox held.
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    let announces = frames(&log, p, "participant.announce");
    assert_eq!(
        taken(&log, p),
        ["join", "announce:Alice Smith", "Hello.", "leave"],
        "announces read by the server (id, connection, taken): {announces:?}; {stats:?}"
    );
    assert_eq!(announces.len(), 2, "{announces:?}");
}

/// The refused announce is not sent again once a rejoin (which carries the name it announced,
/// `join_as_announced`) stands for it: a server replaying, on the new connection, its refusal
/// of the old connection's announce (pvp-spec 19.1) does not make the participant announce
/// again under an id the server already read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_refusal_of_an_announce_after_the_rejoin_does_not_announce_again() {
    let first: Arc<Mutex<Value>> = Arc::default();
    let f = first.clone();
    let replayed = std::sync::atomic::AtomicBool::new(false);
    let (url, log) = server_on(Box::new(move |conn, v| {
        match (conn, v["type"].as_str().unwrap_or("")) {
            // Refused for the rate, and the connection drops before the error is written.
            (0, "participant.announce") => {
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
    let p = "t140:0000e003@127.0.0.1:40303";
    ws.send(talk.join(p));
    ws.send(announce(&mut talk, p, "Alice"));
    wait_until("the rejoin", &log, || {
        frames(&log, p, "session.join")
            .iter()
            .any(|(_, c, _)| *c == 1)
    })
    .await;
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    let announces = frames(&log, p, "participant.announce");
    assert_eq!(announces.len(), 1, "{announces:?}; {stats:?}");
    let rejoin_name = log
        .lock()
        .unwrap()
        .iter()
        .find(|(v, _)| v["type"] == "session.join" && v["conn"] == 1)
        .map(|(v, _)| v["payload"]["participant"]["name"].clone());
    assert_eq!(rejoin_name, Some(json!("Alice")));
}

/// Log lines, as the `tracing` subscriber of this test binary writes them.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let b = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Writer(b.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buf
    })
    .clone()
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A server that refuses a heartbeat (the connection's own `heartbeat.ping`, or its pong to
/// the server's ping) as RATE_LIMITED gets it logged at warn level as "an envelope not among
/// the last 64 written: if it was text, it is lost": the connection wrote it moments ago and
/// knows it was a heartbeat, which is not sent again and loses nothing. The operator is told
/// text may have been lost when none was (README "Delivery to a PVP server": only one not
/// among the last 64 envelopes written "cannot be told for text").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_heartbeat_or_pong_is_not_said_to_be_maybe_lost_text() {
    let logs = logs();
    let ping_sent = std::sync::atomic::AtomicBool::new(false);
    let (url, log) = server(Box::new(move |v| match v["type"].as_str().unwrap_or("") {
        "heartbeat.ping" | "heartbeat.pong" => (false, vec![rate_limited(&v["id"])]),
        // The server pings once, after the join.
        "session.join" if !ping_sent.swap(true, std::sync::atomic::Ordering::SeqCst) => {
            (true, vec![from_server("heartbeat.ping", json!({}))])
        }
        _ => (true, vec![]),
    }))
    .await;
    let cfg = WsConfig {
        heartbeat: Duration::from_millis(300),
        ..config(url)
    };
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000e004@127.0.0.1:40304";
    ws.send(talk.join(p));
    let lines_about = |id: &str| -> Vec<String> {
        String::from_utf8_lossy(&logs.lock().unwrap())
            .lines()
            .filter(|l| l.contains(id) && l.contains("refused as RATE_LIMITED"))
            .map(str::to_owned)
            .collect()
    };
    // A pong and a ping refused, and their refusals acted on.
    let ids = |kind: &str| -> Vec<String> {
        frames(&log, p, kind)
            .into_iter()
            .map(|(id, ..)| id)
            .collect()
    };
    wait_until("a refused pong and ping logged", &log, || {
        let told = |kind: &str| ids(kind).iter().any(|id| !lines_about(id).is_empty());
        told("heartbeat.pong") && told("heartbeat.ping")
    })
    .await;
    let _ = ws.close(Duration::from_secs(1)).await;
    let lines: Vec<String> = ids("heartbeat.pong")
        .iter()
        .chain(ids("heartbeat.ping").iter())
        .flat_map(|id| lines_about(id))
        .collect();
    assert!(
        lines.iter().all(|l| !l.contains("if it was text")),
        "{lines:#?}"
    );
}

/// An announce refused as RATE_LIMITED waits in the outbox for the pause; the connection drops
/// during it (the server closes right after the error). The rejoin carries the announced name
/// and stands for the announce: it is not sent again on the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announce_refused_then_a_reconnect_during_the_pause_is_carried_by_the_rejoin() {
    let refused = std::sync::atomic::AtomicBool::new(false);
    let (url, log) = server_on(Box::new(move |_conn, v| {
        if v["type"] == "participant.announce"
            && !refused.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            // Refused for the rate, and the server goes away.
            return (false, vec![rate_limited(&v["id"])], true);
        }
        (true, vec![], false)
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000e005@127.0.0.1:40305";
    ws.send(talk.join(p));
    ws.send(announce(&mut talk, p, "Alice"));
    wait_until("the rejoin", &log, || {
        frames(&log, p, "session.join")
            .iter()
            .any(|(_, c, _)| *c == 1)
    })
    .await;
    ws.send(talk.add(p, "Hello."));
    let stats = leave_once_taken(ws, &mut talk, &log, p, "Hello.").await;
    let announces = frames(&log, p, "participant.announce");
    assert_eq!(announces.len(), 1, "{announces:?}; {stats:?}");
    let on_second: Vec<Value> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(v, ok)| *ok && v["conn"] == 1 && v["sender"] == p)
        .map(|(v, _)| v["type"].clone())
        .collect();
    assert_eq!(
        on_second,
        [
            json!("session.join"),
            json!("context.add"),
            json!("session.leave")
        ]
    );
    let rejoin_name = log
        .lock()
        .unwrap()
        .iter()
        .find(|(v, _)| v["type"] == "session.join" && v["conn"] == 1)
        .map(|(v, _)| v["payload"]["participant"]["name"].clone());
    assert_eq!(rejoin_name, Some(json!("Alice")));
}

/// A server that refused a rejoin as the connection dropped replays that refusal on the next
/// connection (pvp-spec 19.1), after the newer rejoin was taken. The gateway wrote that rejoin
/// itself moments ago, and the newer one stands for it, yet the refusal is logged at warn level
/// as naming "an envelope not among the last 64 written: if it was text, it is lost": the
/// operator is told text may be lost when none was (README "Delivery to a PVP server").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_refusal_of_an_older_rejoin_is_not_said_to_be_maybe_lost_text() {
    let logs = logs();
    let refused: Arc<Mutex<Value>> = Arc::default();
    let r = refused.clone();
    let (url, log) = server_on(Box::new(move |conn, v| {
        match (conn, v["type"].as_str().unwrap_or("")) {
            // The first connection drops once it has the join.
            (0, "session.join") => (true, vec![], true),
            // The rejoin refused for the rate, and the connection drops before the error.
            (1, "session.join") => {
                *r.lock().unwrap() = v["id"].clone();
                (false, vec![], true)
            }
            // The next rejoin taken; the missed error replayed.
            (2, "session.join") => {
                let old = r.lock().unwrap().clone();
                (true, vec![rate_limited(&old)], false)
            }
            _ => (true, vec![], false),
        }
    }))
    .await;
    let mut ws = WsSink::new(config(url));
    let mut talk = Talk::new();
    let p = "t140:0000e006@127.0.0.1:40306";
    ws.send(talk.join(p));
    let old = || refused.lock().unwrap().as_str().unwrap_or("-").to_owned();
    let lines_about = |id: &str| -> Vec<String> {
        String::from_utf8_lossy(&logs.lock().unwrap())
            .lines()
            .filter(|l| l.contains(id) && l.contains("refused as RATE_LIMITED"))
            .map(str::to_owned)
            .collect()
    };
    wait_until("the replayed refusal acted on", &log, || {
        old() != "-" && !lines_about(&old()).is_empty()
    })
    .await;
    ws.send(talk.add(p, "Hello."));
    let deadline = tokio::time::Instant::now() + WAIT;
    while !taken(&log, p).iter().any(|s| s == "Hello.") {
        if tokio::time::Instant::now() > deadline {
            let all = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
            let mine: Vec<&str> = all.lines().filter(|l| l.contains(p)).collect();
            panic!("text not taken: {mine:#?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ws.send(talk.leave(p));
    let _ = ws.close(Duration::from_secs(5)).await;
    let lines = lines_about(&old());
    assert!(
        lines.iter().all(|l| !l.contains("if it was text")),
        "{lines:#?}"
    );
    // Joined once on each connection.
    let joins: Vec<u64> = frames(&log, p, "session.join")
        .iter()
        .map(|(_, c, _)| *c)
        .collect();
    assert_eq!(joins, [0, 1, 2]);
}
