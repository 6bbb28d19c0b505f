//! Delivery of the WebSocket sink across connection loss (the unread text a connection takes
//! back and sends again after the rejoin, `Retry` in src/sink/ws.rs), against real WebSocket
//! servers on 127.0.0.1 and real spool directories.
//!
//! Found by review ai (session 44).

#[path = "common/raw_ws.rs"]
mod raw_ws;
use raw_ws::*;
mod common;
#[path = "common/ws_recorder.rs"]
mod ws_recorder;

use std::sync::Arc;
use std::time::Duration;

use common::talk::Talk;
use futures_util::StreamExt;
use pvp_t140::sink::spool::Spool;
use pvp_t140::sink::ws::{WsConfig, WsSink};
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(20);

/// Waits (20 s at most) until `pred` holds, polling.
async fn until(what: &str, pred: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !pred() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A scratch directory of this test's own.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pvp-t140-review-ai-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A server that takes one connection, reads its join, and then hangs (reads nothing more,
/// answers nothing) and takes no more connections: the gateway leaves the connection for
/// silence and cannot connect again. Returns the url and a receiver that has the join.
async fn hang_after_join() -> (String, tokio::sync::oneshot::Receiver<serde_json::Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        // No more connections: the port is closed from now on.
        drop(listener);
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        if let Some(Ok(m)) = ws.next().await {
            let _ = tx.send(serde_json::from_str(m.to_text().unwrap()).unwrap());
        }
        // Held, never read again.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(ws);
    });
    (url, rx)
}

/// Text written into a connection the server never read (it hung), left for silence, while
/// the server stays unreachable until the gateway stops: the text was never delivered, so the
/// `stopped` line must count it as dropped, not sent, and with `--spool` the next start must
/// send it. It was counted as sent and marked done in the journal (lost, silently): the
/// connection took the unread text back only after a successful rejoin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_text_of_a_connection_lost_before_a_stop_is_dropped_and_journaled_not_sent() {
    let (url, join) = hang_after_join().await;
    let dir = scratch("unread-stop");
    let (spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    assert!(resend.is_empty());
    let spool = Arc::new(spool);
    let cfg = WsConfig {
        heartbeat: Duration::from_secs(1),
        silence: Duration::from_secs(2),
        spool: Some(spool.clone()),
        ..ws_recorder::config(url)
    };
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    let j = tokio::time::timeout(WAIT, join).await.unwrap().unwrap();
    assert_eq!(j["type"], "session.join");
    sink.send(talk.add(p, "Written into the hung connection."));
    // The connection is left for silence, and connecting again fails.
    until("the connection left and a connect failing", || {
        metrics.failing.get() == 1
    })
    .await;
    let stats = sink.close(Duration::from_millis(500)).await;
    drop(spool);
    // A restart, on a copy of the journal: the connection's task is still trying to connect.
    let copy = scratch("unread-stop-copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(dir.join("journal.ndjson"), copy.join("journal.ndjson")).unwrap();
    let (_spool, resend) = Spool::open(&copy, Default::default()).unwrap();
    let again: Vec<String> = resend
        .iter()
        .map(|e| {
            let m = e.to_message();
            format!("{} {}", m.kind, m.payload["content"].as_str().unwrap_or(""))
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&copy).ok();
    assert_eq!(
        (stats.sent, stats.dropped),
        (1, 1),
        "the join sent, the unread text dropped: {stats:?}"
    );
    assert!(
        again
            .iter()
            .any(|s| s == "context.add Written into the hung connection."),
        "the next start sends the unread text: {again:?}"
    );
}

/// The next `n` text frames a raw connection reads (answering no ping), each also sent to `tx`
/// as connection 0's; `None` if it ends first.
async fn read_texts(
    tcp: &mut tokio::net::TcpStream,
    n: usize,
    tx: &tokio::sync::mpsc::UnboundedSender<(usize, serde_json::Value)>,
) -> Option<Vec<serde_json::Value>> {
    let mut texts = Vec::with_capacity(n);
    while texts.len() < n {
        let (op, p) = read_frame(tcp).await?;
        if op == 1 {
            let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
            let _ = tx.send((0, v.clone()));
            texts.push(v);
        }
    }
    Some(texts)
}

/// A server whose first connection is served raw by `first` (handed the stream after the
/// handshake, and a sender for what it reads); every later one is a tungstenite server that
/// answers pings and records each text frame.
async fn first_raw<F, Fut>(first: F) -> (String, Frames)
where
    F: FnOnce(
            tokio::net::TcpStream,
            tokio::sync::mpsc::UnboundedSender<(usize, serde_json::Value)>,
        ) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    first_raw_answering(first, |_| None).await
}

/// [`first_raw`], the later connections answering each text frame as `answer` says.
async fn first_raw_answering<F, Fut>(
    first: F,
    answer: fn(&serde_json::Value) -> Option<String>,
) -> (String, Frames)
where
    F: FnOnce(
            tokio::net::TcpStream,
            tokio::sync::mpsc::UnboundedSender<(usize, serde_json::Value)>,
        ) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut first = Some(first);
        let mut n = 0;
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (conn, tx) = (n, tx.clone());
            n += 1;
            if let Some(f) = first.take() {
                accept_raw(&mut tcp).await;
                tokio::spawn(f(tcp, tx));
                continue;
            }
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if let Ok(v) = serde_json::from_str(m.to_text().unwrap_or("")) {
                        let reply = answer(&v);
                        let _ = tx.send((conn, v));
                        if let Some(r) = reply {
                            use futures_util::SinkExt;
                            let _ = ws
                                .send(tokio_tungstenite::tungstenite::Message::text(r))
                                .await;
                        }
                    }
                }
            });
        }
    });
    (url, rx)
}

/// A sink with room for `said` texts: a participant joins and says "Said 0." ... to the
/// server at `url`, whose first connection reads them all (connection 0's frames); then the
/// rejoin on the next connection. The sink, its metrics, the talk and the participant.
async fn said_then_rejoined(
    url: String,
    rx: &mut Frames,
    said: usize,
) -> (WsSink, pvp_t140::metrics::SinkMetrics, Talk, &'static str) {
    let cfg = WsConfig {
        queue: 1024,
        ..ws_recorder::config(url)
    };
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    for i in 0..said {
        sink.send(talk.add(p, &format!("Said {i}.")));
    }
    for _ in 0..=said {
        assert_eq!(next(rx).await.0, 0);
    }
    assert_eq!(shown(&next(rx).await), "1 session.join ");
    (sink, metrics, talk, p)
}

/// A server reads "One." and "Two." (answering none of the pings), refuses "One." as
/// RATE_LIMITED and closes. On the next connection: the rejoin, then "One." (refused, waiting
/// to go again after the pause) and "Two." (unread) in the order they were said, then what was
/// said after; each counted once as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_and_rate_limited_text_go_again_in_order_after_the_rejoin() {
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        let Some(texts) = read_texts(&mut tcp, 3, &tx).await else {
            return;
        };
        let refusal = serde_json::json!({"v": 1, "id": "01JQ0000000000000000000001",
            "ts": "2026-11-29T00:00:00.000Z", "session": "s", "sender": "system", "type": "error",
            "payload": {"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
                "related_to": texts[1]["id"]}});
        write_frame(&mut tcp, 1, refusal.to_string().as_bytes()).await;
        drop(tcp);
    })
    .await;
    let cfg = ws_recorder::config(url);
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "One."));
    sink.send(talk.add(p, "Two."));
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(shown(&next(&mut rx).await));
    }
    assert_eq!(
        seen,
        [
            "0 session.join ",
            "0 context.add One.",
            "0 context.add Two."
        ]
    );
    let rejoin = next(&mut rx).await;
    assert_eq!(shown(&rejoin), "1 session.join ");
    sink.send(talk.add(p, "Three."));
    let mut again = Vec::new();
    for _ in 0..3 {
        again.push(shown(&next(&mut rx).await));
    }
    let stats = sink.close(Duration::from_secs(2)).await;
    assert_eq!(
        again,
        [
            "1 context.add One.",
            "1 context.add Two.",
            "1 context.add Three."
        ]
    );
    assert_eq!((stats.sent, stats.dropped), (4, 0), "{stats:?}");
    assert_eq!(metrics.unread_resent.get(), 1);
    assert_eq!(metrics.rate_limited_resent.get(), 1);
}

/// A server that reads the text and its ping and then sends pongs that answer nothing (one
/// unasked and empty, one with a payload of its own, one echoing the ping's payload with its
/// count raised) before closing: none of them shows the text read, so it goes again after the
/// rejoin, the same envelope (its id and key: the documented duplicate), and is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pongs_that_answer_no_ping_show_nothing_read_and_the_resent_text_is_counted_once() {
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        let mut texts = 0;
        let ping = loop {
            let Some((op, p)) = read_frame(&mut tcp).await else {
                return;
            };
            match op {
                1 => {
                    texts += 1;
                    let _ = tx.send((0, serde_json::from_slice(&p).unwrap()));
                }
                9 if texts == 2 => break p,
                _ => {}
            }
        };
        assert_eq!(ping.len(), 16, "the ping's payload: {ping:?}");
        write_frame(&mut tcp, 10, b"").await;
        write_frame(&mut tcp, 10, b"0123456789abcdef").await;
        let mut raised = ping.clone();
        raised[15] = raised[15].wrapping_add(1);
        write_frame(&mut tcp, 10, &raised).await;
        // Everything written is read before the close.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(tcp);
    })
    .await;
    let cfg = ws_recorder::config(url);
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Read, but no pong says so."));
    let first: Vec<_> = [next(&mut rx).await, next(&mut rx).await].into();
    let again: Vec<_> = [next(&mut rx).await, next(&mut rx).await].into();
    let stats = sink.close(Duration::from_secs(2)).await;
    assert_eq!(shown(&again[0]), "1 session.join ");
    assert_eq!(shown(&again[1]), "1 context.add Read, but no pong says so.");
    assert_eq!(again[1].1["id"], first[1].1["id"]);
    assert_eq!(again[1].1["payload"]["key"], first[1].1["payload"]["key"]);
    assert_eq!((stats.sent, stats.dropped), (2, 0), "{stats:?}");
    assert_eq!(metrics.unread_resent.get(), 1);
}

/// A server that reads everything and answers no ping holds the connection to at most 128
/// unread text envelopes: 200 written, then the close; the last 128 go again after the rejoin,
/// in order, and each of the 200 is counted once as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_server_that_answers_no_ping_at_most_128_go_again() {
    const SAID: usize = 200;
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        if read_texts(&mut tcp, SAID + 1, &tx).await.is_none() {
            return;
        }
        drop(tcp);
    })
    .await;
    let (sink, metrics, _, _) = said_then_rejoined(url, &mut rx, SAID).await;
    let mut again = Vec::new();
    for _ in 0..128 {
        again.push(shown(&next(&mut rx).await));
    }
    let want: Vec<String> = (SAID - 128..SAID)
        .map(|i| format!("1 context.add Said {i}."))
        .collect();
    assert_eq!(again, want);
    let stats = sink.close(Duration::from_secs(2)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (1 + SAID as u64, 0),
        "{stats:?}"
    );
    assert_eq!(metrics.unread_resent.get(), 128);
}

/// As above, but the write of "One." after the pause is what fails (a server that floods
/// pings and stops reading: the connection's write buffer is full of the pongs it owes, and a
/// frame that does not fit fails the write). "One." is then the connection's pending write
/// and "Two." unread text: after the rejoin they must still go in the order they were said
/// (pvp-spec 19.5, per-sender order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_text_whose_write_again_failed_still_goes_before_later_unread_text() {
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        let Some(texts) = read_texts(&mut tcp, 3, &tx).await else {
            return;
        };
        // "One." refused, and four refusals more: a pause of 8 s.
        for (i, related) in [texts[1]["id"].clone(), "x1".into(), "x2".into(), "x3".into(), "x4".into()]
            .into_iter()
            .enumerate()
        {
            let refusal = serde_json::json!({"v": 1, "id": format!("01JQ000000000000000000000{i}"),
                "ts": "2026-11-29T00:00:00.000Z", "session": "s", "sender": "system", "type": "error",
                "payload": {"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
                    "related_to": related}});
            write_frame(&mut tcp, 1, refusal.to_string().as_bytes()).await;
        }
        // 32 MiB of pings, not reading the pongs.
        let mut ping = vec![0x89u8, 125];
        ping.extend_from_slice(&[b'p'; 125]);
        let batch: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 512).collect();
        let mut sent = 0;
        while sent < 32 << 20 {
            use tokio::io::AsyncWriteExt;
            if tcp.write_all(&batch).await.is_err() {
                return;
            }
            sent += batch.len();
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    })
    .await;
    let cfg = ws_recorder::config(url);
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "One."));
    sink.send(talk.add(p, "Two."));
    for _ in 0..3 {
        next(&mut rx).await;
    }
    let rejoin = next(&mut rx).await;
    assert_eq!(shown(&rejoin), "1 session.join ");
    let again = [shown(&next(&mut rx).await), shown(&next(&mut rx).await)];
    sink.close(Duration::from_secs(2)).await;
    assert_eq!(again, ["1 context.add One.", "1 context.add Two."]);
}

/// An approval of the gate `request` (a `gate.request` envelope), from an approver.
fn approve(request: &serde_json::Value) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let gate = &request["id"];
    serde_json::json!({"v": 1, "id": format!("01JQ{n:0>22}"),
        "ts": "2026-11-29T00:00:00.000Z", "session": "s", "sender": "approver-1",
        "type": "gate.approve", "ref": gate,
        "payload": {"gate": gate, "approver": "approver-1"}})
    .to_string()
}

/// `--gate-transcripts`: "One." approved and written on a connection that is lost before a
/// pong shows it read, while "Two." still awaits approval. After the rejoin: "Two." asked
/// about again, "One." sent again, then "Two." once approved: the text in the order said, each
/// counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_text_and_a_chunk_awaiting_approval_across_a_reconnect() {
    let (url, mut rx) = first_raw_answering(
        |mut tcp, tx| async move {
            loop {
                let Some((op, p)) = read_frame(&mut tcp).await else {
                    return;
                };
                if op != 1 {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                let _ = tx.send((0, v.clone()));
                if v["type"] == "gate.request" {
                    if v["payload"]["message"].as_str().unwrap().ends_with("Two.") {
                        // The server goes away with this gate undecided.
                        return;
                    }
                    write_frame(&mut tcp, 1, approve(&v).as_bytes()).await;
                }
            }
        },
        |v| (v["type"] == "gate.request").then(|| approve(v)),
    )
    .await;
    let cfg = WsConfig {
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(60),
        }),
        ..ws_recorder::config(url)
    };
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "One."));
    let mut first = Vec::new();
    loop {
        let f = next(&mut rx).await;
        first.push(shown(&f));
        if f.1["type"] == "context.add" {
            break;
        }
    }
    sink.send(talk.add(p, "Two."));
    let mut second = Vec::new();
    let mut texts = Vec::new();
    while texts.len() < 2 {
        let f = next(&mut rx).await;
        if f.0 == 1 {
            if f.1["type"] == "context.add" {
                texts.push(shown(&f));
            }
            second.push(f.1["type"].as_str().unwrap().to_owned());
        }
    }
    let stats = sink.close(Duration::from_secs(2)).await;
    assert_eq!(
        texts,
        ["1 context.add One.", "1 context.add Two."],
        "{first:?} {second:?}"
    );
    assert_eq!(second[0], "session.join", "{second:?}");
    assert_eq!((stats.sent, stats.dropped), (3, 0), "{stats:?}");
}

/// `--spool`: text written into a connection the server never read goes again after the
/// rejoin, journaled undelivered meanwhile and done once written again: a restart after it
/// sends nothing (no duplicate), and the server got it once on the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_text_resent_after_a_rejoin_is_done_in_the_journal() {
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        if let Some((1, p)) = read_frame(&mut tcp).await {
            let _ = tx.send((0, serde_json::from_slice(&p).unwrap()));
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(tcp);
    })
    .await;
    let dir = scratch("unread-done");
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let cfg = WsConfig {
        heartbeat: Duration::from_secs(1),
        silence: Duration::from_secs(2),
        spool: Some(spool.clone()),
        ..ws_recorder::config(url)
    };
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    assert_eq!(shown(&next(&mut rx).await), "0 session.join ");
    sink.send(talk.add(p, "Said while the server hung."));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(shown(&next(&mut rx).await));
    }
    sink.send(talk.leave(p));
    seen.push(shown(&next(&mut rx).await));
    let stats = sink.close(Duration::from_secs(2)).await;
    drop(spool);
    let (_spool, resend) = Spool::open(&dir, Default::default()).unwrap();
    let again: Vec<String> = resend
        .iter()
        .map(|e| e.to_message().kind.to_string())
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        seen,
        [
            "1 session.join ",
            "1 context.add Said while the server hung.",
            "1 session.leave "
        ]
    );
    assert_eq!((stats.sent, stats.dropped), (3, 0), "{stats:?}");
    assert!(again.is_empty(), "a restart sends {again:?}");
}

/// The real binary: text written into a connection the server never read goes again after
/// the rejoin, and the `stopped` line counts each envelope once: the join, the text and the
/// leave sent, nothing dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stopped_line_counts_resent_unread_text_once() {
    use common::gateway_proc::{Gateway, Sender, log_number};
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        if let Some((1, p)) = read_frame(&mut tcp).await {
            let _ = tx.send((0, serde_json::from_slice(&p).unwrap()));
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(tcp);
    })
    .await;
    let mut gw =
        Gateway::start_for_server(&url, &["--heartbeat-s", "1", "--server-silence-s", "2"]);
    Sender::new(gw.listen, 7).send("Said while the server hung. ");
    assert_eq!(shown(&next(&mut rx).await), "0 session.join ");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(shown(&next(&mut rx).await));
    }
    assert!(gw.terminate(Duration::from_secs(20)).success());
    seen.push(shown(&next(&mut rx).await));
    let lines = gw.stderr_lines();
    let stopped = lines
        .iter()
        .find(|l| l.contains("\"message\":\"stopped\""))
        .unwrap_or_else(|| panic!("no stopped line: {lines:?}"));
    assert_eq!(
        seen,
        [
            "1 session.join ",
            "1 context.add Said while the server hung.",
            "1 session.leave "
        ]
    );
    assert_eq!(
        (log_number(stopped, "sent"), log_number(stopped, "dropped")),
        (3, 0),
        "{stopped}"
    );
}

/// `--spool`, a stop (the participant's leave written behind its text) against a server that
/// hung: it answers neither the ping behind the text nor the Close. The text was never shown
/// read: it is not sent again now (no join after the leave), but it was counted as sent and
/// done in the journal, so no start sent it again. Now counted as dropped and journaled
/// again, as a RATE_LIMITED refusal read after the leave is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_text_before_a_leave_to_a_hung_server_is_journaled_for_the_next_start() {
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        for _ in 0..2 {
            if let Some((1, p)) = read_frame(&mut tcp).await {
                let _ = tx.send((0, serde_json::from_slice(&p).unwrap()));
            }
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(tcp);
    })
    .await;
    let dir = scratch("unread-leave");
    let (spool, _) = Spool::open(&dir, Default::default()).unwrap();
    let spool = Arc::new(spool);
    let cfg = WsConfig {
        spool: Some(spool.clone()),
        ..ws_recorder::config(url)
    };
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Read by nobody."));
    next(&mut rx).await;
    next(&mut rx).await;
    sink.send(talk.leave(p));
    let stats = sink.close(Duration::from_secs(4)).await;
    assert_eq!((stats.sent, stats.dropped), (2, 1), "{stats:?}");
    drop(spool);
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
        again.iter().any(|s| s == "context.add Read by nobody."),
        "a restart sends {again:?}"
    );
}

/// A server that answers no ping reads the join and 100 texts, refuses the first text as
/// INVALID_MESSAGE and closes. The connection holds up to 128 texts unread, but told a refused
/// text only among its last 64 writes: the refusal was passed over (not counted), and the
/// refused text went again after the rejoin with the 99 others. Now it is dropped and counted
/// once, and only the 99 go again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_unread_text_older_than_the_last_64_writes_is_counted_not_sent_again() {
    const SAID: usize = 100;
    let (url, mut rx) = first_raw(|mut tcp, tx| async move {
        let Some(texts) = read_texts(&mut tcp, SAID + 1, &tx).await else {
            return;
        };
        let refusal = serde_json::json!({"v": 1, "id": "01JQ0000000000000000000001",
            "ts": "2026-11-29T00:00:00.000Z", "session": "s", "sender": "system", "type": "error",
            "payload": {"code": "INVALID_MESSAGE", "message": "no", "recoverable": false,
                "related_to": texts[1]["id"]}});
        write_frame(&mut tcp, 1, refusal.to_string().as_bytes()).await;
        drop(tcp);
    })
    .await;
    let (mut sink, metrics, mut talk, p) = said_then_rejoined(url, &mut rx, SAID).await;
    sink.send(talk.add(p, "After."));
    let mut again = Vec::new();
    loop {
        let f = shown(&next(&mut rx).await);
        let last = f == "1 context.add After.";
        again.push(f);
        if last {
            break;
        }
    }
    let mut want: Vec<String> = (1..SAID)
        .map(|i| format!("1 context.add Said {i}."))
        .collect();
    want.push("1 context.add After.".into());
    assert_eq!(again, want);
    let stats = sink.close(Duration::from_secs(2)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (1 + SAID as u64, 1),
        "the join, 99 texts and the last sent; the refused text dropped: {stats:?}"
    );
    assert_eq!(metrics.server_refused_items.get(), 1);
    assert_eq!(metrics.unread_resent.get(), SAID as u64 - 1);
}

/// A burst past the 128 texts a connection holds unread (a participant's backlog after an
/// outage, a restart's resend) into a server that has stopped reading, then the connection
/// lost: every text goes again after the rejoin, in order. The connection wrote on past 128
/// without waiting for the pong, letting the oldest go (marked done in the journal) though the
/// server never read them, so the rejoin resent only the last 128: 72 texts lost, counted
/// sent (found by review bb, session 47). It now waits for the pong, up to 5 s, before writing
/// more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_128_unread_waits_for_the_pong_and_loses_nothing_to_a_lost_connection() {
    const SAID: usize = 200;
    let (url, mut rx) = first_raw(|tcp, _tx| async move {
        // Reads nothing after the handshake: what is written waits in the socket buffers.
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(tcp);
    })
    .await;
    let cfg = WsConfig {
        queue: 1024,
        ..ws_recorder::config(url)
    };
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    for i in 0..SAID {
        sink.send(talk.add(p, &format!("Said {i}.")));
    }
    assert_eq!(shown(&next(&mut rx).await), "1 session.join ");
    let mut got = Vec::with_capacity(SAID);
    for _ in 0..SAID {
        got.push(shown(&next(&mut rx).await));
    }
    let want: Vec<String> = (0..SAID)
        .map(|i| format!("1 context.add Said {i}."))
        .collect();
    assert_eq!(got, want);
    let stats = sink.close(Duration::from_secs(2)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (1 + SAID as u64, 0),
        "{stats:?}"
    );
    assert_eq!(metrics.unread_resent.get(), 128);
}
