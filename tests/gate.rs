//! `--gate-transcripts`: each chunk becomes a `gate.request` (pvp-spec 14.1, action_type
//! "context_change"); the `context.add` follows only once an approver approves, in order, and a
//! rejected chunk is never added. A real approver client takes part through the test server's
//! broadcast (as the reference server relays session traffic).

mod common;

use std::time::Duration;

use common::gateway_proc::{Gateway, Sender, http_get, sample};
use common::pvp_server::{ServerOptions, TestPvpServer, gate_answerer, make_envelope};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// An approver that approves every gate whose message says "approve", rejects "reject".
async fn approver(url: String, session: &'static str) {
    gate_answerer(url, session, "approver-1", move |e| {
        let message = e["payload"]["message"].as_str().unwrap_or("");
        let gate = e["id"].as_str().unwrap();
        vec![if message.contains("reject") {
            make_envelope(
                "gate.reject",
                session,
                "approver-1",
                json!({"gate": gate, "rejector": "approver-1", "reason": "no"}),
                Some(gate),
            )
        } else {
            make_envelope(
                "gate.approve",
                session,
                "approver-1",
                json!({"gate": gate, "approver": "approver-1"}),
                Some(gate),
            )
        }]
    })
    .await;
}

/// A server relaying session traffic to every member (as the reference one does), with an
/// [`approver`] in session "gated".
async fn gated_server() -> TestPvpServer {
    let server = TestPvpServer::start_with(ServerOptions {
        broadcast: true,
        ..ServerOptions::default()
    })
    .await;
    approver(server.url(), "gated").await;
    server
}

/// [`gated_server`] and a gateway gating for it in session "gated", serving /metrics.
async fn gated_with_metrics() -> (TestPvpServer, Gateway) {
    let server = gated_server().await;
    let gw = Gateway::start_for_server(
        &server.url(),
        &[
            "--session",
            "gated",
            "--gate-transcripts",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    (server, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_are_added_only_once_approved_and_in_order() {
    let server = gated_server().await;
    let url = server.url();
    let mut gw = Gateway::start_for_server(&url, &["--session", "gated", "--gate-transcripts"]);
    let mut s = Sender::new(gw.listen, 0x6a7e);
    s.send("Please approve this. ");
    s.send("Please reject this. ");
    s.send("And approve this too. ");
    let p = s.participant();
    let adds = |srv: &TestPvpServer| -> Vec<String> {
        srv.received_of_type("context.add")
            .iter()
            .filter(|e| e["sender"] == p.as_str())
            .map(|e| e["payload"]["content"].as_str().unwrap().to_owned())
            .collect()
    };
    server
        .wait_until(WAIT, "two approved chunks", |srv| adds(srv).len() == 2)
        .await;
    assert!(gw.terminate(WAIT).success());
    assert_eq!(
        adds(&server),
        ["Please approve this.", "And approve this too."]
    );
    let requests = server.received_of_type("gate.request");
    let mine: Vec<&Value> = requests
        .iter()
        .filter(|e| e["sender"] == p.as_str())
        .collect();
    assert_eq!(mine.len(), 3);
    for r in &mine {
        assert_eq!(r["payload"]["action_type"], "context_change");
        assert_eq!(r["payload"]["quorum"], json!({"type": "any", "count": 1}));
    }
    // Each add is the very message its request referred to.
    let added_ids: Vec<Value> = server
        .received_of_type("context.add")
        .iter()
        .filter(|e| e["sender"] == p.as_str())
        .map(|e| e["id"].clone())
        .collect();
    assert_eq!(
        added_ids,
        [
            mine[0]["payload"]["action_ref"].clone(),
            mine[2]["payload"]["action_ref"].clone()
        ]
    );
    server.assert_no_violations();
    server.stop().await;
}

/// The gates' work is on /metrics: each chunk held counted once as a request, the approved
/// ones as approved, the rejected one as refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_approvals_and_refusals_are_counted_on_metrics() {
    let (server, mut gw) = gated_with_metrics().await;
    let m = gw.metrics_addr();
    let mut s = Sender::new(gw.listen, 0x6c70);
    s.send("Please approve this. ");
    s.send("Please reject this. ");
    s.send("And approve this too. ");
    // Released in order: once the second approved chunk is out, the rejected one before it
    // was settled.
    let deadline = std::time::Instant::now() + WAIT;
    let body = loop {
        let body = tokio::task::spawn_blocking(move || http_get(m, "/metrics").1)
            .await
            .unwrap();
        if sample(&body, "pvp_t140_gated_chunks_approved_total").unwrap_or(0.0) >= 2.0 {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not approved:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        sample(&body, "pvp_t140_gate_requests_total"),
        Some(3.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "pvp_t140_gated_chunks_approved_total"),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "pvp_t140_gated_chunks_refused_total"),
        Some(1.0),
        "{body}"
    );
    assert!(gw.terminate(WAIT).success());
    let p = s.participant();
    let requests = server.received_of_type("gate.request");
    assert_eq!(
        requests
            .iter()
            .filter(|e| e["sender"] == p.as_str())
            .count(),
        3
    );
    server.stop().await;
}

#[test]
fn gating_needs_a_server() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .args(["--listen", "127.0.0.1:0", "--gate-transcripts"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--gate-transcripts needs --server"));
}

/// README (Gated transcripts): "Dropped chunks, and the corrections dropped with them, are
/// logged, counted (`pvp_t140_gated_chunks_refused_total`) and marked done in the `--spool`
/// journal". A rejected chunk and the `context.update` correcting it (two backspaces into the
/// sent sentence) are two envelopes dropped; only the chunk was counted, on /metrics and in
/// the `stopped` line's `gated_chunks_refused`, and the correction was not logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_dropped_with_its_rejected_chunk_is_counted() {
    let (server, mut gw) = gated_with_metrics().await;
    let m = gw.metrics_addr();
    let mut s = Sender::new(gw.listen, 0x6b7f);
    s.send("Please reject this. ");
    s.send("\u{8}\u{8}");
    // The core made the chunk and its correction (published once a second), and the chunk was
    // refused.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let body = tokio::task::spawn_blocking(move || http_get(m, "/metrics").1)
            .await
            .unwrap();
        let corrections = sample(&body, "pvp_t140_corrections_total").unwrap_or(0.0);
        let refused = sample(&body, "pvp_t140_gated_chunks_refused_total").unwrap_or(0.0);
        if corrections >= 1.0 && refused >= 1.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no correction or no refusal:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gw.terminate(WAIT).success());
    // Neither the chunk nor its correction reached the server.
    let p = s.participant();
    for kind in ["context.add", "context.update"] {
        assert!(
            server
                .received_of_type(kind)
                .iter()
                .all(|e| e["sender"] != p.as_str()),
            "{kind} of a rejected chunk was sent"
        );
    }
    let stopped = gw
        .stderr_lines()
        .into_iter()
        .find(|l| l.contains("\"stopped\""))
        .expect("a stopped line");
    let v: Value = serde_json::from_str(&stopped).unwrap();
    assert_eq!(
        v["fields"]["gated_chunks_refused"], 2,
        "the chunk and the correction dropped with it: {stopped}"
    );
    server.stop().await;
}
