//! Review z: observability (`--metrics`: /metrics, /healthz, and the `stopped` line's counts).

use std::time::Duration;

use pvp_t140::metrics::SinkMetrics;
use pvp_t140::pvp::{Builder, Envelope, Kind, SenderId};
use pvp_t140::sink::ws::{WsConfig, WsSink};
use pvp_t140::time::Time;
use serde_json::{Value, json};

struct Talk {
    b: Builder,
    t: u64,
}

impl Talk {
    fn new() -> Self {
        Talk {
            b: Builder::new("s".into(), None, 41),
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
