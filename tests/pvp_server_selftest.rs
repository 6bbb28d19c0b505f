//! Proves that the PVP test server (`tests/common/pvp_server.rs`) accepts a conformant client and
//! catches each kind of non-conformance, so a gateway test that sees zero violations means
//! something.

mod common;

use std::time::Duration;

use common::pvp_server::{
    PRIMITIVE_TYPES, Received, ServerOptions, TestPvpServer, check_timestamp, check_ulid,
    make_envelope, new_ulid, now_ts, validate_envelope,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const WAIT: Duration = Duration::from_secs(5);
const SESSION: &str = "ses_test";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Client {
    async fn connect(server: &TestPvpServer) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(server.url())
            .await
            .expect("connect to test server");
        Client { ws }
    }

    async fn send(&mut self, v: &Value) {
        self.ws
            .send(Message::text(v.to_string()))
            .await
            .expect("send");
    }

    async fn send_raw(&mut self, m: Message) {
        self.ws.send(m).await.expect("send");
    }

    /// Next envelope from the server, skipping WebSocket control frames.
    async fn recv(&mut self) -> Value {
        loop {
            let m = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("timed out waiting for a frame from the server")
                .expect("connection ended")
                .expect("websocket error");
            if let Message::Text(t) = m {
                return serde_json::from_str(t.as_str()).expect("server sent JSON");
            }
        }
    }

    /// Next envelope of type `typ` (others are skipped).
    async fn recv_type(&mut self, typ: &str) -> Value {
        loop {
            let v = self.recv().await;
            if v["type"] == typ {
                return v;
            }
        }
    }
}

fn env(typ: &str, sender: &str, payload: Value) -> Value {
    json!({
        "v": 1,
        "id": new_ulid(),
        "ts": now_ts(),
        "session": SESSION,
        "sender": sender,
        "type": typ,
        "payload": payload,
    })
}

fn join(sender: &str) -> Value {
    env(
        "session.join",
        sender,
        json!({
            "participant": {
                "id": sender,
                "name": "T.140 caller",
                "type": "human",
                "roles": ["navigator"],
                "capabilities": ["add_context"],
                "transport": "t140",
                "metadata": { "ssrc": 305419896 }
            },
            "supported_versions": [1]
        }),
    )
}

fn context_add(sender: &str, key: &str) -> Value {
    env(
        "context.add",
        sender,
        json!({
            "key": key,
            "content_type": "audio_transcript",
            "content": "Hello, world.",
            "source": "t140:ssrc=305419896",
            "tags": ["t140", "transcript"]
        }),
    )
}

fn leave(sender: &str) -> Value {
    env("session.leave", sender, json!({ "reason": "stream ended" }))
}

/// Waits until at least `n` envelopes have arrived, then returns the violations found by then
/// (the server records an envelope and its violations under one lock).
async fn violations_after(server: &TestPvpServer, n: usize) -> Vec<String> {
    server.wait_for(WAIT, |r| r.len() >= n).await;
    server.violations()
}

fn assert_violation(violations: &[String], needles: &[&str]) {
    assert!(
        violations
            .iter()
            .any(|v| needles.iter().all(|n| v.contains(n))),
        "no violation contains all of {needles:?}; violations:\n  {}",
        violations.join("\n  ")
    );
}

fn problems(v: &Value) -> String {
    validate_envelope(v).expect_err("envelope should be rejected")
}

// ---------------------------------------------------------------------------------------------
// validate_envelope: pure checks
// ---------------------------------------------------------------------------------------------

#[test]
fn valid_envelopes_pass_the_validator() {
    for v in [
        join("gw_1"),
        context_add("gw_1", "t140-1"),
        leave("gw_1"),
        env("session.leave", "gw_1", json!({})),
        env("heartbeat.pong", "gw_1", json!({})),
        make_envelope("heartbeat.ping", SESSION, "system", json!({}), None),
    ] {
        assert_eq!(validate_envelope(&v), Ok(()), "{v}");
    }
    let mut with_optionals = context_add("gw_1", "k");
    with_optionals["ref"] = json!(new_ulid());
    with_optionals["seq"] = json!(7);
    with_optionals["causal_refs"] = json!([new_ulid()]);
    with_optionals["fork"] = json!("explore-auth");
    with_optionals["payload"]["visible_to"] = json!(["alice_01"]);
    assert_eq!(validate_envelope(&with_optionals), Ok(()));

    let mut by_ref = context_add("gw_1", "k");
    by_ref["payload"].as_object_mut().unwrap().remove("content");
    by_ref["payload"]["content_ref"] = json!({
        "hash": "ab12", "size_bytes": 12, "mime_type": "text/plain", "storage": "local"
    });
    assert_eq!(validate_envelope(&by_ref), Ok(()));

    // Every type of the 4.3 table (41 of them, the spec's "40" notwithstanding) is accepted.
    for t in PRIMITIVE_TYPES {
        if [
            "session.join",
            "context.add",
            "error",
            "participant.announce",
        ]
        .contains(&t)
        {
            continue; // these payloads have required fields, checked below
        }
        let v = env(t, "gw_1", json!({}));
        assert_eq!(validate_envelope(&v), Ok(()), "{t}");
    }
    assert_eq!(PRIMITIVE_TYPES.len(), 41);
}

#[test]
fn validator_rejects_bad_envelope_fields() {
    let base = context_add("gw_1", "k");
    let with = |field: &str, val: Value| {
        let mut v = base.clone();
        v[field] = val;
        v
    };
    assert!(problems(&with("v", json!(2))).contains("field `v`"));
    assert!(problems(&with("v", json!("1"))).contains("field `v`"));
    assert!(problems(&with("v", json!(1.0))).contains("field `v`"));
    assert!(problems(&with("id", json!("not-a-ulid"))).contains("field `id`"));
    assert!(problems(&with("id", json!(12))).contains("field `id`"));
    assert!(problems(&with("ts", json!("yesterday"))).contains("field `ts`"));
    assert!(problems(&with("ts", json!(1_764_000_000))).contains("field `ts`"));
    assert!(problems(&with("session", json!(""))).contains("field `session`"));
    assert!(problems(&with("sender", json!(null))).contains("field `sender`"));
    assert!(problems(&with("type", json!("context.append"))).contains("field `type`"));
    assert!(problems(&with("payload", json!("text"))).contains("field `payload`"));
    assert!(problems(&with("seq", json!(-1))).contains("field `seq`"));
    assert!(problems(&with("causal_refs", json!("x"))).contains("field `causal_refs`"));
    assert!(problems(&with("extra", json!(1))).contains("field `extra`: unknown"));
    for field in ["v", "id", "ts", "session", "sender", "type", "payload"] {
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove(field);
        assert!(
            problems(&v).contains(&format!("field `{field}`: missing")),
            "{field}"
        );
    }
    assert!(problems(&json!([1, 2])).contains("not a JSON object"));
}

#[test]
fn ulid_check_is_crockford_base32() {
    assert_eq!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAV"), Ok(()));
    assert_eq!(check_ulid(&new_ulid()), Ok(()));
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FA").is_err()); // 25 chars
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAVV").is_err()); // 27 chars
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAI").is_err()); // I
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAL").is_err()); // L
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAO").is_err()); // O
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAU").is_err()); // U
    assert!(check_ulid("01arz3ndektsv4rrffq69g5fav").is_err()); // lower case
    assert!(check_ulid("81ARZ3NDEKTSV4RRFFQ69G5FAV").is_err()); // > 128 bits
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FA-").is_err());
    assert!(check_ulid("01ARZ3NDEKTSV4RRFFQ69G5FAé").is_err());
    // The spec's own Appendix A uses ids with U and I, which are not Crockford base32.
    assert!(check_ulid("01HX7K9Q5RAEWF4SG9NX7S6U3C").is_err());
    // Many ids are unique and canonical.
    let ids: std::collections::HashSet<String> = (0..10_000).map(|_| new_ulid()).collect();
    assert_eq!(ids.len(), 10_000);
    assert!(ids.iter().all(|i| check_ulid(i).is_ok()));
}

#[test]
fn timestamp_check_is_iso_8601() {
    for ok in [
        "2026-11-22T19:07:12.123Z",
        "2026-11-22T19:07:12Z",
        "2026-11-22T19:07:12.123456789Z",
        "2026-11-22T19:07:12+01:00",
        "2026-11-22T19:07:12.5-05:30",
        "2024-02-29T00:00:00Z",
        "2016-12-31T23:59:60Z",
    ] {
        assert_eq!(check_timestamp(ok), Ok(()), "{ok}");
    }
    for bad in [
        "2026-11-22 19:07:12.123Z",
        "2026-11-22T19:07:12.123",
        "2026-11-22T19:07:12.Z",
        "2026-11-22T19:07:12.1234567890Z",
        "2026-11-22T19:07:12z",
        "2026-11-22T19:07Z",
        "2026-13-22T19:07:12Z",
        "2025-02-29T19:07:12Z",
        "2026-11-22T24:07:12Z",
        "2026-11-22T19:07:12+0100",
        "2026-11-22T19:07:12.123Zjunk",
        "20261122T190712Z",
        "1764000000",
    ] {
        assert!(check_timestamp(bad).is_err(), "{bad}");
    }
    assert_eq!(check_timestamp(&now_ts()), Ok(()));
}

#[test]
fn validator_checks_session_join_payload() {
    let mut v = join("gw_1");
    v["payload"]["participant"]["id"] = json!("someone_else");
    assert!(problems(&v).contains("payload.participant.id"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["roles"] = json!([]);
    assert!(problems(&v).contains("payload.participant.roles"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["roles"] = json!(["navigator", "speaker"]);
    assert!(problems(&v).contains("payload.participant.roles[1]"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["capabilities"] = json!(["add_context", "transcribe"]);
    assert!(problems(&v).contains("payload.participant.capabilities[1]"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["type"] = json!("bot");
    assert!(problems(&v).contains("payload.participant.type"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["transport"] = json!("rtp");
    assert!(problems(&v).contains("payload.participant.transport"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["name"] = json!("");
    assert!(problems(&v).contains("payload.participant.name"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["metadata"] = json!("ssrc");
    assert!(problems(&v).contains("payload.participant.metadata"));

    let mut v = join("gw_1");
    v["payload"]["supported_versions"] = json!([2]);
    assert!(problems(&v).contains("payload.supported_versions"));

    let mut v = join("gw_1");
    v["payload"]
        .as_object_mut()
        .unwrap()
        .remove("supported_versions");
    assert!(problems(&v).contains("payload.supported_versions`: missing"));

    let mut v = join("gw_1");
    v["payload"]["token"] = json!(42);
    assert!(problems(&v).contains("payload.token"));

    let mut v = join("gw_1");
    v["payload"].as_object_mut().unwrap().remove("participant");
    assert!(problems(&v).contains("payload.participant`: missing"));

    let mut v = join("gw_1");
    v["payload"]["participant"]["displayName"] = json!("x");
    assert!(problems(&v).contains("payload.participant.displayName`: unknown"));
}

#[test]
fn validator_checks_context_add_leave_heartbeat_and_error_payloads() {
    let mut v = context_add("gw_1", "k");
    v["payload"]["content_type"] = json!("transcript");
    assert!(problems(&v).contains("payload.content_type"));

    let mut v = context_add("gw_1", "k");
    v["payload"].as_object_mut().unwrap().remove("content");
    assert!(problems(&v).contains("neither `content` nor `content_ref`"));

    let mut v = context_add("gw_1", "k");
    v["payload"]["content"] = json!(["a"]);
    assert!(problems(&v).contains("payload.content"));

    let mut v = context_add("gw_1", "");
    assert!(problems(&v).contains("payload.key"));
    v["payload"]["key"] = json!("session:tasks");
    assert!(problems(&v).contains("reserved"));

    let mut v = context_add("gw_1", "k");
    v["payload"]["tags"] = json!(["ok", 3]);
    assert!(problems(&v).contains("payload.tags[1]"));

    let mut v = context_add("gw_1", "k");
    v["payload"]["visible_to"] = json!("alice");
    assert!(problems(&v).contains("payload.visible_to"));

    let mut v = context_add("gw_1", "k");
    v["payload"]["source"] = json!({});
    assert!(problems(&v).contains("payload.source"));

    let mut v = context_add("gw_1", "k");
    v["payload"]["content_ref"] =
        json!({ "hash": "x", "size_bytes": -1, "mime_type": "t", "storage": "ftp" });
    let p = problems(&v);
    assert!(
        p.contains("payload.content_ref.size_bytes") && p.contains("payload.content_ref.storage")
    );

    assert!(
        problems(&env("session.leave", "gw_1", json!({"reason": 5}))).contains("payload.reason")
    );
    assert!(problems(&env("heartbeat.pong", "gw_1", json!({"t": 1}))).contains("empty object"));
    assert!(problems(&env("heartbeat.ping", "gw_1", json!({"t": 1}))).contains("empty object"));

    let good_error = env(
        "error",
        "gw_1",
        json!({"code": "TRANSPORT_ERROR", "message": "rtp gone", "recoverable": true}),
    );
    assert_eq!(validate_envelope(&good_error), Ok(()));
    let p = problems(&env(
        "error",
        "gw_1",
        json!({"code": "OOPS", "message": 1, "recoverable": "yes"}),
    ));
    assert!(
        p.contains("payload.code")
            && p.contains("payload.message")
            && p.contains("payload.recoverable")
    );
}

// ---------------------------------------------------------------------------------------------
// The server: conformant traffic
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn valid_join_context_leave_sequence_is_recorded_without_violations() {
    let server = TestPvpServer::start().await;
    assert!(server.url().starts_with("ws://127.0.0.1:"));
    let mut client = Client::connect(&server).await;
    let sent = [
        join("gw_1"),
        context_add("gw_1", "t140-1"),
        context_add("gw_1", "t140-2"),
        leave("gw_1"),
    ];
    for v in &sent {
        client.send(v).await;
    }
    let received = server.wait_for(WAIT, |r| r.len() == sent.len()).await;
    assert_eq!(
        received,
        sent.iter()
            .map(|v| Received {
                conn: 0,
                envelope: v.clone()
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(server.violations(), Vec::<String>::new());
    server.assert_no_violations();
    assert_eq!(server.received_of_type("context.add").len(), 2);
    assert_eq!(server.sender_of(0).as_deref(), Some("gw_1"));
    assert!(
        server.sent().is_empty(),
        "nothing to answer: {:?}",
        server.sent()
    );
    assert_eq!(server.connections_opened(), 1);

    client.ws.close(None).await.unwrap();
    server
        .wait_until(WAIT, "the connection to close", |s| {
            s.connections_closed() == 1
        })
        .await;
    server.stop().await;
}

#[tokio::test]
async fn two_participants_on_two_connections_and_a_rejoin_are_fine() {
    let server = TestPvpServer::start().await;
    let mut a = Client::connect(&server).await;
    let mut b = Client::connect(&server).await;
    a.send(&join("gw_a")).await;
    b.send(&join("gw_b")).await;
    a.send(&context_add("gw_a", "a-1")).await;
    b.send(&context_add("gw_b", "b-1")).await;
    a.send(&leave("gw_a")).await;
    a.ws.close(None).await.unwrap();
    server
        .wait_until(WAIT, "connection a to close", |s| {
            s.connections_closed() == 1
        })
        .await;
    // Reconnect as the same participant: a new connection, a new join.
    let mut a2 = Client::connect(&server).await;
    a2.send(&join("gw_a")).await;
    a2.send(&context_add("gw_a", "a-2")).await;
    server.wait_for(WAIT, |r| r.len() == 7).await;
    server.assert_no_violations();
    assert_eq!(server.connections_opened(), 3);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The server: each kind of violation is caught
// ---------------------------------------------------------------------------------------------

/// Joins as `gw_1`, then sends `bad`; returns the violations and the error the server answered.
async fn join_then(bad: Value) -> (Vec<String>, Value) {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    client.send(&bad).await;
    let violations = violations_after(&server, 2).await;
    let error = client.recv_type("error").await;
    assert_eq!(validate_envelope(&error), Ok(()), "server error envelope");
    assert_eq!(error["sender"], "system");
    if let Some(id) = bad["id"].as_str() {
        assert_eq!(error["payload"]["related_to"], id);
    }
    server.stop().await;
    (violations, error)
}

#[tokio::test]
async fn version_2_is_a_violation() {
    let mut bad = context_add("gw_1", "k");
    bad["v"] = json!(2);
    let id = bad["id"].as_str().unwrap().to_string();
    let (violations, error) = join_then(bad).await;
    assert_violation(&violations, &["conn 0", &id, "field `v`"]);
    assert_eq!(error["payload"]["code"], "INVALID_MESSAGE");
}

#[tokio::test]
async fn bad_ulid_is_a_violation() {
    let mut bad = context_add("gw_1", "k");
    bad["id"] = json!("01HX7K9Q5RAEWF4SG9NX7S6U3C"); // has a U
    let (violations, _) = join_then(bad).await;
    assert_violation(
        &violations,
        &["conn 0", "01HX7K9Q5RAEWF4SG9NX7S6U3C", "field `id`"],
    );
}

#[tokio::test]
async fn bad_timestamp_is_a_violation() {
    let mut bad = context_add("gw_1", "k");
    bad["ts"] = json!("2026-11-22 19:07:12");
    let id = bad["id"].as_str().unwrap().to_string();
    let (violations, _) = join_then(bad).await;
    assert_violation(&violations, &[&id, "field `ts`"]);
}

#[tokio::test]
async fn missing_payload_is_a_violation() {
    let mut bad = context_add("gw_1", "k");
    bad.as_object_mut().unwrap().remove("payload");
    let id = bad["id"].as_str().unwrap().to_string();
    let (violations, _) = join_then(bad).await;
    assert_violation(&violations, &[&id, "field `payload`: missing"]);
}

#[tokio::test]
async fn unknown_type_and_unknown_field_are_violations() {
    let mut bad = context_add("gw_1", "k");
    bad["type"] = json!("transcript.add");
    bad["speaker"] = json!("alice");
    let id = bad["id"].as_str().unwrap().to_string();
    let (violations, _) = join_then(bad).await;
    assert_violation(&violations, &[&id, "field `type`"]);
    assert_violation(&violations, &[&id, "field `speaker`: unknown"]);
}

#[tokio::test]
async fn invalid_context_add_payload_is_a_violation() {
    let mut bad = context_add("gw_1", "k");
    bad["payload"]["content_type"] = json!("speech");
    let id = bad["id"].as_str().unwrap().to_string();
    let (violations, _) = join_then(bad).await;
    assert_violation(&violations, &[&id, "field `payload.content_type`"]);
}

#[tokio::test]
async fn invalid_join_payload_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    let mut bad = join("gw_1");
    bad["payload"]["participant"]["roles"] = json!(["speaker"]);
    bad["payload"]["supported_versions"] = json!([2]);
    let id = bad["id"].as_str().unwrap().to_string();
    client.send(&bad).await;
    let violations = violations_after(&server, 1).await;
    assert_violation(&violations, &[&id, "payload.participant.roles[0]"]);
    assert_violation(&violations, &[&id, "payload.supported_versions"]);
    server.stop().await;
}

#[tokio::test]
async fn context_add_before_join_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    let bad = context_add("gw_1", "k");
    let id = bad["id"].as_str().unwrap().to_string();
    client.send(&bad).await;
    let violations = violations_after(&server, 1).await;
    assert_violation(&violations, &[&id, "has not sent session.join"]);
    assert_violation(
        &violations,
        &[&id, "first frame on a connection must be session.join"],
    );
    let error = client.recv_type("error").await;
    assert_eq!(error["payload"]["related_to"], id.as_str());
    server.stop().await;
}

#[tokio::test]
async fn context_add_after_leave_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    client.send(&leave("gw_1")).await;
    let bad = context_add("gw_1", "k");
    let id = bad["id"].as_str().unwrap().to_string();
    client.send(&bad).await;
    let violations = violations_after(&server, 3).await;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_violation(&violations, &[&id, "has left"]);
    server.stop().await;
}

#[tokio::test]
async fn context_add_without_permission_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    let mut observer = join("gw_1");
    observer["payload"]["participant"]["roles"] = json!(["observer"]);
    observer["payload"]["participant"]
        .as_object_mut()
        .unwrap()
        .remove("capabilities");
    client.send(&observer).await;
    let bad = context_add("gw_1", "k");
    let id = bad["id"].as_str().unwrap().to_string();
    client.send(&bad).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(&violations, &[&id, "may not add context"]);
    assert_eq!(
        client.recv_type("error").await["payload"]["code"],
        "UNAUTHORIZED"
    );
    server.stop().await;
}

#[tokio::test]
async fn duplicate_context_key_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    client.send(&context_add("gw_1", "t140-1")).await;
    let again = context_add("gw_1", "t140-1");
    let id = again["id"].as_str().unwrap().to_string();
    client.send(&again).await;
    let violations = violations_after(&server, 3).await;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_violation(
        &violations,
        &["conn 0", &id, "field `payload.key`", "already exists"],
    );

    // Unique within the session, not per connection: another participant cannot reuse it either.
    let mut other = Client::connect(&server).await;
    other.send(&join("gw_2")).await;
    let third = context_add("gw_2", "t140-1");
    let id3 = third["id"].as_str().unwrap().to_string();
    other.send(&third).await;
    let violations = violations_after(&server, 5).await;
    assert_violation(&violations, &["conn 1", &id3, "already exists"]);
    server.stop().await;
}

#[tokio::test]
async fn wrong_first_frame_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    let first = leave("gw_1");
    let id = first["id"].as_str().unwrap().to_string();
    client.send(&first).await;
    client.send(&join("gw_1")).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(
        &violations,
        &[
            "conn 0",
            &id,
            "field `type`",
            "first frame on a connection must be session.join",
        ],
    );
    server.stop().await;
}

#[tokio::test]
async fn sender_change_mid_connection_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    let bad = context_add("gw_2", "k");
    let id = bad["id"].as_str().unwrap().to_string();
    client.send(&bad).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(
        &violations,
        &[
            "conn 0",
            &id,
            "field `sender`",
            "\"gw_2\" differs from \"gw_1\"",
        ],
    );
    server.stop().await;
}

#[tokio::test]
async fn same_sender_on_two_open_connections_is_a_violation() {
    let server = TestPvpServer::start().await;
    let mut a = Client::connect(&server).await;
    let mut b = Client::connect(&server).await;
    a.send(&join("gw_1")).await;
    server.wait_for(WAIT, |r| r.len() == 1).await;
    b.send(&join("gw_1")).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(
        &violations,
        &["conn 1", "already bound to open connection 0"],
    );
    server.stop().await;
}

#[tokio::test]
async fn system_sender_and_session_change_are_violations() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    let mut other_session = context_add("gw_1", "k");
    other_session["session"] = json!("ses_other");
    client.send(&other_session).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(
        &violations,
        &["field `session`", "differs from \"ses_test\""],
    );

    let mut c2 = Client::connect(&server).await;
    let mut spoof = join("system");
    spoof["payload"]["participant"]["id"] = json!("system");
    c2.send(&spoof).await;
    let violations = violations_after(&server, 3).await;
    assert_violation(&violations, &["conn 1", "reserved for the server"]);
    server.stop().await;
}

#[tokio::test]
async fn duplicate_id_is_a_violation() {
    let first = context_add("gw_1", "a");
    let mut second = context_add("gw_1", "b");
    second["id"] = first["id"].clone();
    let id = first["id"].as_str().unwrap().to_string();

    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    client.send(&first).await;
    client.send(&second).await;
    let violations = violations_after(&server, 3).await;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_violation(&violations, &[&id, "field `id`: duplicate"]);
    server.stop().await;
}

#[tokio::test]
async fn binary_and_non_json_frames_are_violations() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    client
        .send_raw(Message::binary(join("gw_1").to_string().into_bytes()))
        .await;
    client.send_raw(Message::text("{\"v\": 1,")).await;
    let violations = server.wait_for_violations(WAIT, |v| v.len() >= 2).await;
    assert_violation(&violations, &["conn 0", "frame 2", "binary frame"]);
    assert_violation(&violations, &["conn 0", "frame 3", "not JSON"]);
    assert_eq!(
        server.received().len(),
        1,
        "only the JSON frame is an envelope"
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_session_gets_session_not_found() {
    let server = TestPvpServer::start_with(ServerOptions {
        sessions: Some(vec!["ses_known".to_string()]),
        ping_interval: Some(Duration::from_millis(20)),
        ..Default::default()
    })
    .await;
    let mut client = Client::connect(&server).await;
    let j = join("gw_1");
    let id = j["id"].as_str().unwrap().to_string();
    client.send(&j).await;
    let error = client.recv_type("error").await;
    assert_eq!(validate_envelope(&error), Ok(()));
    assert_eq!(error["sender"], "system");
    assert_eq!(error["session"], SESSION);
    assert_eq!(error["payload"]["code"], "SESSION_NOT_FOUND");
    assert_eq!(error["payload"]["recoverable"], false);
    assert_eq!(error["payload"]["related_to"], id.as_str());
    assert!(
        error["payload"]["message"]
            .as_str()
            .unwrap()
            .contains(SESSION)
    );
    // The join did not join: nothing may follow it, and no pings are sent.
    let bad = context_add("gw_1", "k");
    client.send(&bad).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(
        &violations,
        &[bad["id"].as_str().unwrap(), "has not sent session.join"],
    );
    assert_eq!(server.pings_sent(), 0);

    // The known session works.
    let mut ok = Client::connect(&server).await;
    let mut j = join("gw_2");
    j["session"] = json!("ses_known");
    ok.send(&j).await;
    let ping = ok.recv_type("heartbeat.ping").await;
    assert_eq!(ping["session"], "ses_known");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Heartbeats
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn server_pings_are_answered_and_counted() {
    let server = TestPvpServer::start_with(ServerOptions {
        ping_interval: Some(Duration::from_millis(20)),
        ..Default::default()
    })
    .await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    // A client that answers every ping, one with `ref` and one without (both are accepted).
    let responder = tokio::spawn(async move {
        let mut answered = 0;
        loop {
            let ping = client.recv_type("heartbeat.ping").await;
            assert_eq!(validate_envelope(&ping), Ok(()), "server ping");
            assert_eq!(ping["sender"], "system");
            assert_eq!(ping["payload"], json!({}));
            let mut pong = env("heartbeat.pong", "gw_1", json!({}));
            if answered % 2 == 0 {
                pong["ref"] = ping["id"].clone();
            }
            client.send(&pong).await;
            answered += 1;
        }
    });
    server
        .wait_until(WAIT, "three pongs", |s| s.pongs_received() >= 3)
        .await;
    assert!(server.pongs_received_on(0) >= 3);
    assert!(server.pings_sent_on(0) >= 3);
    server.assert_no_violations();
    responder.abort();
    server.stop().await;
}

#[tokio::test]
async fn unanswered_pings_are_not_counted_and_stray_pongs_are_violations() {
    let server = TestPvpServer::start_with(ServerOptions {
        ping_interval: Some(Duration::from_millis(20)),
        ..Default::default()
    })
    .await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    server
        .wait_until(WAIT, "two pings", |s| s.pings_sent() >= 2)
        .await;
    assert_eq!(server.pongs_received(), 0);

    let mut stray = env("heartbeat.pong", "gw_1", json!({}));
    stray["ref"] = json!(new_ulid());
    client.send(&stray).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(
        &violations,
        &[
            "field `ref`",
            "not a heartbeat.ping sent on this connection",
        ],
    );
    assert_eq!(server.pongs_received(), 0);
    server.stop().await;

    // Without pings, a pong answers nothing.
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    client.send(&env("heartbeat.pong", "gw_1", json!({}))).await;
    let violations = violations_after(&server, 2).await;
    assert_violation(&violations, &["without an outstanding heartbeat.ping"]);
    assert_eq!(server.pings_sent(), 0);
    server.stop().await;
}

#[tokio::test]
async fn pings_stop_after_leave() {
    let server = TestPvpServer::start_with(ServerOptions {
        ping_interval: Some(Duration::from_millis(10)),
        ..Default::default()
    })
    .await;
    let mut leaver = Client::connect(&server).await;
    leaver.send(&join("gw_1")).await;
    server
        .wait_until(WAIT, "a ping on conn 0", |s| s.pings_sent_on(0) >= 1)
        .await;
    leaver.send(&leave("gw_1")).await;
    server.wait_for(WAIT, |r| r.len() == 2).await;
    let after_leave = server.pings_sent_on(0);
    // A second participant's pings are the clock: five of its intervals pass...
    let mut stayer = Client::connect(&server).await;
    stayer.send(&join("gw_2")).await;
    server
        .wait_until(WAIT, "five pings on conn 1", |s| s.pings_sent_on(1) >= 5)
        .await;
    // ...and conn 0 got at most the one that may have been due while the leave was in flight.
    assert!(
        server.pings_sent_on(0) <= after_leave + 1,
        "pings continued after leave: {} -> {}",
        after_leave,
        server.pings_sent_on(0)
    );
    server.assert_no_violations();
    server.stop().await;
}

#[tokio::test]
async fn client_ping_gets_a_pong() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    let ping = env("heartbeat.ping", "gw_1", json!({}));
    client.send(&ping).await;
    let pong = client.recv_type("heartbeat.pong").await;
    assert_eq!(validate_envelope(&pong), Ok(()));
    assert_eq!(pong["sender"], "system");
    assert_eq!(pong["session"], SESSION);
    assert_eq!(pong["ref"], ping["id"]);
    assert_eq!(pong["payload"], json!({}));
    server.assert_no_violations();
    assert_eq!(server.sent().len(), 1);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Plumbing: broadcast mode, injection, close, stop, and wait_for failing
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn broadcast_mode_announces_and_echoes_like_the_reference_server() {
    let server = TestPvpServer::start_with(ServerOptions {
        broadcast: true,
        ..Default::default()
    })
    .await;
    let mut a = Client::connect(&server).await;
    a.send(&join("gw_a")).await;
    let announce = a.recv_type("participant.announce").await;
    assert_eq!(validate_envelope(&announce), Ok(()));
    assert_eq!(announce["sender"], "gw_a");
    assert_eq!(announce["payload"]["transport"], "t140");

    let mut b = Client::connect(&server).await;
    b.send(&join("gw_b")).await;
    assert_eq!(a.recv_type("participant.announce").await["sender"], "gw_b");
    let add = context_add("gw_b", "b-1");
    b.send(&add).await;
    assert_eq!(a.recv_type("context.add").await, add);
    assert_eq!(b.recv_type("context.add").await, add);
    server.assert_no_violations();
    server.stop().await;
}

#[tokio::test]
async fn send_to_and_close_connection_reach_the_client() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    server.wait_for(WAIT, |r| r.len() == 1).await;
    let injected = make_envelope(
        "error",
        SESSION,
        "system",
        json!({"code": "RATE_LIMITED", "message": "slow down", "recoverable": true}),
        None,
    );
    assert!(server.send_to(0, injected.clone()));
    assert_eq!(client.recv().await, injected);
    assert!(server.close_connection(0));
    let end = tokio::time::timeout(WAIT, client.ws.next()).await.unwrap();
    assert!(
        matches!(end, None | Some(Ok(Message::Close(_))) | Some(Err(_))),
        "{end:?}"
    );
    server
        .wait_until(WAIT, "the connection to close", |s| {
            s.connections_closed() == 1
        })
        .await;
    assert!(!server.send_to(0, injected));
    server.stop().await;
}

#[tokio::test]
async fn stop_closes_connections() {
    let server = TestPvpServer::start().await;
    let url = server.url();
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    server.wait_for(WAIT, |r| r.len() == 1).await;
    server.stop().await;
    let end = tokio::time::timeout(WAIT, client.ws.next()).await.unwrap();
    assert!(
        matches!(end, None | Some(Ok(Message::Close(_))) | Some(Err(_))),
        "{end:?}"
    );
    assert!(
        tokio_tungstenite::connect_async(url).await.is_err(),
        "listener still open"
    );
}

#[tokio::test]
#[should_panic(expected = "timed out after")]
async fn wait_for_panics_with_what_was_received() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    server
        .wait_for(Duration::from_millis(100), |r| {
            r.iter().any(|r| r.envelope["type"] == "context.add")
        })
        .await;
}

#[tokio::test]
async fn wait_for_timeout_message_lists_received_envelopes() {
    let server = TestPvpServer::start().await;
    let mut client = Client::connect(&server).await;
    client.send(&join("gw_1")).await;
    server.wait_for(WAIT, |r| r.len() == 1).await;
    let waiting = tokio::spawn(async move {
        server
            .wait_for(Duration::from_millis(50), |r| r.len() == 2)
            .await;
    });
    let err = waiting.await.expect_err("wait_for must panic");
    let msg = err
        .into_panic()
        .downcast::<String>()
        .map(|b| *b)
        .unwrap_or_default();
    assert!(msg.contains("timed out after 50ms"), "{msg}");
    assert!(
        msg.contains("session.join") && msg.contains("gw_1"),
        "{msg}"
    );
}
