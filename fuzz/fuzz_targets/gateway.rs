//! The whole sans-IO gateway driven by an arbitrary sequence of datagrams from a few sources,
//! time steps and timer wake-ups (format in `src/lib.rs`), then `shutdown`. Checks the protocol
//! invariants of what comes out, not only the absence of panics.
#![no_main]

use std::collections::{HashMap, HashSet};

use libfuzzer_sys::fuzz_target;
use pvp_t140::pvp::{Envelope, Message};
use pvp_t140::{Gateway, Time};
use pvp_t140_fuzz::{MAX_STREAMS, SESSION, config, decode, source};
use serde_json::Value;

struct Check {
    max_chunk_chars: usize,
    ids: HashSet<String>,
    last_id: String,
    /// Every context key added, with its sender and whether it was removed since.
    keys: HashMap<String, (String, bool)>,
    /// Senders joined and not yet left.
    active: HashSet<String>,
    joins: u64,
    envelopes: u64,
}

impl Check {
    fn envelope(&mut self, e: &Envelope) {
        self.envelopes += 1;
        let json = e.json().to_owned();
        let v: Value = serde_json::from_str(&json).expect("envelope JSON parses");
        assert_eq!(v["v"], 1, "{json}");
        assert_eq!(v["session"], SESSION, "{json}");
        let id = v["id"].as_str().expect("id is a string");
        assert_eq!(id.len(), 26, "ULID id: {json}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !b"ILOU".contains(&b))),
            "ULID alphabet: {id}"
        );
        assert!(self.ids.insert(id.to_owned()), "duplicate id {id}");
        assert!(
            *id > *self.last_id,
            "ids out of order: {} then {id}",
            self.last_id
        );
        self.last_id = id.to_owned();
        let back: Message = serde_json::from_value(v.clone()).expect("envelope deserializes");
        assert_eq!(
            &back.to_envelope().expect("a kind we send"),
            e,
            "JSON round trip"
        );
        assert_eq!(back.id, e.id().to_string());
        assert_eq!(back.kind, e.kind().as_str());
        assert_eq!(back.sender, &**e.sender());

        let sender = e.sender().to_string();
        assert!(!sender.is_empty());
        match e.kind().as_str() {
            "session.join" => {
                assert_eq!(v["payload"]["participant"]["id"], sender.as_str(), "{json}");
                assert!(
                    self.active.insert(sender),
                    "joined twice without leaving: {json}"
                );
                self.joins += 1;
            }
            "participant.announce" => {
                assert!(
                    self.active.contains(&sender),
                    "announce from a non-member: {json}"
                );
                assert_eq!(v["payload"]["id"], sender.as_str(), "{json}");
            }
            "context.add" => {
                assert!(
                    self.active.contains(&sender),
                    "context.add from a non-member: {json}"
                );
                let key = v["payload"]["key"].as_str().expect("key").to_owned();
                let dup = self.keys.insert(key, (sender, false));
                assert!(dup.is_none(), "duplicate context key: {json}");
                self.content(&v["payload"]["content"], &json);
            }
            "context.update" | "context.remove" => {
                assert!(
                    self.active.contains(&sender),
                    "{} from a non-member: {json}",
                    e.kind()
                );
                let key = v["payload"]["key"].as_str().expect("key");
                let item = self.keys.get_mut(key);
                let Some((owner, removed)) = item else {
                    panic!("{} of a key never added: {json}", e.kind())
                };
                assert_eq!(
                    *owner,
                    sender,
                    "{} of another sender's item: {json}",
                    e.kind()
                );
                assert!(!*removed, "{} of a removed item: {json}", e.kind());
                if e.kind() == "context.update" {
                    self.content(&v["payload"]["new_content"], &json);
                } else {
                    *removed = true;
                }
            }
            "session.leave" => {
                assert!(self.active.remove(&sender), "leave without join: {json}");
            }
            other => panic!("unexpected envelope type {other}: {json}"),
        }
    }

    /// Transcript text: trimmed, never empty, within the chunk size.
    fn content(&self, content: &Value, json: &str) {
        let content = content.as_str().expect("content is a string");
        assert!(!content.is_empty() && content == content.trim(), "{json}");
        if let Err(e) = pvp_t140_fuzz::check_chunk_size(content, self.max_chunk_chars) {
            panic!("chunk size: {e}: {json}");
        }
    }

    fn drain(&mut self, gw: &mut Gateway) {
        while let Some(e) = gw.poll_output() {
            self.envelope(&e);
        }
        assert!(gw.live_streams() <= MAX_STREAMS);
        let s = gw.stats();
        assert_eq!(s.streams_live, gw.live_streams() as u64);
        assert!(s.streams_total >= s.streams_live);
        assert_eq!(s.speakers_joined, self.joins, "joins vs speakers_joined");
        assert_eq!(s.envelopes, self.envelopes);
    }
}

fuzz_target!(|data: &[u8]| {
    let (cfg_byte, events) = decode(data);
    let cfg = config(cfg_byte);
    let max_chunk_chars = cfg.max_chunk_chars;
    let mut gw = Gateway::new(cfg);
    let mut c = Check {
        max_chunk_chars,
        ids: HashSet::new(),
        last_id: String::new(),
        keys: HashMap::new(),
        active: HashSet::new(),
        joins: 0,
        envelopes: 0,
    };
    let mut now = Time::from_millis(1_700_000_000_000);
    let mut per_source: HashMap<u8, u64> = HashMap::new();
    for ev in &events {
        now = Time(now.0 + ev.step_us);
        if ev.timeout_first || ev.datagram.is_none() {
            gw.handle_timeout(now);
            if let Some(t) = gw.poll_timeout() {
                assert!(
                    t > now,
                    "timer due at {t:?} left after handle_timeout({now:?})"
                );
            }
            c.drain(&mut gw);
        }
        if let Some(d) = ev.datagram {
            *per_source.entry(ev.source).or_default() += 1;
            gw.handle_datagram(now, source(ev.source), d);
            if let Some(t) = gw.poll_timeout() {
                assert!(
                    t > now,
                    "timer due at {t:?} left after a datagram at {now:?}"
                );
            }
            c.drain(&mut gw);
        }
    }
    let datagrams: u64 = per_source.values().sum();
    assert_eq!(gw.stats().datagrams, datagrams);
    gw.shutdown(now);
    c.drain(&mut gw);
    assert!(
        c.active.is_empty(),
        "still joined after shutdown: {:?}",
        c.active
    );
    assert_eq!(gw.live_streams(), 0);
    assert_eq!(gw.poll_timeout(), None);
});
