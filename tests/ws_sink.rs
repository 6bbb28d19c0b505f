//! The WebSocket sink's delivery order, its spool and its gates across a participant's leave
//! and return, a full queue and a reconnect, against a real WebSocket server on 127.0.0.1 and
//! a real spool directory.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use pvp_t140::metrics::SinkMetrics;
use pvp_t140::pvp::{Builder, Envelope, Kind, SenderId};
use pvp_t140::sink::spool::Spool;
use pvp_t140::sink::ws::{WsConfig, WsSink};
use pvp_t140::time::Time;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// Every text frame any connection sent, in the order the server read them, with the
/// connection's number (accept order).
type Log = Arc<Mutex<Vec<(usize, Value)>>>;

/// What a test server does after recording a frame from connection `conn`.
enum Answer {
    Nothing,
    /// Closes the connection (the server goes down).
    Close,
    Send(Value),
}

/// A WebSocket server on `listener` that records every text frame. The handshake of the
/// connections numbered in `slow` is answered only after `delay` (a server busy after a
/// restart, with many clients reconnecting at once, answers handshakes in no set order).
fn serve(listener: tokio::net::TcpListener, slow: &'static [usize], delay: Duration) -> Log {
    serve_answering(listener, slow, delay, |_, _| Answer::Nothing)
}

/// [`serve`], answering each frame as `answer` says.
fn serve_answering(
    listener: tokio::net::TcpListener,
    slow: &'static [usize],
    delay: Duration,
    answer: fn(usize, &Value) -> Answer,
) -> Log {
    let log: Log = Arc::default();
    let out = log.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let (conn, log) = (n, out.clone());
            n += 1;
            tokio::spawn(async move {
                if slow.contains(&conn) {
                    tokio::time::sleep(delay).await;
                }
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                        continue;
                    };
                    let reply = answer(conn, &v);
                    log.lock().unwrap().push((conn, v));
                    match reply {
                        Answer::Nothing => {}
                        Answer::Close => {
                            let _ = ws.close(None).await;
                            return;
                        }
                        Answer::Send(v) => {
                            let text = tokio_tungstenite::tungstenite::Message::text(v.to_string());
                            let _ = ws.send(text).await;
                        }
                    }
                }
            });
        }
    });
    log
}

fn config(url: String, queue: usize, spool: Option<Arc<Spool>>) -> WsConfig {
    WsConfig {
        url,
        session: "s".into(),
        heartbeat: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        silence: Duration::from_secs(90),
        queue,
        metrics: SinkMetrics::default(),
        tls: None,
        spool,
        gate: None,
    }
}

struct Talk {
    b: Builder,
    t: u64,
}

impl Talk {
    fn new() -> Self {
        Talk {
            b: Builder::new("s".into(), None, 7),
            t: 1_700_000_000_000,
        }
    }
    fn env(&mut self, who: &str, kind: Kind, payload: Value) -> Envelope {
        self.t += 1;
        self.b.envelope(
            Time::from_millis(self.t),
            SenderId::from(who),
            kind,
            &payload,
        )
    }
    fn join(&mut self, who: &str) -> Envelope {
        self.env(
            who,
            Kind::SessionJoin,
            json!({"participant": {"id": who, "name": who, "type": "human",
                "roles": ["navigator"], "transport": "t140"}, "supported_versions": [1]}),
        )
    }
    fn add(&mut self, who: &str, text: &str) -> Envelope {
        self.env(
            who,
            Kind::ContextAdd,
            json!({"key": format!("k-{text}"), "content_type": "audio_transcript", "content": text}),
        )
    }
    fn leave(&mut self, who: &str) -> Envelope {
        self.env(who, Kind::SessionLeave, json!({"reason": "stream timeout"}))
    }
}

/// What the server got from `who`, heartbeats left out: "join", "leave", or the text added.
fn said(log: &Log, who: &str) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| v["sender"] == who)
        .filter_map(|(_, v)| match v["type"].as_str().unwrap() {
            "session.join" => Some("join".to_owned()),
            "session.leave" => Some("leave".to_owned()),
            "context.add" => Some(v["payload"]["content"].as_str().unwrap().to_owned()),
            _ => None,
        })
        .collect()
}

async fn wait_for(log: &Log, what: &str, pred: impl Fn(&Log) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !pred(log) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A stream that goes silent past --stream-timeout-s leaves; when the same sender (same SSRC
/// and address, so the same participant id) speaks again it joins again. The sink opens a
/// second connection for the new join while the first one still has the old stream's text and
/// leave to deliver, and nothing orders the two: whichever connects first writes first. Here
/// the first connection's handshake is slow, so the server sees the new join and the new text,
/// then the old text, then the old leave, which leaves the participant that is now talking.
/// pvp-spec 19.5 (1): per-sender FIFO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_that_leaves_and_joins_again_keeps_its_order() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log = serve(listener, &[0], Duration::from_millis(500));
    let mut ws = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000abcd@127.0.0.1:40000";
    // The old stream: joined, said something, timed out.
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Old sentence."));
    ws.send(talk.leave(p));
    // The same sender again, a moment later.
    tokio::time::sleep(Duration::from_millis(50)).await;
    ws.send(talk.join(p));
    ws.send(talk.add(p, "New sentence."));
    wait_for(&log, "both joins and the text", |l| said(l, p).len() == 5).await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!((stats.sent, stats.dropped), (5, 0));
    assert_eq!(
        said(&log, p),
        ["join", "Old sentence.", "leave", "join", "New sentence."],
        "per-sender FIFO across the leave and the rejoin"
    );
}

/// `--spool`: an envelope the sink drops because the participant's connection queue is full
/// (a server that was down for a while) is journaled (`added`) but never marked, so the
/// journal keeps it as undelivered for ever and a restart sends it, after the text that came
/// later and after the participant's leave were delivered: per-sender FIFO (pvp-spec 19.5)
/// is broken across the restart, and the participant, long gone, joins and leaves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelopes_dropped_for_a_full_queue_are_not_resent_out_of_order_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-review-spool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A port with nothing listening yet: the server is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let (spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    assert!(resend.is_empty());
    let spool = Arc::new(spool);
    let mut ws = WsSink::new(config(url, 4, Some(spool.clone())));
    let mut talk = Talk::new();
    let p = "t140:00001234@127.0.0.1:40002";
    ws.send(talk.join(p));
    for i in 0..10 {
        ws.send(talk.add(p, &format!("Said during the outage, {i}.")));
    }
    // The server comes back; the participant's queued text goes out, then what it says next,
    // then its leave.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let log = serve(listener, &[], Duration::ZERO);
    wait_for(&log, "the queued text", |l| said(l, p).len() >= 2).await;
    ws.send(talk.add(p, "Said after the outage."));
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert!(stats.dropped > 0, "some were dropped: {stats:?}");
    let delivered = said(&log, p);
    drop(spool);
    // A restart (a clean stop before it: everything the sink still had was delivered).
    let (_spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    let again: Vec<String> = resend
        .iter()
        .map(|e| {
            let m = e.to_message();
            format!("{} {}", m.kind, m.payload["content"].as_str().unwrap_or(""))
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        again.is_empty(),
        "after delivering {delivered:?} (the participant left), a restart sends {again:?}"
    );
}

/// `--gate-transcripts`: a chunk held for approval when the connection drops (the server
/// restarts: its gates are gone with it) is offered again on the new connection, after the
/// rejoin, so the approval can come and the chunk is delivered. (It used to be offered once:
/// no approval could come, and it was dropped as timed out, accepted text lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_awaiting_approval_is_offered_again_after_a_reconnect() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log = serve_answering(listener, &[], Duration::ZERO, |conn, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        // The first server goes down once the chunk's gate is requested; the second approves
        // what it is asked.
        if conn == 0 {
            return Answer::Close;
        }
        let gate = &v["id"];
        Answer::Send(json!({
            "v": 1, "id": "01JQAAAAAAAAAAAAAAAAAAAAAA",
            "ts": "2026-11-25T00:00:00.000Z", "session": "s",
            "sender": "approver", "type": "gate.approve",
            "ref": gate, "payload": {"gate": gate, "approver": "approver"},
        }))
    });
    let mut cfg = config(url, 64, None);
    cfg.gate = Some(pvp_t140::sink::gate::GateConfig {
        quorum: 1,
        timeout: Duration::from_secs(60),
    });
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000ca7e@127.0.0.1:40004";
    ws.send(talk.join(p));
    let add = talk.add(p, "Held for approval.");
    let add_id = add.id().to_string();
    ws.send(add);
    // Approved on the second connection, the chunk is delivered there, after the rejoin and
    // the request made again.
    wait_for(&log, "the held chunk, delivered", |l| {
        l.lock()
            .unwrap()
            .iter()
            .any(|(c, v)| *c == 1 && v["type"] == "context.add")
    })
    .await;
    let second: Vec<(String, String)> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| *c == 1)
        .map(|(_, v)| {
            let about = v["payload"]["action_ref"]
                .as_str()
                .or(v["payload"]["content"].as_str())
                .unwrap_or("")
                .to_owned();
            (v["type"].as_str().unwrap().to_owned(), about)
        })
        .collect();
    assert_eq!(
        second,
        [
            ("session.join".to_owned(), String::new()),
            ("gate.request".to_owned(), add_id),
            ("context.add".to_owned(), "Held for approval.".to_owned()),
        ]
    );
    // Everything settled: the request is not one of the queue's envelopes, the chunk is.
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!((stats.sent, stats.dropped), (3, 0));
}

/// At the end of a run whose server is down, what the connections still hold when the grace
/// ends is lost (without --spool), and counted as dropped, as the stdout sink counts what it
/// could not write in the grace. (It used to be counted nowhere: `stopped sent=0 dropped=0`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_still_queued_when_the_grace_ends_counts_as_dropped() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut ws = WsSink::new(config(format!("ws://127.0.0.1:{port}"), 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000dead@127.0.0.1:40006";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Never delivered."));
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_millis(300)).await;
    assert_eq!((stats.sent, stats.dropped), (0, 3), "{stats:?}");
}
