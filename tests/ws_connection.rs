//! The WebSocket sink's connection life (close handling, reconnects and their backoff, frames
//! it cannot read, what it logs and counts), against a real WebSocket server on 127.0.0.1.
//! Each test failed before the fix it pins (review, session 32).

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use pvp_t140::metrics::SinkMetrics;
use pvp_t140::pvp::{Builder, Envelope, Kind, SenderId};
use pvp_t140::sink::ws::{WsConfig, WsSink};
use pvp_t140::time::Time;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

const WAIT: Duration = Duration::from_secs(20);

fn config(url: String) -> WsConfig {
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

struct Talk {
    b: Builder,
    t: u64,
}

impl Talk {
    fn new() -> Self {
        Talk {
            b: Builder::new("s".into(), None, 32),
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
    let mut sink = WsSink::new(config(url));
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
        ..config(url)
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
    let mut sink = WsSink::new(config(url));
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
        ..config(url)
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
    let mut sink = WsSink::new(config(url));
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
