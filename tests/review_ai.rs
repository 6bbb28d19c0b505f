//! Review ai (session 44): delivery of the WebSocket sink across connection loss (the unread
//! text a connection takes back and sends again after the rejoin, `Retry` in
//! src/sink/ws.rs), against real WebSocket servers on 127.0.0.1 and real spool directories.

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
