//! Shared by `benches/core.rs` and `examples/core_drive.rs`: senders typing a sentence, three
//! characters per packet, into one sans-IO `Gateway`, plain or RED, on N interleaved streams.
//! `examples/loadtest.rs` takes [`shuffled_order`] from here.
#![allow(dead_code)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use pvp_t140::gateway::WARM_BATCH;
use pvp_t140::red;
use pvp_t140::rtp;
use pvp_t140::{Config, Gateway, Time};

pub const T140_PT: u8 = 98;
pub const RED_PT: u8 = 100;
/// 60 characters; the space after the full stop ends the sentence and cuts the chunk.
pub const SENTENCE: &str = "The quick brown fox jumps over the lazy dog near the river. ";
pub const CHARS_PER_PACKET: usize = 3;
/// RFC 4103 section 5.1: text is buffered for 300 ms before it is sent.
pub const PACKET_INTERVAL_US: u64 = 300_000;
pub const START: Time = Time::from_millis(1_700_000_000_000);

pub fn sentence_blocks() -> Vec<&'static [u8]> {
    assert_eq!(SENTENCE.chars().count(), 60);
    SENTENCE.as_bytes().chunks(CHARS_PER_PACKET).collect()
}

pub fn plain_packet(seq: u16, ssrc: u32, text: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    rtp::write_packet(
        &mut p,
        false,
        T140_PT,
        seq,
        u32::from(seq) * 300,
        ssrc,
        text,
    );
    p
}

pub fn red_packet(seq: u16, ssrc: u32, blocks: &[&[u8]], i: usize) -> Vec<u8> {
    let n = blocks.len();
    let mut payload = Vec::new();
    red::write_payload(
        &mut payload,
        T140_PT,
        &[
            (600, blocks[(i + n - 2) % n]),
            (300, blocks[(i + n - 1) % n]),
        ],
        blocks[i],
    );
    let mut p = Vec::new();
    rtp::write_packet(
        &mut p,
        false,
        RED_PT,
        seq,
        u32::from(seq) * 300,
        ssrc,
        &payload,
    );
    p
}

/// Stream `i`'s source address, computed rather than read from a table: with 10,000 streams a
/// 320 KB table of addresses cost the measurement half a cache miss a packet that a gateway,
/// which gets the address from `recvfrom`, never pays.
#[inline]
pub fn source(i: usize) -> SocketAddr {
    let ip = Ipv4Addr::new(10, 0, (i >> 8) as u8, i as u8);
    SocketAddr::new(IpAddr::V4(ip), 20_000 + (i % 40_000) as u16)
}

/// `streams` senders typing [`SENTENCE`] in lockstep; `step` sends the next packet round-robin.
pub struct Traffic {
    pub gw: Gateway,
    /// One packet per position in the sentence; sequence number and SSRC are patched per send.
    pub templates: Vec<Vec<u8>>,
    streams: usize,
    /// Next stream to send, and the sentence position / sequence number of the current round.
    next: usize,
    round: u64,
    now: Time,
    step_us: u64,
    pub envelopes: u64,
    /// The order streams send in within a round, when not 0, 1, 2, ... ([`Traffic::shuffled`]).
    order: Option<Vec<u32>>,
    /// Datagrams of the current batch ([`Traffic::step_batch`]), as a receive loop holds them.
    batch: Vec<(SocketAddr, Vec<u8>)>,
}

impl Traffic {
    pub fn new(streams: usize, red: bool) -> Self {
        let blocks = sentence_blocks();
        let templates = (0..blocks.len())
            .map(|i| {
                if red {
                    red_packet(0, 0, &blocks, i)
                } else {
                    plain_packet(0, 0, blocks[i])
                }
            })
            .collect();
        let gw = Gateway::new(Config {
            session: "bench".into(),
            t140_pt: T140_PT,
            red_pt: RED_PT,
            max_streams: streams + 1,
            id_seed: 42,
            ..Config::default()
        });
        let mut t = Traffic {
            gw,
            templates,
            streams,
            next: 0,
            round: 1,
            now: START,
            step_us: (PACKET_INTERVAL_US / streams as u64).max(1),
            envelopes: 0,
            order: None,
            batch: Vec::new(),
        };
        // Pre-warm: create every stream and type two whole sentences on each, so the stream
        // table, buffers, timer heap and output queue have reached their steady-state size.
        let warm = streams * 2 * t.templates.len();
        for _ in 0..warm {
            t.step();
        }
        assert_eq!(t.gw.live_streams(), streams);
        assert_eq!(t.gw.stats().drops_total(), 0);
        t
    }

    /// Like [`Traffic::new`], but every round visits the streams in one fixed pseudo-random
    /// order instead of by slot: arrivals as a busy gateway sees them, which the hardware
    /// prefetcher cannot follow from one stream's memory to the next as it can a sweep.
    pub fn shuffled(streams: usize, red: bool) -> Self {
        let mut t = Traffic::new(streams, red);
        t.order = Some(shuffled_order(streams));
        t
    }

    /// The next `n` packets as the gateway's receive loop feeds them: read into a batch first,
    /// then handled one after another at one clock reading; with `warm`, as the UDP loop does,
    /// by `Gateway::handle_batch` (at most `WARM_BATCH` datagrams a batch).
    pub fn step_batch(&mut self, n: usize, warm: bool) {
        self.fill_batch(n);
        self.handle_filled(warm);
    }

    /// Puts the next `n` datagrams in the batch, as the kernel puts them in the receive loop's
    /// buffer: copied from their templates and patched (sequence number, SSRC, marker). Not the
    /// core's work, so a caller timing the core leaves it out (`benches/core.rs`'s `_core`
    /// benchmarks) and callgrind counts only [`Traffic::handle_filled`]
    /// (`--toggle-collect='*handle_filled*'`).
    pub fn fill_batch(&mut self, n: usize) {
        while self.batch.len() < n {
            self.batch.push((source(0), Vec::with_capacity(64)));
        }
        self.batch.truncate(n);
        for i in 0..n {
            let (stream, phase, round) = self.advance();
            let (src, buf) = &mut self.batch[i];
            buf.clear();
            buf.extend_from_slice(&self.templates[phase]);
            patch(buf, round, stream);
            *src = source(stream);
        }
    }

    /// Handles the batch [`Traffic::fill_batch`] made, at one clock reading as the UDP loop
    /// takes, and takes the envelopes it made; then moves the clock on. Out of line, so that
    /// callgrind can count it alone.
    #[inline(never)]
    pub fn handle_filled(&mut self, warm: bool) {
        let n = self.batch.len();
        let now = self.now;
        if warm {
            assert!(
                n <= WARM_BATCH,
                "a batch holds at most {WARM_BATCH} datagrams"
            );
            // As the UDP loop holds them: borrowed, handed over as one batch.
            let mut views = [(source(0), &[][..]); WARM_BATCH];
            for (v, (s, b)) in views.iter_mut().zip(&self.batch) {
                *v = (*s, &b[..]);
            }
            self.gw.handle_batch(now, black_box(&views[..n]));
            self.drain();
        } else {
            for i in 0..n {
                let (src, buf) = &self.batch[i];
                self.gw.handle_datagram(now, *src, black_box(buf));
                self.drain();
            }
        }
        self.now = Time(self.now.0 + self.step_us * n as u64);
    }

    #[inline]
    pub fn step(&mut self) {
        let (stream, phase, round) = self.advance();
        let pkt = &mut self.templates[phase];
        patch(pkt, round, stream);
        self.gw
            .handle_datagram(self.now, source(stream), black_box(pkt));
        self.drain();
        self.now = Time(self.now.0 + self.step_us);
    }

    /// The stream whose turn it is, with the sentence position and round of its packet; moves
    /// the turn on.
    #[inline]
    fn advance(&mut self) -> (usize, usize, u64) {
        let stream = match &self.order {
            Some(order) => order[self.next] as usize,
            None => self.next,
        };
        let (phase, round) = (
            (self.round % self.templates.len() as u64) as usize,
            self.round,
        );
        self.next += 1;
        if self.next == self.streams {
            self.next = 0;
            self.round += 1;
        }
        (stream, phase, round)
    }

    /// Takes the envelopes the last packet made.
    #[inline]
    fn drain(&mut self) {
        while let Some(e) = self.gw.poll_output() {
            self.envelopes += 1;
            black_box(e);
        }
    }
}

/// Makes a template packet `stream`'s packet of `round`.
#[inline]
fn patch(pkt: &mut [u8], round: u64, stream: usize) {
    // RFC 4103 5.2: the marker bit flags the first packet of a stream (else the register holds
    // it for a possibly late head).
    pkt[1] = pkt[1] & 0x7f | if round == 1 { 0x80 } else { 0 };
    pkt[2..4].copy_from_slice(&(round as u16).to_be_bytes());
    pkt[8..12].copy_from_slice(&(0x5000_0000 | stream as u32).to_be_bytes());
}

/// 0..n in one fixed pseudo-random order (Fisher-Yates with a fixed xorshift): the same order
/// every run. `examples/loadtest.rs` opens its streams in it too.
pub fn shuffled_order(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}
