//! Scale of the sans-IO core: memory per stream and timer cost with 100,000 live streams.
//!
//! `cargo bench --bench scale` (about 20 s). Plain `main` (no criterion): a counting global
//! allocator measures the bytes the core holds, which criterion cannot.
//!
//! * **memory**: `Gateway` fed N streams (default 100,000; `SCALE_STREAMS` overrides) of one
//!   kind, with every envelope drained and dropped; live heap bytes after minus before, over N.
//!   Kinds: `idle` (one packet whose T.140 is only the BOM: a stream that never carried text,
//!   never joined), `text` (3 RED packets from `send::Sender` carrying a sentence that does not
//!   end, so the chunker holds it), `flushed` (the same with a finished sentence: joined, chunk
//!   sent, buffer empty but its capacity kept). "beyond text" subtracts the bytes of text the
//!   chunker holds.
//! * **timers**: with 1,000 and with 100,000 idle streams live, each round gives 10 other
//!   streams text that does not end a sentence and then calls `handle_timeout` at their idle
//!   flush deadline (10 flushes due, every other stream far from due); also `handle_timeout`
//!   with nothing due. A scan of all streams would make 100k ~100x dearer than 1k. Median of
//!   300 rounds; 3 alternating passes, the lowest median kept.
//! * **steady**: allocations and ns per datagram once 1,000 streams are warm (RED 2, a word a
//!   packet), with and without sentence ends (chunks sent or not).
//! * **limit flood**: at the stream limit (1,000 and N streams), every stream holding text
//!   behind a gap (it may yet speak, so it is no eviction candidate), 20,000 datagrams of new
//!   SSRCs are refused; ns per refused datagram. A walk of every candidate per refusal would
//!   make N ~100x dearer than 1,000.
//! * **stats()**: `Gateway::stats()` at 1k and 100k streams (it folds every live stream's
//!   counters; the live shell calls it once a second per worker when `--metrics` is on).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pvp_t140::send::{Sender, SenderConfig};
use pvp_t140::{Config, Gateway, Time, rtp};

#[path = "support/counting.rs"]
mod counting;
use counting::{CALLS, Counting, TRACE, TRACED, TRACING, live};

#[global_allocator]
static ALLOC: Counting = Counting;

const T0: Time = Time::from_millis(1_700_000_000_000);
const T140_PT: u8 = 98;
/// Source ports the streams are spread over (SSRCs stay globally unique).
const PORTS: u32 = 256;

fn source(i: u32) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
        (20_000 + i % PORTS) as u16,
    )
}

fn ssrc(i: u32) -> u32 {
    0x1000_0000 + i
}

fn config() -> Config {
    Config {
        max_streams: 1_000_000,
        // Nothing times out during the measurement: every stream stays live.
        stream_timeout: Duration::from_secs(3600),
        idle_flush: Duration::from_secs(2),
        max_pps_per_source: 0,
        ..Config::default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Idle,
    Text,
    Flushed,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Idle => "idle (BOM only, never joined)",
            Kind::Text => "text held (no sentence end)",
            Kind::Flushed => "flushed (sentence sent, joined)",
        }
    }
}

fn bom_packet(i: u32) -> Vec<u8> {
    let mut p = Vec::new();
    rtp::write_packet(&mut p, true, T140_PT, 1, 0, ssrc(i), "\u{feff}".as_bytes());
    p
}

/// The datagrams `send::Sender` (RED, 2 generations) makes for `text`, until it is idle.
fn sender_packets(i: u32, text: &str) -> Vec<Vec<u8>> {
    let cfg = SenderConfig {
        ssrc: ssrc(i),
        initial_seq: (i as u16).wrapping_mul(7),
        initial_ts: i.wrapping_mul(1000),
        cps: None,
        ..SenderConfig::default()
    };
    let mut s = Sender::new(cfg, T0);
    s.push_text(T0, text);
    s.packets_until_idle(T0)
}

fn text_for(kind: Kind, i: u32) -> String {
    match kind {
        Kind::Idle => String::new(),
        Kind::Text => format!("Hello from stream {i}, still talking and"),
        Kind::Flushed => format!("Hello from stream {i}. "),
    }
}

fn drain(gw: &mut Gateway) -> u64 {
    let mut n = 0;
    while let Some(e) = gw.poll_output() {
        black_box(e);
        n += 1;
    }
    n
}

/// Opens `n` streams of `kind` (streams `first..first+n`), all packets at `at`, in stream
/// order per packet round as a live sender set would interleave them.
fn open(gw: &mut Gateway, kind: Kind, first: u32, n: u32, at: Time) -> (u64, usize) {
    let mut envelopes = 0;
    let mut text_bytes = 0;
    const BATCH: u32 = 1000;
    let mut start = first;
    while start < first + n {
        let end = (start + BATCH).min(first + n);
        let per: Vec<Vec<Vec<u8>>> = (start..end)
            .map(|i| match kind {
                Kind::Idle => vec![bom_packet(i)],
                _ => {
                    let t = text_for(kind, i);
                    if kind == Kind::Text {
                        text_bytes += t.len();
                    }
                    sender_packets(i, &t)
                }
            })
            .collect();
        let rounds = per.iter().map(Vec::len).max().unwrap_or(0);
        for r in 0..rounds {
            for (k, pkts) in per.iter().enumerate() {
                if let Some(p) = pkts.get(r) {
                    gw.handle_datagram(at, source(start + k as u32), p);
                }
            }
            envelopes += drain(gw);
        }
        start = end;
    }
    (envelopes, text_bytes)
}

fn memory(kind: Kind, n: u32) {
    let before = live();
    let mut gw = Gateway::new(config());
    let empty = live() - before;
    let (envelopes, text_bytes) = open(&mut gw, kind, 0, n, T0);
    let after = live();
    assert_eq!(gw.live_streams(), n as usize, "every stream is live");
    let per = (after - before - empty) as f64 / f64::from(n);
    let beyond = per - text_bytes as f64 / f64::from(n);
    println!(
        "memory  {:<34} streams {n:>7}  heap {:>7.1} MiB  {per:>6.0} B/stream  {beyond:>6.0} B/stream beyond text  (envelopes {envelopes})",
        kind.name(),
        (after - before) as f64 / 1048576.0,
    );
    drop(gw);
}

/// The heap allocations one more stream of `kind` makes, on a gateway that already holds 1,000
/// (so no table is at a growth step): where the bytes of a stream go.
fn one_stream(kind: Kind) {
    let mut gw = Gateway::new(config());
    open(&mut gw, kind, 0, 1000, T0);
    let packets = match kind {
        Kind::Idle => vec![bom_packet(5000)],
        _ => sender_packets(5000, &text_for(kind, 5000)),
    };
    let before = live();
    TRACED.store(0, Ordering::Relaxed);
    TRACING.store(true, Ordering::Relaxed);
    for p in &packets {
        gw.handle_datagram(T0, source(5000), p);
    }
    TRACING.store(false, Ordering::Relaxed);
    let after = live();
    let n = TRACED.load(Ordering::Relaxed).min(TRACE.len());
    let mut sizes: Vec<usize> = TRACE[..n]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    println!(
        "one     {:<34} +{} B live; allocations (bytes, largest first, envelopes not drained): {sizes:?}",
        kind.name(),
        after - before
    );
    drain(&mut gw);
}

/// Steady-state allocations per datagram: `streams` streams (RED 2, one word per packet, as the
/// load test sends) already warmed up, then `rounds` more packets each. With `sentences` the
/// text has sentence ends (a chunk every ~9 words); without, it never flushes during the run.
fn steady_allocs(streams: u32, sentences: bool) -> (f64, f64, f64) {
    const WARM: u32 = 30;
    const ROUNDS: u32 = 60;
    let words: Vec<&str> = if sentences {
        "The quick brown fox jumps over the lazy dog. Real-time text arrives one word at a time. "
            .split_inclusive(' ')
            .collect()
    } else {
        "the quick brown fox jumps over the lazy dog and real time text arrives one word at a time "
            .split_inclusive(' ')
            .collect()
    };
    let mut gw = Gateway::new(Config {
        max_chunk_chars: if sentences { 500 } else { 1_000_000 },
        ..config()
    });
    let mut talkers: Vec<(Sender, Time)> = (0..streams)
        .map(|i| {
            let cfg = SenderConfig {
                ssrc: ssrc(i),
                cps: None,
                ..SenderConfig::default()
            };
            (Sender::new(cfg, T0), T0)
        })
        .collect();
    let mut packets = 0u64;
    let mut envelopes = 0u64;
    let mut calls = 0usize;
    let mut elapsed = Duration::ZERO;
    for round in 0..WARM + ROUNDS {
        // Build this round's datagrams first: the sender's allocations are not counted.
        let mut batch = Vec::with_capacity(streams as usize);
        for (i, (s, vt)) in talkers.iter_mut().enumerate() {
            *vt = vt.saturating_add(Duration::from_millis(300));
            s.push_text(*vt, words[(round as usize + i) % words.len()]);
            while let Some(p) = s.poll_packet(*vt) {
                batch.push((i as u32, *vt, p));
            }
        }
        let c0 = CALLS.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut e = 0;
        for (i, vt, p) in &batch {
            gw.handle_datagram(*vt, source(*i), p);
            while let Some(env) = gw.poll_output() {
                black_box(&env);
                e += 1;
                // Dropping the envelope frees; freeing is not counted, allocating it was.
            }
        }
        if round >= WARM {
            elapsed += started.elapsed();
            calls += CALLS.load(Ordering::Relaxed) - c0;
            packets += batch.len() as u64;
            envelopes += e;
        }
    }
    (
        calls as f64 / packets as f64,
        envelopes as f64 / packets as f64,
        elapsed.as_nanos() as f64 / packets as f64,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (ns per handle_timeout with 10 flushes due, ns with nothing due, ns per stats()).
fn timers(n: u32) -> (f64, f64, f64) {
    const DUE: u32 = 10;
    const ROUNDS: u32 = 300;
    let mut gw = Gateway::new(config());
    open(&mut gw, Kind::Idle, 0, n, T0);
    // The streams that become due: opened with the rest, then given text each round.
    let mut talkers: Vec<(u32, Sender)> = (0..DUE)
        .map(|k| {
            let i = 1_000_000 + k;
            let cfg = SenderConfig {
                ssrc: ssrc(i),
                redundancy: 0,
                cps: None,
                ..SenderConfig::default()
            };
            (i, Sender::new(cfg, T0))
        })
        .collect();
    let mut due_ns = Vec::new();
    let mut none_ns = Vec::new();
    for r in 0..ROUNDS {
        // 3 s apart: each round's text is flushed (idle, 2 s) before the next arrives.
        let t = T0.saturating_add(Duration::from_secs(10 + 3 * u64::from(r)));
        for (i, s) in &mut talkers {
            s.push_text(t, "still talking and");
            while let Some(p) = s.poll_packet(t) {
                gw.handle_datagram(t, source(*i), &p);
            }
        }
        drain(&mut gw);
        let idle = t.saturating_add(Duration::from_millis(1000));
        let started = Instant::now();
        gw.handle_timeout(idle);
        none_ns.push(started.elapsed().as_nanos() as f64);
        let flush = t.saturating_add(Duration::from_millis(2001));
        let started = Instant::now();
        gw.handle_timeout(flush);
        due_ns.push(started.elapsed().as_nanos() as f64);
        let flushed = drain(&mut gw);
        // Each due stream sends its chunk (and its join the first time).
        assert!(flushed >= u64::from(DUE), "round {r}: {flushed} envelopes");
    }
    let mut stats_ns = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        black_box(gw.stats());
        stats_ns.push(started.elapsed().as_nanos() as f64);
    }
    (median(due_ns), median(none_ns), median(stats_ns))
}

/// ns per datagram refused at the stream limit of `n` streams that may all yet speak.
fn limit_flood(n: u32) -> f64 {
    const FLOOD: u32 = 20_000;
    let mut gw = Gateway::new(Config {
        max_streams: n as usize,
        ..config()
    });
    let mut d = Vec::new();
    for i in 0..n {
        // Sequence 1 opens the stream; 3 carries text behind the gap 2 left.
        for (seq, text) in [(1, "\u{feff}"), (3, "held")] {
            d.clear();
            rtp::write_packet(&mut d, seq == 1, T140_PT, seq, 0, ssrc(i), text.as_bytes());
            gw.handle_datagram(T0, source(i), &d);
        }
    }
    drain(&mut gw);
    let packets: Vec<(SocketAddr, Vec<u8>)> = (0..FLOOD)
        .map(|k| {
            let i = 2_000_000 + k;
            let mut d = Vec::new();
            rtp::write_packet(&mut d, true, T140_PT, 1, 0, ssrc(i), "\u{feff}".as_bytes());
            (source(i), d)
        })
        .collect();
    let refused_before = gw.stats().drops(pvp_t140::DropReason::StreamLimit);
    let started = Instant::now();
    // 100 ms of flood, 5 us apart: within the reorder wait, every stream still waits.
    for (k, (from, d)) in packets.iter().enumerate() {
        gw.handle_datagram(T0.plus_us(5 * k as u64), *from, d);
    }
    let ns = started.elapsed().as_nanos() as f64 / f64::from(FLOOD);
    let refused = gw.stats().drops(pvp_t140::DropReason::StreamLimit) - refused_before;
    assert_eq!(refused, u64::from(FLOOD), "every new stream is refused");
    ns
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    // A bad value is said, not measured as the default under the name asked for.
    let n: u32 = match std::env::var("SCALE_STREAMS") {
        Err(_) => 100_000,
        Ok(s) => match s.parse() {
            Ok(n) if n >= 1_000 => n,
            _ => {
                eprintln!("SCALE_STREAMS={s:?}: a whole number of streams, at least 1000");
                std::process::exit(2);
            }
        },
    };
    println!(
        "sizes: Stream {} B, Speaker {} B, Register {} B, Chunker {} B (inline, before heap parts)",
        std::mem::size_of::<pvp_t140::stream::Stream>(),
        std::mem::size_of::<pvp_t140::speaker::Speaker>(),
        std::mem::size_of::<pvp_t140::register::Register>(),
        std::mem::size_of::<pvp_t140::chunker::Chunker>(),
    );
    for kind in [Kind::Idle, Kind::Text, Kind::Flushed] {
        memory(kind, n);
    }
    for kind in [Kind::Idle, Kind::Text] {
        one_stream(kind);
    }
    for sentences in [false, true] {
        let (allocs, envelopes, ns) = steady_allocs(1000, sentences);
        println!(
            "steady  1000 streams, RED 2, a word a packet, {}: {allocs:.2} allocations/datagram, {envelopes:.3} envelopes/datagram, {ns:.0} ns/datagram",
            if sentences {
                "sentence ends (chunks sent)"
            } else {
                "no sentence end (nothing sent)"
            }
        );
    }
    // Alternating passes, the lowest median of each kept: the machine this runs on is shared.
    let (mut small, mut large) = (
        (f64::MAX, f64::MAX, f64::MAX),
        (f64::MAX, f64::MAX, f64::MAX),
    );
    for _ in 0..3 {
        let s = timers(1_000);
        let l = timers(n);
        small = (small.0.min(s.0), small.1.min(s.1), small.2.min(s.2));
        large = (large.0.min(l.0), large.1.min(l.1), large.2.min(l.2));
    }
    println!(
        "timers  handle_timeout, 10 idle flushes due: {:>8.0} ns with 1k streams, {:>8.0} ns with {}k (x{:.2})",
        small.0,
        large.0,
        n / 1000,
        large.0 / small.0
    );
    println!(
        "timers  handle_timeout, nothing due:         {:>8.0} ns with 1k streams, {:>8.0} ns with {}k (x{:.2})",
        small.1,
        large.1,
        n / 1000,
        large.1 / small.1
    );
    let (flood_small, flood_large) = (limit_flood(1_000), limit_flood(n));
    println!(
        "limit   datagram refused at the stream limit, every stream may yet speak: {flood_small:>8.0} ns with 1k streams, {flood_large:>8.0} ns with {}k (x{:.2})",
        n / 1000,
        flood_large / flood_small
    );
    println!(
        "stats   Gateway::stats():                    {:>8.0} ns with 1k streams, {:>8.0} ns with {}k (x{:.2})",
        small.2,
        large.2,
        n / 1000,
        large.2 / small.2
    );
}
