//! A WebSocket PVP server on 127.0.0.1 that logs every frame and answers each as a test says
//! (taking it, or refusing it with an `error` such as RATE_LIMITED), and a `WsSink` to drive
//! against it: tests/rate_limited_controls.rs and tests/rate_limited_notices.rs.
#![allow(dead_code)]
// What the test files take with `use ws_rate::*`, each file some of it.
#![allow(unused_imports)]

pub use std::sync::{Arc, Mutex};
pub use std::time::Duration;

pub use futures_util::{SinkExt, StreamExt};
pub use pvp_t140::metrics::SinkMetrics;
pub use pvp_t140::pvp::{Builder, Envelope, Kind, SenderId};
pub use pvp_t140::sink::ws::{WsConfig, WsSink};
pub use pvp_t140::time::Time;
pub use serde_json::{Value, json};
pub use tokio_tungstenite::tungstenite::Message;

pub const WAIT: Duration = Duration::from_secs(20);

/// Every text frame the server read, in order, and whether the server took it (`false`:
/// answered with an error).
pub type Log = Arc<Mutex<Vec<(Value, bool)>>>;

/// What the server answers a frame with: whether it takes it, and the frames it sends back.
pub type Answer = Box<dyn Fn(&Value) -> (bool, Vec<Value>) + Send + Sync>;

pub async fn server(answer: Answer) -> (String, Log) {
    server_on(Box::new(move |_, v| {
        let (taken, replies) = answer(v);
        (taken, replies, false)
    }))
    .await
}

/// What the server answers a frame from connection `conn` (accept order) with: whether it
/// takes it, the frames it sends back, and whether it then closes the connection.
pub type ConnAnswer = Box<dyn Fn(usize, &Value) -> (bool, Vec<Value>, bool) + Send + Sync>;

/// [`server`], logging each frame with its connection's number in `"conn"`.
pub async fn server_on(answer: ConnAnswer) -> (String, Log) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let answer = Arc::new(answer);
    let out = log.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let (log, answer, conn) = (out.clone(), answer.clone(), n);
            n += 1;
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                        continue;
                    };
                    let (taken, replies, close) = answer(conn, &v);
                    let mut v = v;
                    v["conn"] = json!(conn);
                    log.lock().unwrap().push((v, taken));
                    for r in replies {
                        let _ = ws.send(Message::text(r.to_string())).await;
                    }
                    if close {
                        let _ = ws.close(None).await;
                        return;
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

#[path = "talk.rs"]
mod talk;
pub use talk::Talk;

/// A ULID of the server's own (Crockford digits only).
pub fn fresh_id() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    format!(
        "01JQ{:022}",
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

pub fn from_server(kind: &str, payload: Value) -> Value {
    json!({"v": 1, "id": fresh_id(), "ts": "2026-11-25T00:00:00.000Z",
        "session": "s", "sender": "server", "type": kind, "payload": payload})
}

pub fn rate_limited(related: &Value) -> Value {
    from_server(
        "error",
        json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true,
            "related_to": related}),
    )
}

/// What the server took from `who` (frames it answered with an error left out), heartbeats
/// left out: "join", "leave", "gate.request", or the text added.
pub fn taken(log: &Log, who: &str) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(v, ok)| *ok && v["sender"] == who)
        .filter_map(|(v, _)| match v["type"].as_str().unwrap() {
            "session.join" => Some("join".to_owned()),
            "session.leave" => Some("leave".to_owned()),
            "gate.request" => Some("gate.request".to_owned()),
            "participant.announce" => Some(format!(
                "announce:{}",
                v["payload"]["name"].as_str().unwrap()
            )),
            "context.add" => Some(v["payload"]["content"].as_str().unwrap().to_owned()),
            _ => None,
        })
        .collect()
}

pub async fn wait_until(what: &str, log: &Log, pred: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !pred() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many frames of `kind` from `who` the server read (taken or not) with the id `id`, or
/// any id if `id` is None.
pub fn frames(log: &Log, who: &str, kind: &str) -> Vec<(String, u64, bool)> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(v, _)| v["sender"] == who && v["type"] == kind)
        .map(|(v, ok)| {
            (
                v["id"].as_str().unwrap().to_owned(),
                v["conn"].as_u64().unwrap(),
                *ok,
            )
        })
        .collect()
}

/// Waits until the server took `text` from `p`, then sends `p`'s leave and closes the sink
/// (5 s of grace): its counts.
pub async fn leave_once_taken(
    mut ws: WsSink,
    talk: &mut Talk,
    log: &Log,
    p: &str,
    text: &str,
) -> pvp_t140::sink::SinkStats {
    wait_until("the text taken", log, || {
        taken(log, p).iter().any(|s| s == text)
    })
    .await;
    ws.send(talk.leave(p));
    ws.close(Duration::from_secs(5)).await
}
