//! The sans-IO gateway: datagrams and time in, PVP envelopes out.
//!
//! Modelled on str0m's `Rtc` and quinn-proto's `Endpoint`: the caller feeds
//! [`Gateway::handle_datagram`] and [`Gateway::handle_timeout`] with `now` as a value, drains
//! [`Gateway::poll_output`], and sleeps until [`Gateway::poll_timeout`]. No sockets, clocks or
//! tasks live here, so the UDP loop, pcap replay, fuzzers and benches all drive the same code.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::json;

use crate::chunker::{Chunk, FlushCause};
use crate::pvp::{Builder, Envelope, Participant};
use crate::red::{RedError, RedPayload};
use crate::register::{Outcome, RegisterStats};
use crate::rtcp::RtcpEvent;
use crate::rtp::{RtpError, RtpPacket, looks_like_rtcp};
use crate::stream::{Stream, StreamKey};
use crate::t140::DecodeStats;
use crate::time::Time;

/// Gateway settings; the CLI maps its flags onto this.
#[derive(Debug, Clone)]
pub struct Config {
    pub session: String,
    /// pvp-spec 7.2 roles of every virtual participant.
    pub roles: Vec<String>,
    /// RFC 4103 text/t140 payload type (dynamic; from SDP in a SIP deployment).
    pub t140_pt: u8,
    /// RFC 2198 text/red payload type.
    pub red_pt: u8,
    pub idle_flush: Duration,
    pub max_chunk_chars: usize,
    /// A stream with no packets for this long is flushed and leaves.
    pub stream_timeout: Duration,
    /// New streams beyond this are refused and counted; existing ones keep working.
    pub max_streams: usize,
    pub token: Option<String>,
    /// Seed for the random part of message ULIDs.
    pub id_seed: u128,
    /// How long a packet ahead of a gap waits for the gap to fill (RFC 4103 5.4: up to 1 s).
    pub reorder_wait: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            session: "default".into(),
            roles: vec!["navigator".into()],
            t140_pt: 98,
            red_pt: 100,
            idle_flush: Duration::from_millis(2000),
            max_chunk_chars: 500,
            stream_timeout: Duration::from_secs(60),
            max_streams: 100_000,
            token: None,
            id_seed: 0,
            reorder_wait: Duration::from_millis(1000),
        }
    }
}

/// Why a datagram produced no text. Every drop is counted by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    Rtp(RtpError),
    Red(RedError),
    /// An RTCP compound packet (told apart per RFC 5761) that is malformed.
    RtcpMalformed,
    UnknownPayloadType,
    /// Duplicate or older than what was already delivered.
    Stale,
    /// A new stream beyond `max_streams`.
    StreamLimit,
    /// A sequence jump beyond RFC 3550 A.1 limits, not confirmed by a following packet.
    SequenceJump,
    /// An SSRC already live from another source address: a collision or a hijack attempt
    /// (RFC 3550 8.2); the stream keeps its original source.
    SsrcConflict,
}

impl DropReason {
    pub const ALL: [DropReason; 13] = [
        DropReason::Rtp(RtpError::TooShort),
        DropReason::Rtp(RtpError::BadVersion),
        DropReason::Rtp(RtpError::CsrcOverrun),
        DropReason::Rtp(RtpError::ExtensionOverrun),
        DropReason::Rtp(RtpError::BadPadding),
        DropReason::Red(RedError::TruncatedHeader),
        DropReason::Red(RedError::BlockOverrun),
        DropReason::RtcpMalformed,
        DropReason::UnknownPayloadType,
        DropReason::Stale,
        DropReason::StreamLimit,
        DropReason::SequenceJump,
        DropReason::SsrcConflict,
    ];

    fn index(self) -> usize {
        match self {
            DropReason::Rtp(e) => e as usize,
            DropReason::Red(e) => 5 + e as usize,
            DropReason::RtcpMalformed => 7,
            DropReason::UnknownPayloadType => 8,
            DropReason::Stale => 9,
            DropReason::StreamLimit => 10,
            DropReason::SequenceJump => 11,
            DropReason::SsrcConflict => 12,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::Rtp(e) => e.as_str(),
            DropReason::Red(e) => e.as_str(),
            DropReason::RtcpMalformed => "rtcp_malformed",
            DropReason::UnknownPayloadType => "unknown_payload_type",
            DropReason::Stale => "stale_or_duplicate",
            DropReason::StreamLimit => "stream_limit",
            DropReason::SequenceJump => "sequence_jump",
            DropReason::SsrcConflict => "ssrc_conflict",
        }
    }
}

/// Gateway-wide counters. Plain integers: the shell reads them for logs and metrics.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub datagrams: u64,
    pub bytes: u64,
    /// RTCP compound packets read (malformed ones are also counted as drops).
    pub rtcp: u64,
    drops: [u64; DropReason::ALL.len()],
    pub streams_total: u64,
    pub streams_live: u64,
    chunks: [u64; FlushCause::ALL.len()],
    pub envelopes: u64,
    /// Lost packets recovered from RED generations.
    pub recovered: u64,
    /// Lost packets marked with U+FFFD.
    pub lost: u64,
    /// Packets that arrived ahead of a gap and waited in the reorder buffer.
    pub reordered: u64,
    /// Sequence restarts accepted (RFC 3550 A.1 bad_seq confirmed).
    pub restarts: u64,
    /// Streams whose first packets were lost (first packet without the marker bit).
    pub head_lost: u64,
    /// Lost packets judged to be the redundancy-only tail before an idle period (not marked).
    pub idle_tail: u64,
    /// Sent items corrected (context.update/remove) because backspaces erased their text.
    pub corrections: u64,
    /// Backspaces that reached further back than the last sent item (not applied).
    pub erase_unmatched: u64,
    /// Decoder counters of streams that have ended (live ones are added by [`Gateway::stats`]).
    pub decode: DecodeStats,
}

impl Stats {
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }

    pub fn drops_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    pub fn chunks(&self, cause: FlushCause) -> u64 {
        self.chunks[cause as usize]
    }

    fn fold_stream(&mut self, r: &RegisterStats, d: &DecodeStats) {
        self.recovered += r.recovered;
        self.lost += r.lost;
        self.reordered += r.reordered;
        self.restarts += r.restarts;
        self.head_lost += r.head_lost;
        self.idle_tail += r.idle_tail;
        add_decode(&mut self.decode, d);
    }
}

fn add_decode(a: &mut DecodeStats, b: &DecodeStats) {
    a.invalid_utf8 += b.invalid_utf8;
    a.bom += b.bom;
    a.backspace_unmatched += b.backspace_unmatched;
    a.controls_dropped += b.controls_dropped;
    a.sequences_skipped += b.sequences_skipped;
}

/// The sans-IO core.
pub struct Gateway {
    cfg: Config,
    pvp: Builder,
    index: HashMap<StreamKey, u32>,
    /// Which source a live SSRC belongs to: only consulted when a stream would be created.
    ssrc_owner: HashMap<u32, SocketAddr>,
    /// Slab of streams; `free` lists reusable slots.
    slots: Vec<Option<Stream>>,
    free: Vec<u32>,
    /// One live entry per stream (`Stream::timer`), plus stale ones skipped when popped, so
    /// timers cost O(log n) per event and never a scan of all streams.
    timers: BinaryHeap<Reverse<(Time, u32)>>,
    out: VecDeque<Envelope>,
    stats: Stats,
    serial: u64,
    /// SDES names of sources not seen on RTP yet (bounded, oldest evicted).
    early_names: Vec<(IpAddr, u32, String, u8)>,
}

const MAX_EARLY_NAMES: usize = 256;
const MAX_NAME_CHARS: usize = 128;

impl Gateway {
    pub fn new(cfg: Config) -> Self {
        let pvp = Builder::new(cfg.session.clone(), cfg.token.clone(), cfg.id_seed);
        Gateway {
            cfg,
            pvp,
            index: HashMap::new(),
            ssrc_owner: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            timers: BinaryHeap::new(),
            out: VecDeque::new(),
            stats: Stats::default(),
            serial: 0,
            early_names: Vec::new(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters, including the decoder counters of live streams.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        for st in self.slots.iter().flatten() {
            s.fold_stream(&st.register.stats, &st.decoder.stats);
        }
        s
    }

    pub fn live_streams(&self) -> usize {
        self.index.len()
    }

    /// Next envelope to send, in the order they must be sent.
    pub fn poll_output(&mut self) -> Option<Envelope> {
        self.out.pop_front()
    }

    /// When [`Gateway::handle_timeout`] next has work (idle flush or stream timeout).
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// One UDP datagram from `source`, received at `now`.
    pub fn handle_datagram(&mut self, now: Time, source: SocketAddr, data: &[u8]) {
        // Timers due before this packet fire first, so replay matches what happened on the wire.
        if self.poll_timeout().is_some_and(|t| t <= now) {
            self.handle_timeout(now);
        }
        self.stats.datagrams += 1;
        self.stats.bytes += data.len() as u64;
        if let Err(reason) = self.receive(now, source, data) {
            self.stats.drops[reason.index()] += 1;
            tracing::debug!(%source, len = data.len(), reason = reason.as_str(), "datagram dropped");
        }
    }

    fn receive(&mut self, now: Time, source: SocketAddr, data: &[u8]) -> Result<(), DropReason> {
        if looks_like_rtcp(data) {
            return self.receive_rtcp(now, source, data);
        }
        let pkt = RtpPacket::parse(data).map_err(DropReason::Rtp)?;
        let red = if pkt.payload_type == self.cfg.t140_pt {
            false
        } else if pkt.payload_type == self.cfg.red_pt {
            // Validated before a stream is created for it, so junk opens no stream.
            RedPayload::parse(pkt.payload).map_err(DropReason::Red)?;
            true
        } else {
            return Err(DropReason::UnknownPayloadType);
        };
        let key = StreamKey {
            source,
            ssrc: pkt.ssrc,
        };
        let slot = match self.index.get(&key) {
            Some(&slot) => slot,
            None => self.open_stream(now, key)?,
        };
        let stream = self.slots[slot as usize]
            .as_mut()
            .expect("indexed slot is live");
        stream.stats.packets += 1;
        stream.stats.bytes += data.len() as u64;
        stream.last_packet = now;
        let outcome = stream
            .receive(now, pkt.sequence, pkt.marker, red, pkt.payload)
            .map_err(DropReason::Red)?;
        self.after_text(now, slot);
        // Pushes a heap entry only when the deadline moved earlier (text started to be
        // buffered, a packet started to wait for a gap); later deadlines are re-armed lazily
        // when the existing entry fires.
        self.arm(slot);
        match outcome {
            Outcome::Delivered | Outcome::Held => Ok(()),
            Outcome::Stale => Err(DropReason::Stale),
            Outcome::Jump => Err(DropReason::SequenceJump),
        }
    }

    fn open_stream(&mut self, now: Time, key: StreamKey) -> Result<u32, DropReason> {
        if self.ssrc_owner.contains_key(&key.ssrc) {
            return Err(DropReason::SsrcConflict);
        }
        if self.index.len() >= self.cfg.max_streams {
            return Err(DropReason::StreamLimit);
        }
        self.serial += 1;
        let mut stream = Stream::new(key, self.serial, now, self.cfg.max_chunk_chars);
        // An SDES that arrived before the first RTP packet names the participant in its join.
        if let Some(i) = self
            .early_names
            .iter()
            .position(|(ip, ssrc, _, _)| *ip == key.source.ip() && *ssrc == key.ssrc)
        {
            let (_, _, name, rank) = self.early_names.remove(i);
            stream.name = name;
            stream.name_rank = rank;
        }
        let participant = self.participant(&stream);
        let join = self.pvp.join(now, &participant);
        self.push(join);
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(stream);
                s
            }
            None => {
                self.slots.push(Some(stream));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(key, slot);
        self.ssrc_owner.insert(key.ssrc, key.source);
        self.stats.streams_total += 1;
        self.stats.streams_live += 1;
        tracing::info!(source = %key.source, ssrc = format_args!("{:08x}", key.ssrc), "stream started");
        self.arm(slot);
        Ok(slot)
    }

    fn participant(&self, s: &Stream) -> Participant {
        Participant {
            id: s.participant.clone(),
            name: s.name.clone(),
            roles: self.cfg.roles.clone(),
            metadata: json!({
                "ssrc": format!("{:08x}", s.key.ssrc),
                "source": s.key.source.to_string(),
                "gateway": concat!("pvp-t140/", env!("CARGO_PKG_VERSION")),
            }),
        }
    }

    /// RTCP (RFC 3550 6): SDES NAME (else CNAME) names the participant, BYE ends the stream.
    /// It may come from the RTP port (rtcp-mux, RFC 5761) or the next one up (RFC 3550 11).
    fn receive_rtcp(
        &mut self,
        now: Time,
        source: SocketAddr,
        data: &[u8],
    ) -> Result<(), DropReason> {
        self.stats.rtcp += 1;
        let mut events = [None; 8];
        let mut n = 0;
        let ok = crate::rtcp::parse(data, &mut |e| {
            if n < events.len() {
                events[n] = Some(e);
                n += 1;
            }
        });
        for e in events.into_iter().flatten() {
            match e {
                RtcpEvent::Bye { ssrc } => {
                    if let Some(slot) = self.rtcp_stream(source, ssrc) {
                        self.close_stream(now, slot, "rtcp bye");
                    }
                }
                RtcpEvent::Name { ssrc, name } => self.name_stream(now, source, ssrc, name, 2),
                RtcpEvent::Cname { ssrc, cname } => self.name_stream(now, source, ssrc, cname, 1),
            }
        }
        if ok {
            Ok(())
        } else {
            Err(DropReason::RtcpMalformed)
        }
    }

    fn rtcp_stream(&self, source: SocketAddr, ssrc: u32) -> Option<u32> {
        let mut rtp = source;
        let by_mux = self.index.get(&StreamKey { source, ssrc });
        rtp.set_port(source.port().wrapping_sub(1));
        by_mux
            .or_else(|| self.index.get(&StreamKey { source: rtp, ssrc }))
            .copied()
    }

    /// `rank` 2 for NAME, 1 for CNAME: a NAME is never replaced by a CNAME.
    fn name_stream(&mut self, now: Time, source: SocketAddr, ssrc: u32, name: &str, rank: u8) {
        let name: String = name.chars().take(MAX_NAME_CHARS).collect();
        let Some(slot) = self.rtcp_stream(source, ssrc) else {
            let same = |e: &(IpAddr, u32, String, u8)| e.0 == source.ip() && e.1 == ssrc;
            if self.early_names.iter().any(|e| same(e) && e.3 > rank) {
                return;
            }
            self.early_names.retain(|e| !same(e));
            if self.early_names.len() >= MAX_EARLY_NAMES {
                self.early_names.remove(0);
            }
            self.early_names.push((source.ip(), ssrc, name, rank));
            return;
        };
        let s = self.slots[slot as usize].as_mut().expect("live");
        if rank < s.name_rank || s.name == name {
            return;
        }
        s.name = name;
        s.name_rank = rank;
        // The join already went out with the old name: announce the new one (pvp-spec 7.1).
        let s = self.slots[slot as usize].as_ref().expect("live");
        let p = self.participant(s);
        let e = self.pvp.announce(now, &p);
        self.push(e);
    }

    /// The earliest moment this stream needs attention.
    fn deadline(&self, s: &Stream) -> Time {
        let mut at = s.last_packet.saturating_add(self.cfg.stream_timeout);
        if !s.chunker.is_blank() {
            at = at.min(s.last_text.saturating_add(self.cfg.idle_flush));
        }
        if let Some(gap) = s.register.deadline(self.cfg.reorder_wait) {
            at = at.min(gap);
        }
        at
    }

    fn arm(&mut self, slot: u32) {
        let s = self.slots[slot as usize].as_ref().expect("live");
        let at = self.deadline(s);
        if s.timer.is_some_and(|t| t <= at) {
            return;
        }
        self.slots[slot as usize].as_mut().expect("live").timer = Some(at);
        self.timers.push(Reverse((at, slot)));
    }

    /// Fires every timer due at `now`: idle flushes and stream timeouts.
    pub fn handle_timeout(&mut self, now: Time) {
        while let Some(&Reverse((at, slot))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(s) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if s.timer != Some(at) {
                continue; // superseded entry
            }
            s.timer = None;
            s.expire(now, self.cfg.reorder_wait);
            self.after_text(now, slot);
            let s = self.slots[slot as usize].as_mut().expect("live");
            let timeout_at = s.last_packet.saturating_add(self.cfg.stream_timeout);
            let idle_at = s.last_text.saturating_add(self.cfg.idle_flush);
            if timeout_at <= now {
                self.close_stream(timeout_at.max(at), slot, "stream timeout");
                continue;
            }
            if idle_at <= now && !s.chunker.is_blank() {
                let chunk = s.flush(FlushCause::Idle);
                self.emit(idle_at, slot, chunk);
            }
            self.arm(slot);
        }
    }

    /// Graceful stop: every stream flushes what it holds and leaves, in creation order.
    pub fn shutdown(&mut self, now: Time) {
        let mut live: Vec<(u64, u32)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (s.serial, i as u32)))
            .collect();
        live.sort_unstable();
        for (_, slot) in live {
            self.close_stream(now, slot, "gateway shutdown");
        }
        self.timers.clear();
    }

    fn close_stream(&mut self, now: Time, slot: u32, reason: &str) {
        let Some(s) = self.slots[slot as usize].as_mut() else {
            return;
        };
        s.finish_input();
        self.after_text(now, slot);
        let chunk = self.slots[slot as usize]
            .as_mut()
            .expect("live")
            .flush(FlushCause::End);
        self.emit(now, slot, chunk);
        let s = self.slots[slot as usize].take().expect("live");
        let leave = self.pvp.leave(now, &s.participant, reason);
        self.push(leave);
        self.index.remove(&s.key);
        self.ssrc_owner.remove(&s.key.ssrc);
        self.free.push(slot);
        self.stats.streams_live -= 1;
        self.stats.fold_stream(&s.register.stats, &s.decoder.stats);
        tracing::info!(
            source = %s.key.source,
            ssrc = format_args!("{:08x}", s.key.ssrc),
            reason,
            packets = s.stats.packets,
            chunks = s.chunks_sent,
            "stream ended"
        );
    }

    /// After text reached a stream's chunker: first correct sent text that backspaces erased
    /// (they came before any chunk cut since), then send the chunks cut.
    fn after_text(&mut self, now: Time, slot: u32) {
        let s = self.slots[slot as usize].as_mut().expect("live");
        let erase = s.chunker.take_erase_sent();
        if erase > 0 {
            self.erase_sent(now, slot, erase);
        }
        let s = self.slots[slot as usize].as_mut().expect("live");
        if s.chunker.has_ready() {
            self.emit_ready(now, slot);
        }
    }

    /// T.140 backspace reaching text already sent: a transcript must not keep characters the
    /// speaker erased, so the last item is replaced (pvp-spec 9.3 `context.update`), or removed
    /// when nothing is left. Erasing further back than the last item is counted, not applied.
    fn erase_sent(&mut self, now: Time, slot: u32, count: usize) {
        let s = self.slots[slot as usize].as_mut().expect("live");
        if s.last_sent == 0 {
            self.stats.erase_unmatched += count as u64;
            return;
        }
        let text = &mut s.last_sent_text;
        let mut erased = 0;
        while erased < count && text.pop().is_some() {
            erased += 1;
        }
        self.stats.erase_unmatched += (count - erased) as u64;
        if erased == 0 {
            return;
        }
        text.truncate(text.trim_end().len());
        let key = s.key(s.last_sent);
        let reason = "T.140 backspace erased transcribed text";
        let e = if s.last_sent_text.is_empty() {
            s.last_sent = 0;
            self.pvp.context_remove(now, &s.participant, &key, reason)
        } else {
            self.pvp
                .context_update(now, &s.participant, &key, &s.last_sent_text, reason)
        };
        self.stats.corrections += 1;
        self.push(e);
    }

    fn emit_ready(&mut self, now: Time, slot: u32) {
        let s = self.slots[slot as usize].as_mut().expect("live");
        let ready: Vec<Chunk> = s.chunker.drain_ready().collect();
        for chunk in ready {
            self.emit(now, slot, Some(chunk));
        }
    }

    fn emit(&mut self, now: Time, slot: u32, chunk: Option<Chunk>) {
        let Some(chunk) = chunk else { return };
        let s = self.slots[slot as usize].as_mut().expect("live");
        let key = s.next_key();
        s.last_sent = s.chunks_sent;
        s.last_sent_text.clear();
        s.last_sent_text.push_str(&chunk.text);
        let source = s.key.source_uri();
        let env = self.pvp.context_add(
            now,
            &s.participant,
            key,
            chunk.text,
            source,
            chunk.cause.as_str(),
        );
        self.stats.chunks[chunk.cause as usize] += 1;
        self.push(env);
    }

    fn push(&mut self, e: Envelope) {
        self.stats.envelopes += 1;
        self.out.push_back(e);
    }
}
