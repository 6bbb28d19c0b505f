//! Found by review z: observability (`--metrics`: /metrics, /healthz, and the `stopped` line's counts).

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::gateway_proc::{Gateway, Sender, log_number};
use common::pvp_server::{ServerOptions, TestPvpServer, gate_answerer, make_envelope};

use pvp_t140::metrics::SinkMetrics;
use pvp_t140::sink::ws::{WsConfig, WsSink};
use serde_json::{Value, json};

use common::talk::Talk;

/// The exposition of `sink`'s metrics, as /metrics serves it.
fn exposition(sink: &SinkMetrics) -> String {
    let running = prometheus_client::metrics::gauge::Gauge::default();
    let registry = pvp_t140::metrics::registry(Vec::new(), &running, sink);
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry).unwrap();
    body
}

/// A PVP server down for a while: a participant's connection queue fills, and what does not
/// fit is dropped ("PVP connection queue full; envelope dropped", counted in the `stopped`
/// line's `dropped`). /metrics must show those drops while they happen, as it shows the
/// hand-off queue's (`_sink_queue_refused_total`): an operator watching /metrics during an
/// outage saw no counter move while text was thrown away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelopes_a_full_participant_queue_drops_are_counted_on_metrics() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = SinkMetrics::default();
    let mut ws = WsSink::new(WsConfig {
        url: format!("ws://127.0.0.1:{port}"),
        session: "s".into(),
        heartbeat: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        silence: Duration::from_secs(90),
        queue: 4,
        metrics: metrics.clone(),
        tls: None,
        spool: None,
        gate: None,
    });
    let mut talk = Talk::new();
    let p = "t140:0000abcd@127.0.0.1:40100";
    ws.send(talk.join(p));
    for i in 0..10 {
        ws.send(talk.add(p, &format!("Said during the outage, {i}.")));
    }
    let body = exposition(&metrics);
    let stats = ws.close(Duration::from_millis(300)).await;
    assert!(stats.dropped > 0, "{stats:?}");
    let shown: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("pvp_t140_participant_queue_refused_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no participant queue refusals on /metrics:\n{body}"));
    // Of the 11, the queue of 4 took the join and 3 sentences (a fifth place is kept for the
    // leave): 7 refused while the sink ran.
    assert_eq!(shown, 7, "{body}");
}

/// `GET /metrics` with this `Accept` header, over a fresh connection: the response's head and
/// body.
fn scrape(addr: std::net::SocketAddr, accept: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_ascii_lowercase(), body.to_owned())
}

/// A scraper that asks for the Prometheus text format (`Accept: text/plain;version=0.0.4`:
/// Prometheus with `scrape_protocols: [PrometheusText0.0.4]`, and many agents) was sent
/// OpenMetrics whatever it asked: in the 0.0.4 format a family's samples carry its name, so
/// `# TYPE pvp_t140_datagrams counter` followed by `pvp_t140_datagrams_total 0` is a counter
/// with no samples and an untyped `pvp_t140_datagrams_total` (Python's prometheus_client 0.0.4
/// parser read every counter so). Asked for text/plain, /metrics answers in 0.0.4: each
/// counter's HELP and TYPE under its sample name, no `# EOF`; asked for OpenMetrics (or
/// anything), OpenMetrics as before.
#[test]
fn a_scraper_asking_for_prometheus_text_gets_counters_it_can_type() {
    let mut gw = Gateway::start(&["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]);
    let m = gw.metrics_addr();
    let (head, body) = scrape(m, "text/plain;version=0.0.4;q=0.9,*/*;q=0.1");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(!body.contains("# EOF"), "{body}");
    let types: Vec<(&str, &str)> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    assert!(types.len() > 40, "{body}");
    for (name, ty) in types {
        assert!(body.contains(&format!("# HELP {name} ")), "{name}: {body}");
        let suffixes: &[&str] = if ty == "histogram" {
            &["_bucket", "_sum", "_count"]
        } else {
            &[""]
        };
        let has_samples = body.lines().filter(|l| !l.starts_with('#')).any(|l| {
            let sample = l.split([' ', '{']).next().unwrap();
            suffixes.iter().any(|s| sample == format!("{name}{s}"))
        });
        assert!(
            has_samples,
            "# TYPE {name} {ty} has no samples of that name:\n{body}"
        );
    }
    assert!(
        body.lines()
            .any(|l| l == "# TYPE pvp_t140_datagrams_total counter"),
        "{body}"
    );
    // OpenMetrics for a scraper that asks for it, as before.
    let (head, body) = scrape(
        m,
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    );
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert_eq!(body.trim_end().lines().last(), Some("# EOF"), "{body}");
    assert!(gw.terminate(Duration::from_secs(20)).success());
}

/// `--gate-transcripts`: the `stopped` line's `sent` counted each chunk's `gate.request` (a
/// frame the connection makes itself, as a heartbeat) as an envelope sent, on top of the
/// chunk's `context.add` once approved: three chunks, two approved, said `sent=7` for the join,
/// two adds and the leave the server took. What the core made must add up: sent + dropped +
/// gated_chunks_refused = the `counters` line's envelopes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stopped_lines_sent_counts_envelopes_not_gate_requests() {
    let server = TestPvpServer::start_with(ServerOptions {
        broadcast: true,
        ..ServerOptions::default()
    })
    .await;
    gate_answerer(server.url(), "gated", "approver-1", move |e| {
        let message = e["payload"]["message"].as_str().unwrap_or("");
        let gate = e["id"].as_str().unwrap();
        vec![if message.contains("reject") {
            make_envelope(
                "gate.reject",
                "gated",
                "approver-1",
                json!({"gate": gate, "rejector": "approver-1", "reason": "no"}),
                Some(gate),
            )
        } else {
            make_envelope(
                "gate.approve",
                "gated",
                "approver-1",
                json!({"gate": gate, "approver": "approver-1"}),
                Some(gate),
            )
        }]
    })
    .await;
    let url = server.url();
    let mut gw = Gateway::start_for_server(&url, &["--session", "gated", "--gate-transcripts"]);
    let mut s = Sender::new(gw.listen, 0x6c71);
    s.send("Please approve this. ");
    s.send("Please reject this. ");
    s.send("And approve this too. ");
    let p = s.participant();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server
        .received_of_type("context.add")
        .iter()
        .filter(|e| e["sender"] == p.as_str())
        .count()
        < 2
    {
        assert!(std::time::Instant::now() < deadline, "not approved");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gw.terminate(Duration::from_secs(20)).success());
    let lines = gw.stderr_lines();
    let find = |what: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("\"message\":\"{what}\"")))
            .unwrap_or_else(|| panic!("no {what} line: {lines:?}"))
            .clone()
    };
    let (stopped, counters) = (find("stopped"), find("counters"));
    let (sent, dropped, gated) = (
        log_number(&stopped, "sent"),
        log_number(&stopped, "dropped"),
        log_number(&stopped, "gated_chunks_refused"),
    );
    let envelopes = log_number(&counters, "envelopes");
    assert_eq!(
        (sent, dropped, gated),
        (envelopes - 1, 0, 1),
        "join, 3 chunks and the leave made ({envelopes}); the server took all but the rejected \
         chunk: {stopped}"
    );
    server.stop().await;
}

/// A PVP server that refuses a participant (UNAUTHORIZED, pvp-spec 17) ends it, and what its
/// connection still held (here a chunk awaiting approval) is given up: counted as dropped in
/// the `stopped` line, but on /metrics only `_participants_refused_total` moved, one a
/// participant, however much of its text was lost. The text given up is counted with what its
/// queue refuses (`_participant_queue_refused_total`: its connection ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_refused_participant_held_is_counted_on_metrics() {
    use futures_util::{SinkExt, StreamExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or("")) else {
                        continue;
                    };
                    if v["type"] == "gate.request" {
                        let error = json!({"v": 1, "id": "01JQAAAAAAAAAAAAAAAAAAAAZ1",
                            "ts": "2026-11-25T00:00:00.000Z", "session": "s",
                            "sender": "system", "type": "error",
                            "payload": {"code": "UNAUTHORIZED", "message": "no",
                                "recoverable": false}});
                        let _ = ws
                            .send(tokio_tungstenite::tungstenite::Message::text(
                                error.to_string(),
                            ))
                            .await;
                    }
                }
            });
        }
    });
    let metrics = SinkMetrics::default();
    let mut ws = WsSink::new(WsConfig {
        url,
        session: "s".into(),
        heartbeat: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
        silence: Duration::from_secs(90),
        queue: 64,
        metrics: metrics.clone(),
        tls: None,
        spool: None,
        gate: Some(pvp_t140::sink::gate::GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(3600),
        }),
    });
    let mut talk = Talk::new();
    let p = "t140:0000de12@127.0.0.1:40135";
    ws.send(talk.join(p));
    ws.send(talk.add(p, "Never approved, never delivered."));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while metrics.refused.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "not refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let body = exposition(&metrics);
    let stats = ws.close(Duration::from_secs(5)).await;
    assert_eq!(stats.dropped, 1, "{stats:?}");
    assert!(
        body.lines()
            .any(|l| l == "pvp_t140_participant_queue_refused_total 1"),
        "the chunk given up is not on /metrics:\n{body}"
    );
}
