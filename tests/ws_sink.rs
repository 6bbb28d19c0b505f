//! The WebSocket sink's delivery order, its spool and its gates across a participant's leave
//! and return, a full queue and a reconnect, and the connection's life (close handling,
//! reconnects and their backoff, frames it cannot read, what it logs and counts), against a
//! real WebSocket server on 127.0.0.1 and a real spool directory.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use pvp_t140::metrics::SinkMetrics;
use pvp_t140::pvp::Kind;
use pvp_t140::sink::spool::Spool;
use pvp_t140::sink::ws::{WsConfig, WsSink};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

#[path = "common/talk.rs"]
mod talk;
use talk::Talk;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

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
    /// Sends these, in order.
    SendAll(Vec<Value>),
    /// Sends this after a pause (an approver taking a moment to decide).
    Later(Duration, Value),
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
                        Answer::SendAll(all) => {
                            for v in all {
                                let text =
                                    tokio_tungstenite::tungstenite::Message::text(v.to_string());
                                let _ = ws.send(text).await;
                            }
                        }
                        Answer::Later(pause, v) => {
                            tokio::time::sleep(pause).await;
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

/// A test server on a free port of 127.0.0.1, answering each frame as `answer` says: its URL
/// and its log.
async fn server(answer: fn(usize, &Value) -> Answer) -> (String, Log) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    (url, serve_answering(listener, &[], Duration::ZERO, answer))
}

/// [`config`] with `--gate-transcripts`: `quorum` approvals, a 60 s timeout.
fn gated(url: String, quorum: u32, spool: Option<Arc<Spool>>) -> WsConfig {
    WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum,
            timeout: Duration::from_secs(60),
        }),
        ..config(url, 64, spool)
    }
}

/// The names the server learnt (of joins and announces) before the first `context.add`, on
/// connection `conn` (every connection: `None`).
fn names_before_text(log: &Log, conn: Option<usize>) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| conn.is_none_or(|n| *c == n))
        .take_while(|(_, v)| v["type"] != "context.add")
        .filter_map(|(_, v)| match v["type"].as_str().unwrap() {
            "session.join" => Some(v["payload"]["participant"]["name"].to_string()),
            "participant.announce" => Some(v["payload"]["name"].to_string()),
            _ => None,
        })
        .collect()
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

/// Waits (up to [`WAIT`]) until `pred` holds.
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
    let (url, log) = server(|conn, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        // The first server goes down once the chunk's gate is requested; the second approves
        // what it is asked.
        if conn == 0 {
            return Answer::Close;
        }
        Answer::Send(gate_answer(
            &v["id"],
            "gate.approve",
            "01JQAAAAAAAAAAAAAAAAAAAAAA",
        ))
    })
    .await;
    let mut ws = WsSink::new(gated(url, 1, None));
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
    // Everything settled: the request is not one of the queue's envelopes, the chunk is; sent,
    // the join and the chunk (a request is not counted as sent, review z).
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!((stats.sent, stats.dropped), (2, 0));
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

/// `pvp_t140_sink_queue_depth` with the WebSocket sink reads the hand-off queue's count when
/// shown, as with stdout: the envelopes the sink task has not taken yet are in it, and gone from
/// it once taken. (Review, session 34: the gauge was set only after the task took a batch.)
#[tokio::test]
async fn the_queue_depth_gauge_shows_what_the_sink_task_has_not_taken() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = config(format!("ws://127.0.0.1:{port}"), 64, None);
    let metrics = cfg.metrics.clone();
    let (mut tx, rx) = pvp_t140::handoff::queue(100);
    let sink = pvp_t140::sink::Sink::start(
        rx,
        Some(WsSink::new(cfg)),
        metrics.clone(),
        Duration::from_millis(300),
    )
    .unwrap();
    let mut talk = Talk::new();
    let p = "t140:0000dead@127.0.0.1:40007";
    // This runtime has one thread: the sink task runs only once the test awaits.
    assert_eq!(
        tx.offer(vec![talk.join(p), talk.add(p, "Waiting."), talk.leave(p)]),
        0
    );
    assert_eq!(metrics.queue_depth.get(), 3);
    drop(tx);
    let stats = sink.finish().await.unwrap();
    assert_eq!((stats.sent, stats.dropped), (0, 3), "{stats:?}");
    assert_eq!(metrics.queue_depth.get(), 0);
}

/// A server's answer to a `gate.request`: a `gate.reject` or `gate.approve` of it.
fn gate_reply(gate: &Value, kind: &str) -> Answer {
    Answer::Send(gate_answer(gate, kind, "01JQAAAAAAAAAAAAAAAAAAAAAB"))
}

/// A `gate.approve` or `gate.reject` of `gate` from the approver "approver-1", with this id.
fn gate_answer(gate: &Value, kind: &str, id: &str) -> Value {
    json!({
        "v": 1, "id": id,
        "ts": "2026-11-25T00:00:00.000Z", "session": "s",
        "sender": "approver-1", "type": kind,
        "ref": gate, "payload": {"gate": gate, "approver": "approver-1",
            "rejector": "approver-1", "reason": "no"},
    })
}

/// What a restart on `dir`'s journal would send, as "type content".
fn resent(dir: &std::path::Path) -> Vec<String> {
    let (_spool, resend) = Spool::open(dir, Default::default()).unwrap();
    resend
        .iter()
        .map(|e| {
            let m = e.to_message();
            let about = m.payload["content"]
                .as_str()
                .or(m.payload["key"].as_str())
                .unwrap_or("");
            format!("{} {about}", m.kind)
        })
        .collect()
}

/// `--gate-transcripts` with `--spool`, stopped with SIGTERM while a chunk still awaits
/// approval: the README says that chunk is dropped ("or when the gateway stops, a pending chunk
/// is dropped"), it is logged and counted as refused (`gated_chunks_refused_total`), and the
/// participant's leave goes out after it. But the connection's shutdown path drops it without
/// marking it in the journal (unlike a reject or a timeout, `settle`), so the journal keeps it
/// as undelivered and the next start resends it: the participant, which had left, joins again
/// and asks for approval of text from before its leave, and the text counted as refused may
/// yet be added. A user expects a chunk given up on (and counted so) not to be resent: "Envelopes
/// the sink gives up on ... are marked in the journal as well, and not resent on the next start".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_dropped_unapproved_at_shutdown_is_not_resent_after_a_restart() {
    let dir =
        std::env::temp_dir().join(format!("pvp-t140-review-gate-stop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Nobody approves anything.
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let mut ws = WsSink::new(gated(url, 1, Some(spool.clone())));
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40010";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Still awaiting approval at the stop."));
    wait_for(&log, "the gate request", |l| {
        l.lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v["type"] == "gate.request")
    })
    .await;
    // The gateway stops: the stream's leave, then the sink closes.
    ws.send(talk.leave(p));
    ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        said(&log, p),
        ["join", "leave"],
        "the chunk was dropped, the leave sent"
    );
    spool.flush();
    drop(spool);
    let again = resent(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        again.is_empty(),
        "the chunk dropped (and counted refused) at the stop is resent by the next start: {again:?}"
    );
}

/// `--gate-transcripts --gate-timeout-s 86400` (the flag's largest value): at a stop a pending
/// chunk is dropped, counted, and the leave behind it goes out (README "Gated transcripts"),
/// whatever the gate's deadline. The stop forced the gates out by releasing them at "now +
/// 86,400 s", short of a deadline of the offer + timeout + 5 s of grace: a chunk offered less
/// than 5 s before the stop stayed held, the leave was never sent, and the server kept a
/// participant that was gone (pvp-spec 6.4). A review found it (review, session 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_drops_a_pending_chunk_and_sends_the_leave_whatever_the_gate_timeout() {
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let metrics = SinkMetrics::default();
    let mut ws = WsSink::new(WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(86_400),
        }),
        metrics: metrics.clone(),
        ..config(url, 64, None)
    });
    let mut talk = Talk::new();
    let p = "t140:0000b001@127.0.0.1:41000";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Awaiting an approval that never comes."));
    ws.send(talk.leave(p));
    wait_for(&log, "the gate request", |l| requests(l, p) == 1).await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        said(&log, p),
        ["join", "leave"],
        "the stop drops the pending chunk and sends the leave; {stats:?}"
    );
    assert_eq!(
        metrics.gates_refused.get(),
        1,
        "the dropped chunk is counted"
    );
}

/// The `gate.request`s the server got from `who`.
fn requests(log: &Log, who: &str) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| v["sender"] == who && v["type"] == "gate.request")
        .count()
}

/// `--gate-transcripts` with `--spool`: a chunk is rejected, then the speaker backspaces into
/// it, so the core sends a `context.update` of its key. The gate drops the correction with its
/// chunk (as the README says), but only counts it: it is never marked in the journal, so the
/// next start resends it: the participant, long gone, rejoins and sends a `context.update` of
/// an item that was never added (the server answers with an error), then leaves again. A user
/// expects nothing of a rejected chunk, its corrections included, to reach the session, then or
/// after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_of_a_rejected_chunk_is_not_resent_after_a_restart() {
    let dir =
        std::env::temp_dir().join(format!("pvp-t140-review-gate-corr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (url, log) = server(|_, v| {
        if v["type"] == "gate.request" {
            gate_reply(&v["id"], "gate.reject")
        } else {
            Answer::Nothing
        }
    })
    .await;
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let mut ws = WsSink::new(gated(url, 1, Some(spool.clone())));
    let mut talk = Talk::new();
    let p = "t140:0000c0de@127.0.0.1:40012";
    ws.send(talk.join(p));
    // `Talk::add` keys the item "k-<text>".
    let add = talk.add(p, "Rejected.");
    let add_id = add.id().to_string();
    ws.send(add);
    // The reject is applied: the chunk is marked in the journal as given up.
    let journal = dir.join("journal.ndjson");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        spool.flush();
        let text = std::fs::read_to_string(&journal).unwrap_or_default();
        if text.contains(&format!("{{\"done\":\"{add_id}\"}}")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reject never applied: {text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Then the speaker backspaces into the sentence already cut.
    ws.send(talk.env(
        p,
        Kind::ContextUpdate,
        json!({"key": "k-Rejected.", "new_content": "Rejected", "reason": "backspace"}),
    ));
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    ws.close(Duration::from_secs(5)).await;
    let updates = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| v["type"] == "context.update")
        .count();
    assert_eq!(
        (said(&log, p), updates),
        (vec!["join".to_owned(), "leave".to_owned()], 0)
    );
    spool.flush();
    drop(spool);
    let again = resent(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        again.is_empty(),
        "the correction of the rejected chunk is resent by the next start: {again:?}"
    );
}

/// `--spool` after a long outage: a participant's connection queue (4,096, as `main.rs` sets
/// it) held the most the sink keeps for it, all journaled and undelivered, when the gateway was
/// killed. The restart's resend is that plus the rejoin before and the leave after
/// (`resend_plan`), 4,098 envelopes, pushed into a fresh queue of the same 4,096 before its
/// connection can take any (here the server is still down at the restart, as after an outage):
/// the last sentence and the leave are refused as
/// "queue full" and marked done in the journal. The README promises the restart "resends ...
/// what it had journaled and not written — each participant rejoins first and leaves after";
/// the user loses the newest text the journal held, and the participant never says leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resends_everything_a_full_participant_queue_held() {
    const QUEUE: usize = 4096;
    let dir =
        std::env::temp_dir().join(format!("pvp-t140-review-spool-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let mut talk = Talk::new();
    let p = "t140:0000f00d@127.0.0.1:40014";
    // The journal of the killed gateway: the join delivered before the server went down, then
    // a full queue's worth of sentences journaled and never written.
    {
        let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
        let j = talk.join(p);
        spool.added(&j);
        spool.done(j.id());
        for i in 0..QUEUE {
            spool.added(&talk.add(p, &format!("Said during the outage, {i}.")));
        }
    }
    // The restart, as main.rs does it: the resend goes into the sink before anything else.
    let (spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    assert_eq!(resend.len(), QUEUE + 2, "rejoin, the sentences, leave");
    let spool = Arc::new(spool);
    let mut ws = WsSink::new(config(url, QUEUE, Some(spool.clone())));
    ws.resend(resend);
    // The server is back.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let log = serve(listener, &[], Duration::ZERO);
    let stats = ws.close(Duration::from_secs(20)).await;
    wait_for(&log, "every frame written", |l| {
        said(l, p).len() as u64 >= stats.sent
    })
    .await;
    let got = said(&log, p);
    let sentences = got.iter().filter(|s| s.starts_with("Said")).count();
    drop(spool);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        (sentences, got.last().map(String::as_str), stats.dropped),
        (QUEUE, Some("leave"), 0),
        "after the restart: {sentences} sentences of {QUEUE}, then {:?}; {stats:?}",
        &got[got.len().saturating_sub(2)..]
    );
}

/// A server that accepts every connection and closes it at once (one restarting behind a
/// proxy, one shedding load, one that closes on the join it will not take): the README
/// promises reconnects "with exponential backoff (the backoff doubles from 100 ms to 10 s;
/// each wait is half of it plus a random part ...)". But the backoff is reset to 100 ms as soon
/// as a handshake succeeds, and a connection the server closes is made again at once, with no
/// wait at all: each participant reconnects as fast as the handshakes go (a TCP connect, a
/// handshake, a rejoin, an info log line, each time), thousands of participants in a hot loop
/// against a server that is struggling. Six connections need at least five waits of 50 ms (the
/// least any backoff here allows, even one reset every time); here they come within a few ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_closes_every_connection_is_not_reconnected_in_a_hot_loop() {
    let (url, log) = server(|_, v| {
        if v["type"] == "session.join" {
            Answer::Close
        } else {
            Answer::Nothing
        }
    })
    .await;
    let mut ws = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000d00d@127.0.0.1:40016";
    let start = tokio::time::Instant::now();
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Hello."));
    let joins = |l: &Log| {
        l.lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v["type"] == "session.join")
            .count()
    };
    wait_for(&log, "six connections", |l| joins(l) >= 6).await;
    let took = start.elapsed();
    let so_far = joins(&log);
    ws.close(Duration::from_millis(100)).await;
    assert!(
        took >= Duration::from_millis(250),
        "six connections (five reconnects) within {took:?}; {so_far} joins by then"
    );
}

/// `--gate-transcripts`: a speaker's last sentence is still held for approval when its stream
/// ends (the sender's RTCP BYE, which `pvp-t140 send` sends as its input ends, or
/// `--stream-timeout-s`): the core hands over the chunk and the leave together. The README
/// says "anything else the participant sends (its leave) waits behind pending chunks", and a
/// chunk is dropped only when rejected, timed out (`--gate-timeout-s` plus 5 s) or when the
/// gateway stops. But the sink drops the participant's queue on its leave, and the connection
/// takes the closed queue for the gateway stopping: the chunk is dropped at once ("stopping
/// with a chunk still awaiting approval"), counted refused, and the leave goes out; the
/// approval that comes a moment later finds nothing. Every speaker that ends its stream right
/// after speaking loses its last sentences; a user expects them added once approved, then the
/// leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_awaiting_approval_when_its_participant_leaves_is_added_once_approved() {
    // The approver approves every request, after a moment.
    let (url, log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        Answer::Later(
            Duration::from_millis(300),
            gate_answer(&v["id"], "gate.approve", "01JQAAAAAAAAAAAAAAAAAAAAAC"),
        )
    })
    .await;
    let mut ws = WsSink::new(gated(url, 1, None));
    let mut talk = Talk::new();
    let p = "t140:0000b1e5@127.0.0.1:40018";
    ws.send(talk.join(p));
    // The last sentence and the stream's end, as the core hands them over after a BYE.
    ws.send(talk.add(p, "My last sentence."));
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        said(&log, p),
        ["join", "My last sentence.", "leave"],
        "the approved chunk before the leave; {stats:?}"
    );
}

/// `--gate-quorum 2`: pvp-spec 14.2's `{type: "any", count: N}` is "any N participants with
/// approve capability", and the README's request says so (`"quorum": {"type": "any", "count":
/// --gate-quorum}`). But the gate counts `gate.approve` messages, not approvers: one approver
/// approving twice (a double click, or approving again the same request the gateway offers
/// anew after a reconnect, which README says it does) meets a quorum of two, and the chunk is
/// added with one person's consent. A user who asked for two approvers expects the chunk to
/// wait for a second one. (A `heartbeat.ping` after the approvals tells when the connection
/// has read them: its pong comes after anything they released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_approver_approving_twice_does_not_meet_a_quorum_of_two() {
    let (url, log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        let gate = &v["id"];
        Answer::SendAll(vec![
            gate_answer(gate, "gate.approve", "01JQAAAAAAAAAAAAAAAAAAAAAD"),
            gate_answer(gate, "gate.approve", "01JQAAAAAAAAAAAAAAAAAAAAAE"),
            json!({"v": 1, "id": "01JQAAAAAAAAAAAAAAAAAAAAAF",
                "ts": "2026-11-25T00:00:00.000Z", "session": "s",
                "sender": "server", "type": "heartbeat.ping", "payload": {}}),
        ])
    })
    .await;
    let mut ws = WsSink::new(gated(url, 2, None));
    let mut talk = Talk::new();
    let p = "t140:0000a221@127.0.0.1:40020";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Needs two approvers."));
    wait_for_pong(&log, "the pong after the approvals").await;
    let got = said(&log, p);
    ws.close(Duration::from_millis(100)).await;
    assert_eq!(got, ["join"], "added with one approver's two approvals");
}

/// pvp-spec 4.2: implementations "MUST reject envelopes with unknown versions". A
/// `gate.approve` with `"v": 2` was acted on: the held chunk was added as approved. A user
/// expects a frame of a protocol version the gateway does not speak to change nothing (the
/// chunk keeps waiting for an approval it understands), and to find it counted. The ping
/// after it tells when the connection has read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_approval_of_an_unknown_protocol_version_is_not_acted_on() {
    let (url, log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        let mut approve = gate_answer(&v["id"], "gate.approve", "01JQAAAAAAAAAAAAAAAAAAAAV2");
        approve["v"] = json!(2);
        Answer::SendAll(vec![
            approve,
            from_server("heartbeat.ping", "01JQAAAAAAAAAAAAAAAAAAAAV3", json!({})),
        ])
    })
    .await;
    let cfg = gated(url, 1, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000b002@127.0.0.1:40078";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Approved by a version 2 envelope."));
    wait_for_pong(&log, "the pong after the approval").await;
    let got = said(&log, p);
    ws.close(Duration::from_millis(100)).await;
    assert_eq!(got, ["join"], "a v:2 gate.approve released the chunk");
    assert_eq!(metrics.server_frames_rejected.get(), 1);
}

/// Waits for the gateway's pong: a ping the server sent after other frames tells when the
/// connection has read them.
async fn wait_for_pong(log: &Log, what: &str) {
    wait_for(log, what, |l| {
        l.lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v["type"] == "heartbeat.pong")
    })
    .await;
}

/// A server's frame from "server": `kind` with `payload`.
fn from_server(kind: &str, id: &str, payload: Value) -> Value {
    json!({"v": 1, "id": id, "ts": "2026-11-25T00:00:00.000Z", "session": "s",
        "sender": "server", "type": kind, "payload": payload})
}

/// What each connection carried, as `(session, what)`, sorted: a frame's type, or the text a
/// `context.add` added. Every connection carries one session.
fn rooms(log: &Log) -> Vec<(String, Vec<String>)> {
    let conns = by_connection(log);
    let mut rooms: Vec<(String, Vec<String>)> = conns
        .values()
        .map(|frames| {
            let session = frames[0]["session"].as_str().unwrap().to_owned();
            for f in frames {
                assert_eq!(
                    f["session"],
                    session.as_str(),
                    "one connection, two sessions: {conns:?}"
                );
            }
            let said = frames
                .iter()
                .map(|f| match f["type"].as_str().unwrap() {
                    "context.add" => f["payload"]["content"].as_str().unwrap().to_owned(),
                    kind => kind.to_owned(),
                })
                .collect();
            (session, said)
        })
        .collect();
    rooms.sort();
    rooms
}

/// One of [`rooms`]' entries.
fn room<const N: usize>(session: &str, said: [&str; N]) -> (String, Vec<String>) {
    (session.to_owned(), said.map(str::to_owned).to_vec())
}

/// Every frame each connection carried, by connection number.
fn by_connection(log: &Log) -> std::collections::BTreeMap<usize, Vec<Value>> {
    let mut all = std::collections::BTreeMap::<usize, Vec<Value>>::new();
    for (conn, v) in log.lock().unwrap().iter() {
        all.entry(*conn).or_default().push(v.clone());
    }
    all
}

/// A `[[stream]]` rule's `participant` may be one id in two rules (one captioner identity in
/// two rooms), and README says one gateway feeds several sessions. A PVP server binds a
/// connection to the sender and session of its first frame (pvp-spec 19.1), but the sink
/// keyed connections by participant id alone: both sessions' joins and text went down one
/// connection, and the leave from one session closed it under the other, whose next text
/// went out on a new connection that never joined. Each (session, participant) needs its own
/// connection, carrying only its own session's frames, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_participant_id_in_two_sessions_gets_a_connection_in_each() {
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let mut ws = WsSink::new(config(url, 64, None));
    let (mut s, mut t) = (Talk::new(), Talk::in_session("t"));
    let p = "captioner";
    ws.send(s.join(p));
    ws.send(t.join(p));
    ws.send(s.add(p, "For room s."));
    ws.send(t.add(p, "For room t."));
    ws.send(s.leave(p));
    ws.send(t.add(p, "Still in t."));
    wait_for(&log, "six frames", |l| l.lock().unwrap().len() == 6).await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!((stats.sent, stats.dropped), (6, 0));
    assert_eq!(
        rooms(&log),
        [
            room("s", ["session.join", "For room s.", "session.leave"]),
            room("t", ["session.join", "For room t.", "Still in t."]),
        ]
    );
}

/// A connection's own envelopes (its pong to a server's ping, its heartbeats) go to its
/// participant's session, not to the gateway's `--session`: a `[[stream]]` rule may put the
/// participant in another session, and a pong in the wrong session is another session's
/// traffic (pvp-spec 8.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_answers_and_beats_in_its_participants_session() {
    let (url, log) = server(|_, v| {
        if v["type"] != "session.join" {
            return Answer::Nothing;
        }
        Answer::Send(from_server(
            "heartbeat.ping",
            "01JQAAAAAAAAAAAAAAAAAAAAB0",
            json!({}),
        ))
    })
    .await;
    let cfg = WsConfig {
        heartbeat: Duration::from_millis(100),
        ..config(url, 64, None)
    };
    let mut ws = WsSink::new(cfg);
    let mut other = Talk::in_session("other-room");
    let p = "t140:0000b0b0@127.0.0.1:40030";
    ws.send(other.join(p));
    wait_for(&log, "a pong and a heartbeat ping", |l| {
        let l = l.lock().unwrap();
        ["heartbeat.pong", "heartbeat.ping"]
            .iter()
            .all(|k| l.iter().any(|(_, v)| v["type"] == *k))
    })
    .await;
    ws.close(Duration::from_secs(1)).await;
    for (_, v) in log.lock().unwrap().iter() {
        assert_eq!(v["session"], "other-room", "{v}");
    }
}

/// A participant's queue (`--ws-queue`) fills while its server is slow to answer: what does
/// not fit is dropped and counted. But its leave was dropped with the text, so the server kept
/// a participant that had gone, present for ever (pvp-spec 6: a leave ends presence). The
/// leave is one envelope a connection and must always fit; text is what is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_text_but_never_the_leave() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    // The handshake waits until everything below is queued, so the queue is full.
    let log = serve(listener, &[0], Duration::from_millis(500));
    let mut ws = WsSink::new(config(url, 4, None));
    let mut talk = Talk::new();
    let p = "t140:0000f011@127.0.0.1:40031";
    ws.send(talk.join(p));
    for i in 0..10 {
        ws.send(talk.add(p, &format!("Sentence {i}.")));
    }
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        said(&log, p),
        ["join", "Sentence 0.", "Sentence 1.", "Sentence 2.", "leave"]
    );
    assert_eq!((stats.sent, stats.dropped), (5, 7));
}

/// `--gate-transcripts`: the chunks awaiting approval count against the participant's queue
/// bound (README "Delivery to a PVP server"): a chunk offered at the bound is dropped, counted
/// with the refused chunks, its corrections with it, and marked done in the spool. The
/// connection took every chunk from its queue at once and held it, a `gate.request` each, for
/// up to a day: an approver that does not answer made a participant hold any number of
/// chunks, and the server get as many requests. A review found it (review, session 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_awaiting_approval_are_bounded_by_the_participant_queue() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-gate-bound-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Nobody approves anything.
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let queue = 2;
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(60),
        }),
        ..config(url, queue, Some(spool.clone()))
    };
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000b002@127.0.0.1:41002";
    ws.send(talk.join(p));
    for i in 0..8 {
        ws.send(talk.add(p, &format!("Sentence {i}.")));
        // Taken from the queue (requested, or dropped) before the next comes.
        wait_for(&log, "the chunk taken", |l| {
            requests(l, p) + metrics.gates_refused.get() as usize == i + 1
        })
        .await;
    }
    assert_eq!(
        requests(&log, p),
        queue,
        "held for approval: the queue's bound"
    );
    assert_eq!(metrics.gates_refused.get(), 6);
    // A correction of the last chunk, dropped with it, and the leave; then the stop drops the
    // two chunks held.
    ws.send(talk.env(
        p,
        Kind::ContextUpdate,
        json!({"key": "k-Sentence 7.", "new_content": "Sentence", "reason": "backspace"}),
    ));
    ws.send(talk.leave(p));
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(said(&log, p), ["join", "leave"], "{stats:?}");
    assert_eq!(metrics.gates_refused.get(), 6 + 1 + 2);
    spool.flush();
    drop(spool);
    let again = resent(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(again.is_empty(), "undelivered in the journal: {again:?}");
}

/// `--gate-transcripts` with `--spool`: a correction of a chunk crowded out at the gates'
/// bound, offered while other chunks await approval, is dropped at once and marked done in the
/// journal, like its chunk (README "Gated transcripts"). It waited behind the pending gates
/// undone: a gateway killed then resent it alone after its restart, a `context.remove` of an
/// item never added (pvp-spec 9.3). A review found it (review, session 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_of_a_crowded_out_chunk_is_not_resent_after_a_kill() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-gate-crowd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Nobody approves anything.
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(60),
        }),
        ..config(url, 2, Some(spool.clone()))
    };
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000b0b1@127.0.0.1:42002";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "S0"));
    wait_for(&log, "S0's request", |l| requests(l, p) == 1).await;
    ws.send(talk.add(p, "S1"));
    wait_for(&log, "S1's request", |l| requests(l, p) == 2).await;
    ws.send(talk.add(p, "S2"));
    wait_until("S2 dropped", || metrics.gates_refused.get() == 1).await;
    // The speaker backspaces over S2, crowded out; then S3 comes, crowded out too: once all
    // three are counted the connection has taken the correction.
    ws.send(talk.env(
        p,
        Kind::ContextRemove,
        json!({"key": "k-S2", "reason": "T.140 backspace erased transcribed text"}),
    ));
    ws.send(talk.add(p, "S3"));
    wait_until("S2, its correction and S3 dropped", || {
        metrics.gates_refused.get() == 3
    })
    .await;
    spool.flush();
    // Killed now: what would the restart send? Asked of a copy of the journal, as the running
    // spool holds its directory.
    let killed = dir.with_extension("killed");
    let _ = std::fs::remove_dir_all(&killed);
    std::fs::create_dir_all(&killed).unwrap();
    std::fs::copy(dir.join("journal.ndjson"), killed.join("journal.ndjson")).unwrap();
    let again = resent(&killed);
    std::fs::remove_dir_all(&killed).ok();
    ws.close(Duration::from_secs(3)).await;
    drop(spool);
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        !again.iter().any(|l| l.contains("k-S2")),
        "a restart sends the correction of the chunk dropped unasked: {again:?}"
    );
}

/// The gateway stops while a participant that has left is paused by RATE_LIMITED (pvp-spec
/// 17) with its approved last sentence and its leave waiting in the connection: the stop path
/// sent only what the gates still held, so the sentence and the leave were lost although the
/// pause ended well within the shutdown's grace. A stop waits out the pause (within the grace)
/// and sends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_rate_limit_pause_still_sends_what_was_approved() {
    let (url, log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        let limited = |id: &str| {
            from_server(
                "error",
                id,
                json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true}),
            )
        };
        // Three in a row: a pause of 2 s, so the stop below comes during it.
        Answer::SendAll(vec![
            limited("01JQAAAAAAAAAAAAAAAAAAAAC1"),
            limited("01JQAAAAAAAAAAAAAAAAAAAAC2"),
            limited("01JQAAAAAAAAAAAAAAAAAAAAC3"),
            gate_answer(&v["id"], "gate.approve", "01JQAAAAAAAAAAAAAAAAAAAAC4"),
            from_server("heartbeat.ping", "01JQAAAAAAAAAAAAAAAAAAAAC5", json!({})),
        ])
    })
    .await;
    let mut ws = WsSink::new(gated(url, 1, None));
    let mut talk = Talk::new();
    let p = "t140:0000ca1e@127.0.0.1:40032";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Approved, then paused."));
    ws.send(talk.leave(p));
    // The pong comes after the approval is read: the sentence and the leave wait out the pause.
    wait_for_pong(&log, "the pong").await;
    let stats = ws.close(Duration::from_secs(10)).await;
    assert_eq!(
        said(&log, p),
        ["join", "Approved, then paused.", "leave"],
        "{stats:?}"
    );
    assert_eq!(stats.dropped, 0);
}

/// pvp-spec 17: "Servers MUST send `error` messages for all rejected operations": a
/// `RATE_LIMITED` error whose `related_to` names a `context.add` says that chunk was refused,
/// not added. The sink only paused, and counted the refused chunk as sent and (with --spool)
/// delivered, so the transcript lost that sentence for good while the ones after it arrived.
/// A user expects text the server refused for the rate to go again after the pause, and the
/// journal to have nothing left undelivered once it went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_the_server_refused_as_rate_limited_is_sent_again_after_the_pause() {
    let dir =
        std::env::temp_dir().join(format!("pvp-t140-review-rate-again-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (url, log) = server(|_, v| {
        // The first time it sees "First.", the server refuses it for the rate.
        static ONCE: std::sync::Once = std::sync::Once::new();
        let mut refuse = false;
        if v["type"] == "context.add" && v["payload"]["content"] == "First." {
            ONCE.call_once(|| refuse = true);
        }
        if !refuse {
            return Answer::Nothing;
        }
        let mut error = from_server(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAR1",
            json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
                "related_to": v["id"]}),
        );
        error["ref"] = v["id"].clone();
        Answer::Send(error)
    })
    .await;
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let cfg = config(url, 64, Some(spool.clone()));
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000ra7e@127.0.0.1:40077";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "First."));
    ws.send(talk.add(p, "Second."));
    wait_for(&log, "\"First.\" again", |l| {
        said(l, p).iter().filter(|s| *s == "First.").count() == 2
    })
    .await;
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(5)).await;
    spool.flush();
    drop(spool);
    let again = resent(&dir);
    std::fs::remove_dir_all(&dir).ok();
    // Whether "Second." went before the refusal was read depends on timing; "First." went
    // twice, the refused write and the one taken.
    let mut got = said(&log, p);
    got.sort();
    assert_eq!(got, ["First.", "First.", "Second.", "join", "leave"]);
    // Taken: the join, both sentences and the leave.
    assert_eq!((stats.sent, stats.dropped), (4, 0));
    assert_eq!(metrics.rate_limited_resent.get(), 1);
    assert!(again.is_empty(), "undelivered in the journal: {again:?}");
}

/// A server that rate-limits a burst answers after the sink wrote it (a connection writes its
/// queue before it reads again), so the refusal of an early chunk can come after many newer
/// writes. One no longer held to go again is counted as dropped (README): it was left in the
/// sink's `sent` once more than 16 envelopes were written after it, and nothing said the
/// transcript lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_refused_as_rate_limited_after_many_newer_writes_is_counted_dropped() {
    static FIRST: std::sync::Mutex<Option<Value>> = std::sync::Mutex::new(None);
    let (url, log) = server(|_, v| {
        let content = v["payload"]["content"].as_str().unwrap_or("");
        if v["type"] == "context.add" && content == "n0" {
            *FIRST.lock().unwrap() = Some(v["id"].clone());
        }
        if v["type"] != "context.add" || content != "n20" {
            return Answer::Nothing;
        }
        // The server's bucket refused "n0"; it says so once the burst is read, then pings.
        let first = FIRST.lock().unwrap().clone().unwrap();
        let mut error = from_server(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAD1",
            json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
                "related_to": first}),
        );
        error["ref"] = first;
        Answer::SendAll(vec![
            error,
            from_server("heartbeat.ping", "01JQAAAAAAAAAAAAAAAAAAAAD2", json!({})),
        ])
    })
    .await;
    let cfg = config(url, 64, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000d00d@127.0.0.1:40090";
    ws.send(talk.join(p));
    for i in 0..=20 {
        ws.send(talk.add(p, &format!("n{i}")));
    }
    // The pong answers the ping sent after the error: the connection has read the error.
    wait_for_pong(&log, "the pong").await;
    let adds = said(&log, p).len() - 1;
    let stats = ws.close(Duration::from_secs(2)).await;
    assert_eq!(adds, 21, "n0 is not sent again");
    assert_eq!(metrics.rate_limited_resent.get(), 0);
    // The join and n1..n20 were taken; n0 was refused and is gone: one dropped.
    assert_eq!((stats.sent, stats.dropped), (21, 1), "{stats:?}");
}

/// A RATE_LIMITED naming a text envelope no longer held (9 newer ones written since) is
/// counted dropped once, however often it is read (a server repeating it, or replaying its
/// history on a reconnect, pvp-spec 19.1). The id stayed among the connection's recent ones,
/// so each reading took one more from `sent` (an unsigned count, which could wrap) and added
/// one more to `dropped`. A review found it (review, session 34). Counted on /metrics too
/// (`server_refused_items`; it was in the `stopped` line only, noticed by review z).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_read_twice_counts_a_chunk_no_longer_held_dropped_once() {
    let (url, log, to_client) = controlled().await;
    let cfg = config(url, 64, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000b0b2@127.0.0.1:42004";
    ws.send(talk.join(p));
    let first = talk.add(p, "n0");
    let id = first.id().to_string();
    ws.send(first);
    for i in 1..10 {
        ws.send(talk.add(p, &format!("n{i}")));
    }
    // n0 has 9 newer text envelopes written after it: no longer held.
    wait_for(&log, "all written", |l| said(l, p).len() == 11).await;
    let refusal = from_server(
        "error",
        "01JQAAAAAAAAAAAAAAAAAAAAE1",
        json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
            "related_to": id}),
    );
    to_client.send(refusal.clone()).unwrap();
    to_client.send(refusal).unwrap();
    // The pong to a ping sent after the errors says the connection has read them.
    to_client
        .send(from_server(
            "heartbeat.ping",
            "01JQAAAAAAAAAAAAAAAAAAAAE2",
            json!({}),
        ))
        .unwrap();
    wait_for_pong(&log, "the pong").await;
    let stats = ws.close(Duration::from_secs(3)).await;
    assert_eq!(said(&log, p).len(), 11, "n0 is not sent again");
    // Written: the join and n0..n9; n0 was refused: 10 taken, 1 dropped.
    assert_eq!((stats.sent, stats.dropped), (10, 1), "{stats:?}");
    // And on /metrics, as every text envelope the server refused and is not sent again.
    assert_eq!(metrics.server_refused_items.get(), 1);
}

/// The same RATE_LIMITED error envelope (one id) read twice for a chunk still held is acted
/// on once: the first reading sends the chunk again after the pause, and it is held once more;
/// the second (a server repeating it, or replaying its history, pvp-spec 19.1) sent it a third
/// time, so the server got the text twice (README "Delivery to a PVP server") and
/// `rate_limited_resent` counted 2 for one refusal. A review found it (review, session 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_refusal_read_twice_does_not_send_a_held_chunk_a_third_time() {
    let (url, log, to_client) = controlled().await;
    let cfg = config(url, 64, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000e0e1@127.0.0.1:42104";
    ws.send(talk.join(p));
    let first = talk.add(p, "Refused once.");
    let id = first.id().to_string();
    ws.send(first);
    wait_for(&log, "the chunk", |l| said(l, p).len() == 2).await;
    let refusal = from_server(
        "error",
        "01JQAAAAAAAAAAAAAAAAAAAAF1",
        json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
            "related_to": id}),
    );
    to_client.send(refusal.clone()).unwrap();
    wait_for(&log, "the chunk sent again after the pause", |l| {
        said(l, p).len() == 3
    })
    .await;
    // The same error envelope read again, then a ping: the pong says the connection has read
    // it.
    to_client.send(refusal).unwrap();
    to_client
        .send(from_server(
            "heartbeat.ping",
            "01JQAAAAAAAAAAAAAAAAAAAAF2",
            json!({}),
        ))
        .unwrap();
    wait_for_pong(&log, "the pong").await;
    // A stop waits out a pause (within its grace) to send what the participant holds.
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        said(&log, p),
        ["join", "Refused once.", "Refused once."],
        "{stats:?}"
    );
    assert_eq!(metrics.rate_limited_resent.get(), 1);
}

/// The same with an error id that is no ULID (pvp-spec 5.1: identifiers are opaque strings):
/// it is remembered too, and the refusal read again is acted on once. Remembered only when it
/// parsed as a ULID, it sent the chunk a third time. A review found it (review, session 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_refusal_with_an_id_that_is_no_ulid_read_twice_is_acted_on_once() {
    let (url, log, to_client) = controlled().await;
    let cfg = config(url, 64, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000e0e9@127.0.0.1:42109";
    ws.send(talk.join(p));
    let first = talk.add(p, "Refused once.");
    let id = first.id().to_string();
    ws.send(first);
    wait_for(&log, "the chunk", |l| said(l, p).len() == 2).await;
    let refusal = from_server(
        "error",
        "3f0c9a52-7d41-4e8e-9b1a-5c2d8e6f0a11",
        json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
            "related_to": id}),
    );
    to_client.send(refusal.clone()).unwrap();
    wait_for(&log, "the chunk sent again after the pause", |l| {
        said(l, p).len() == 3
    })
    .await;
    to_client.send(refusal).unwrap();
    to_client
        .send(from_server(
            "heartbeat.ping",
            "3f0c9a52-7d41-4e8e-9b1a-5c2d8e6f0a12",
            json!({}),
        ))
        .unwrap();
    wait_for_pong(&log, "the pong").await;
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(
        said(&log, p),
        ["join", "Refused once.", "Refused once."],
        "{stats:?}"
    );
    assert_eq!(metrics.rate_limited_resent.get(), 1);
}

/// A server whose connections record every text frame, and to which the test hands frames to
/// send (to the newest connection): its URL, its log, and the frames' way in.
async fn controlled() -> (String, Log, tokio::sync::mpsc::UnboundedSender<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let out = log.clone();
    tokio::spawn(async move {
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let (conn, log, rx) = (n, out.clone(), rx.clone());
            n += 1;
            tokio::spawn(async move {
                let Ok(ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let (mut w, mut r) = ws.split();
                let writer = tokio::spawn(async move {
                    let mut rx = rx.lock().await;
                    while let Some(v) = rx.recv().await {
                        if w.send(Message::text(v.to_string())).await.is_err() {
                            break;
                        }
                    }
                });
                while let Some(Ok(m)) = r.next().await {
                    if let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) {
                        log.lock().unwrap().push((conn, v));
                    }
                }
                writer.abort();
            });
        }
    });
    (url, log, tx)
}

/// A text envelope is held to go again on a RATE_LIMITED for 5 s after it was written
/// (README "Delivery to a PVP server"); one refused later is counted as dropped, not sent
/// again. The age was checked only when the next text envelope was written: a participant that
/// wrote one chunk and fell silent held it for ever, and a refusal naming it 6 s later (a late
/// answer, a server replaying its history after a reconnect) sent it again, so the server could
/// get it twice. A review found it (review, session 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_refusal_more_than_5_s_after_the_write_is_not_resent() {
    let (url, log, to_client) = controlled().await;
    let cfg = config(url, 64, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000b003@127.0.0.1:41004";
    ws.send(talk.join(p));
    let first = talk.add(p, "Written, then the speaker fell silent.");
    let id = first.id().to_string();
    ws.send(first);
    wait_for(&log, "the chunk", |l| said(l, p).len() == 2).await;
    // More than HOLD_FOR (5 s) after the write, with nothing written since.
    tokio::time::sleep(Duration::from_millis(6_000)).await;
    to_client
        .send(from_server(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAB1",
            json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
                "related_to": id}),
        ))
        .unwrap();
    // The pong to a ping sent after the error says the connection has read it.
    to_client
        .send(from_server(
            "heartbeat.ping",
            "01JQAAAAAAAAAAAAAAAAAAAAB2",
            json!({}),
        ))
        .unwrap();
    wait_for_pong(&log, "the pong").await;
    // The leave comes after whatever the refusal made the connection send again.
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    let stats = ws.close(Duration::from_secs(3)).await;
    assert_eq!(
        said(&log, p),
        ["join", "Written, then the speaker fell silent.", "leave"],
        "a refusal 6 s after the write does not send the chunk again; {stats:?}"
    );
    assert_eq!(metrics.rate_limited_resent.get(), 0);
    assert_eq!(stats.dropped, 1, "counted as dropped: {stats:?}");
}

/// `--gate-transcripts`: a chunk's gate that times out while the connection is down (the
/// server gone for longer than `--gate-timeout-s` plus its grace) is settled as timed out. The
/// reconnect asked again for every gate without a decision, the expired ones too, so
/// approvers were asked about text already dropped, whose approval can no longer add it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_expired_while_disconnected_is_not_requested_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    // The first server goes down once the chunk's gate is requested; the second one answers
    // its handshake only after the gate has expired (its timeout is 0 s plus 5 s of grace).
    let log = serve_answering(listener, &[1], Duration::from_secs(6), |conn, v| {
        if conn == 0 && v["type"] == "gate.request" {
            Answer::Close
        } else {
            Answer::Nothing
        }
    });
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::ZERO,
        }),
        connect_timeout: Duration::from_secs(15),
        ..config(url, 64, None)
    };
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000e7e1@127.0.0.1:40033";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Expires unanswered."));
    wait_for(&log, "the rejoin", |l| {
        l.lock().unwrap().iter().any(|(c, _)| *c == 1)
    })
    .await;
    ws.send(talk.leave(p));
    wait_for(&log, "the leave", |l| {
        said(l, p).last().is_some_and(|s| s == "leave")
    })
    .await;
    ws.close(Duration::from_secs(5)).await;
    let second: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| *c == 1)
        .map(|(_, v)| v["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(second, ["session.join", "session.leave"]);
}

/// A server that refuses a participant (UNAUTHORIZED, pvp-spec 17) ends it: what it still
/// held (here a chunk awaiting approval) is given up. The sink counted it neither sent nor
/// dropped, so the "stopped" line's totals did not add up to what the core handed over, and
/// only an error line's `undelivered` told that text was lost. It counts as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_refused_participant_held_counts_as_dropped() {
    let (url, _log) = server(|_, v| {
        if v["type"] != "gate.request" {
            return Answer::Nothing;
        }
        Answer::Send(from_server(
            "error",
            "01JQAAAAAAAAAAAAAAAAAAAAD1",
            json!({"code": "UNAUTHORIZED", "message": "no", "recoverable": false}),
        ))
    })
    .await;
    let cfg = gated(url, 1, None);
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000de11@127.0.0.1:40034";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Never approved, never delivered."));
    let deadline = tokio::time::Instant::now() + WAIT;
    while metrics.refused.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "not refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = ws.close(Duration::from_secs(5)).await;
    // Sent: the join (the chunk's gate request is the connection's own, review z); dropped:
    // the chunk.
    assert_eq!((stats.sent, stats.dropped), (1, 1));
}

/// `--spool` with one participant id in two sessions (a `[[stream]]` rule's captioner in two
/// rooms, which the sink now gives a connection each): the gateway is killed while text for
/// both rooms is undelivered. The README promises the restart resends what it journaled,
/// "each participant rejoins first and leaves after". But the journal's resend plan groups by
/// sender id alone, not by (session, sender): room s's text goes out on a new connection that
/// never joined (the one rejoin is room t's join, the sender's last), and only room t gets a
/// leave, so the captioner stays present in room s for ever. A user expects each room's
/// connection to rejoin its own room, carry its text, and leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_rejoins_and_leaves_each_session_of_a_participant_in_two() {
    let dir =
        std::env::temp_dir().join(format!("pvp-t140-review-two-rooms-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut s, mut t) = (Talk::new(), Talk::in_session("t"));
    let p = "captioner";
    // The killed gateway's journal: both joins delivered, then text for each room journaled
    // and never written.
    {
        let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
        for j in [s.join(p), t.join(p)] {
            spool.added(&j);
            spool.done(j.id());
        }
        spool.added(&s.add(p, "For room s."));
        spool.added(&t.add(p, "For room t."));
    }
    let (spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let mut ws = WsSink::new(config(url, 64, Some(Arc::new(spool))));
    ws.resend(resend);
    // Every connection is told to finish and does: what each carried is in the log.
    ws.close(Duration::from_secs(5)).await;
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        rooms(&log),
        [
            room("s", ["session.join", "For room s.", "session.leave"]),
            room("t", ["session.join", "For room t.", "session.leave"]),
        ],
        "each room's connection after the restart"
    );
}

/// A connection's pong goes to its participant's session ("the connection's own envelopes
/// (pongs, heartbeats, gate requests) go to its participant's session", as
/// `a_connection_answers_and_beats_in_its_participants_session` checks for a ping that comes
/// after the join). But the session is learnt only when the first envelope is taken from the
/// queue, and frames from the server are read first: a server that pings as soon as the
/// connection opens (here the ping arrives with the handshake's answer) gets a pong in the
/// gateway's `--session` "s", as the connection's first frame, before the participant has
/// joined its own session "other-room". A user whose `[[stream]]` rule routes a participant
/// to another room expects nothing of that connection to land in the default session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_at_once_on_open_is_answered_in_the_participants_session() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::protocol::Role;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let out = log.clone();
    tokio::spawn(async move {
        let Ok((mut tcp, _)) = listener.accept().await else {
            return;
        };
        // The handshake by hand, so that its answer and a ping go out in one write.
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") {
            if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            request.push(byte[0]);
        }
        let request = String::from_utf8_lossy(&request).into_owned();
        let key = request
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("sec-websocket-key")
                    .then(|| value.trim().to_owned())
            })
            .unwrap();
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let mut answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        )
        .into_bytes();
        let ping = from_server("heartbeat.ping", "01JQAAAAAAAAAAAAAAAAAAAAE0", json!({}))
            .to_string()
            .into_bytes();
        // One unmasked text frame (RFC 6455 5.2), 126..65535 bytes or fewer.
        answer.push(0x81);
        if ping.len() < 126 {
            answer.push(ping.len() as u8);
        } else {
            answer.push(126);
            answer.extend_from_slice(&(ping.len() as u16).to_be_bytes());
        }
        answer.extend_from_slice(&ping);
        tcp.write_all(&answer).await.unwrap();
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(tcp, Role::Server, None).await;
        while let Some(Ok(m)) = ws.next().await {
            if let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) {
                out.lock().unwrap().push((0, v));
            }
        }
    });
    let mut ws = WsSink::new(config(url, 64, None));
    let mut other = Talk::in_session("other-room");
    let p = "t140:0000b0b1@127.0.0.1:40040";
    ws.send(other.join(p));
    wait_for(&log, "the join and the pong", |l| {
        let l = l.lock().unwrap();
        ["session.join", "heartbeat.pong"]
            .iter()
            .all(|k| l.iter().any(|(_, v)| v["type"] == *k))
    })
    .await;
    ws.close(Duration::from_secs(1)).await;
    let frames: Vec<(String, String)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(_, v)| {
            (
                v["type"].as_str().unwrap().to_owned(),
                v["session"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (kind, session) in &frames {
        assert_eq!(session, "other-room", "{kind} in {session}: {frames:?}");
    }
}

/// A `--server` password is not shown in the log: `ShownUrl` promises to hide it "whatever the
/// URL's mistakes" (an unencoded `/` in it is hidden since the last review). A generated
/// password just as often has a `#` or a `?` in it, not percent-encoded: such a URL is refused
/// at start, rightly, but the error (and every connect-failure warning, had it started) prints
/// the URL whole. `ShownUrl` looks for the user information's `@` only before the first `?` or
/// `#`, so a password holding one of them has its `@` after that point and nothing is hidden.
/// A user who pasted a password into the URL expects it kept out of the log.
#[test]
fn a_refused_server_url_does_not_show_a_password_with_a_hash_or_a_question_mark() {
    for url in [
        "ws://gw:s3cr#tpw@127.0.0.1:1/pvp",
        "ws://gw:s3cr?tpw@127.0.0.1:1/pvp",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
            .args(["--listen", "127.0.0.1:0", "--server", url])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--server"), "not refused at start: {err}");
        assert!(!err.contains("s3cr"), "the password is in the log: {err}");
        // The same through the type every log line uses.
        let shown = pvp_t140::sink::ShownUrl(url).to_string();
        assert!(!shown.contains("s3cr"), "{shown}");
    }
}

/// pvp-spec 6.3 / 7.1, README "What it emits" and "Delivery to a PVP server": a participant
/// joins under its id, and once the sender's RTCP CNAME (or a NAME) is known the gateway sends
/// a `participant.announce` naming it; after a reconnect it "joins again". The server that
/// comes back (a restart, or one that dropped the connection and with it the participant)
/// learns the participant from that rejoin alone. But the rejoin is the first join re-sent
/// ("same content"): it announces the name the gateway has since replaced, and no announce
/// follows, so after every reconnect the session shows the speaker under its stale name
/// (here its id) for the rest of its life. A user expects the participant, once named, to stay
/// named across a server restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_after_a_reconnect_keeps_the_announced_name() {
    // The server goes down right after the announce (its first connection closes).
    let (url, log) = server(|conn, v| {
        if conn == 0 && v["type"] == "participant.announce" {
            Answer::Close
        } else {
            Answer::Nothing
        }
    })
    .await;
    let mut ws = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000a11c@127.0.0.1:40050";
    ws.send(talk.join(p));
    ws.send(talk.env(
        p,
        Kind::ParticipantAnnounce,
        json!({"id": p, "name": "Alice (captions)", "type": "human",
            "roles": ["navigator"], "transport": "t140"}),
    ));
    wait_for(&log, "the rejoin on a second connection", |l| {
        l.lock().unwrap().iter().any(|(c, _)| *c == 1)
    })
    .await;
    ws.send(talk.add(p, "After the reconnect."));
    wait_for(&log, "the text after the reconnect", |l| {
        said(l, p)
            .last()
            .is_some_and(|s| s == "After the reconnect.")
    })
    .await;
    ws.close(Duration::from_secs(2)).await;
    // What the second connection told the server about the participant's name, before its
    // text: the name of the last join or announce.
    let named = names_before_text(&log, Some(1));
    assert_eq!(
        named.last().map(String::as_str),
        Some("\"Alice (captions)\""),
        "names the server learnt on the new connection: {named:?}"
    );
}

/// README "Gated transcripts" and "Delivery to a PVP server": a participant that has left
/// keeps its connection while a chunk of its awaits approval, its leave behind it; "when the
/// gateway stops, a pending chunk is dropped" and the leave goes out, and "once the gateway
/// stops, a [reconnect] wait is cut short". What is wrong: the wait is cut short by
/// `stop.wait_for`, which marks the stop as seen; the connection then reconnects (the server
/// is back), rejoins, asks again for the approval, and waits on `stop.changed()` for a stop it
/// has already consumed. It never notices the gateway is stopping: it sits until the
/// shutdown's grace ends, the chunk is not dropped, and the leave is never sent (the session
/// keeps a participant that is gone). Before the cut-short wait (a plain sleep) the stop was
/// still unseen after the reconnect and the leave went out at once. What should happen: the
/// leave reaches the server that is back, within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_the_backoff_of_a_participant_awaiting_approval_still_sends_its_leave() {
    let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = first.local_addr().unwrap();
    let url = format!("ws://{addr}");
    // The first server takes the connection, and goes down a moment after the chunk's gate
    // is requested (by then the connection has read the leave and its queue's end).
    let (down_tx, down) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = first.accept().await.unwrap();
        drop(first);
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        while let Some(Ok(m)) = ws.next().await {
            let v: Value = serde_json::from_str(m.to_text().unwrap_or("")).unwrap_or_default();
            if v["type"] == "gate.request" {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = ws.close(None).await;
                break;
            }
        }
        let _ = down_tx.send(());
    });
    let mut ws = WsSink::new(gated(url, 1, None));
    let mut talk = Talk::new();
    let p = "t140:0000b0ff@127.0.0.1:40060";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Awaiting approval when the server went down."));
    ws.send(talk.leave(p));
    tokio::time::timeout(WAIT, down)
        .await
        .expect("the gate request reached the first server")
        .unwrap();
    // The connection retries against nothing, its backoff growing (each attempt is refused at
    // once, so it is in a wait nearly all the time); then the gateway stops and the server
    // comes back.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let closing = tokio::spawn(async move { ws.close(Duration::from_secs(5)).await });
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let log = serve(listener, &[], Duration::ZERO);
    let stats = closing.await.unwrap();
    assert_eq!(
        said(&log, p),
        ["join", "leave"],
        "the server back at the stop got the rejoin but never the leave; {stats:?}"
    );
}

/// `--spool`: after a restart "each participant rejoins first"; after a reconnect the README now
/// says it joins again "under the name its last `participant.announce` gave, say an RTCP NAME
/// learnt after the first join". What is wrong: the restart's rejoin is the journal's copy of
/// the first join, whatever was announced since; the announce was delivered (marked done), so it
/// is not resent either. The server, which forgot the participant with the killed gateway's
/// connection, learns it under its stale name (here its id) and files the text resent under it.
/// What should happen: the rejoin after a restart carries the name last announced, as the one
/// after a reconnect does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_after_a_restart_keeps_the_announced_name() {
    let dir = std::env::temp_dir().join(format!("pvp-t140-review-named-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut talk = Talk::new();
    let p = "t140:0000a11c@127.0.0.1:40062";
    // The killed gateway's journal: the join and the announce delivered, then text journaled
    // and never written.
    {
        let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
        let announce = talk.env(
            p,
            Kind::ParticipantAnnounce,
            json!({"id": p, "name": "Alice (captions)", "type": "human",
                "roles": ["navigator"], "transport": "t140"}),
        );
        for e in [talk.join(p), announce] {
            spool.added(&e);
            spool.done(e.id());
        }
        spool.added(&talk.add(p, "Said before the kill."));
    }
    let (spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    let (url, log) = server(|_, _| Answer::Nothing).await;
    let mut ws = WsSink::new(config(url, 64, Some(Arc::new(spool))));
    ws.resend(resend);
    ws.close(Duration::from_secs(5)).await;
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(said(&log, p), ["join", "Said before the kill.", "leave"]);
    // The name the server learnt before the text: the last join's or announce's.
    let named = names_before_text(&log, None);
    assert_eq!(
        named.last().map(String::as_str),
        Some("\"Alice (captions)\""),
        "names the server learnt after the restart: {named:?}"
    );
}

/// RFC 6455 5.5.1: "If an endpoint receives a Close frame and did not previously send a Close
/// frame, the endpoint MUST send a Close frame in response." A PVP server going down for a
/// restart (or shedding a participant) closes its connections with a code, 1001 "going
/// away". tungstenite queues the Close reply when it reads the Close and writes it on the next
/// read, write or flush: the connection flushes before it is made again. It went straight to
/// the reconnect, and the server saw the TCP connection end without the closing handshake
/// (`ResetWithoutClosingHandshake`) instead of the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_from_the_server_is_answered_with_a_close() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        // Only the first connection matters; later ones (the reconnect) are accepted and read.
        let mut first = true;
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen_tx.clone();
            let this_is_first = std::mem::take(&mut first);
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                // The join.
                let Some(Ok(_)) = ws.next().await else { return };
                if !this_is_first {
                    while let Some(Ok(_)) = ws.next().await {}
                    return;
                }
                let close = CloseFrame {
                    code: CloseCode::Away,
                    reason: "restarting".into(),
                };
                ws.send(Message::Close(Some(close))).await.unwrap();
                // What the client answers: its Close, or the end of the connection.
                let answer = loop {
                    match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
                        Err(_) => break "nothing within 5 s".to_owned(),
                        Ok(Some(Ok(Message::Close(c)))) => break format!("close {c:?}"),
                        Ok(Some(Ok(_))) => continue,
                        Ok(Some(Err(e))) => break format!("error: {e}"),
                        Ok(None) => break "end of stream".to_owned(),
                    }
                };
                let _ = seen.send(answer);
            });
        }
    });
    let mut sink = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000c105@127.0.0.1:40100";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Hello."));
    let answer = tokio::time::timeout(WAIT, seen_rx.recv())
        .await
        .expect("the server's first connection ended")
        .unwrap();
    sink.close(Duration::from_millis(500)).await;
    assert!(
        answer.starts_with("close"),
        "the server's Close (1001 going away) was answered with: {answer}"
    );
}

/// A server on a free port of 127.0.0.1 that completes every handshake and closes each
/// connection with 1013 "try again later" as soon as the participant's join arrives (a server
/// shedding load, a proxy refusing the session): its URL, and the times the joins arrived.
async fn closing_server() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let joins = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = joins.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                        continue;
                    };
                    if v["type"] == "session.join" {
                        seen.lock().unwrap().push(std::time::Instant::now());
                        let close = CloseFrame {
                            code: CloseCode::Again,
                            reason: "try again later".into(),
                        };
                        let _ = ws.send(Message::Close(Some(close))).await;
                    }
                }
            });
        }
    });
    (url, joins)
}

/// `pvp_t140_connections_failing` is "PVP connections in reconnect backoff" (src/metrics.rs;
/// `SinkMetrics::failing`: "currently failing to connect (in backoff)"), and /healthz is 503
/// while it is above 0: the README's "/healthz answers 200 when ... the PVP server accepts
/// connections and no participant connection is failing (retrying to connect)". A server that
/// takes the handshake and closes the connection at once, every time, leaves the participant
/// retrying for ever, each wait in the doubling backoff (up to 10 s), and delivering nothing:
/// it is failing through those waits. `failing` was raised only when the connect itself
/// failed, and /healthz said ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_in_backoff_after_the_server_closed_it_counts_as_failing() {
    let (url, joins) = closing_server().await;
    let metrics = SinkMetrics::default();
    let mut sink = WsSink::new(WsConfig {
        metrics: metrics.clone(),
        ..config(url, 64, None)
    });
    let mut talk = Talk::new();
    let p = "t140:0000fa11@127.0.0.1:40101";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Never delivered."));
    // Five connections, each closed on its join: between them, four waits of the backoff
    // (50-100, 100-200, 200-400, 400-800 ms), and a fifth of 800-1,600 ms after the last.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut most_failing = 0;
    while joins.lock().unwrap().len() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "five connections");
        most_failing = most_failing.max(metrics.failing.get());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Well inside the fifth wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failing_now = metrics.failing.get();
    let open_now = metrics.connections.get();
    sink.close(Duration::from_millis(100)).await;
    assert_eq!(open_now, 0, "no connection is open during the backoff");
    assert!(
        failing_now == 1 && most_failing >= 1,
        "a participant whose every connection the server closes is in reconnect backoff, \
         yet pvp_t140_connections_failing = {failing_now} (at most {most_failing} before)"
    );
}

/// The README: the backoff "doubles from 100 ms to 10 s; each wait is half of it plus a random
/// part of up to the other half, so participants that lost a restarting server come back
/// spread out; ... only one that lived longer [than 10 s] resets it". After a reset the wait
/// is that of the 100 ms backoff, 50 ms at the least. It reconnected at once: every
/// participant of a server that restarts (or of a proxy that drops its connections while the
/// server is already back) came back in the same instant. (10.5 s: `STABLE` is fixed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lived_connection_the_server_closes_is_made_again_after_a_random_wait() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    // (when the first connection was closed, when the second was accepted)
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(&str, std::time::Instant)>();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tx.send(("accepted", std::time::Instant::now()));
            n += 1;
            let first = n == 1;
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                if first {
                    // Lives past the 10 s that make a connection stable, reading what comes.
                    let until = tokio::time::Instant::now() + Duration::from_millis(10_500);
                    while let Ok(Some(Ok(_))) = tokio::time::timeout_at(until, ws.next()).await {}
                    let close = CloseFrame {
                        code: CloseCode::Away,
                        reason: "restarting".into(),
                    };
                    let _ = tx.send(("closed", std::time::Instant::now()));
                    let _ = ws.send(Message::Close(Some(close))).await;
                }
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    let mut sink = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:00005a1e@127.0.0.1:40102";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Hello."));
    let mut next = async || {
        tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(next().await.0, "accepted");
    let (what, closed) = next().await;
    assert_eq!(what, "closed");
    let (what, again) = next().await;
    assert_eq!(what, "accepted");
    sink.close(Duration::from_millis(500)).await;
    let gap = again.duration_since(closed);
    assert!(
        gap >= Duration::from_millis(50),
        "made again {gap:?} after the server closed it: no random wait"
    );
}

/// The README: "A frame from the server whose `v` is not 1 is not acted on ...: it is logged
/// at warn level and counted, with frames that do not parse, in
/// `pvp_t140_server_frames_rejected_total`". pvp-spec 19.1: "one per WebSocket text frame".
/// A binary frame (here one holding a `heartbeat.ping`, as a server that writes its JSON as
/// bytes sends it) is no PVP message the gateway can read, and is not acted on: the ping goes
/// unanswered, so it is counted, as a text frame that does not parse is, for the operator to
/// tell why the server's pings go unanswered (pvp-spec 8.1). It was dropped without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_frame_from_the_server_is_counted_as_rejected() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let done = done_tx.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let Some(Ok(_join)) = ws.next().await else {
                    return;
                };
                let ping = r#"{"v":1,"id":"01HZY3Q6W8V0J5N7Q2R4S6T8V0","ts":"2024-01-01T00:00:00.000Z","session":"s","sender":"system","type":"heartbeat.ping","payload":{}}"#;
                ws.send(Message::binary(ping.as_bytes().to_vec()))
                    .await
                    .unwrap();
                // Then a text frame that does not parse, and a ping that does, whose pong
                // tells the frames before it were read.
                ws.send(Message::text("{not json")).await.unwrap();
                let ping2 = r#"{"v":1,"id":"01HZY3Q6W8V0J5N7Q2R4S6T8V1","ts":"2024-01-01T00:00:00.000Z","session":"s","sender":"system","type":"heartbeat.ping","payload":{}}"#;
                ws.send(Message::text(ping2)).await.unwrap();
                while let Some(Ok(m)) = ws.next().await {
                    let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                        continue;
                    };
                    if v["type"] == "heartbeat.pong" && v["ref"] == "01HZY3Q6W8V0J5N7Q2R4S6T8V1" {
                        let _ = done.send(());
                    }
                }
            });
        }
    });
    let metrics = SinkMetrics::default();
    let mut sink = WsSink::new(WsConfig {
        metrics: metrics.clone(),
        ..config(url, 64, None)
    });
    let mut talk = Talk::new();
    let p = "t140:0000b1e5@127.0.0.1:40103";
    sink.send(talk.join(p));
    tokio::time::timeout(WAIT, done.recv())
        .await
        .expect("the second ping answered")
        .unwrap();
    let rejected = metrics.server_frames_rejected.get();
    sink.close(Duration::from_millis(500)).await;
    assert_eq!(
        rejected, 2,
        "a binary frame and a text frame that does not parse, neither acted on"
    );
}

/// Log lines of this test binary, once [`capture_logs`] has installed the subscriber.
static LOGS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .try_init();
    });
}

fn log_lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&LOGS.lock().unwrap())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// A server that will not have a participant often says so with its close code and reason
/// (RFC 6455 7.1.5, 7.1.6: 1008 policy violation, "token rejected"), and a server shedding
/// load with 1013 "try again later": the gateway's log line says them, the one thing that
/// tells the operator what is wrong (a bad `--token`, a wrong session). It said only "PVP
/// server closed the connection; reconnecting".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_close_code_and_reason_are_logged() {
    capture_logs();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                let Some(Ok(_join)) = ws.next().await else {
                    return;
                };
                let close = CloseFrame {
                    code: CloseCode::Policy,
                    reason: "token rejected".into(),
                };
                let _ = ws.send(Message::Close(Some(close))).await;
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    let mut sink = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000c0de@127.0.0.1:40104";
    sink.send(talk.join(p));
    let deadline = tokio::time::Instant::now() + WAIT;
    let line = loop {
        if let Some(l) = log_lines_with(p)
            .into_iter()
            .find(|l| l.contains("closed the connection"))
        {
            break l;
        }
        assert!(tokio::time::Instant::now() < deadline, "no close logged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    sink.close(Duration::from_millis(300)).await;
    assert!(
        line.contains("token rejected") && line.contains("1008"),
        "{line}"
    );
}

/// A server that closes every connection soon after it opens: the first close is logged at
/// warn level, the ones after it at debug (as a failed connect's retries), not a warn line a
/// cycle for as long as the server does it (review, session 32).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_closing_every_connection_is_warned_of_once() {
    capture_logs();
    let (url, joins) = closing_server().await;
    let mut sink = WsSink::new(config(url, 64, None));
    let mut talk = Talk::new();
    let p = "t140:0000c1c1@127.0.0.1:40105";
    sink.send(talk.join(p));
    let deadline = tokio::time::Instant::now() + WAIT;
    while joins.lock().unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "three connections");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sink.close(Duration::from_millis(100)).await;
    let warned: Vec<_> = log_lines_with(p)
        .into_iter()
        .filter(|l| l.contains("closed the connection"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
}
