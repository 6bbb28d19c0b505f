//! Per-packet hot path of the sans-IO core.
//!
//! * `parse/*`: RTP header parse, RED payload parse (with its blocks walked), T.140 decode of a
//!   typical 3-10 byte payload, chunker append of one 3-character packet.
//! * `gateway/*`: the whole `Gateway::handle_datagram` plus draining `poll_output`, for plain
//!   T.140 and RED (2 generations) packets, on 1 stream and on 10,000 interleaved streams
//!   (distinct SSRCs and source ports, round-robin). Streams are created and their buffers grown
//!   before measuring. Every stream types a 60-character sentence 3 characters per packet, so a
//!   `context.add` is flushed every 20th packet of a stream, and simulated time advances 300 ms
//!   per packet per stream (RFC 4103's recommended buffering interval), so timers fire as live.
//!
//!   The `_shuffled` benchmarks visit the 10,000 streams in a random order, one packet at a
//!   time or in warmed batches of 32 as the UDP loop feeds the core; `_core` times only the
//!   core's handling of each batch, made before its clock starts (the others also time the
//!   harness copying and patching each packet from its template).
//!
//! * `adversarial/*`: RED packets made only of empty redundant-block headers, MTU-sized and
//!   65,507 bytes, to show whether per-packet cost stays linear in the datagram size; and RTCP
//!   SDES compounds naming ~170 and ~8,000 sources (1,400 bytes, 64 KiB), whose cost stays
//!   bounded (a compound acts on at most 256 sources).
//!
//! Each iteration is one packet (`Throughput::Elements(1)`): criterion's "thrpt" is packets/s
//! and "time" is ns/packet. The `_shuffled_batch32_warm` and `_core` benchmarks are the
//! exception: an iteration is a batch of 32 (`Throughput::Elements(32)`), so their "time" is
//! per batch of 32 (divide by 32 for ns/packet); their "thrpt" is still packets/s.
//!
//! `cargo bench --bench core` (about a minute on 2 cores).

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use pvp_t140::chunker::{Chunker, Cuts};
use pvp_t140::red::{self, RedPayload};
use pvp_t140::rtp::{self, RtpPacket};
use pvp_t140::t140::{DecodeStats, Decoder, TextSink};
use pvp_t140::{Config, Gateway, Time};

#[path = "support/traffic.rs"]
mod traffic;

use traffic::*;

/// A sink that only counts: isolates the decoder from the chunker.
#[derive(Default)]
struct Count(u64);

impl TextSink for Count {
    fn push_char(&mut self, c: char) {
        self.0 += u64::from(c);
    }
    fn new_line(&mut self) {
        self.0 += 1;
    }
    fn backspace(&mut self) -> bool {
        self.0 += 2;
        true
    }
}

fn bench_parsers(c: &mut Criterion) {
    let blocks = sentence_blocks();
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));

    let plain = plain_packet(1234, 0xdead_beef, blocks[3]);
    g.bench_function("rtp_plain", |b| {
        b.iter(|| {
            let p = RtpPacket::parse(black_box(&plain)).unwrap();
            black_box((p.sequence, p.ssrc, p.payload.len()))
        })
    });

    let redp = red_packet(1234, 0xdead_beef, &blocks, 3);
    g.bench_function("rtp_red", |b| {
        b.iter(|| {
            let p = RtpPacket::parse(black_box(&redp)).unwrap();
            black_box((p.sequence, p.ssrc, p.payload.len()))
        })
    });

    let red_payload = RtpPacket::parse(&redp).unwrap().payload.to_vec();
    g.bench_function("red_2gen", |b| {
        b.iter(|| {
            let r = RedPayload::parse(black_box(&red_payload)).unwrap();
            let redundant: usize = r.redundant_blocks().map(|b| b.data.len()).sum();
            black_box((redundant, r.primary().data.len()))
        })
    });

    for (name, payload) in [
        ("t140_ascii_3B", &b"fox"[..]),
        ("t140_utf8_10B", "café—ü".as_bytes()),
    ] {
        let mut d = Decoder::new();
        let mut sink = Count::default();
        let mut counts = DecodeStats::default();
        g.bench_function(name, |b| {
            b.iter(|| {
                d.feed(black_box(payload), &mut sink, &mut counts);
            })
        });
        black_box(sink.0);
    }

    // One 3-character packet's worth of chars into the chunker, sentence cuts included.
    let mut ch = Chunker::new();
    let mut cuts = Cuts::new(500);
    let mut i = 0usize;
    g.bench_function("chunker_3chars", |b| {
        b.iter(|| {
            let mut sink = ch.fed(&mut cuts);
            for &byte in blocks[i] {
                sink.push_char(char::from(byte));
            }
            i = (i + 1) % blocks.len();
            for chunk in cuts.drain() {
                black_box(chunk);
            }
        })
    });
    g.finish();
}

fn bench_gateway(c: &mut Criterion) {
    let mut g = c.benchmark_group("gateway");
    g.throughput(Throughput::Elements(1));
    for streams in [1usize, 10_000] {
        for red in [false, true] {
            let mut t = Traffic::new(streams, red);
            let before = t.gw.stats();
            let name = format!("{}_{}streams", if red { "red2" } else { "plain" }, streams);
            g.bench_function(&name, |b| b.iter(|| t.step()));
            // Sanity: the measured traffic was accepted and flushed at the sentence rate.
            let s = t.gw.stats();
            let packets = s.datagrams - before.datagrams;
            assert_eq!(s.drops_total(), 0, "{name}: drops");
            assert_eq!(s.streams_live, streams as u64, "{name}");
            let chunks = s.envelopes - before.envelopes;
            let expect = packets / t.templates.len() as u64;
            assert!(
                chunks + streams as u64 >= expect && chunks <= expect + streams as u64,
                "{name}: {chunks} chunks for {packets} packets"
            );
        }
    }
    // Arrivals in a random order, as a gateway with thousands of independent senders sees
    // them: the hardware prefetcher cannot follow from one stream's memory to the next as it
    // follows the sweep above, so each packet pays its misses. One at a time, and in batches
    // of 32 handled together (`Gateway::handle_batch`), which is how the UDP loop feeds the core.
    for red in [false, true] {
        let streams = 10_000;
        let kind = if red { "red2" } else { "plain" };
        let mut t = Traffic::shuffled(streams, red);
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("{kind}_{streams}streams_shuffled"), |b| {
            b.iter(|| t.step())
        });
        g.throughput(Throughput::Elements(32));
        g.bench_function(
            format!("{kind}_{streams}streams_shuffled_batch32_warm"),
            |b| b.iter(|| t.step_batch(32, true)),
        );
        // The same, timing the core alone: each batch's datagrams are made before its clock
        // starts, as the kernel fills the UDP loop's buffer before the core sees it. Making
        // them (template copy and patch) is the harness's work, which the benchmark above
        // counts as the core's. Two clock readings a batch stay in (about 1 ns a packet).
        g.bench_function(
            format!("{kind}_{streams}streams_shuffled_batch32_warm_core"),
            |b| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        t.fill_batch(32);
                        let started = Instant::now();
                        t.handle_filled(true);
                        spent += started.elapsed();
                    }
                    spent
                })
            },
        );
        assert_eq!(t.gw.stats().drops_total(), 0);
        assert_eq!(t.gw.stats().streams_live, streams as u64);
    }
    g.finish();
}

/// Hostile input: one stream receiving RED packets made only of empty redundant-block headers
/// (F=1, length 0) in a 1,400-byte (MTU) datagram and in the largest UDP datagram (65,507 bytes,
/// which the UDP shell accepts). The cost per packet should grow linearly with its size.
fn bench_adversarial(c: &mut Criterion) {
    let mut g = c.benchmark_group("adversarial");
    g.throughput(Throughput::Elements(1));
    g.sampling_mode(SamplingMode::Flat).sample_size(10);
    for size in [1_400usize, 65_507] {
        let headers = (size - 12 - 1) / 4;
        let gens: Vec<(u16, &[u8])> = vec![(0, &[][..]); headers];
        let mut payload = Vec::new();
        red::write_payload(&mut payload, T140_PT, &gens, b"");
        let mut pkt = Vec::new();
        rtp::write_packet(&mut pkt, true, RED_PT, 0, 0, 0x0bad_0bad, &payload);
        let mut gw = Gateway::new(Config {
            t140_pt: T140_PT,
            red_pt: RED_PT,
            ..Config::default()
        });
        let source: SocketAddr = "192.0.2.66:5004".parse().unwrap();
        let mut seq = 0u16;
        let mut now = START;
        let mut send = |gw: &mut Gateway| {
            pkt[2..4].copy_from_slice(&seq.to_be_bytes());
            seq = seq.wrapping_add(1);
            now = Time(now.0 + PACKET_INTERVAL_US);
            gw.handle_datagram(now, source, &pkt);
            while let Some(e) = gw.poll_output() {
                black_box(e);
            }
        };
        send(&mut gw);
        let name = format!("red_{headers}_empty_generations_{size}B");
        g.bench_function(&name, |b| b.iter(|| send(&mut gw)));
        assert_eq!(gw.stats().drops_total(), 0, "{name}");
    }
    // RTCP: SDES chunks of distinct sources (a NAME each), 1,400 bytes (about 170 sources)
    // and the largest datagram (about 8,000: the compound acts on the first 256, counted as
    // `rtcp_too_many_sources`). Each compound's cost should stay bounded, not quadratic.
    for size in [1_400usize, 65_000] {
        let mut pkt = Vec::new();
        let mut ssrc = 1_000u32;
        while pkt.len() + 4 + 31 * 8 <= size {
            let start = pkt.len();
            pkt.extend_from_slice(&[0x80 | 31, 202, 0, 0]);
            for _ in 0..31 {
                pkt.extend_from_slice(&ssrc.to_be_bytes());
                pkt.extend_from_slice(&[2, 1, b'x', 0]);
                ssrc += 1;
            }
            let words = ((pkt.len() - start) / 4 - 1) as u16;
            pkt[start + 2..start + 4].copy_from_slice(&words.to_be_bytes());
        }
        let mut gw = Gateway::new(Config::default());
        let source: SocketAddr = "192.0.2.67:5005".parse().unwrap();
        let mut now = START;
        let name = format!("rtcp_sdes_{}_sources_{}B", ssrc - 1_000, pkt.len());
        g.bench_function(&name, |b| {
            b.iter(|| {
                now = Time(now.0 + PACKET_INTERVAL_US);
                gw.handle_datagram(now, source, &pkt);
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_parsers, bench_gateway, bench_adversarial
}
criterion_main!(benches);
