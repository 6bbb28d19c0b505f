//! The PVP envelope layer (src/pvp.rs, src/time.rs) and the envelopes the gateway chooses to
//! send (src/gateway.rs) against pvp-spec 4-9: property checks (the fast writer against
//! serde_json, ids and timestamps, per-sender causality under random traffic), and the cases a
//! review found wrong, each of which failed before its fix.

use std::net::SocketAddr;

use pvp_t140::chunker::FlushCause;
use pvp_t140::pvp::{Builder, Message, Metadata, Participant, SenderId};
use pvp_t140::{Config, Gateway, Time, rtp};
use serde_json::{Value, json};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

/// xorshift64*: deterministic pseudo-random strings without a dev-dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A string mixing every C0 control, DEL, quote, backslash, ASCII, Latin-1, U+2028/2029,
    /// U+FEFF/FFFD, non-BMP and long runs (so the 8-byte scan sees every alignment).
    fn string(&mut self, max: u64) -> String {
        let len = self.below(max + 1);
        let mut s = String::new();
        for _ in 0..len {
            let c = match self.below(12) {
                0 | 1 => char::from(self.below(0x20) as u8),
                2 => '"',
                3 => '\\',
                4 => '\u{7f}',
                5 => ['\u{2028}', '\u{2029}', '\u{feff}', '\u{fffd}', '\u{85}']
                    [self.below(5) as usize],
                6 => char::from_u32(0x80 + self.below(0x700) as u32).unwrap_or('x'),
                7 => char::from_u32(0x1_0000 + self.below(0x1_0000) as u32).unwrap_or('x'),
                8 => char::from_u32(0x3000 + self.below(0x5000) as u32).unwrap_or('x'),
                _ => char::from(0x20 + self.below(0x5f) as u8),
            };
            s.push(c);
        }
        s
    }
}

/// pvp-spec 4.1, 9.1: the hand-written `context.add` is what serde_json writes for the same
/// message, for random and adversarial content, sender ids, session ids, key prefixes and
/// sources, at every length (the SWAR scan's alignments) up to 4 KiB.
#[test]
fn prop_context_add_is_byte_identical_to_serde_json() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for round in 0..3000 {
        let session = rng.string(12);
        let id = rng.string(20);
        let prefix = format!("{id}/{}/", rng.below(1 << 40));
        let source = rng.string(16);
        let text = if round % 50 == 0 {
            rng.string(4096)
        } else {
            rng.string(80)
        };
        let n = rng.next();
        let now = Time::from_micros(rng.below(253_402_300_799_999_999));
        let mut b = Builder::new(session.clone(), None, u128::from(rng.next()));
        let sender = SenderId::from(id.as_str()).with_template(&prefix, &source);
        let e = b
            .context_add(now, &sender, n, &text, FlushCause::Idle)
            .expect("template");
        let m: Message = serde_json::from_str(e.json()).expect("valid JSON");
        let want = Message {
            v: 1,
            id: e.id().to_string(),
            ts: now.to_iso8601(),
            session: session.clone(),
            sender: id.clone(),
            kind: "context.add".into(),
            payload: json!({
                "key": format!("{prefix}{n}"),
                "content_type": "audio_transcript",
                "content": text,
                "source": source,
                "tags": ["t140", "transcript", "flush:idle"],
            }),
            reference: None,
        };
        assert_eq!(m, want, "round {round}");
        assert_eq!(e.json(), want.to_json(), "round {round}: bytes differ");
        assert!(!e.json().contains('\n'), "one line (pvp-spec 19.4)");
    }
}

/// The same for join and announce, with hostile ids, names, roles and metadata values, and
/// for the serde_json-built kinds with a hostile session.
#[test]
fn prop_join_announce_update_remove_leave_are_serde_json() {
    let mut rng = Rng(0x0bad_cafe_f00d_0002);
    for round in 0..1000 {
        let session = rng.string(10);
        let token = (rng.below(2) == 0).then(|| rng.string(10));
        let id = rng.string(20);
        let name = rng.string(20);
        let csrc = rng.string(8);
        let sid = rng.string(8);
        let p = Participant {
            id: id.clone(),
            name: name.clone(),
            roles: vec!["navigator".into(), "observer".into()],
            metadata: Metadata::default()
                .field("csrc", &csrc)
                .field("gateway", "g")
                .field("source", "[::1]:5")
                .field("ssrc", "00000001")
                .field("stream_id", &sid),
        };
        let announce = json!({
            "id": id, "name": name, "type": "human", "roles": ["navigator", "observer"],
            "capabilities": ["add_context"],
            "transport": "t140",
            "metadata": {"csrc": csrc, "gateway": "g", "source": "[::1]:5", "ssrc": "00000001",
                "stream_id": sid},
        });
        let mut b = Builder::new(session.clone(), token.clone(), 9);
        let now = Time::from_micros(rng.below(253_402_300_799_999_999));
        let e = b.join(now, id.as_str().into(), &p);
        let m = e.to_message();
        let mut payload = json!({"participant": announce, "supported_versions": [1]});
        if let Some(t) = &token {
            payload["token"] = json!(t);
        }
        assert_eq!(m.payload, payload, "round {round}");
        assert_eq!(m.session, session);
        assert_eq!(m.sender, id);
        assert_eq!(e.json(), m.to_json(), "round {round}");
        let e = b.announce(now, id.as_str().into(), &p);
        assert_eq!(e.to_message().payload, announce);
        assert_eq!(e.json(), e.to_message().to_json());
        for e in [
            b.context_update(now, id.as_str().into(), &name, &csrc, "r"),
            b.context_remove(now, id.as_str().into(), &name, "r"),
            b.leave(now, id.as_str().into(), &sid),
        ] {
            let m = e.to_message();
            assert_eq!(m.session, session);
            assert_eq!(m.sender, id);
            assert_eq!(e.json(), m.to_json());
        }
    }
}

/// pvp-spec 4.2 / 5.1: ids are valid ULIDs that sort in emission order, and `ts` is RFC 3339
/// UTC with milliseconds, whatever the clock does (same millisecond, steps back), for
/// many envelopes in one millisecond.
#[test]
fn prop_ids_sort_in_emission_order_and_ts_is_rfc3339_utc_millis() {
    let mut rng = Rng(7);
    let mut b = Builder::new("s".into(), None, 3);
    let mut last: Option<ulid::Ulid> = None;
    let mut t = T0 * 1000;
    // The clock may step back; the stamps do not (each is the latest time yet).
    let mut latest = 0;
    let sender = SenderId::from("p").with_template("p/1/", "rtp://x");
    for i in 0..20_000u64 {
        match rng.below(10) {
            0 => t = t.saturating_sub(rng.below(5_000_000)),
            1..=4 => {}
            _ => t += rng.below(3_000),
        }
        let e = b
            .context_add(Time(t), &sender, i, "x", FlushCause::Size)
            .unwrap();
        let m = e.to_message();
        let id: ulid::Ulid = m.id.parse().expect("ULID");
        assert_eq!(id, e.id());
        if let Some(l) = last {
            assert!(l < id, "ids must increase: {l} then {id}");
        }
        last = Some(id);
        let ts = &m.ts;
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(ts.ends_with('Z'));
        let parsed = humantime::parse_rfc3339(ts).expect("RFC 3339");
        latest = Time(t).as_millis().max(latest);
        assert_eq!(Time::from_system(parsed).as_millis(), latest);
    }
}

/// pvp-spec 4.2: `ts` is an ISO 8601 timestamp of the message's creation. RFC 3339 cannot
/// write years after 9999, so a later time has no right text; but the text written must not
/// claim a different instant that is *earlier* than the one before it: it is written as the last
/// one RFC 3339 can. (`iso8601_bytes` clamped only the year: 10000-01-01 became 9999-01-01, a
/// year before 9999-12-31.) Times that far out reach the core from a pcapng whose timestamp
/// resolution or offset is wrong (capture.rs saturates, it does not refuse).
#[test]
fn timestamps_after_year_9999_never_go_back_in_time() {
    let last_9999 = Time::from_millis(253_402_300_799_999); // 9999-12-31T23:59:59.999Z
    let first_10000 = Time::from_millis(253_402_300_800_000); // 10000-01-01T00:00:00.000Z
    assert_eq!(last_9999.to_iso8601(), "9999-12-31T23:59:59.999Z");
    let later = first_10000.to_iso8601();
    assert!(
        later.as_str() >= "9999-12-31T23:59:59.999Z",
        "a time after 9999-12-31T23:59:59.999Z is written as {later}, an earlier instant"
    );
}

/// pvp-spec 4.2 / 5.1: ULIDs hold 48 bits of milliseconds (until 10889-08-02): a later time
/// keeps the last, and ids stay ordered. (`IdGen` passed larger times to `Ulid::from_parts`,
/// which masked them: the id's time wrapped to 1970 and sorted before every earlier one.)
#[test]
fn ids_stay_ordered_past_the_ulid_time_range() {
    let mut b = Builder::new("s".into(), None, 1);
    let max_ms = (1u64 << 48) - 1;
    let a = b.leave(Time::from_millis(max_ms), "p".into(), "r");
    let c = b.leave(Time::from_millis(max_ms + 1), "p".into(), "r");
    assert!(
        a.id() < c.id(),
        "ids go backwards: {} then {} (time part {} then {})",
        a.id(),
        c.id(),
        a.id().timestamp_ms(),
        c.id().timestamp_ms()
    );
}

/// pvp-spec 9.1: a context key is "unique within session" (README: `<participant>/<stream
/// start ms>/<n>`, "unique within the session"). A stream that ends with RTCP BYE and an
/// RTP stream with the same SSRC from the same address that starts in the same millisecond
/// (one `now` for a whole recvmmsg batch in `handle_batch`; equal capture timestamps in a
/// replay) has the same participant id, and its start is moved a millisecond on, so its keys
/// are its own. (Its first `context.add` repeated the first stream's key: the server would
/// overwrite or reject the item, and a correction of either would target both.) The new
/// session starts marked at a random sequence number (RFC 3550 5.1), as a new session does:
/// one numbered just behind the old stream's, within the reorder wait after its BYE, is taken
/// for the old stream's late duplicate.
#[test]
fn a_stream_restarted_in_the_same_millisecond_gets_fresh_context_keys() {
    let mut gw = Gateway::new(Config::default());
    let mut bye = Vec::new();
    pvp_t140::rtcp::write_bye(&mut bye, 7);
    let first = t140(1, 7, "First. ");
    let second = t140m(40_000, 7, true, "Second. ");
    let batch: Vec<(SocketAddr, &[u8])> = vec![
        (addr(4000), &first),
        (addr(4000), &bye),
        (addr(4000), &second),
    ];
    gw.handle_batch(at(0), &batch);
    gw.shutdown(at(10));
    let out = drain(&mut gw);
    let keys: Vec<&str> = out
        .iter()
        .filter(|e| e.kind == "context.add")
        .map(|e| e.payload["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "{out:?}");
    assert_ne!(keys[0], keys[1], "two items with one key in one session");
}

/// Parses each written line back: keeps serde_json's reading of our output in view for the
/// values the spec types (v integer, payload object, strings elsewhere).
#[test]
fn every_gateway_envelope_has_the_envelope_types_of_pvp_spec_4_1() {
    let mut gw = Gateway::new(Config::default());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "I said yes. "));
    gw.handle_datagram(
        at(300),
        addr(4000),
        &t140(2, 7, "\u{8}\u{8}\u{8}\u{8}\u{8}no"),
    );
    gw.shutdown(at(400));
    let mut n = 0;
    while let Some(e) = gw.poll_output() {
        let v: Value = serde_json::from_str(e.json()).unwrap();
        assert_eq!(v["v"], 1);
        for k in ["id", "ts", "session", "sender", "type"] {
            assert!(v[k].is_string(), "{k} in {v}");
        }
        assert!(v["payload"].is_object());
        n += 1;
    }
    assert!(n >= 4);
}

/// Random traffic (several sources, SSRCs, mixer CSRCs, arbitrary bytes with backspaces,
/// BOMs, sentence ends and invalid UTF-8, reordering, RTCP BYEs and SDES names, late timer
/// calls) through the core. Checks, per sender, the causal rules a PVP server relies on:
/// nothing before its join, nothing after its leave (until it joins again), updates and removes
/// only for keys it added and has not removed, announces only while joined; ids strictly
/// increasing; every line valid JSON with the 4.1 types.
#[test]
fn prop_random_traffic_keeps_per_sender_causality() {
    use std::collections::{HashMap, HashSet};
    let pieces: &[&[u8]] = &[
        b"Hello",
        b" ",
        b". ",
        b"\x08",
        b"\x08\x08\x08",
        b"\xef\xbb\xbf",
        b"\xe2\x80\xa8",
        b"\xff\xfe",
        b"\r\n",
        b"\n",
        b"x",
        b"Yes! ",
        b"\"q\\",
        b"\x1b[2J",
        b"\xf0\x9f\x8e\x89",
        b"\xc3",
        b"\xa9",
        b"\xe2\x80",
        b"\x00",
        b"\x07",
    ];
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for seed in 1..40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut gw = Gateway::new(Config {
            idle_flush: std::time::Duration::from_millis(300 + rng.below(1000)),
            stream_timeout: std::time::Duration::from_millis(2000 + rng.below(3000)),
            max_chunk_chars: 5 + rng.below(40) as usize,
            ..Config::default()
        });
        let mut seqs: HashMap<(u16, u32), u16> = HashMap::new();
        let mut t = 0u64;
        let mut all = Vec::new();
        for _ in 0..400 {
            t += rng.below(400);
            let port = 4000 + 2 * rng.below(2) as u16;
            let ssrc = 1 + rng.below(3) as u32;
            match rng.below(20) {
                0 => {
                    let mut bye = Vec::new();
                    pvp_t140::rtcp::write_bye(&mut bye, ssrc);
                    gw.handle_datagram(at(t), addr(port + 1), &bye);
                }
                1 => {
                    let mut d = Vec::new();
                    let name = format!("N{}", rng.below(3));
                    pvp_t140::rtcp::write_sdes(&mut d, ssrc, "c@h", Some(&name));
                    gw.handle_datagram(at(t), addr(port), &d);
                }
                2 => {
                    // A late timer call: everything due by now, at once.
                    gw.handle_timeout(at(t));
                }
                _ => {
                    let seq = seqs.entry((port, ssrc)).or_insert(0);
                    *seq = seq.wrapping_add(if rng.below(15) == 0 { 2 } else { 1 });
                    let mut text = Vec::new();
                    for _ in 0..rng.below(4) {
                        text.extend_from_slice(pieces[rng.below(pieces.len() as u64) as usize]);
                    }
                    let csrc = (rng.below(4) == 0).then(|| 100 + rng.below(2) as u32);
                    let mut d = Vec::new();
                    rtp::write_packet(
                        &mut d,
                        *seq == 1,
                        98,
                        *seq,
                        u32::from(*seq) * 300,
                        ssrc,
                        &text,
                    );
                    if let Some(c) = csrc {
                        d[0] |= 1;
                        let mut with = d[..12].to_vec();
                        with.extend_from_slice(&c.to_be_bytes());
                        with.extend_from_slice(&d[12..]);
                        d = with;
                    }
                    gw.handle_datagram(at(t), addr(port), &d);
                }
            }
            all.extend(std::iter::from_fn(|| gw.poll_output()));
        }
        gw.shutdown(at(t + 1));
        all.extend(std::iter::from_fn(|| gw.poll_output()));
        let mut joined: HashSet<String> = HashSet::new();
        let mut keys: HashMap<String, HashSet<String>> = HashMap::new();
        let mut seen_keys: HashSet<String> = HashSet::new();
        let mut last_id: Option<ulid::Ulid> = None;
        for e in &all {
            if let Some(l) = last_id {
                assert!(l < e.id(), "seed {seed}: ids not increasing");
            }
            last_id = Some(e.id());
            let v: Value = serde_json::from_str(e.json()).expect("JSON");
            assert!(v["payload"].is_object());
            let m = e.to_message();
            *kinds.entry(m.kind.clone()).or_default() += 1;
            let s = m.sender.clone();
            match m.kind.as_str() {
                "session.join" => {
                    assert!(joined.insert(s.clone()), "seed {seed}: {s} joins twice");
                }
                "session.leave" => {
                    assert!(joined.remove(&s), "seed {seed}: {s} leaves unjoined");
                    keys.remove(&s);
                }
                k => {
                    assert!(
                        joined.contains(&s),
                        "seed {seed}: {k} from {s} while not joined"
                    );
                    let key = m.payload["key"].as_str().map(str::to_owned);
                    match k {
                        "context.add" => {
                            let key = key.unwrap();
                            assert!(
                                seen_keys.insert(key.clone()),
                                "seed {seed}: key {key} reused"
                            );
                            keys.entry(s).or_default().insert(key);
                        }
                        "context.update" => {
                            let key = key.unwrap();
                            assert!(
                                keys.get(&s).is_some_and(|k| k.contains(&key)),
                                "seed {seed}: update of {key}"
                            );
                            assert!(
                                m.payload["new_content"]
                                    .as_str()
                                    .is_some_and(|c| !c.trim().is_empty())
                            );
                        }
                        "context.remove" => {
                            let key = key.unwrap();
                            assert!(
                                keys.get_mut(&s).is_some_and(|k| k.remove(&key)),
                                "seed {seed}: remove of {key}"
                            );
                        }
                        "participant.announce" => {}
                        other => panic!("unexpected {other}"),
                    }
                }
            }
        }
        assert!(
            joined.is_empty(),
            "seed {seed}: still joined after shutdown: {joined:?}"
        );
    }
    // The traffic reaches every kind the gateway sends.
    for k in [
        "session.join",
        "session.leave",
        "participant.announce",
        "context.add",
        "context.update",
        "context.remove",
    ] {
        assert!(kinds.get(k).is_some_and(|&n| n > 0), "no {k}: {kinds:?}");
    }
}

/// pvp-spec 4.2 (`ts`: the time of the message's creation) and 19.5 (per-sender order): one
/// participant's envelopes must not carry timestamps that go back: an envelope is never dated
/// before its id's time, which never goes back. (An idle flush that a gap held back was stamped
/// with its idle deadline, though made only when the gap was settled; an envelope the same
/// participant sent in between, here the `participant.announce` of an RTCP SDES NAME, carried a
/// later time, so the `context.add` was dated before the announce it followed, and its ULID's
/// time, 700 ms, differed from its `ts`, 500 ms.) Here the gap
/// is in a mixer stream (RFC 9071) whose own SSRC also speaks, as in `--mixer auto` when a
/// mixer sends its own text without a CSRC.
#[test]
fn an_idle_flush_held_back_by_a_gap_is_not_dated_before_the_participants_last_envelope() {
    let mut gw = Gateway::new(Config {
        idle_flush: std::time::Duration::from_millis(500),
        ..Config::default()
    });
    // The mixer's own voice (no CSRC): joins with its first sentence, then holds "and then".
    gw.handle_datagram(at(0), addr(5000), &t140(1, 9, "Hi. and then"));
    // A contributing source's packet arrives ahead of a gap (seq 2 lost): it waits up to 1 s.
    let mut d = Vec::new();
    rtp::write_packet(&mut d, false, 98, 3, 900, 9, b"x");
    d[0] |= 1;
    let mut pkt = d[..12].to_vec();
    pkt.extend_from_slice(&5u32.to_be_bytes());
    pkt.extend_from_slice(&d[12..]);
    gw.handle_datagram(at(100), addr(5000), &pkt);
    // RTCP SDES names the mixer's own voice: an announce at 700 ms.
    let mut sdes = Vec::new();
    pvp_t140::rtcp::write_sdes(&mut sdes, 9, "mix@host", Some("Mixer"));
    gw.handle_datagram(at(700), addr(5001), &sdes);
    // The gap is given up; the held-back idle flush goes out.
    gw.handle_timeout(at(1100));
    gw.shutdown(at(5000));
    let out = drain(&mut gw);
    let me = "t140:00000009@127.0.0.1:5000";
    let mine: Vec<(&str, &str, String)> = out
        .iter()
        .filter(|e| e.sender == me)
        .map(|e| {
            (
                e.kind.as_str(),
                e.ts.as_str(),
                e.payload["content"].to_string(),
            )
        })
        .collect();
    assert!(
        mine.iter().any(|(k, _, _)| *k == "participant.announce"),
        "{mine:?}"
    );
    for w in mine.windows(2) {
        assert!(
            w[0].1 <= w[1].1,
            "{} at {} after {} at {}: {mine:?}",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
}
