//! A deterministic network emulator between a T.140 [`Sender`] and the [`Gateway`], in virtual
//! time, in the style of str0m's `netem` crate: datagrams go in with [`Netem::send`], come out
//! with [`Netem::poll`] once [`Netem::poll_timeout`] is due, and in between they may be lost
//! (independently, or in bursts with a Gilbert-Elliott two-state model), duplicated, or
//! delayed by a random extra amount so that they overtake each other.
//!
//! Everything is seeded (a tiny xorshift, no `rand`), so a seed replays the same impairments.
//! [`run`] drives a sender, the network and a gateway together and keeps a per-packet log of
//! what was sent and what the network did to it, which the tests compare the transcript with.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::Duration;

use pvp_t140::pvp::Message as Envelope;
use pvp_t140::red::RedPayload;
use pvp_t140::rtp::RtpPacket;
use pvp_t140::send::{Sender, SenderConfig};
use pvp_t140::{Config, Gateway, Stats, Time};

/// xorshift64* (Vigna), seeded through a splitmix64 step so nearby seeds diverge at once.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

/// How datagrams are lost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    None,
    /// Each datagram independently, with this probability.
    Random(f64),
    /// Gilbert-Elliott: a good and a bad state, each with its own loss probability. A
    /// datagram's fate is drawn in the current state, then the state moves good→bad with `p`
    /// and bad→good with `r`: a bad spell lasts 1/r datagrams on average.
    GilbertElliott {
        p: f64,
        r: f64,
        loss_good: f64,
        loss_bad: f64,
    },
}

impl Loss {
    /// Long-run fraction of datagrams lost.
    pub fn mean(&self) -> f64 {
        match *self {
            Loss::None => 0.0,
            Loss::Random(q) => q,
            Loss::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                let bad = p / (p + r);
                (1.0 - bad) * loss_good + bad * loss_bad
            }
        }
    }
}

/// Network settings. Probabilities are in [0, 1].
#[derive(Debug, Clone)]
pub struct NetemConfig {
    /// Delay every datagram gets.
    pub latency: Duration,
    /// Extra delay, uniform in [0, jitter), drawn per copy: datagrams sent closer together
    /// than this can overtake each other.
    pub jitter: Duration,
    pub loss: Loss,
    /// Probability that a datagram that is not lost arrives twice (each copy with its own
    /// jitter, as Linux netem re-queues the copy).
    pub duplicate: f64,
    pub seed: u64,
}

impl Default for NetemConfig {
    fn default() -> Self {
        NetemConfig {
            latency: Duration::from_millis(20),
            jitter: Duration::ZERO,
            loss: Loss::None,
            duplicate: 0.0,
            seed: 0,
        }
    }
}

impl NetemConfig {
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn loss(mut self, loss: Loss) -> Self {
        self.loss = loss;
        self
    }

    pub fn duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }

    pub fn jitter(mut self, max: Duration) -> Self {
        self.jitter = max;
        self
    }

    pub fn latency(mut self, d: Duration) -> Self {
        self.latency = d;
        self
    }
}

/// What the network did to one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub lost: bool,
    /// Delay of each copy that will arrive: none when lost, two when duplicated.
    pub delays: Vec<Duration>,
}

/// A datagram coming out of the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The caller's id for the datagram (given to [`Netem::send`]).
    pub id: usize,
    /// 0 for the first copy drawn, 1 for the duplicate (which may arrive first).
    pub copy: u8,
    pub at: Time,
    pub data: Vec<u8>,
}

/// A copy in flight: `(arrival, enqueue order, id, copy, data)`. Ties on arrival leave in the
/// order they were sent.
type InFlight = (Time, u64, usize, u8, Vec<u8>);

/// The emulated link. Sans-IO, like the gateway: time is passed in.
#[derive(Debug)]
pub struct Netem {
    cfg: NetemConfig,
    rng: Rng,
    /// Gilbert-Elliott state.
    bad: bool,
    queue: BinaryHeap<Reverse<InFlight>>,
    order: u64,
}

impl Netem {
    pub fn new(cfg: NetemConfig) -> Self {
        Netem {
            rng: Rng::new(cfg.seed),
            cfg,
            bad: false,
            queue: BinaryHeap::new(),
            order: 0,
        }
    }

    fn lose(&mut self) -> bool {
        match self.cfg.loss {
            Loss::None => false,
            Loss::Random(q) => self.rng.chance(q),
            Loss::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                let lost = self.rng.chance(if self.bad { loss_bad } else { loss_good });
                self.bad = if self.bad {
                    !self.rng.chance(r)
                } else {
                    self.rng.chance(p)
                };
                lost
            }
        }
    }

    fn delay(&mut self) -> Duration {
        let jitter = self.cfg.jitter.as_micros() as u64;
        self.cfg.latency + Duration::from_micros(self.rng.below(jitter))
    }

    /// One datagram into the network at `now`. The draws happen in a fixed order (loss,
    /// duplication, one delay per copy), so a seed gives the same fates whatever is sent.
    pub fn send(&mut self, now: Time, id: usize, data: &[u8]) -> Verdict {
        if self.lose() {
            return Verdict {
                lost: true,
                delays: Vec::new(),
            };
        }
        let copies = if self.rng.chance(self.cfg.duplicate) {
            2
        } else {
            1
        };
        let mut delays = Vec::with_capacity(copies);
        for copy in 0..copies {
            let d = self.delay();
            delays.push(d);
            self.order += 1;
            self.queue.push(Reverse((
                now.saturating_add(d),
                self.order,
                id,
                copy as u8,
                data.to_vec(),
            )));
        }
        Verdict {
            lost: false,
            delays,
        }
    }

    /// When the next datagram arrives.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.queue.peek().map(|Reverse(e)| e.0)
    }

    /// The next datagram that has arrived by `now`, in arrival order.
    pub fn poll(&mut self, now: Time) -> Option<Delivery> {
        if self.poll_timeout()? > now {
            return None;
        }
        let Reverse((at, _, id, copy, data)) = self.queue.pop()?;
        Some(Delivery { id, copy, at, data })
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// One datagram the sender sent, and what became of it.
#[derive(Debug, Clone)]
pub struct PacketLog {
    /// Send order (0 = first packet of the session).
    pub index: usize,
    pub seq: u16,
    pub sent_at: Time,
    pub marker: bool,
    /// The primary block: the new text this packet carried ("" for redundancy-only packets).
    pub primary: String,
    /// Redundant generations carried (RED), empty placeholders included.
    pub generations: usize,
    /// The earliest non-empty block (oldest generation first, then the primary) starts with
    /// U+FEFF: T.140's session start, as the register recognises it.
    pub bom_start: bool,
    pub lost: bool,
    pub duplicated: bool,
    /// Network delay of each copy that arrived.
    pub delays: Vec<Duration>,
}

impl PacketLog {
    /// Whether the primary block carried new text.
    pub fn text(&self) -> bool {
        !self.primary.is_empty()
    }

    pub fn received(&self) -> bool {
        !self.lost
    }
}

/// Parses a datagram the sender emitted: `(seq, marker, primary, generations, bom_start)`.
fn inspect(d: &[u8], red_pt: u8) -> (u16, bool, String, usize, bool) {
    const BOM: &[u8] = "\u{feff}".as_bytes();
    let p = RtpPacket::parse(d).expect("the sender emits valid RTP");
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).expect("whole UTF-8 characters");
    if p.payload_type == red_pt {
        let red = RedPayload::parse(p.payload).expect("the sender emits valid RED");
        let earliest = red
            .redundant_blocks()
            .map(|b| b.data)
            .chain(std::iter::once(red.primary().data))
            .find(|d| !d.is_empty());
        (
            p.sequence,
            p.marker,
            text(red.primary().data),
            red.redundant_count(),
            earliest.is_some_and(|d| d.starts_with(BOM)),
        )
    } else {
        (
            p.sequence,
            p.marker,
            text(p.payload),
            0,
            p.payload.starts_with(BOM),
        )
    }
}

/// Everything one run produced.
#[derive(Debug)]
pub struct RunResult {
    pub log: Vec<PacketLog>,
    /// Packet indices in the order the gateway received them (duplicates appear twice).
    pub arrivals: Vec<usize>,
    pub envelopes: Vec<Envelope>,
    /// `context.add` contents with `context.update`/`context.remove` applied, joined by one
    /// space (the chunker trims every chunk).
    pub transcript: String,
    pub stats: Stats,
}

impl RunResult {
    pub fn kinds(&self, kind: &str) -> usize {
        self.envelopes.iter().filter(|e| e.kind == kind).count()
    }
}

/// Applies context.add / update / remove to the items, in order.
fn transcript(envelopes: &[Envelope]) -> String {
    let mut items: Vec<(String, String)> = Vec::new();
    for e in envelopes {
        let key = e.payload["key"].as_str().unwrap_or_default().to_owned();
        let pos = items.iter().position(|(k, _)| *k == key);
        match e.kind.as_str() {
            "context.add" => {
                let content = e.payload["content"].as_str().expect("content").to_owned();
                items.push((key, content));
            }
            "context.update" => {
                let new = e.payload["new_content"].as_str().expect("new_content");
                let i = pos.expect("update of a known item");
                items[i].1 = new.to_owned();
            }
            "context.remove" => {
                items.remove(pos.expect("remove of a known item"));
            }
            _ => {}
        }
    }
    items
        .into_iter()
        .map(|(_, c)| c)
        .collect::<Vec<_>>()
        .join(" ")
}

/// How long after the last packet arrived the gateway keeps running (reorder wait and idle
/// flush play out) before it is shut down.
pub const SETTLE: Duration = Duration::from_secs(5);

/// Drives `script` (`(ms from start, text)`) through a sender, the network and a gateway in
/// virtual time: each step jumps to the earliest of the next script entry, the sender's
/// timeout, the next arrival and the gateway's timeout. The gateway gets every datagram at its
/// arrival time and `handle_timeout` at every `poll_timeout` deadline; when everything has
/// arrived it runs on for [`SETTLE`] and is shut down.
pub fn run(
    start: Time,
    sender: SenderConfig,
    gateway: Config,
    net: NetemConfig,
    script: &[(u64, String)],
) -> RunResult {
    let source = SocketAddr::from(([192, 0, 2, 7], 5004));
    let red_pt = sender.red_pt;
    let mut gw = Gateway::new(gateway);
    let mut tx = Sender::new(sender, start);
    let mut net = Netem::new(net);
    let mut log: Vec<PacketLog> = Vec::new();
    let mut arrivals = Vec::new();
    let mut envelopes = Vec::new();
    let at = |ms: u64| start.saturating_add(Duration::from_millis(ms));
    let mut next = 0;
    let mut now = start;
    let mut steps = 0u32;
    while next < script.len() || !tx.is_idle() || !net.is_empty() {
        steps += 1;
        assert!(steps < 1_000_000, "the run does not settle");
        now = [
            script.get(next).map(|(ms, _)| at(*ms)),
            tx.poll_timeout(),
            net.poll_timeout(),
            gw.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("something is pending")
        .max(now);
        while next < script.len() && at(script[next].0) <= now {
            tx.push_text(now, &script[next].1);
            next += 1;
        }
        while let Some(d) = tx.poll_packet(now) {
            let (seq, marker, primary, generations, bom_start) = inspect(&d, red_pt);
            let index = log.len();
            let v = net.send(now, index, &d);
            log.push(PacketLog {
                index,
                seq,
                sent_at: now,
                marker,
                primary,
                generations,
                bom_start,
                lost: v.lost,
                duplicated: v.delays.len() > 1,
                delays: v.delays,
            });
        }
        while let Some(d) = net.poll(now) {
            arrivals.push(d.id);
            gw.handle_datagram(d.at, source, &d.data);
        }
        if gw.poll_timeout().is_some_and(|t| t <= now) {
            gw.handle_timeout(now);
        }
        envelopes.extend(std::iter::from_fn(|| gw.poll_output()).map(|e| e.to_message()));
    }
    let end = now.saturating_add(SETTLE);
    while let Some(t) = gw.poll_timeout().filter(|t| *t <= end) {
        steps += 1;
        assert!(steps < 1_000_000, "the gateway's timers do not settle");
        gw.handle_timeout(t);
    }
    gw.shutdown(end);
    envelopes.extend(std::iter::from_fn(|| gw.poll_output()).map(|e| e.to_message()));
    RunResult {
        transcript: transcript(&envelopes),
        stats: gw.stats(),
        log,
        arrivals,
        envelopes,
    }
}
