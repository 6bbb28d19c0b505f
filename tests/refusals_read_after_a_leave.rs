//! The PVP sink's at-least-once delivery with text marked done at its pong (`Retry` in
//! src/sink/ws.rs, the journal in src/sink/spool.rs), against real WebSocket servers on
//! 127.0.0.1: refusals read while a participant's connection closes after its leave.
//!
//! Found by review an (session 45).

mod common;
#[path = "common/ws_recorder.rs"]
mod ws_recorder;

use std::time::Duration;

use common::talk::Talk;
use futures_util::{SinkExt, StreamExt};
use pvp_t140::sink::ws::WsSink;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// A server that reads everything (answering each ping, as tungstenite does), and once it has
/// read the participant's leave, refuses as RATE_LIMITED the first text it read, 300 ms later:
/// the connection is then closing (its Close written), and reads the refusal there.
async fn refuses_the_first_text_after_the_leave() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let mut first: Option<String> = None;
        while let Some(Ok(m)) = ws.next().await {
            let Message::Text(t) = m else { continue };
            let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
            match v["type"].as_str() {
                Some("context.add") if first.is_none() => {
                    first = v["id"].as_str().map(str::to_owned);
                }
                Some("session.leave") => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let refusal = ws_recorder::frame(
                        "error",
                        "01JQ00000000000000000000RL",
                        "system",
                        serde_json::json!({"code": "RATE_LIMITED", "message": "slow down",
                            "recoverable": true, "related_to": first.clone().unwrap()}),
                    );
                    let _ = ws.send(Message::text(refusal)).await;
                }
                _ => {}
            }
        }
    });
    url
}

/// README: a `RATE_LIMITED` naming text "refused when no longer held (older, or 8 newer
/// since), or after its participant's leave was written, is dropped and counted in
/// `pvp_t140_server_refused_items_total` too". Read while the connection closes after the
/// leave, for text no longer held (10 written, all seen read: the oldest two let go), it was
/// passed over without a word: counted as sent, not as dropped nor refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_read_after_the_leave_of_text_no_longer_held_is_counted_as_dropped() {
    let url = refuses_the_first_text_after_the_leave().await;
    let cfg = ws_recorder::config(url);
    let metrics = cfg.metrics.clone();
    let mut sink = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000beef@127.0.0.1:40000";
    sink.send(talk.join(p));
    for i in 0..10 {
        sink.send(talk.add(p, &format!("Text {i}.")));
    }
    sink.send(talk.leave(p));
    let stats = sink.close(Duration::from_secs(10)).await;
    assert_eq!(
        (stats.sent, stats.dropped),
        (11, 1),
        "the join, nine texts and the leave sent; the refused text dropped: {stats:?}"
    );
    assert_eq!(metrics.server_refused_items.get(), 1);
}
