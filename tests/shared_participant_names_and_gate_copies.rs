//! Participant ids a `[[stream]]` mapping rule gives several speakers (README "Configuration
//! file": every stream from a network is one participant): what the session is told of that
//! participant once the envelopes have passed the sinks' one `Presence`. Gated transcripts
//! (README "Gated transcripts") across a reconnect: a server that still has the gate and
//! refuses the request's copy.
//!
//! Found by review ao (session 45).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use pvp_t140::metrics::SinkMetrics;
use pvp_t140::sink::gate::GateConfig;
use pvp_t140::sink::ws::{WsConfig, WsSink};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use pvp_t140::mapping::{Mapping, Rule};
use pvp_t140::presence::Presence;
use pvp_t140::pvp::Message as Envelope;
use pvp_t140::{Config, Gateway};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/talk.rs"]
mod talk;
use talk::Talk;

/// One RTCP SDES packet (RFC 3550 6.5) for `ssrc`: its CNAME and its NAME.
fn sdes(ssrc: u32, cname: &str, name: &str) -> Vec<u8> {
    let mut d = vec![0x81, 202, 0, 0];
    d.extend_from_slice(&ssrc.to_be_bytes());
    for (kind, text) in [(1u8, cname), (2, name)] {
        d.push(kind);
        d.push(text.len() as u8);
        d.extend_from_slice(text.as_bytes());
    }
    d.push(0);
    while d.len() % 4 != 0 {
        d.push(0);
    }
    let words = (d.len() / 4 - 1) as u16;
    d[2..4].copy_from_slice(&words.to_be_bytes());
    d
}

/// Every source on 127.0.0.0/8 is the participant `room` (no `name` in the rule).
fn one_room() -> Gateway {
    Gateway::new(Config {
        mapping: Mapping {
            rules: vec![Rule {
                match_source: Some("127.0.0.0/8".parse().unwrap()),
                participant: Some("room".into()),
                ..Rule::default()
            }],
            ..Mapping::default()
        },
        ..Config::default()
    })
}

/// What leaves the sinks: the core's envelopes through one `Presence`.
fn admitted(gw: &mut Gateway, presence: &mut Presence) -> Vec<Envelope> {
    std::iter::from_fn(|| gw.poll_output())
        .filter(|e| presence.admit(e))
        .map(|e| e.to_message())
        .collect()
}

fn from(port: u16) -> SocketAddr {
    addr(port)
}

/// Two senders on the rule's network are one participant, `room`, which joined as the first
/// of them. Each sender's RTCP names it (RFC 3550 6.1: every compound carries the CNAME; a
/// sender's first report comes 1-3 s in, after its first sentence made it join): the second
/// one's name, and the metadata of its own SSRC, went out as a `participant.announce` of
/// `room` all the same (pvp-spec 7.1), so the one participant was renamed after whichever
/// sender's report came last, and said it was that sender's SSRC, while its join (the first
/// sender's) was the one the session had been shown. Now only the speaker whose join the
/// session saw names the participant: another speaker's name is its own, not the
/// participant's.
#[test]
fn a_shared_participant_is_not_renamed_after_each_of_its_speakers() {
    let mut gw = one_room();
    let mut presence = Presence::default();
    gw.handle_datagram(at(0), from(5000), &t140(1, 7, "Alpha speaking. "));
    gw.handle_datagram(at(100), from(5002), &t140(1, 8, "Bravo speaking. "));
    gw.handle_datagram(at(1500), from(5000), &sdes(7, "alpha@host", "Alpha"));
    gw.handle_datagram(at(1600), from(5002), &sdes(8, "bravo@host", "Bravo"));
    gw.handle_datagram(at(2000), from(5000), &t140(2, 7, "Alpha again. "));
    let out = admitted(&mut gw, &mut presence);
    let joins: Vec<&Envelope> = out.iter().filter(|e| e.kind == "session.join").collect();
    assert_eq!(joins.len(), 1, "one participant joins once");
    let joined_ssrc = joins[0].payload["participant"]["metadata"]["ssrc"].clone();
    assert_eq!(joined_ssrc, "00000007", "{}", joins[0].payload);
    let announced: Vec<(String, String)> = out
        .iter()
        .filter(|e| e.kind == "participant.announce")
        .map(|e| {
            (
                e.payload["name"].as_str().unwrap_or_default().to_owned(),
                e.payload["metadata"]["ssrc"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        announced,
        [("Alpha".to_owned(), "00000007".to_owned())],
        "only the speaker the session saw join names the participant"
    );
    // The text of both goes out, under the one participant.
    let adds = out.iter().filter(|e| e.kind == "context.add").count();
    assert_eq!(adds, 3);
    assert!(out.iter().all(|e| e.sender == "room"));
}

/// A frame from the server (or relayed from `sender`).
fn frame(sender: &str, kind: &str, payload: Value) -> Message {
    Message::text(
        json!({"v": 1, "id": "01JAAAAAAAAAAAAAAAAAAAAAA1", "ts": "2026-11-29T00:00:00.000Z",
            "session": "s", "sender": sender, "type": kind, "payload": payload})
        .to_string(),
    )
}

/// A connection lost while a chunk awaits approval (a proxy in between dropped it, the server
/// went on): after the rejoin the connection sends the gate's request again, the same
/// envelope (README "Gated transcripts": "a server that restarted has lost its gates"). A
/// server that did not restart still has the gate, and refuses the copy as the message it
/// already took (pvp-spec 19.5: delivered at most once; pvp-spec 17: an `error` for every
/// rejected operation). That refusal was taken for "the server made no gate": the chunk was
/// dropped at once, and the approval that came for the live gate then found nothing to
/// approve: text lost, though approved. Now a refusal of a copy leaves the chunk waiting for
/// its decision (or its timeout, if the server did lose the gate and refuses the copy for
/// another reason).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_copy_of_a_gate_request_after_a_reconnect_does_not_drop_its_chunk() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let log: Arc<Mutex<Vec<(usize, Value)>>> = Arc::default();
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
                    log.lock().unwrap().push((conn, v.clone()));
                    if v["type"] != "gate.request" {
                        continue;
                    }
                    if conn == 0 {
                        // The connection is lost with the gate made.
                        let _ = ws.close(None).await;
                        return;
                    }
                    let gate = v["id"].as_str().unwrap().to_owned();
                    let duplicate = json!({"code": "INVALID_MESSAGE",
                        "message": "duplicate message id", "recoverable": true,
                        "related_to": gate});
                    let _ = ws.send(frame("system", "error", duplicate)).await;
                    let approve = json!({"gate": gate, "approver": "ada"});
                    let _ = ws.send(frame("ada", "gate.approve", approve)).await;
                }
            });
        }
    });
    let metrics = SinkMetrics::default();
    let mut sink = WsSink::new(WsConfig {
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
        gate: Some(GateConfig {
            quorum: 1,
            timeout: Duration::from_secs(60),
        }),
    });
    let mut talk = Talk::new();
    let p = "t140:0000a0a0@127.0.0.1:40070";
    sink.send(talk.join(p));
    sink.send(talk.add(p, "Approved on the server that kept the gate."));
    let added = || {
        log.lock()
            .unwrap()
            .iter()
            .any(|(_, v)| v["type"] == "context.add")
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !added() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let copies = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(c, v)| *c == 1 && v["type"] == "gate.request")
        .count();
    sink.close(Duration::from_secs(5)).await;
    assert_eq!(copies, 1, "the request asked again after the reconnect");
    assert!(
        added(),
        "the approved chunk was never added; refused: {}",
        metrics.gates_refused.get()
    );
    assert_eq!(metrics.gates_refused.get(), 0);
}
