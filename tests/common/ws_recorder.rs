//! A recording WebSocket server for tests of what the gateway does with a PVP server's
//! replies, and a sink configuration pointed at it.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use pvp_t140::metrics::SinkMetrics;
use pvp_t140::sink::ws::WsConfig;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// Every text frame the server read, with the number of the connection it came on.
pub type Log = Arc<Mutex<Vec<(usize, Value)>>>;

/// A WebSocket server on a free port of 127.0.0.1 that records every text frame and answers
/// each with the frames `answer` gives (text, sent in order).
pub async fn server(answer: fn(usize, &Value) -> Vec<String>) -> (String, Log) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let out = log.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let (conn, log) = (n, out.clone());
            n += 1;
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                        continue;
                    };
                    let replies = answer(conn, &v);
                    log.lock().unwrap().push((conn, v));
                    for r in replies {
                        if ws.send(Message::text(r)).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, log)
}

pub fn config(url: String) -> WsConfig {
    WsConfig {
        url,
        session: "s".into(),
        heartbeat: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        silence: Duration::from_secs(90),
        queue: 64,
        metrics: SinkMetrics::default(),
        tls: None,
        spool: None,
        gate: None,
    }
}

/// A frame from the server in session "s".
pub fn frame(kind: &str, id: &str, sender: &str, payload: Value) -> String {
    json!({"v": 1, "id": id, "ts": "2026-11-28T00:00:00.000Z", "session": "s",
        "sender": sender, "type": kind, "payload": payload})
    .to_string()
}

/// Waits (20 s at most, then fails saying `what`) until the frames the server read satisfy
/// `pred`.
pub async fn wait_for(log: &Log, what: &str, pred: impl Fn(&[(usize, Value)]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !pred(&log.lock().unwrap()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A ping from the server: the pong answering it says that what the server sent before it was
/// read.
pub fn ping(id: &str) -> String {
    frame("heartbeat.ping", id, "system", json!({}))
}

/// Whether the participant has answered a ping.
pub fn ponged(log: &[(usize, Value)]) -> bool {
    log.iter().any(|(_, v)| v["type"] == "heartbeat.pong")
}
