//! The `/metrics` exposition of the real binary against the OpenMetrics 1.0 ABNF: every
//! `# HELP` text is an `escaped-string` (no bare double quote or backslash); and the log of a
//! participant whose connection queue drops what it says (a PVP server down) is rate limited.
//!
//! Found by review aq (session 45).

mod common;
#[path = "common/ws_recorder.rs"]
mod ws_recorder;

use std::time::Duration;

use common::gateway_proc::{Gateway, http_get};
use common::talk::Talk;
use pvp_t140::sink::ws::{WsConfig, WsSink};

/// Whether `text` is an OpenMetrics 1.0 `escaped-string`: `normal-char` excludes LF, DQUOTE
/// and BS, which appear only as `\n`, `\"` and `\\`.
fn is_escaped_string(text: &str) -> bool {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\n' => return false,
            '\\' if !matches!(chars.next(), Some('n' | '"' | '\\')) => return false,
            _ => {}
        }
    }
    true
}

/// OpenMetrics 1.0 (ABNF, `metric-descriptor =/ HASH SP help SP metricname SP
/// escaped-string LF`): a HELP text holds a double quote only escaped. The help of
/// `pvp_t140_t140llm_objects` quoted `"[object Object]"` bare: a strict OpenMetrics parser
/// rejects the whole scrape. Escaping it would not do: in the Prometheus text format 0.0.4,
/// served from the same text, `\"` in a HELP is an invalid escape. So no help text may hold
/// a quote or a backslash at all.
#[test]
fn every_help_text_is_an_openmetrics_escaped_string() {
    let mut gw = Gateway::start(&["--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let (status, body) = http_get(m, "/metrics");
    assert_eq!(status, 200, "{body}");
    let helps: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .collect();
    assert!(helps.len() > 50, "{body}");
    let bad: Vec<&&str> = helps
        .iter()
        .filter(|h| {
            let text = h.split_once(' ').map_or("", |(_, t)| t);
            !is_escaped_string(text) || text.contains(['"', '\\'])
        })
        .collect();
    assert!(
        bad.is_empty(),
        "HELP texts that are not escaped-strings: {bad:#?}"
    );
}

/// A log writer into a shared buffer.
#[derive(Clone, Default)]
struct Logged(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logged {
    /// A subscriber writing warnings and errors here.
    fn warnings(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let l = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || l.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish()
    }

    /// The lines logged that contain `needle`, and all that was logged.
    fn lines(&self, needle: &str) -> (usize, String) {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        (text.lines().filter(|l| l.contains(needle)).count(), text)
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A PVP server down: a participant's connection queue fills, and each envelope it refuses
/// was logged at warn level, one line an envelope ("PVP connection queue full; envelope
/// dropped"); the same for every envelope of a participant the server refused (its
/// connection closed). Whoever speaks (or floods the RTP port with text) through an outage
/// filled the log at the rate text came. Now the first drop is logged, then at most one line
/// every 10 s with how many since; every drop is still counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_queue_dropping_everything_logs_once_not_per_envelope() {
    let logged = Logged::default();
    let sub = logged.warnings();
    // On this thread, where `WsSink::send` queues.
    let _log = tracing::subscriber::set_default(sub);
    // A port nobody listens on: the server is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = WsConfig {
        queue: 4,
        ..ws_recorder::config(format!("ws://127.0.0.1:{port}"))
    };
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000abcd@127.0.0.1:40100";
    ws.send(talk.join(p));
    for i in 0..500 {
        ws.send(talk.add(p, &format!("Said during the outage, {i}.")));
    }
    // Of the 501, the queue of 4 took the join and 3 sentences (a fifth place is kept for
    // the leave): 497 refused, each counted.
    assert_eq!(metrics.participant_queue_refused.get(), 497);
    let (lines, text) = logged.lines("envelope dropped");
    // One, unless the test took 10 s to queue 500 envelopes.
    assert!(lines <= 2, "{lines} lines for 497 drops:\n{text}");
    assert!(lines >= 1, "the first drop was not logged:\n{text}");
    drop(_log);
    let stats = ws.close(Duration::from_millis(300)).await;
    assert!(stats.dropped >= 497, "{stats:?}");
}

/// `--gate-transcripts` with a server that decides no gate: once a participant's queue bound
/// of chunks awaits approval, every chunk it speaks is crowded out, and each was logged at warn
/// level, a line a chunk. Now the first is logged, then at most one line every 10 s with how
/// many since; every drop is still counted in `pvp_t140_gated_chunks_refused_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_crowded_out_at_the_gates_log_once_not_per_chunk() {
    use futures_util::StreamExt;
    let logged = Logged::default();
    let sub = logged.warnings();
    // The connection task logs on the runtime's threads: the only global subscriber of this
    // test binary (the other test's, on its own thread, is set there).
    tracing::subscriber::set_global_default(sub).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                // Reads everything, decides nothing.
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    let cfg = WsConfig {
        queue: 4,
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(60),
        }),
        ..ws_recorder::config(url)
    };
    let metrics = cfg.metrics.clone();
    let mut ws = WsSink::new(cfg);
    let mut talk = Talk::new();
    let p = "t140:0000abcd@127.0.0.1:40101";
    ws.send(talk.join(p));
    // Four await approval (the queue's bound), each asked about; each one after is crowded
    // out as the connection takes it (sent one at a time, so the queue refuses none).
    const SAID: u64 = 100;
    for i in 0..SAID {
        ws.send(talk.add(p, &format!("Said with no gate decided, {i}.")));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while metrics.gate_requests.get() + metrics.gates_refused.get() < i + 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "chunk {i} not taken: {} refused, {} requests, {} queue refused",
                metrics.gates_refused.get(),
                metrics.gate_requests.get(),
                metrics.participant_queue_refused.get()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert_eq!(metrics.gate_requests.get(), 4);
    assert_eq!(metrics.gates_refused.get(), SAID - 4);
    assert_eq!(metrics.participant_queue_refused.get(), 0);
    let (lines, text) = logged.lines("awaiting approval; dropped");
    // One, unless the test took 10 s to offer 100 chunks.
    assert!(lines <= 2, "{lines} lines for 96 drops:\n{text}");
    assert!(lines >= 1, "the first drop was not logged:\n{text}");
    ws.close(Duration::from_millis(300)).await;
}
