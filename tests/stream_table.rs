//! The stream table and its timers, driven through the sans-IO core with time as a value (and
//! the timer wheel through its own API): memory after churn, limits, timers against a model
//! (review d, session 39).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use pvp_t140::pvp::Message;
use pvp_t140::timers::Timers;
use pvp_t140::{Config, Gateway, Time, rtp};

#[path = "common/core.rs"]
mod core_helpers;
use core_helpers::*;

#[path = "common/live_bytes.rs"]
mod live_bytes;
use live_bytes::retained;

fn ms_of(m: &Message) -> u64 {
    let t = humantime::parse_rfc3339(&m.ts).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64 - T0
}

/// 100,000 new streams at a stream limit of 16, each evicting the oldest (a flood of random
/// SSRCs): the table stays at the limit and nothing piles up.
#[test]
fn streams_evicted_at_the_limit_leave_no_memory_behind() {
    let mut gw = Gateway::new(Config {
        max_streams: 16,
        max_pps_per_source: 0,
        ..Config::default()
    });
    let mut ssrc = 0x7000_0000u32;
    let mut now = 0u64;
    let mut flood = |gw: &mut Gateway, n: u32| {
        let mut p = Vec::new();
        for i in 0..n {
            ssrc += 1;
            now += 1;
            p.clear();
            rtp::write_packet(&mut p, true, 98, 1, 0, ssrc, "\u{feff}".as_bytes());
            let source = SocketAddr::from(([10, 1, 0, 1], 20_000 + (i % 500) as u16));
            gw.handle_datagram(at(now), source, &p);
            while gw.poll_output().is_some() {}
        }
    };
    flood(&mut gw, 5_000);
    let (grew, ()) = retained(|| flood(&mut gw, 100_000));
    assert_eq!(gw.live_streams(), 16);
    assert_eq!(
        gw.stats().drops_total(),
        0,
        "none refused: each evicts the oldest"
    );
    assert!(
        grew < 64 * 1024,
        "100,000 evictions left {grew} bytes allocated"
    );
}

/// The timer wheel against a model, with the clock stepping back a little and a lot (an NTP
/// step, a capture's records out of order) as well as forward, deadlines already past when
/// set, slots removed and reused, deadlines near the end of time, and a clock near it too.
#[test]
fn timers_fire_as_a_model_with_time_stepping_back() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let tick = 1u64 << 14;
    // `Time`'s last value is no deadline.
    let cap = |x: u64| x.min(u64::MAX - 1);
    for round in 0..32u64 {
        let near_the_end = round % 2 == 1;
        let base = if near_the_end {
            u64::MAX - 3 * 4_096 * tick
        } else {
            1_700_000_000_000_000 + round * 13
        };
        let back = if round % 4 >= 2 {
            2 * 4_096 * tick
        } else {
            3 * tick
        };
        let mut t = Timers::default();
        let mut model: BTreeMap<u32, u64> = BTreeMap::new();
        let mut now = base;
        for _ in 0..5_000 {
            let slot = (next() % 300) as u32;
            match next() % 12 {
                0..=5 => {
                    let due = cap(match next() % 6 {
                        0 => now.saturating_sub(next() % (10 * tick)),
                        1 => now.saturating_add(next() % tick),
                        2 => now.saturating_add(next() % (4_096 * tick)),
                        3 => now.saturating_add(next() % (20_000 * tick)),
                        4 => u64::MAX - 1 - next() % 1000,
                        _ => now.saturating_add(next() % (8 * tick)),
                    });
                    t.set(slot, Time(due), Time(now));
                    model.insert(slot, due);
                }
                6 => {
                    t.remove(slot);
                    model.remove(&slot);
                }
                7 => {
                    // The clock steps back.
                    now = now.saturating_sub(next() % back).max(base / 2);
                }
                _ => {
                    now = cap(now.saturating_add(match next() % 8 {
                        0 => 4_096 * tick + next() % (8_192 * tick),
                        1..=3 => next() % (4 * tick),
                        _ => next() % 2_000,
                    }));
                    let mut want: Vec<(u64, u32)> = model
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|(s, at)| (*at, *s))
                        .collect();
                    want.sort();
                    for (_, s) in &want {
                        model.remove(s);
                    }
                    let got: Vec<(u64, u32)> = std::iter::from_fn(|| t.pop_due(Time(now)))
                        .map(|(at, s)| (at.0, s))
                        .collect();
                    assert_eq!(got, want, "round {round} at {now}");
                }
            }
            if let Some(e) = model.values().min() {
                let n = t.next().expect("an entry for every deadline");
                assert!(n.0 <= *e, "next {} after {e}", n.0);
            }
        }
    }
}

/// Idle flushes and stream timeouts of many streams (enough that the wheel is used), due at
/// every offset within and across ticks, fire each at its own time, in time order, when one
/// late `handle_timeout` catches up on all of them, and again when it is called at each
/// deadline.
#[test]
fn idle_flushes_and_timeouts_fire_at_their_own_times_late_or_not() {
    for late in [false, true] {
        let mut gw = Gateway::new(Config {
            max_pps_per_source: 0,
            ..Config::default()
        });
        let mut want_flush = BTreeMap::new();
        let mut last = BTreeMap::new();
        let mut rng = 0x9e37_79b9u64;
        let mut times: Vec<u64> = (0..400u64)
            .map(|i| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                i * 37 + (rng >> 40) % 70_000
            })
            .collect();
        // The shell's clock never steps back.
        times.sort();
        for (i, &t) in (0u32..).zip(&times) {
            let ssrc = 0x100 + i;
            let src = addr(30_000 + (i % 7) as u16);
            let sender = format!("t140:{ssrc:08x}@{src}");
            gw.handle_datagram(at(t), src, &t140(1, ssrc, "hi"));
            last.insert(sender.clone(), t);
            want_flush.insert(sender, t + 2_000);
        }
        let mut out = Vec::new();
        if late {
            // Past everything, in one call.
            gw.handle_timeout(at(10_000_000));
            out = drain(&mut gw);
        } else {
            while let Some(t) = gw.poll_timeout() {
                gw.handle_timeout(t);
                out.extend(drain(&mut gw));
            }
        }
        let mut prev = 0;
        for m in &out {
            let ms = ms_of(m);
            assert!(ms >= prev, "{} at {ms} after {prev}", m.kind);
            prev = ms;
            match m.kind.as_str() {
                "context.add" => assert_eq!(ms, want_flush[&m.sender], "{}", m.sender),
                "session.leave" => assert_eq!(ms, last[&m.sender] + 60_000, "{}", m.sender),
                _ => {}
            }
        }
        assert_eq!(
            out.iter().filter(|m| m.kind == "context.add").count(),
            400,
            "late {late}"
        );
        assert_eq!(gw.live_streams(), 0);
    }
}

/// A stream evicted at the limit and back under the same key while its old timer entry waits,
/// several times over: each of its words goes out once, at its idle flush, and it leaves once.
#[test]
fn a_stream_evicted_and_back_again_fires_once_at_its_own_time() {
    let mut gw = Gateway::new(Config {
        max_streams: 1,
        max_pps_per_source: 0,
        ..Config::default()
    });
    let a = addr(4000);
    let b = addr(4002);
    let mut out = Vec::new();
    // A opens with a BOM, B's packet evicts it, A's next evicts B, and so on.
    gw.handle_datagram(at(0), a, &t140(1, 7, "\u{feff}"));
    for k in 0..5u16 {
        let t = 100 + u64::from(k) * 100;
        gw.handle_datagram(at(t), b, &t140(1 + k, 9, "\u{feff}"));
        gw.handle_datagram(at(t + 50), a, &t140(2 + k, 7, "\u{feff}"));
        out.extend(drain(&mut gw));
    }
    gw.handle_datagram(at(1_000), a, &t140(7, 7, "word"));
    while let Some(t) = gw.poll_timeout() {
        gw.handle_timeout(t);
        out.extend(drain(&mut gw));
    }
    let kinds: Vec<(String, u64, String)> = out
        .iter()
        .map(|m| (m.kind.clone(), ms_of(m), m.sender.clone()))
        .collect();
    let a_id = "t140:00000007@127.0.0.1:4000".to_string();
    assert_eq!(
        kinds,
        vec![
            ("session.join".into(), 3_000, a_id.clone()),
            ("context.add".into(), 3_000, a_id.clone()),
            ("session.leave".into(), 61_000, a_id.clone()),
        ]
    );
    assert_eq!(gw.stats().drops_total(), 0);
}

/// The limit holds after evictions and timeouts: it never refuses once streams have gone.
#[test]
fn the_limit_admits_again_after_streams_time_out() {
    let mut gw = Gateway::new(Config {
        max_streams: 3,
        max_pps_per_source: 0,
        stream_timeout: Duration::from_secs(5),
        ..Config::default()
    });
    let mut t = 0;
    for round in 0..50u32 {
        // Three callers that speak (not evictable), then a fourth refused.
        for k in 0..3u32 {
            let ssrc = round * 10 + k + 1;
            gw.handle_datagram(at(t), addr(5000 + k as u16), &t140(1, ssrc, "Hello."));
        }
        assert_eq!(gw.live_streams(), 3);
        let refused_before = gw.stats().drops(pvp_t140::DropReason::StreamLimit);
        gw.handle_datagram(at(t + 1), addr(5009), &t140(1, round * 10 + 9, "x"));
        assert_eq!(
            gw.stats().drops(pvp_t140::DropReason::StreamLimit),
            refused_before + 1
        );
        t += 6_000;
        gw.handle_timeout(at(t));
        drain(&mut gw);
        assert_eq!(gw.live_streams(), 0, "round {round}");
    }
}

/// Random traffic (plain, RED, a mixer's CSRCs, t140llm prefixes, jumps, duplicates, SDES and
/// BYEs, from a port and the one above) at a stream limit of 1-4, with the clock jumping past
/// stream timeouts: the table never holds more than the limit, its live count is the
/// counters', every participant joins once before it speaks and leaves once, envelope times
/// never go back and no context key repeats.
#[test]
fn random_traffic_at_a_small_limit_keeps_the_tables_invariants() {
    for seed in 1..=30u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let llm = seed % 3 == 0;
        let mut gw = Gateway::new(Config {
            max_streams: 1 + (seed % 4) as usize,
            max_pps_per_source: 0,
            stream_timeout: Duration::from_secs(1 + seed % 5),
            reorder_wait: Duration::from_millis(seed % 3 * 500),
            compat: if llm {
                pvp_t140::Compat::T140llm
            } else {
                pvp_t140::Compat::None
            },
            t140_pt: if llm { 96 } else { 98 },
            red_pt: if llm { 98 } else { 100 },
            ..Config::default()
        });
        let (tpt, rpt) = if llm { (96, 98) } else { (98, 100) };
        let mut seqs: BTreeMap<(u16, u32), u16> = BTreeMap::new();
        let mut now = 0u64;
        let mut out = Vec::new();
        let texts: [&[u8]; 9] = [
            b"a",
            b"Hi. ",
            "\u{feff}".as_bytes(),
            b"\x1b[",
            b"\xe2\x82",
            b"\xac",
            b"\x08",
            b"",
            b"word ",
        ];
        for _ in 0..3_000 {
            let port = 6000 + (next() % 4) as u16 * 2;
            let ssrc = 1 + (next() % 5) as u32;
            let src = addr(port);
            match next() % 20 {
                0 => {
                    let mut d = Vec::new();
                    pvp_t140::rtcp::write_rr(&mut d, ssrc);
                    if next() % 2 == 0 {
                        pvp_t140::rtcp::write_sdes(
                            &mut d,
                            40 + (next() % 3) as u32,
                            "c",
                            Some("Src"),
                        );
                    }
                    if next() % 2 == 0 {
                        pvp_t140::rtcp::write_bye(&mut d, ssrc);
                    } else {
                        pvp_t140::rtcp::write_bye(&mut d, 40 + (next() % 3) as u32);
                    }
                    let port = if next() % 2 == 0 { port + 1 } else { port };
                    gw.handle_datagram(at(now), addr(port), &d);
                }
                1 => now += 1_000 + next() % 70_000,
                2..=5 => now += next() % 3_000,
                _ => {
                    let seq = seqs.entry((port, ssrc)).or_insert((next() % 65536) as u16);
                    let s = match next() % 10 {
                        0 => seq.wrapping_add((next() % 5) as u16),
                        1 => seq.wrapping_sub((next() % 5) as u16),
                        2 => seq.wrapping_add((next() % 40000) as u16),
                        _ => seq.wrapping_add(1),
                    };
                    *seq = s;
                    let text = texts[(next() % texts.len() as u64) as usize];
                    let mut d = Vec::new();
                    let ts = u32::from(s).wrapping_mul(300);
                    let mut prefixed;
                    let mut text = text;
                    if llm && next() % 3 == 0 {
                        prefixed = format!("id{}\x1e", next() % 3).into_bytes();
                        prefixed.extend_from_slice(text);
                        text = &prefixed;
                    }
                    if next() % 3 == 0 {
                        let prev = texts[(next() % texts.len() as u64) as usize];
                        let mut payload = Vec::new();
                        pvp_t140::red::write_payload(&mut payload, tpt, &[(300, prev)], text);
                        rtp::write_packet(&mut d, next() % 8 == 0, rpt, s, ts, ssrc, &payload);
                    } else {
                        rtp::write_packet(&mut d, next() % 8 == 0, tpt, s, ts, ssrc, text);
                    }
                    if next() % 4 == 0 {
                        // A mixer's packet: one CSRC.
                        let csrc = 40 + (next() % 3) as u32;
                        d[0] = (d[0] & 0xf0) | 1;
                        d.splice(12..12, csrc.to_be_bytes());
                    }
                    gw.handle_datagram(at(now), src, &d);
                }
            }
            out.extend(drain(&mut gw));
            assert!(gw.live_streams() <= gw.config().max_streams);
            assert_eq!(
                gw.stats().streams_live as usize,
                gw.live_streams(),
                "seed {seed}"
            );
            if next() % 10 == 0
                && let Some(t) = gw.poll_timeout()
                && t <= at(now)
            {
                gw.handle_timeout(at(now));
                out.extend(drain(&mut gw));
            }
        }
        gw.shutdown(at(now + 1));
        out.extend(drain(&mut gw));
        assert_eq!(gw.live_streams(), 0);
        let mut joined: BTreeMap<String, bool> = BTreeMap::new();
        let mut keys = std::collections::HashSet::new();
        for m in out.iter().filter(|m| m.kind == "context.add") {
            let k = m.payload["key"].as_str().unwrap().to_string();
            assert!(keys.insert(k.clone()), "seed {seed}: key {k} twice");
        }
        let mut prev = 0;
        for m in &out {
            let ms = ms_of(m);
            assert!(
                ms >= prev,
                "seed {seed}: {} {} at {ms} after {prev}",
                m.kind,
                m.sender
            );
            prev = ms;
            let j = joined.entry(m.sender.clone()).or_default();
            match m.kind.as_str() {
                "session.join" => {
                    assert!(!*j, "seed {seed}: {} joined twice", m.sender);
                    *j = true;
                }
                "session.leave" => {
                    assert!(*j, "seed {seed}: {} left unjoined", m.sender);
                    *j = false;
                }
                _ => assert!(*j, "seed {seed}: {} {} unjoined", m.kind, m.sender),
            }
        }
        assert!(joined.values().all(|j| !j), "seed {seed}: left joined");
    }
}

/// Streams that join, say a sentence and time out, 50,000 of them: nothing piles up.
#[test]
fn speaking_streams_that_come_and_go_leave_no_memory_behind() {
    let mut gw = Gateway::new(Config {
        max_pps_per_source: 0,
        stream_timeout: Duration::from_secs(1),
        ..Config::default()
    });
    let mut ssrc = 0x3000_0000u32;
    let mut now = 0u64;
    let mut churn = |gw: &mut Gateway, n: u32| {
        for i in 0..n {
            ssrc += 1;
            now += 1;
            let source = SocketAddr::from(([10, 1, 0, 1], 20_000 + (i % 500) as u16));
            gw.handle_datagram(at(now), source, &t140(1, ssrc, "Hi. there"));
            while gw.poll_output().is_some() {}
        }
    };
    churn(&mut gw, 10_000);
    let (grew, ()) = retained(|| churn(&mut gw, 50_000));
    assert!(
        grew < 256 * 1024,
        "50,000 streams left {grew} bytes allocated"
    );
}

/// As the flood above, each stream named by an SDES before its first packet, from 200 hosts:
/// the names kept for evicted streams' returns stay bounded.
#[test]
fn named_streams_evicted_at_the_limit_leave_no_memory_behind() {
    let mut gw = Gateway::new(Config {
        max_streams: 16,
        max_pps_per_source: 0,
        ..Config::default()
    });
    let mut ssrc = 0x7000_0000u32;
    let mut now = 0u64;
    let mut flood = |gw: &mut Gateway, n: u32| {
        let mut p = Vec::new();
        for i in 0..n {
            ssrc += 1;
            now += 1;
            let source = SocketAddr::from(([10, 1, (i % 200) as u8, 1], 20_000 + (i % 500) as u16));
            let mut sdes = Vec::new();
            pvp_t140::rtcp::write_rr(&mut sdes, ssrc);
            pvp_t140::rtcp::write_sdes(&mut sdes, ssrc, "c@x", Some("Some Name Here"));
            gw.handle_datagram(at(now), source, &sdes);
            p.clear();
            rtp::write_packet(&mut p, true, 98, 1, 0, ssrc, "\u{feff}".as_bytes());
            gw.handle_datagram(at(now), source, &p);
            while gw.poll_output().is_some() {}
        }
    };
    flood(&mut gw, 5_000);
    let (grew, ()) = retained(|| flood(&mut gw, 30_000));
    assert_eq!(gw.live_streams(), 16);
    assert!(
        grew < 64 * 1024,
        "30,000 evictions left {grew} bytes allocated"
    );
}

fn red_pkt(
    seq: u16,
    ts: u32,
    ssrc: u32,
    marker: bool,
    gens: &[(u16, &str)],
    primary: &str,
) -> Vec<u8> {
    let g: Vec<(u16, &[u8])> = gens.iter().map(|(o, t)| (*o, t.as_bytes())).collect();
    let mut payload = Vec::new();
    pvp_t140::red::write_payload(&mut payload, 98, &g, primary.as_bytes());
    let mut d = Vec::new();
    rtp::write_packet(&mut d, marker, 100, seq, ts, ssrc, &payload);
    d
}

/// Across the sequence and timestamp wrap, with a loss recovered from redundancy: the text in
/// order, once, and the idle flush at its own time.
#[test]
fn text_across_the_sequence_and_timestamp_wrap_flushes_on_time() {
    let mut gw = Gateway::new(Config {
        max_streams: 1,
        max_pps_per_source: 0,
        ..Config::default()
    });
    let a = addr(4000);
    let ts0 = u32::MAX - 600;
    let mut t = 0;
    let texts = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut hist: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for (k, s) in (0..8u16).zip(texts) {
        let seq = 65533u16.wrapping_add(k);
        let ts = ts0.wrapping_add(u32::from(k) * 300);
        let gens: Vec<(u16, &str)> = hist
            .iter()
            .rev()
            .take(2)
            .enumerate()
            .map(|(i, g)| ((i as u16 + 1) * 300, *g))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let p = red_pkt(seq, ts, 7, k == 0, &gens, s);
        hist.push(s);
        t += 300;
        if k == 2 {
            continue; // lost: recovered from the next's redundancy
        }
        gw.handle_datagram(at(t), a, &p);
        out.extend(drain(&mut gw));
    }
    while let Some(x) = gw.poll_timeout() {
        gw.handle_timeout(x);
        out.extend(drain(&mut gw));
    }
    let adds: Vec<(u64, String)> = out
        .iter()
        .filter(|m| m.kind == "context.add")
        .map(|m| (ms_of(m), m.payload["content"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(adds, vec![(2_400 + 2_000, "abcdefgh".to_string())]);
    assert_eq!(gw.stats().drops_total(), 0);
}

/// Lossless in-order senders (a marked packet after each pause, RFC 4103 5.2) at a limit of
/// 1-3: every word of a sender none of whose packets was refused comes out, evictions,
/// returns and timeouts notwithstanding.
#[test]
fn no_word_of_a_sender_never_refused_is_lost_to_eviction() {
    let mut checked = 0;
    for seed in 1..=400u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let max = 1 + (seed % 3) as usize;
        let mut gw = Gateway::new(Config {
            max_streams: max,
            max_pps_per_source: 0,
            stream_timeout: Duration::from_secs(2 + seed % 30),
            idle_flush: Duration::from_millis(200 + seed % 2000),
            ..Config::default()
        });
        let senders = 2 + (seed % 9) as u32;
        let mut seq = vec![0u16; senders as usize];
        let mut sent = vec![String::new(); senders as usize];
        let mut tainted = vec![false; senders as usize];
        let mut last = vec![0u64; senders as usize];
        let mut now = 0u64;
        let mut out = Vec::new();
        let texts = ["", "\u{feff}", "\u{feff}", "", "ab", "c. ", "é", "x"];
        for _ in 0..300 {
            let k = (next() % u64::from(senders)) as usize;
            now += next() % 400;
            if next() % 30 == 0 {
                now += next() % 40_000;
            }
            seq[k] = seq[k].wrapping_add(1);
            let text = if next() % 4 == 0 {
                texts[4 + (next() % 4) as usize]
            } else {
                texts[(next() % 4) as usize]
            };
            let src = addr(7000 + 2 * k as u16);
            let ssrc = 100 + k as u32;
            let mut d = Vec::new();
            // RFC 4103 5.2: the first packet after an idle period is marked.
            let idle = now - last[k] > 1_000;
            last[k] = now;
            rtp::write_packet(
                &mut d,
                seq[k] == 1 || idle,
                98,
                seq[k],
                u32::from(seq[k]) * 300,
                ssrc,
                text.as_bytes(),
            );
            let before = gw.stats().drops_total();
            gw.handle_datagram(at(now), src, &d);
            if gw.stats().drops_total() != before {
                tainted[k] = true;
            }
            sent[k].push_str(text);
            out.extend(drain(&mut gw));
        }
        gw.shutdown(at(now + 1));
        out.extend(drain(&mut gw));
        for k in 0..senders as usize {
            if tainted[k] {
                continue;
            }
            checked += 1;
            let id = format!("t140:{:08x}@127.0.0.1:{}", 100 + k, 7000 + 2 * k);
            let got: String = out
                .iter()
                .filter(|m| m.kind == "context.add" && m.sender == id)
                .map(|m| m.payload["content"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
                .concat();
            let norm = |s: &str| {
                s.chars()
                    .filter(|c| !c.is_whitespace() && *c != '\u{feff}')
                    .collect::<String>()
            };
            assert_eq!(
                norm(&got),
                norm(&sent[k]),
                "seed {seed} sender {k}: evicted {}",
                gw.stats().evicted
            );
        }
    }
    assert!(checked > 50, "{checked}");
}

/// The wheel with many slots whose deadlines crowd into a few ticks (bucket chains of many
/// blocks), deadlines a whole span ahead (the bucket being emptied), lazy re-arms and
/// compaction, against a model.
#[test]
fn timers_with_crowded_ticks_fire_as_a_model() {
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let tick = 1u64 << 14;
    let span = 4_096 * tick;
    for round in 0..10u64 {
        let mut t = Timers::default();
        let mut model: BTreeMap<u32, u64> = BTreeMap::new();
        let mut now = 1_700_000_000_000_000 + round;
        for _ in 0..40_000 {
            let slot = (next() % 2_000) as u32;
            match next() % 10 {
                0..=6 => {
                    let base = now - now % tick;
                    let due = match next() % 5 {
                        0 => base + (next() % 3) * tick + next() % 4,
                        1 => base + span + (next() % 2) * tick,
                        2 => base + span - tick + next() % tick,
                        3 => now + next() % 50,
                        _ => base + (next() % 6) * span / 2,
                    };
                    t.set(slot, Time(due), Time(now));
                    model.insert(slot, due);
                }
                7 => {
                    t.remove(slot);
                    model.remove(&slot);
                }
                _ => {
                    now += match next() % 6 {
                        0 => span - tick + next() % (2 * tick),
                        1 => next() % span,
                        _ => next() % (2 * tick),
                    };
                    let mut want: Vec<(u64, u32)> = model
                        .iter()
                        .filter(|(_, at)| **at <= now)
                        .map(|(s, at)| (*at, *s))
                        .collect();
                    want.sort();
                    for (_, s) in &want {
                        model.remove(s);
                    }
                    let got: Vec<(u64, u32)> = std::iter::from_fn(|| t.pop_due(Time(now)))
                        .map(|(at, s)| (at.0, s))
                        .collect();
                    assert_eq!(got, want, "round {round} at {now}");
                }
            }
            if let Some(e) = model.values().min() {
                let n = t.next().expect("an entry for every deadline");
                assert!(n.0 <= *e, "next {} after {e}", n.0);
            }
        }
    }
}

/// `--help` said streams beyond `--max-streams` "are refused (counted); existing streams keep
/// working", and README's flag table that they "are refused and counted": at the limit a new
/// stream takes the place of the oldest that never carried text, which is removed (README
/// "Stream limit"); only with none such (nor one lingering after its BYE) is it refused.
#[test]
fn the_help_and_flag_table_say_what_the_stream_limit_does() {
    let mut gw = Gateway::new(Config {
        max_streams: 1,
        max_pps_per_source: 0,
        ..Config::default()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 7, "\u{feff}"));
    gw.handle_datagram(at(10), addr(4002), &t140(1, 9, "Hello."));
    // Not refused: the silent stream made room.
    assert_eq!(gw.stats().drops_total(), 0);
    assert_eq!(gw.stats().evicted, 1);
    assert_eq!(gw.live_streams(), 1);
    // With every place held by a stream that spoke, the next one is refused.
    gw.handle_datagram(at(20), addr(4004), &t140(1, 11, "Hi."));
    assert_eq!(gw.stats().drops(pvp_t140::DropReason::StreamLimit), 1);

    let help = std::process::Command::new(env!("CARGO_BIN_EXE_pvp-t140"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout)
        .unwrap()
        .replace(char::is_whitespace, " ");
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let at_flag = help.find("--max-streams").expect("the flag in --help");
    let text = &help[at_flag..at_flag + 300];
    assert!(!text.contains("existing streams keep working"), "{text}");
    assert!(text.contains("never carried text"), "{text}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let row = readme
        .lines()
        .find(|l| l.starts_with("| `--max-streams`"))
        .unwrap();
    assert!(row.contains("never carried text"), "{row}");
}

/// README "Stream limit": the last 64 streams evicted with nothing held are remembered; one of
/// them comes back without a wait for its head or a loss mark (its record is taken before its
/// return makes room, so 64 packets of others may open and evict streams meanwhile: A and 63
/// others evicted), and one that 64 other evictions followed is not (its next unmarked packet
/// waits for a head and marks it lost).
#[test]
fn the_last_64_evicted_streams_are_remembered_and_no_more() {
    for others in [64u32, 65] {
        let mut gw = Gateway::new(Config {
            max_streams: 1,
            max_pps_per_source: 0,
            ..Config::default()
        });
        let a = addr(4000);
        gw.handle_datagram(at(0), a, &t140(1, 7, "\u{feff}"));
        for k in 0..others {
            gw.handle_datagram(
                at(1 + u64::from(k)),
                addr(5000),
                &t140(1, 100 + k, "\u{feff}"),
            );
        }
        // A's eviction and `others` more (the last made by A's return itself).
        gw.handle_datagram(at(100), a, &t140m(2, 7, false, "Hi."));
        let mut out = drain(&mut gw);
        while let Some(t) = gw.poll_timeout() {
            gw.handle_timeout(t);
            out.extend(drain(&mut gw));
        }
        let adds: Vec<(u64, String)> = out
            .iter()
            .filter(|m| m.kind == "context.add")
            .map(|m| (ms_of(m), m.payload["content"].as_str().unwrap().to_string()))
            .collect();
        if others == 64 {
            assert_eq!(
                adds,
                vec![(2_100, "Hi.".to_string())],
                "{others} evicted after A"
            );
        } else {
            assert_eq!(
                adds,
                vec![(3_100, "\u{fffd}Hi.".to_string())],
                "{others} after A"
            );
        }
    }
}

/// Cores sharing a stream budget (`--workers N`) under random traffic: together they never
/// hold more than the limit, and none refuses a stream while it holds less than its reserve.
#[test]
fn cores_sharing_a_budget_stay_within_it_and_refuse_none_under_their_reserve() {
    use pvp_t140::budget::StreamBudget;
    for seed in 1..=40u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let max = 2 + (seed % 7) as usize;
        let n = 1 + (seed % 3) as usize;
        let budget = StreamBudget::new(max, n);
        let mut cores: Vec<Gateway> = (0..n)
            .map(|_| {
                Gateway::with_budget(
                    Config {
                        max_streams: max,
                        max_pps_per_source: 0,
                        stream_timeout: Duration::from_secs(3),
                        ..Config::default()
                    },
                    budget.clone(),
                )
            })
            .collect();
        let reserve = budget.reserve();
        let mut now = 0;
        for _ in 0..2_000 {
            let c = (next() % n as u64) as usize;
            now += next() % 300;
            let ssrc = 1 + (next() % 40) as u32 + 100 * c as u32;
            let src = addr(9000 + c as u16 * 100 + (next() % 4) as u16 * 2);
            let text = if next() % 5 == 0 { "Hi. x" } else { "\u{feff}" };
            let live = cores[c].live_streams();
            let refused = cores[c].stats().drops(pvp_t140::DropReason::StreamLimit);
            let mut d = Vec::new();
            rtp::write_packet(
                &mut d,
                true,
                98,
                1 + (next() % 3) as u16,
                0,
                ssrc,
                text.as_bytes(),
            );
            cores[c].handle_datagram(at(now), src, &d);
            if cores[c].stats().drops(pvp_t140::DropReason::StreamLimit) > refused {
                assert!(
                    live >= reserve,
                    "seed {seed}: refused under the reserve ({live} < {reserve})"
                );
            }
            while cores[c].poll_output().is_some() {}
            let total: usize = cores.iter().map(|g| g.live_streams()).sum();
            assert!(total <= max, "seed {seed}: {total} > {max}");
        }
    }
}

/// As the flood above from IPv6 and v4-mapped sources (the index's other map and its mapped
/// keys): the limit holds, none is refused, nothing piles up.
#[test]
fn ipv6_and_mapped_streams_evicted_at_the_limit_leave_no_memory_behind() {
    let mut gw = Gateway::new(Config {
        max_streams: 16,
        max_pps_per_source: 0,
        ..Config::default()
    });
    let mut ssrc = 0x7000_0000u32;
    let mut now = 0u64;
    let mut flood = |gw: &mut Gateway, n: u32| {
        let mut p = Vec::new();
        for i in 0..n {
            ssrc += 1;
            now += 1;
            p.clear();
            rtp::write_packet(&mut p, true, 98, 1, 0, ssrc, "\u{feff}".as_bytes());
            let source: SocketAddr = if i % 2 == 0 {
                format!("[2001:db8::{:x}]:{}", i % 300, 20_000 + i % 500)
                    .parse()
                    .unwrap()
            } else {
                format!("[::ffff:10.0.{}.1]:{}", i % 200, 20_000 + i % 500)
                    .parse()
                    .unwrap()
            };
            gw.handle_datagram(at(now), source, &p);
            while gw.poll_output().is_some() {}
        }
    };
    flood(&mut gw, 5_000);
    let (grew, ()) = retained(|| flood(&mut gw, 30_000));
    assert_eq!(gw.live_streams(), 16);
    assert_eq!(gw.stats().drops_total(), 0);
    assert!(grew < 64 * 1024, "left {grew} bytes");
}
