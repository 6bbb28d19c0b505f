//! `--gate-transcripts` (src/sink/gate.rs) against pvp-spec 14: who decides, what a quorum
//! counts, a request asked again; through the gates' plain-data API with time passed in as a
//! value, and end to end with a real gateway and server.

mod common;

use std::time::{Duration, Instant};

use common::gateway_proc::{Gateway, Sender, http_get, sample};
use common::pvp_server::{ServerOptions, TestPvpServer, gate_answerer, make_envelope};

use pvp_t140::pvp::{Builder, Envelope, Kind, Message};
use pvp_t140::sink::gate::{GateConfig, Gates};
use pvp_t140::time::Time;
use serde_json::{Value, json};

fn gates(quorum: u32) -> Gates {
    Gates::new(
        GateConfig {
            quorum,
            timeout: Duration::from_secs(60),
        },
        64,
    )
}

fn add(pvp: &mut Builder, key: &str) -> Envelope {
    pvp.envelope(
        Time(0),
        "t140:00000001@127.0.0.1:5000".into(),
        Kind::ContextAdd,
        &json!({"key": key, "content": "Hello there."}),
    )
}

/// A frame from the server, sent under `sender`.
fn from(sender: &str, kind: &str, payload: Value) -> Message {
    Message {
        v: 1,
        id: "01JAAAAAAAAAAAAAAAAAAAAAAA".into(),
        ts: "2026-11-28T00:00:00.000Z".into(),
        session: "s".into(),
        sender: sender.into(),
        kind: kind.into(),
        payload,
        reference: None,
    }
}

/// pvp-spec 14.2: "Any N participants with approve capability". One member (the envelope's
/// sender, whom the server authenticated and checked for the approver role) approving twice,
/// naming a different `approver` in each payload, is one participant: with a quorum of 2 the
/// chunk must still wait. It was released on the second approval.
#[test]
fn one_member_approving_twice_under_two_approver_names_is_one_approval() {
    let mut pvp = Builder::new("s".into(), None, 1);
    let mut g = gates(2);
    let t = Instant::now();
    let chunk = add(&mut pvp, "k1");
    let request = g.offer(chunk, &mut pvp, t, Time(0)).unwrap();
    let gate = request.id().to_string();
    for name in ["alice", "bob"] {
        g.on_server(&from(
            "mallory",
            "gate.approve",
            json!({"gate": gate, "approver": name}),
        ));
    }
    let (send, dropped) = g.release(t);
    assert!(
        send.is_empty() && dropped.is_empty(),
        "released on one member's two approvals"
    );
    // A second member makes the quorum.
    g.on_server(&from(
        "carol",
        "gate.approve",
        json!({"gate": gate, "approver": "carol"}),
    ));
    assert_eq!(g.release(t).0.len(), 1);
    assert_eq!(g.stats.approved, 1);
}

/// A server relaying approvals under its own id (pvp-spec 4.2 "system") names the approver in
/// the payload: those count by `approver`.
#[test]
fn approvals_relayed_by_the_server_count_by_their_approver() {
    let mut pvp = Builder::new("s".into(), None, 1);
    let mut g = gates(2);
    let t = Instant::now();
    let request = g.offer(add(&mut pvp, "k1"), &mut pvp, t, Time(0)).unwrap();
    let gate = request.id().to_string();
    for name in ["alice", "bob"] {
        g.on_server(&from(
            "system",
            "gate.approve",
            json!({"gate": gate, "approver": name}),
        ));
    }
    assert_eq!(g.release(t).0.len(), 1);
}

/// pvp-spec 14.3 / implementation guide 1.4: `gate.timeout` is the server's ("Emit
/// `gate.timeout` when timeout expires", "resolve based on session config"). The reference
/// server checks the approver role for `gate.approve` and `gate.reject` but relays a
/// `gate.timeout` from any member as-is (router.ts' default branch), so any member, an
/// observer included, could approve a chunk unasked with `resolution: "auto_approved"`, or
/// suppress it with "rejected". The gateway acted on it whoever sent it.
#[test]
fn a_gate_timeout_from_a_member_is_not_the_servers_decision() {
    let mut pvp = Builder::new("s".into(), None, 1);
    let mut g = gates(1);
    let t = Instant::now();
    let a = g.offer(add(&mut pvp, "k1"), &mut pvp, t, Time(0)).unwrap();
    let b = g.offer(add(&mut pvp, "k2"), &mut pvp, t, Time(0)).unwrap();
    let timeout = |gate: &Envelope, resolution: &str| {
        json!({"gate": gate.id().to_string(), "approvals_received": 0,
               "approvals_required": 1, "resolution": resolution})
    };
    g.on_server(&from(
        "observer-1",
        "gate.timeout",
        timeout(&a, "auto_approved"),
    ));
    g.on_server(&from("observer-1", "gate.timeout", timeout(&b, "rejected")));
    let (send, dropped) = g.release(t);
    assert!(
        send.is_empty(),
        "a member's auto_approved released the chunk"
    );
    assert!(
        dropped.is_empty(),
        "a member's gate.timeout dropped a chunk"
    );
    // The server's own gate.timeout decides.
    g.on_server(&from(
        "system",
        "gate.timeout",
        timeout(&a, "auto_approved"),
    ));
    g.on_server(&from("server", "gate.timeout", timeout(&b, "rejected")));
    let (send, dropped) = g.release(t);
    assert_eq!(send.len(), 1);
    assert_eq!(dropped.len(), 1);
}

/// `--help` said `--gate-quorum` is the "gate.approve messages a chunk needs", but the gates
/// count approvers (distinct members; README "Gated transcripts", pvp-spec 14.2): two
/// messages from one approver do not meet a quorum of two.
#[test]
fn help_says_the_quorum_counts_approvers_not_messages() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let quorum = help
        .split("--gate-quorum <GATE_QUORUM>")
        .nth(1)
        .and_then(|s| s.split("--gate-timeout-s").next())
        .expect("--gate-quorum in --help");
    assert!(
        !quorum.contains("messages a chunk needs") && quorum.contains("distinct"),
        "--gate-quorum's help: {quorum}"
    );
}

/// README (Gated transcripts): after a reconnect the participant "sends the requests of its
/// pending chunks again (the same envelopes): a server that restarted has lost its gates"; a
/// request refused as RATE_LIMITED is asked again after the pause. The server makes the gate
/// then, and times it out `timeout_seconds` from then, as its approvers see. The gateway kept
/// the deadline of the first offer: a server down for 40 s of a 60 s timeout left approvers
/// 25 s of the 60 they were told, and an approval (or the server's `auto_approved`) after that
/// was ignored, the chunk dropped as timed out. Asked again, a gate waits `timeout_seconds` and
/// the grace from then.
#[test]
fn a_request_asked_again_gets_its_whole_timeout_from_then() {
    let mut pvp = Builder::new("s".into(), None, 1);
    let mut g = gates(1);
    let t = Instant::now();
    let request = g.offer(add(&mut pvp, "k1"), &mut pvp, t, Time(0)).unwrap();
    let secs = Duration::from_secs;
    // The connection comes back 40 s later and asks again.
    assert!(g.asked(request.id(), t + secs(40)));
    assert_eq!(g.next_deadline(), Some(t + secs(105)));
    let (send, dropped) = g.release(t + secs(90));
    assert!(send.is_empty() && dropped.is_empty(), "timed out early");
    g.on_server(&from(
        "approver-1",
        "gate.approve",
        json!({"gate": request.id().to_string(), "approver": "approver-1"}),
    ));
    assert_eq!(g.release(t + secs(90)).0.len(), 1);
    // Asked earlier than the deadline it has, a gate keeps it; a decided one is not asked.
    let r2 = g
        .offer(add(&mut pvp, "k2"), &mut pvp, t + secs(100), Time(0))
        .unwrap();
    assert!(g.asked(r2.id(), t));
    assert_eq!(g.next_deadline(), Some(t + secs(165)));
    assert!(!g.asked(request.id(), t + secs(100)));
}

/// End to end, a real gateway and a server relaying session traffic as the reference one does:
/// a member (joined as an approver, but any member will do) answers each of the gateway's
/// `gate.request`s with a `gate.timeout` of its own, `resolution: "auto_approved"`, then a
/// `gate.reject`. Only the reject is a decision the gateway may act on: the chunk must not be
/// added. It was, on the forged timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_auto_approve_a_chunk_with_a_gate_timeout_of_its_own() {
    let server = TestPvpServer::start_with(ServerOptions {
        broadcast: true,
        ..ServerOptions::default()
    })
    .await;
    gate_answerer(server.url(), "gated", "member-1", |e| {
        let gate = e["id"].as_str().unwrap();
        let forged = make_envelope(
            "gate.timeout",
            "gated",
            "member-1",
            json!({"gate": gate, "approvals_received": 0, "approvals_required": 1,
                "resolution": "auto_approved"}),
            Some(gate),
        );
        let reject = make_envelope(
            "gate.reject",
            "gated",
            "member-1",
            json!({"gate": gate, "rejector": "member-1", "reason": "no"}),
            Some(gate),
        );
        vec![forged, reject]
    })
    .await;
    let mut gw = Gateway::start_for_server(
        &server.url(),
        &[
            "--session",
            "gated",
            "--gate-transcripts",
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    let mut s = Sender::new(gw.listen, 0x7a11);
    s.send("Not for the record. ");
    let p = s.participant();
    let m = gw.metrics_addr();
    let adds = |srv: &TestPvpServer| -> Vec<Value> {
        srv.received_of_type("context.add")
            .into_iter()
            .filter(|e| e["sender"] == p.as_str())
            .collect()
    };
    // Settled one way or the other: added, or dropped and counted.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = tokio::task::spawn_blocking(move || http_get(m, "/metrics").1)
            .await
            .unwrap();
        let refused = sample(&body, "pvp_t140_gated_chunks_refused_total").unwrap_or(0.0);
        if refused >= 1.0 || !adds(&server).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the chunk was not settled:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gw.terminate(Duration::from_secs(20)).success());
    let added = adds(&server);
    assert!(
        added.is_empty(),
        "added on a member's gate.timeout: {added:?}"
    );
    server.stop().await;
}
