//! Helpers for the tests that drive the sans-IO core directly (datagrams and time in,
//! envelopes out); included by path, so such a test builds none of the other helpers.
#![allow(dead_code)]

use std::net::SocketAddr;

use pvp_t140::pvp::Message;
use pvp_t140::{Gateway, Time, rtp};

/// The tests' epoch, in milliseconds (2023-11-14).
pub const T0: u64 = 1_700_000_000_000;

/// `ms` milliseconds after [`T0`].
pub fn at(ms: u64) -> Time {
    Time::from_millis(T0 + ms)
}

/// 127.0.0.1:`port`.
pub fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A plain T.140 packet (payload type 98, 300 ms of timestamp a sequence number), marked when
/// it is the first.
pub fn t140(seq: u16, ssrc: u32, text: &str) -> Vec<u8> {
    t140m(seq, ssrc, seq == 1, text)
}

/// [`t140`] with the marker bit given.
pub fn t140m(seq: u16, ssrc: u32, marker: bool, text: &str) -> Vec<u8> {
    let mut d = Vec::new();
    let ts = u32::from(seq) * 300;
    rtp::write_packet(&mut d, marker, 98, seq, ts, ssrc, text.as_bytes());
    d
}

/// Every envelope the core has made, parsed.
pub fn drain(gw: &mut Gateway) -> Vec<Message> {
    std::iter::from_fn(|| gw.poll_output())
        .map(|e| e.to_message())
        .collect()
}

/// What a reader of the context items sees: every add, update and remove applied in order.
pub fn shown(out: &[Message]) -> Vec<String> {
    let mut items: Vec<(String, String)> = Vec::new();
    for e in out {
        match e.kind.as_str() {
            "context.add" => items.push((
                e.payload["key"].as_str().unwrap().into(),
                e.payload["content"].as_str().unwrap().into(),
            )),
            "context.update" => {
                let k = e.payload["key"].as_str().unwrap();
                let it = items.iter_mut().find(|i| i.0 == k).unwrap();
                it.1 = e.payload["new_content"].as_str().unwrap().into();
            }
            "context.remove" => {
                let k = e.payload["key"].as_str().unwrap();
                items.retain(|i| i.0 != k);
            }
            _ => {}
        }
    }
    items.into_iter().map(|i| i.1).collect()
}

/// The README's example rule: the speaker whose SDES name is "Alice" is participant "alice";
/// any other as `unmatched` says.
pub fn alice_rule(unmatched: pvp_t140::mapping::Unmatched) -> pvp_t140::mapping::Mapping {
    use pvp_t140::mapping::{Mapping, Rule};
    Mapping {
        rules: vec![Rule {
            match_rtcp_name: Some("Alice".into()),
            participant: Some("alice".into()),
            ..Rule::default()
        }],
        unmatched,
    }
}

/// A t140llm RED payload (docs/t140llm.md section 5): its blocks' headers name T.140's type
/// 96, with 16-bit offsets 160 apart and 8-bit lengths, newest first; then the primary.
pub fn t140llm_red_payload(gens_newest_first: &[&str], primary: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for (k, g) in gens_newest_first.iter().enumerate() {
        p.push(0x80 | 96);
        p.extend_from_slice(&(160 * (k as u16 + 1)).to_be_bytes());
        p.push(g.len() as u8);
    }
    p.push(96);
    for g in gens_newest_first {
        p.extend_from_slice(g.as_bytes());
    }
    p.extend_from_slice(primary.as_bytes());
    p
}
