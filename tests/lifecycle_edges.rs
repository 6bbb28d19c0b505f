//! Found by review y: a participant's lifecycle in the core, from first packet to leave.

#[path = "common/core.rs"]
mod core;
use core::*;

use std::time::Duration;

use pvp_t140::pvp::Message;
use pvp_t140::{Config, Gateway, Time};

fn cfg() -> Config {
    Config {
        max_pps_per_source: 0,
        ..Config::default()
    }
}

fn kinds(out: &[Message]) -> Vec<String> {
    out.iter().map(|m| m.kind.clone()).collect()
}

fn bye(ssrc: u32) -> Vec<u8> {
    let mut d = Vec::new();
    pvp_t140::rtcp::write_bye(&mut d, ssrc);
    d
}

/// Every participant that left had joined, every one that joined left, and nothing it sent
/// came after its leave.
fn paired(out: &[Message]) {
    for (who, joined) in ordered(out) {
        assert!(!joined, "{who} never left");
    }
}

/// Every participant that left had joined, and nothing it sent came outside its join; whether
/// each is in the session at the end, by participant.
fn ordered(out: &[Message]) -> std::collections::HashMap<String, bool> {
    use std::collections::HashMap;
    let mut state: HashMap<String, bool> = HashMap::new();
    for m in out {
        let joined = state.get(&m.sender).copied().unwrap_or(false);
        match m.kind.as_str() {
            "session.join" => {
                assert!(!joined, "{} joined twice", m.sender);
                state.insert(m.sender.clone(), true);
            }
            "session.leave" => {
                assert!(joined, "{} left without a join", m.sender);
                state.insert(m.sender.clone(), false);
            }
            k => assert!(joined, "{k} from {} outside a join", m.sender),
        }
    }
    state
}

#[test]
fn the_idle_flush_fires_at_exactly_its_boundary() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "hello"));
    assert_eq!(gw.poll_timeout(), Some(at(2000)));
    gw.handle_timeout(Time(at(2000).0 - 1));
    assert!(drain(&mut gw).is_empty());
    gw.handle_timeout(at(2000));
    let out = drain(&mut gw);
    assert_eq!(kinds(&out), ["session.join", "context.add"]);
    assert_eq!(shown(&out), ["hello"]);
}

#[test]
fn a_stream_timing_out_with_a_packet_held_says_it_then_leaves() {
    let mut gw = Gateway::new(Config {
        reorder_wait: Duration::from_secs(5),
        stream_timeout: Duration::from_secs(2),
        ..cfg()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "one "));
    gw.handle_datagram(at(10), addr(4000), &t140(3, 1, "three"));
    let mut out = Vec::new();
    while let Some(t) = gw.poll_timeout() {
        gw.handle_timeout(t);
        out.extend(drain(&mut gw));
    }
    paired(&out);
    assert_eq!(shown(&out).concat(), "one \u{fffd}three");
    assert_eq!(gw.live_streams(), 0);
}

#[test]
fn ten_thousand_streams_ending_in_one_tick_each_leave() {
    let mut gw = Gateway::new(cfg());
    let n = 10_000u32;
    for i in 0..n {
        let port = 1000 + (i % 50_000) as u16;
        gw.handle_datagram(at(0), addr(port), &t140(1, i + 1, "hi."));
    }
    gw.handle_timeout(at(120_000));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(
        out.iter().filter(|m| m.kind == "session.leave").count(),
        n as usize
    );
    assert_eq!(gw.live_streams(), 0);
}

#[test]
fn a_clock_stepping_back_an_hour_still_times_the_stream_out() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(3_600_000), addr(4000), &t140(1, 1, "a"));
    // The clock steps back an hour.
    gw.handle_datagram(at(0), addr(4000), &t140(2, 1, "b"));
    let mut out = Vec::new();
    gw.handle_timeout(at(2_000));
    out.extend(drain(&mut gw));
    assert_eq!(shown(&out), ["ab"], "the idle flush after the last packet");
    gw.handle_timeout(at(60_000));
    out.extend(drain(&mut gw));
    paired(&out);
    assert_eq!(gw.live_streams(), 0);
}

#[test]
fn a_clock_jumping_hours_ahead_flushes_then_leaves_in_time_order() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "a"));
    gw.handle_datagram(at(5 * 3_600_000), addr(4001), &t140(1, 2, "b"));
    let out = drain(&mut gw);
    // The first stream has left; the second, its text not yet flushed, has said nothing.
    assert!(ordered(&out).values().all(|joined| !joined));
    assert_eq!(
        kinds(&out),
        ["session.join", "context.add", "session.leave"]
    );
    assert_eq!(out[1].ts, "2023-11-14T22:13:22.000Z");
}

#[test]
fn a_bye_then_more_text_is_a_new_participation() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "bye now"));
    gw.handle_datagram(at(10), addr(4000), &bye(1));
    gw.handle_timeout(at(1010));
    let mut out = drain(&mut gw);
    assert_eq!(
        kinds(&out),
        ["session.join", "context.add", "session.leave"]
    );
    gw.handle_datagram(at(5000), addr(4000), &t140m(2, 1, true, "back"));
    gw.shutdown(at(6000));
    out.extend(drain(&mut gw));
    paired(&out);
    assert_eq!(shown(&out), ["bye now", "back"]);
}

#[test]
fn an_evicted_stream_coming_back_joins_with_its_text_and_leaves() {
    let mut gw = Gateway::new(Config {
        max_streams: 1,
        ..cfg()
    });
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{feff}"));
    gw.handle_datagram(at(10), addr(4001), &t140(1, 2, "\u{feff}"));
    gw.handle_datagram(at(20), addr(4000), &t140(2, 1, "I am back."));
    gw.shutdown(at(30_000));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(shown(&out), ["I am back."]);
}

#[test]
fn the_shutdown_says_what_every_stream_holds() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "held"));
    gw.handle_datagram(at(0), addr(4001), &t140(1, 2, "one "));
    gw.handle_datagram(at(0), addr(4001), &t140(3, 2, "three"));
    gw.handle_datagram(at(0), addr(4002), &t140(1, 3, "lingering"));
    gw.handle_datagram(at(1), addr(4002), &bye(3));
    gw.shutdown(at(100));
    let out = drain(&mut gw);
    paired(&out);
    let mut s = shown(&out);
    s.sort();
    assert_eq!(s, ["held", "lingering", "one \u{fffd}three"]);
}

#[test]
fn the_same_ssrc_from_a_new_address_after_its_timeout_is_a_new_participant() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "first."));
    gw.handle_datagram(at(70_000), addr(4001), &t140(1, 1, "second."));
    gw.shutdown(at(80_000));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(shown(&out), ["first.", "second."]);
    assert_eq!(gw.stats().drops_total(), 0);
}

#[test]
fn ten_thousand_byes_in_one_tick_each_leave_after_their_wait() {
    let mut gw = Gateway::new(cfg());
    let n = 10_000u32;
    for i in 0..n {
        let port = 1000 + (i % 50_000) as u16;
        gw.handle_datagram(at(0), addr(port), &t140(1, i + 1, "bye"));
    }
    for i in 0..n {
        let port = 1000 + (i % 50_000) as u16;
        gw.handle_datagram(at(500), addr(port), &bye(i + 1));
    }
    assert_eq!(gw.live_streams(), n as usize);
    let out = drain(&mut gw);
    assert!(out.is_empty(), "{:?}", kinds(&out));
    assert_eq!(gw.poll_timeout(), Some(at(1500)));
    gw.handle_timeout(at(1500));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(
        out.iter().filter(|m| m.kind == "session.leave").count(),
        n as usize
    );
    assert!(out.iter().all(|m| m.ts == out[0].ts));
    assert_eq!(gw.live_streams(), 0);
}

/// A flood of new SSRCs at the limit evicts silent streams, never one holding words: every
/// caller's words are said, joined and left, however many junk streams came and went.
#[test]
fn a_flood_at_the_limit_never_loses_a_callers_words() {
    let mut gw = Gateway::new(Config {
        max_streams: 8,
        ..cfg()
    });
    for c in 0..4u32 {
        gw.handle_datagram(at(0), addr(4000 + c as u16), &t140(1, 100 + c, "typing"));
    }
    for j in 0..2_000u32 {
        let t = at(1 + u64::from(j));
        gw.handle_datagram(
            t,
            addr(6000 + (j % 1000) as u16),
            &t140(1, 10_000 + j, "\u{feff}"),
        );
    }
    gw.shutdown(at(100_000));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(shown(&out), ["typing"; 4]);
}

/// Packets the BYE overtook, or that continue the numbering within its wait, are the same
/// participant's: one join, one leave, after them.
#[test]
fn packets_within_the_wait_after_a_bye_are_the_same_participants() {
    let mut gw = Gateway::new(cfg());
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "last "));
    gw.handle_datagram(at(10), addr(4000), &bye(1));
    gw.handle_datagram(at(400), addr(4000), &t140(3, 1, "words"));
    gw.handle_datagram(at(500), addr(4000), &t140(2, 1, "few "));
    assert_eq!(gw.live_streams(), 1);
    gw.handle_timeout(at(1010));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(
        kinds(&out),
        ["session.join", "context.add", "session.leave"]
    );
    assert_eq!(shown(&out), ["last few words"]);
    assert_eq!(out[2].ts, "2023-11-14T22:13:21.010Z");
    assert_eq!(gw.live_streams(), 0);
}

/// An evicted stream's record lasts until its stream timeout, as a live stream would: a
/// return a microsecond before is the same stream (no head wait, no mark), one at it is new.
#[test]
fn an_evicted_streams_return_at_its_timeout_is_a_new_stream() {
    for (back, same) in [(59_999, true), (60_000, false)] {
        let mut gw = Gateway::new(Config {
            max_streams: 1,
            ..cfg()
        });
        gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{feff}"));
        gw.handle_datagram(at(0), addr(4001), &t140(1, 2, "\u{feff}"));
        gw.handle_datagram(at(back), addr(4000), &t140(2, 1, "again."));
        gw.shutdown(at(back + 5_000));
        let out = drain(&mut gw);
        paired(&out);
        let want = if same { "again." } else { "\u{fffd}again." };
        assert_eq!(shown(&out), [want], "back at {back} ms");
    }
}

/// pvp-spec 9.1: a context key is unique within the session. A stream that ends and starts
/// again under its key within one millisecond starts a millisecond later, so its keys
/// (`participant/start ms/n`) are not the ended one's, however many other streams ended in
/// that millisecond (one batch of datagrams is handled at one `now`).
#[test]
fn a_stream_started_again_in_its_millisecond_never_repeats_a_key() {
    let mut gw = Gateway::new(Config {
        reorder_wait: Duration::ZERO,
        ..cfg()
    });
    let now = at(0);
    gw.handle_datagram(now, addr(4000), &t140(1, 1, "first. "));
    gw.handle_datagram(now, addr(4000), &bye(1));
    for i in 0..40u32 {
        let a = addr(5000 + i as u16);
        gw.handle_datagram(now, a, &t140(1, 100 + i, "other. "));
        gw.handle_datagram(now, a, &bye(100 + i));
    }
    gw.handle_datagram(now, addr(4000), &t140m(7, 1, true, "second. "));
    gw.shutdown(at(10));
    let out = drain(&mut gw);
    let mut keys: Vec<String> = out
        .iter()
        .filter(|m| m.kind == "context.add")
        .map(|m| m.payload["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 42);
    keys.sort();
    let n = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), n, "a key repeated");
}

/// A clock near `Time`'s end (a capture's absurd timestamps): nothing panics, and every
/// stream's text and leave still go out at the shutdown.
#[test]
fn a_clock_near_its_end_panics_nowhere_and_loses_nothing() {
    let mut gw = Gateway::new(cfg());
    let end = u64::MAX - 1;
    gw.handle_datagram(Time(end - 3_000_000), addr(4000), &t140(1, 1, "near"));
    gw.handle_datagram(Time(end - 2_000_000), addr(4001), &t140(1, 2, "the end"));
    gw.handle_datagram(Time(end - 1_000_000), addr(4000), &bye(1));
    if let Some(t) = gw.poll_timeout() {
        gw.handle_timeout(t);
    }
    gw.handle_timeout(Time(end));
    gw.shutdown(Time(end));
    let out = drain(&mut gw);
    paired(&out);
    let mut s = shown(&out);
    s.sort();
    assert_eq!(s, ["near", "the end"]);
    assert_eq!(gw.live_streams(), 0);
}

/// Random traffic at a small stream limit: a few sources, SSRCs reused, sequence numbers
/// near each other, marked or not, BYEs, the clock stepping a little or far. Whatever comes,
/// every participant that sends anything joined first, every join has its leave once the
/// gateway shuts down, and nothing is sent after a leave but a new join.
#[test]
fn random_lifecycles_keep_joins_and_leaves_paired() {
    for seed in 1..=24u64 {
        random_lifecycles(seed, false);
    }
}

/// As above, through a mixer (RFC 9071: one CSRC a packet names its speaker), whose
/// sources say BYE and are named by SDES, mixed with its own BYEs.
#[test]
fn random_mixer_lifecycles_keep_joins_and_leaves_paired() {
    for seed in 1..=24u64 {
        random_lifecycles(seed, true);
    }
}

fn with_csrc(mut d: Vec<u8>, csrc: u32) -> Vec<u8> {
    d[0] |= 1;
    d.splice(12..12, csrc.to_be_bytes());
    d
}

fn random_lifecycles(seed: u64, mixed: bool) {
    {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x1234_5678_9abc_def1);
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut gw = Gateway::new(Config {
            max_streams: 1 + (seed % 4) as usize,
            reorder_wait: Duration::from_millis([0, 300, 1000][(seed % 3) as usize]),
            stream_timeout: Duration::from_secs(1 + seed % 3),
            idle_flush: Duration::from_millis(500),
            max_chunk_chars: 12,
            ..cfg()
        });
        let mut now = 0u64;
        let mut seqs = [0u16; 8];
        let mut out = Vec::new();
        let words = [
            "a",
            "b. ",
            "\u{feff}",
            "",
            "hello ",
            "\u{8}",
            "x\n",
            "longer text here ",
        ];
        for _ in 0..3_000 {
            let who = (next() % 8) as usize;
            let port = 4000 + (who % 3) as u16;
            let ssrc = 1 + (who / 2) as u32;
            match next() % 12 {
                0 => gw.handle_datagram(at(now), addr(port), &bye(ssrc)),
                1 => gw.handle_datagram(at(now), addr(port + 1), &bye(ssrc)),
                2 | 3 if mixed => {
                    let csrc = 100 + (next() % 40) as u32;
                    let mut d = Vec::new();
                    pvp_t140::rtcp::write_rr(&mut d, ssrc);
                    if next() % 2 == 0 {
                        pvp_t140::rtcp::write_bye(&mut d, csrc);
                    } else {
                        pvp_t140::rtcp::write_sdes(&mut d, csrc, "c@h", Some("Someone"));
                    }
                    gw.handle_datagram(at(now), addr(port), &d);
                }
                _ => {
                    let step = match next() % 6 {
                        0 => 0u16,
                        1 => 2,
                        2 => 0u16.wrapping_sub(1),
                        3 => 5000,
                        _ => 1,
                    };
                    seqs[who] = seqs[who].wrapping_add(step);
                    let marker = next() % 5 == 0;
                    let text = words[(next() % words.len() as u64) as usize];
                    let mut d = t140m(seqs[who], ssrc, marker, text);
                    if mixed {
                        d = with_csrc(d, 100 + (next() % 40) as u32);
                    }
                    gw.handle_datagram(at(now), addr(port), &d);
                }
            }
            now += match next() % 10 {
                0 => 3_000 + next() % 5_000,
                1..=3 => next() % 700,
                _ => next() % 50,
            };
            if next() % 4 == 0 {
                while let Some(t) = gw.poll_timeout().filter(|t| *t <= at(now)) {
                    gw.handle_timeout(t);
                }
            }
            out.extend(drain(&mut gw));
        }
        gw.shutdown(at(now + 100_000));
        out.extend(drain(&mut gw));
        paired(&out);
        assert_eq!(gw.live_streams(), 0, "seed {seed}");
        let csrc_joins = (out.iter())
            .filter(|m| m.kind == "session.join" && m.sender.contains("/csrc:"))
            .count();
        assert_eq!(csrc_joins > 0, mixed, "seed {seed}");
        let ts: Vec<&String> = out.iter().map(|m| &m.ts).collect();
        assert!(
            ts.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: time went back"
        );
        let mut keys: Vec<String> = out
            .iter()
            .filter(|m| m.kind == "context.add")
            .map(|m| m.payload["key"].as_str().unwrap().to_owned())
            .collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "seed {seed}: a key repeated");
    }
}

/// Random traffic at a stream limit with room for the callers: every word in a datagram the
/// gateway took (none of its drops counted) is said, whatever ends its stream (an idle flush,
/// a timeout, a BYE and its wait, the shutdown) and whatever order its packets came in.
#[test]
fn random_lifecycles_say_every_word_taken() {
    for seed in 1..=16u64 {
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut gw = Gateway::new(Config {
            reorder_wait: Duration::from_millis([0, 300, 1000][(seed % 3) as usize]),
            stream_timeout: Duration::from_secs(1 + seed % 3),
            idle_flush: Duration::from_millis(200 + 300 * (seed % 4)),
            max_streams: 8,
            ..cfg()
        });
        let mut now = 0u64;
        let mut seqs = [1u16; 6];
        let mut fresh = [true; 6];
        let mut taken = Vec::new();
        let mut out = Vec::new();
        let mut n = 0;
        for _ in 0..2_000 {
            let who = (next() % 6) as usize;
            let (port, ssrc) = (4000 + who as u16, 1 + who as u32);
            if next() % 15 == 0 {
                gw.handle_datagram(at(now), addr(port), &bye(ssrc));
                fresh[who] = true;
            } else if next() % 3 == 0 {
                // A junk stream: a BOM from a new SSRC, at the stream limit.
                let junk = 1_000 + (next() % 100_000) as u32;
                gw.handle_datagram(at(now), addr(7000), &t140(1, junk, "\u{feff}"));
            } else {
                let mut send = |gw: &mut Gateway, seq: u16, marker: bool| {
                    n += 1;
                    let word = format!("w{n} ");
                    let before = gw.stats().drops_total();
                    gw.handle_datagram(at(now), addr(port), &t140m(seq, ssrc, marker, &word));
                    if gw.stats().drops_total() == before {
                        taken.push(word);
                    }
                };
                // A new session after a BYE starts marked, a jump on.
                let marker = fresh[who];
                if fresh[who] {
                    seqs[who] = seqs[who].wrapping_add(10_000);
                    fresh[who] = false;
                }
                if next() % 9 == 0 {
                    // A packet lost.
                    seqs[who] = seqs[who].wrapping_add(1);
                }
                if next() % 5 == 0 {
                    // Two packets swapped.
                    let s = seqs[who];
                    send(&mut gw, s.wrapping_add(1), false);
                    send(&mut gw, s, marker);
                    seqs[who] = s.wrapping_add(2);
                } else {
                    send(&mut gw, seqs[who], marker);
                    seqs[who] = seqs[who].wrapping_add(1);
                }
            }
            now += match next() % 10 {
                0 => 2_000 + next() % 3_000,
                1..=3 => next() % 700,
                _ => next() % 50,
            };
            if next() % 3 == 0 {
                while let Some(t) = gw.poll_timeout().filter(|t| *t <= at(now)) {
                    gw.handle_timeout(t);
                }
            }
            out.extend(drain(&mut gw));
        }
        gw.shutdown(at(now + 100_000));
        out.extend(drain(&mut gw));
        paired(&out);
        let said: std::collections::HashSet<String> = shown(&out)
            .join(" ")
            .split(|c: char| c.is_whitespace() || c == '\u{fffd}')
            .filter(|w| !w.is_empty())
            .map(|w| format!("{w} "))
            .collect();
        let lost: Vec<&String> = taken.iter().filter(|w| !said.contains(*w)).collect();
        assert!(
            taken.len() * 10 > n * 7,
            "seed {seed}: {} of {n} taken",
            taken.len()
        );
        assert!(gw.stats().evicted > 0, "seed {seed}: no eviction");
        assert!(
            lost.is_empty(),
            "seed {seed}: {} of {} words lost: {:?}",
            lost.len(),
            taken.len(),
            &lost[..lost.len().min(10)]
        );
    }
}

/// README "RTCP": after a BYE, a packet marked more than 16 past the old numbering is a new
/// session's start (the old stream ends at once, the packet opens the new one: a second
/// participation); one marked 16 past is the speaker's last words after a pause (the same
/// participation, said before the leave).
#[test]
fn after_a_bye_a_marked_packet_is_a_new_session_only_past_sixteen() {
    for (ahead, new) in [(16u16, false), (17, true)] {
        let mut gw = Gateway::new(cfg());
        gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "old "));
        gw.handle_datagram(at(10), addr(4000), &bye(1));
        gw.handle_datagram(at(100), addr(4000), &t140m(1 + ahead, 1, true, "next"));
        gw.shutdown(at(5_000));
        let out = drain(&mut gw);
        paired(&out);
        let joins = out.iter().filter(|m| m.kind == "session.join").count();
        // The numbers between are lost text (no redundancy to say otherwise): marked.
        let gap = "\u{fffd}".repeat(usize::from(ahead) - 1);
        let want = if new {
            vec!["old".to_owned(), "next".to_owned()]
        } else {
            vec![format!("old {gap}next")]
        };
        assert_eq!(shown(&out), want, "{ahead} ahead");
        assert_eq!(joins, if new { 2 } else { 1 }, "{ahead} ahead");
        if new {
            // The old participation leaves at once, before the new one joins.
            assert_eq!(
                kinds(&out)[..4],
                [
                    "session.join",
                    "context.add",
                    "session.leave",
                    "session.join"
                ]
            );
            assert_eq!(out[2].ts, "2023-11-14T22:13:20.100Z");
        }
    }
}

/// README "Stream limit": an evicted stream's SDES name outlives its record, so the same
/// host and SSRC coming back after its timeout joins with it.
#[test]
fn an_evicted_streams_name_is_its_join_after_its_record_ends() {
    let mut gw = Gateway::new(Config {
        max_streams: 1,
        ..cfg()
    });
    let mut sdes = Vec::new();
    pvp_t140::rtcp::write_sdes(&mut sdes, 1, "a@h", Some("Alice"));
    gw.handle_datagram(at(0), addr(4000), &t140(1, 1, "\u{feff}"));
    gw.handle_datagram(at(5), addr(4000), &sdes);
    gw.handle_datagram(at(10), addr(4001), &t140(1, 2, "\u{feff}"));
    assert_eq!(gw.stats().evicted, 1);
    gw.handle_timeout(at(61_000));
    gw.handle_datagram(at(70_000), addr(4000), &t140m(9, 1, true, "hi."));
    gw.shutdown(at(71_000));
    let out = drain(&mut gw);
    paired(&out);
    assert_eq!(out[0].kind, "session.join");
    assert_eq!(out[0].payload["participant"]["name"], "Alice");
    assert_eq!(shown(&out), ["hi."]);
}
